//! The daemon connection's egress: what broca writes, queued per route and bounded, so a
//! route whose frames the daemon does not take fast enough never stalls the others or the
//! connection (a push never waits). The policy, by name (`shed-then-close`):
//!
//! 1. Channel 0 (broca's control frames: PONG, health, binds, its own requests) has its own
//!    queue and goes first.
//! 2. Routes take turns, one frame each, in the order they queued.
//! 3. A route may hold [`ROUTE_BYTES`] queued. A frame that does not fit first sheds the
//!    route's queued display deltas (oldest first; the subscription reports them as a gap);
//!    a display delta that still does not fit is shed itself.
//! 4. Any other frame that still does not fit closes the route: its queue is dropped, a
//!    GOODBYE for it is queued, its subscriptions end, and its later frames are dropped
//!    until the daemon binds the channel again.
//! 5. The whole connection may hold [`CONNECTION_BYTES`]; past it, the route holding the
//!    most is closed the same way.
//!
//! Debug builds take `BROCA_TEST_ROUTE_EGRESS_BYTES` in place of the route bound, for tests.

use std::collections::{HashMap, HashSet, VecDeque};

/// Bytes one route may hold queued.
pub const ROUTE_BYTES: usize = 4 << 20;
/// Bytes the whole connection may hold queued (routes; channel 0 is not bounded).
pub const CONNECTION_BYTES: usize = 64 << 20;

/// What a queued frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A display delta of a subscription: shed first.
    Delta,
    /// Anything else.
    Frame,
}

/// What became of a pushed frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// A display delta shed (no room for it).
    Shed,
    /// The route was closed by the policy (this push, or one before it and not bound since):
    /// the frame is dropped. `true` when this push closed it.
    Closed {
        now: bool,
    },
}

#[derive(Default)]
struct RouteQueue {
    frames: VecDeque<(Vec<u8>, Kind)>,
    bytes: usize,
}

/// The queues.
pub struct Egress {
    control: VecDeque<Vec<u8>>,
    routes: HashMap<u16, RouteQueue>,
    /// Routes with frames, in turn order.
    turns: VecDeque<u16>,
    bytes: usize,
    route_max: usize,
    connection_max: usize,
    /// Routes closed by the policy, until bound again.
    closed: HashSet<u16>,
    /// Deltas shed and routes closed, since the start.
    pub shed: u64,
    pub closes: u64,
}

impl Egress {
    pub fn new() -> Egress {
        Egress::with_bounds(route_bytes(), CONNECTION_BYTES)
    }

    pub fn with_bounds(route_max: usize, connection_max: usize) -> Egress {
        Egress {
            control: VecDeque::new(),
            routes: HashMap::new(),
            turns: VecDeque::new(),
            bytes: 0,
            route_max: route_max.max(1),
            connection_max: connection_max.max(1),
            closed: HashSet::new(),
            shed: 0,
            closes: 0,
        }
    }

    /// Queues a frame of channel 0.
    pub fn push_control(&mut self, frame: Vec<u8>) {
        self.control.push_back(frame);
    }

    /// Queues `frame` for route `channel` under the policy; `goodbye` makes the GOODBYE to
    /// say if the route must close (made only then).
    pub fn push(
        &mut self,
        channel: u16,
        frame: Vec<u8>,
        kind: Kind,
        goodbye: impl FnOnce() -> Vec<u8>,
    ) -> Pushed {
        if self.closed.contains(&channel) {
            return Pushed::Closed { now: false };
        }
        let len = frame.len();
        let max = self.route_max;
        let q = self.routes.entry(channel).or_default();
        if q.bytes + len > max {
            // Shed the route's queued deltas, oldest first, until the frame fits.
            let (mut freed, mut shed, held) = (0, 0, q.bytes);
            q.frames.retain(|(f, k)| {
                if *k == Kind::Delta && held - freed + len > max {
                    freed += f.len();
                    shed += 1;
                    false
                } else {
                    true
                }
            });
            q.bytes -= freed;
            self.bytes -= freed;
            self.shed += shed;
        }
        let q = self.routes.get_mut(&channel).expect("made above");
        if q.bytes + len > self.route_max {
            if kind == Kind::Delta {
                self.shed += 1;
                return Pushed::Shed;
            }
            self.close(channel, goodbye());
            return Pushed::Closed { now: true };
        }
        let q = self.routes.get_mut(&channel).expect("made above");
        if q.frames.is_empty() {
            self.turns.push_back(channel);
        }
        q.frames.push_back((frame, kind));
        q.bytes += len;
        self.bytes += len;
        self.check();
        Pushed::Queued
    }

    /// The queues' counts agree with what they hold (debug builds).
    fn check(&self) {
        debug_assert_eq!(
            self.bytes,
            self.routes.values().map(|q| q.bytes).sum::<usize>(),
            "the connection's count is its routes'"
        );
        debug_assert!(
            self.routes
                .values()
                .all(|q| q.bytes == q.frames.iter().map(|(f, _)| f.len()).sum::<usize>()),
            "a route's count is its frames'"
        );
        debug_assert!(
            self.turns
                .iter()
                .all(|c| self.routes.get(c).is_some_and(|q| !q.frames.is_empty())),
            "a route takes turns only while it holds frames"
        );
        debug_assert!(
            self.routes.values().all(|q| q.bytes <= self.route_max),
            "no route holds past its bound"
        );
    }

    /// Whether the whole connection holds more than its bound; then the route holding the
    /// most, closed (its GOODBYE made by `goodbye`), is answered.
    pub fn enforce_connection_bound(&mut self, goodbye: impl Fn(u16) -> Vec<u8>) -> Option<u16> {
        if self.bytes <= self.connection_max {
            return None;
        }
        let (&largest, _) = self.routes.iter().max_by_key(|(_, q)| q.bytes)?;
        self.close(largest, goodbye(largest));
        Some(largest)
    }

    fn close(&mut self, channel: u16, goodbye: Vec<u8>) {
        let q = self.routes.entry(channel).or_default();
        self.bytes -= q.bytes;
        q.frames.clear();
        q.bytes = 0;
        self.turns.retain(|c| *c != channel);
        self.closed.insert(channel);
        self.closes += 1;
        // The GOODBYE goes with channel 0's frames: it must not wait behind the routes.
        self.control.push_back(goodbye);
        self.check();
    }

    /// The daemon bound `channel` (again): its frames are taken from now on.
    pub fn bound(&mut self, channel: u16) {
        self.closed.remove(&channel);
    }

    /// The next frame to write: channel 0's first, then the routes in turn.
    pub fn pop(&mut self) -> Option<Vec<u8>> {
        if let Some(f) = self.control.pop_front() {
            return Some(f);
        }
        let channel = self.turns.pop_front()?;
        let q = self.routes.get_mut(&channel)?;
        let (frame, _) = q.frames.pop_front()?;
        q.bytes -= frame.len();
        self.bytes -= frame.len();
        if q.frames.is_empty() {
            self.routes.remove(&channel);
        } else {
            self.turns.push_back(channel);
        }
        self.check();
        Some(frame)
    }

    pub fn is_empty(&self) -> bool {
        self.control.is_empty() && self.turns.is_empty()
    }

    /// Bytes queued for routes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes queued for `channel`.
    pub fn route_bytes(&self, channel: u16) -> usize {
        self.routes.get(&channel).map_or(0, |q| q.bytes)
    }

    /// Whether a display delta for `channel` would be shed now (its route holds more than
    /// half its bound): the subscription counts it into a gap instead of encoding it.
    pub fn would_shed(&self, channel: u16) -> bool {
        self.route_bytes(channel) > self.route_max / 2
    }
}

fn route_bytes() -> usize {
    #[cfg(debug_assertions)]
    if let Some(n) = std::env::var("BROCA_TEST_ROUTE_EGRESS_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    ROUTE_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, len: usize) -> Vec<u8> {
        vec![tag; len]
    }

    #[test]
    fn channel_zero_goes_first_and_routes_take_turns() {
        let mut e = Egress::with_bounds(100, 1000);
        e.push(1, frame(1, 10), Kind::Frame, || frame(0xB1, 1));
        e.push(1, frame(2, 10), Kind::Frame, || frame(0xB1, 1));
        e.push(2, frame(3, 10), Kind::Frame, || frame(0xB2, 1));
        e.push_control(frame(9, 5));
        let order: Vec<u8> = std::iter::from_fn(|| e.pop()).map(|f| f[0]).collect();
        assert_eq!(
            order,
            [9, 1, 3, 2],
            "control, then one frame per route in turn"
        );
        assert!(e.is_empty());
        assert_eq!(e.bytes(), 0);
    }

    #[test]
    fn a_full_route_sheds_its_deltas_first_then_closes_and_the_others_go_on() {
        let mut e = Egress::with_bounds(100, 1000);
        for i in 0..4 {
            assert_eq!(
                e.push(1, frame(i, 20), Kind::Delta, || vec![0xB1]),
                Pushed::Queued
            );
        }
        e.push(2, frame(50, 30), Kind::Frame, || vec![0xB2]);
        // 80 queued on route 1: a 60-byte unit sheds the two oldest deltas.
        assert_eq!(
            e.push(1, frame(10, 60), Kind::Frame, || vec![0xB1]),
            Pushed::Queued
        );
        assert_eq!((e.shed, e.route_bytes(1)), (2, 100));
        // A delta that cannot fit even once the queued deltas are shed is shed itself.
        assert_eq!(
            e.push(1, frame(11, 50), Kind::Delta, || vec![0xB1]),
            Pushed::Shed
        );
        assert_eq!((e.shed, e.route_bytes(1)), (5, 60));
        // A unit that does not fit with no deltas left closes the route.
        assert_eq!(
            e.push(1, frame(12, 41), Kind::Frame, || vec![0xB1]),
            Pushed::Closed { now: true }
        );
        assert_eq!(e.closes, 1);
        assert_eq!(
            e.push(1, frame(13, 1), Kind::Frame, || vec![0xB1]),
            Pushed::Closed { now: false }
        );
        // Its GOODBYE goes first; route 2's frame is still there; route 1 holds nothing.
        let order: Vec<u8> = std::iter::from_fn(|| e.pop()).map(|f| f[0]).collect();
        assert_eq!(order, [0xB1, 50]);
        assert_eq!(e.bytes(), 0);
        // Bound again, it takes frames again.
        e.bound(1);
        assert_eq!(
            e.push(1, frame(14, 10), Kind::Frame, || vec![0xB1]),
            Pushed::Queued
        );
    }

    #[test]
    fn past_the_connection_bound_the_largest_route_is_closed() {
        let mut e = Egress::with_bounds(100, 150);
        e.push(1, frame(1, 90), Kind::Frame, || vec![0xB1]);
        e.push(2, frame(2, 40), Kind::Frame, || vec![0xB2]);
        assert_eq!(e.enforce_connection_bound(|c| vec![0xB0 + c as u8]), None);
        e.push(3, frame(3, 30), Kind::Frame, || vec![0xB3]);
        assert_eq!(
            e.enforce_connection_bound(|c| vec![0xB0 + c as u8]),
            Some(1)
        );
        assert_eq!(e.bytes(), 70);
        let order: Vec<u8> = std::iter::from_fn(|| e.pop()).map(|f| f[0]).collect();
        assert_eq!(order, [0xB1, 2, 3]);
        assert!(!e.would_shed(9));
    }
}
