//! One shard's actors of a kind: one per key, started on the first command routed to it,
//! handed its commands in order through its inbox, closed when it has been idle a while or
//! to make room, so an idle key costs no memory (its next command starts it again). Every
//! queue and count has a named limit ([`Limits`]); a command past one is handed back with
//! the reason ([`Refused`]) for the caller to answer.
//!
//! When every live actor is busy at `open_max` (or the caller said descriptors ran short,
//! [`Registry::short_of_room`]), a new key's command waits in the registry instead of being
//! refused: the next actor to finish its work is told to close, and as actors end the waiting
//! keys start in the order they came. Only past `waiting_max` is a command refused.
//!
//! The registry knows nothing of what an actor does: the caller's `start` spawns the actor's
//! task with its [`Inbox`], the actor reads [`Msg`]s from it and, when it ends, gives the
//! inbox back with [`Registry::ended`], which answers the commands that came meanwhile (the
//! caller routes them again: to a new actor, or refused).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

/// The limits of one registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Actors live at once; past it the least recently used idle ones are told to close, and
    /// when every live actor is busy a new key's commands wait for one to end.
    pub open_max: usize,
    /// Commands that may wait for room (a new key's, while every live actor is busy at
    /// `open_max`); past it a new key is refused ([`Refused::AtLimit`]).
    pub waiting_max: usize,
    /// Commands that may wait for one actor ([`Refused::InboxFull`] past it). The registry's
    /// own [`Msg::Close`] and [`Msg::Shutdown`] are sent past this bound.
    pub inbox_max: usize,
    /// An actor that has had no command this long closes ([`Inbox::next_or_idle`]).
    pub idle: Duration,
}

/// Idle actors told to close at once to make room, as a fraction of `open_max` (at least
/// one): closing a batch keeps every new key from paying for an eviction.
pub const EVICT_BATCH_DIVISOR: usize = 64;

/// What an actor's inbox delivers.
#[derive(Debug)]
pub enum Msg<C> {
    /// A command routed to this actor's key.
    Command(C),
    /// Close if idle (the registry makes room); an actor at work goes on.
    Close,
    /// The shard stops: end the work in hand and close.
    Shutdown,
}

/// Why a command was not handed to an actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No actor is live for the key, every live actor is busy at `open_max`, and
    /// `waiting_max` commands already wait for room.
    AtLimit,
    /// The key's actor has `inbox_max` commands waiting.
    InboxFull,
    /// The key's actor is gone and took its inbox with it.
    Closing,
}

/// A live actor's entry: its inbox's sender and what eviction looks at.
struct Slot<C> {
    tx: LocalSender<Msg<C>>,
    last_used: Cell<Instant>,
    /// At work (never told to close to make room).
    busy: Cell<bool>,
    /// Waiting for its next command (in [`Inbox::recv`] or [`Inbox::next_or_idle`]).
    idle: Cell<bool>,
    /// Told to close (still counted against `open_max` until it ends).
    evicting: Cell<bool>,
    /// Could not open for want of a descriptor ([`Registry::short_of_room`]): its end
    /// frees none.
    short: Cell<bool>,
    /// Commands waiting for room in the registry (shared by every slot): an actor that
    /// finishes its work while any wait closes to make room.
    waiting: Rc<Cell<usize>>,
}

impl<C> Slot<C> {
    /// Waiting for its next command with none queued and no work in hand: closing it now
    /// loses nothing.
    fn is_idle(&self) -> bool {
        self.idle.get() && !self.busy.get() && self.tx.len() == 0 && !self.evicting.get()
    }

    /// Tells the actor to close (once) to make room; `true` when this call told it.
    fn tell_close(&self) -> bool {
        if self.evicting.replace(true) {
            return false;
        }
        let _ = self.tx.try_send(Msg::Close);
        true
    }
}

/// Marks a slot idle while its actor waits for a command.
struct Idle<'a>(&'a Cell<bool>);

impl<'a> Idle<'a> {
    fn mark<C>(slot: &'a Slot<C>) -> Idle<'a> {
        slot.idle.set(true);
        Idle(&slot.idle)
    }
}

impl Drop for Idle<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// A command waiting for room, with what starts its key's actor.
struct Waiting<K, C> {
    key: K,
    cmd: C,
    start: Box<dyn FnOnce(Inbox<C>)>,
    since: Instant,
}

/// A live actor's inbox.
pub struct Inbox<C> {
    rx: LocalReceiver<Msg<C>>,
    slot: Rc<Slot<C>>,
}

impl<C> Inbox<C> {
    /// The next message; `None` once every sender is gone.
    pub async fn recv(&self) -> Option<Msg<C>> {
        let _idle = Idle::mark(&self.slot);
        self.rx.recv().await
    }

    /// The next message, or `None` once no message came for `idle` (or every sender is gone).
    pub async fn next_or_idle(&self, idle: Duration) -> Option<Msg<C>> {
        let _idle = Idle::mark(&self.slot);
        futures_lite::future::or(self.rx.recv(), async {
            glommio::timer::sleep(idle).await;
            None
        })
        .await
    }

    /// A message already queued, without waiting.
    pub async fn queued(&self) -> Option<Msg<C>> {
        futures_lite::future::poll_once(self.rx.recv())
            .await
            .flatten()
    }

    /// Runs `work` with the actor marked busy: it is not told to close to make room meanwhile.
    pub async fn busy<T>(&self, work: impl std::future::Future<Output = T>) -> T {
        assert!(!self.slot.busy.get(), "an actor's work does not nest");
        self.slot.busy.set(true);
        let done = work.await;
        self.slot.busy.set(false);
        // Keys wait for room: this actor closes once the commands it has are answered.
        if self.slot.waiting.get() > 0 {
            self.slot.tell_close();
        }
        done
    }
}

/// A registry's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegistryStats {
    /// Actors live now.
    pub live: usize,
    /// Idle actors told to close to stay within `open_max`.
    pub evicted: u64,
    /// Commands refused [`Refused::AtLimit`].
    pub refused_at_limit: u64,
    /// Commands that waited for room (every live actor busy at `open_max`, or descriptors
    /// short) before their key's actor started.
    pub waited_for_room: u64,
    /// Commands waiting for room now.
    pub waiting_for_room: usize,
    /// Commands that waited for room longer than they may and were handed back
    /// ([`Registry::expire_waiting`]).
    pub waited_too_long: u64,
    /// Commands refused [`Refused::InboxFull`].
    pub inbox_full: u64,
    /// Commands waiting in the live actors' inboxes now.
    pub waiting: usize,
}

/// One shard's actors of one kind, by key.
pub struct Registry<K, C> {
    limits: Limits,
    slots: RefCell<HashMap<K, Rc<Slot<C>>>>,
    /// The shard stops: actors end after their work and take no new commands.
    closing: Cell<bool>,
    evicted: Cell<u64>,
    refused_at_limit: Cell<u64>,
    inbox_full: Cell<u64>,
    /// Commands waiting for room, in the order they came; `waiting_keys` counts them by key
    /// (a key that has commands waiting takes its next one behind them, in order).
    waiting: RefCell<VecDeque<Waiting<K, C>>>,
    waiting_keys: RefCell<HashMap<K, usize>>,
    /// `waiting`'s length, shared with every slot.
    waiting_len: Rc<Cell<usize>>,
    waited: Cell<u64>,
    waited_too_long: Cell<u64>,
    /// Descriptors ran short (an actor could not open): no new actor starts until one ends.
    short: Cell<bool>,
}

impl<K: Eq + Hash + Clone, C> Registry<K, C> {
    /// An empty registry with `limits`.
    pub fn new(limits: Limits) -> Registry<K, C> {
        assert!(limits.open_max > 0, "a registry keeps at least one actor");
        assert!(limits.inbox_max > 0, "an inbox holds at least one command");
        Registry {
            limits,
            slots: RefCell::new(HashMap::new()),
            closing: Cell::new(false),
            evicted: Cell::new(0),
            refused_at_limit: Cell::new(0),
            inbox_full: Cell::new(0),
            waiting: RefCell::new(VecDeque::new()),
            waiting_keys: RefCell::new(HashMap::new()),
            waiting_len: Rc::new(Cell::new(0)),
            waited: Cell::new(0),
            waited_too_long: Cell::new(0),
            short: Cell::new(false),
        }
    }

    /// The registry's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether `key` has a live actor.
    pub fn is_live(&self, key: &K) -> bool {
        self.slots.borrow().contains_key(key)
    }

    /// Whether the registry is closing (see [`Registry::shutdown_all`]).
    pub fn is_closing(&self) -> bool {
        self.closing.get()
    }

    /// The counters.
    pub fn stats(&self) -> RegistryStats {
        RegistryStats {
            live: self.slots.borrow().len(),
            evicted: self.evicted.get(),
            refused_at_limit: self.refused_at_limit.get(),
            inbox_full: self.inbox_full.get(),
            waiting: self.slots.borrow().values().map(|slot| slot.tx.len()).sum(),
            waited_for_room: self.waited.get(),
            waiting_for_room: self.waiting_len.get(),
            waited_too_long: self.waited_too_long.get(),
        }
    }

    /// Commands waiting for room now.
    pub fn waiting_for_room(&self) -> usize {
        self.waiting_len.get()
    }

    /// Hands back the commands that have waited for room `longer_than` or more, oldest first,
    /// for the caller to refuse: a wait has a bound, so that a caller is told instead of
    /// waiting on every open actor's work however long it takes.
    pub fn expire_waiting(&self, longer_than: std::time::Duration) -> Vec<C> {
        let mut out = Vec::new();
        loop {
            let w = {
                let mut waiting = self.waiting.borrow_mut();
                match waiting.front() {
                    Some(front) if front.since.elapsed() >= longer_than => waiting.pop_front(),
                    _ => None,
                }
            };
            let Some(w) = w else { break };
            self.waiting_len.set(self.waiting_len.get() - 1);
            self.uncount_waiting(&w.key);
            out.push(w.cmd);
        }
        self.waited_too_long
            .set(self.waited_too_long.get() + out.len() as u64);
        debug_assert_eq!(
            self.waiting_len.get(),
            self.waiting.borrow().len(),
            "the count follows the queue"
        );
        out
    }

    /// One command of `key` no longer waits.
    fn uncount_waiting(&self, key: &K) {
        let mut keys = self.waiting_keys.borrow_mut();
        let n = keys.get_mut(key).expect("a waiting key is counted");
        *n -= 1;
        if *n == 0 {
            keys.remove(key);
        }
    }

    /// Hands `cmd` to the actor of `key`, first starting one when none is live: `start` is
    /// given the new actor's inbox and spawns its task. With no room for a new actor the
    /// command waits for one (see the module's notes); a refused command comes back with the
    /// reason.
    pub fn route(
        &self,
        key: &K,
        cmd: C,
        start: impl FnOnce(Inbox<C>) + 'static,
    ) -> Result<(), (C, Refused)>
    where
        C: 'static,
    {
        let live = self.slots.borrow().get(key).cloned();
        if let Some(slot) = live {
            return self.hand(&slot, cmd);
        }
        // Behind the commands of this key already waiting, or with no room: wait.
        if self.waiting_keys.borrow().contains_key(key) || !self.make_room() {
            return self.wait(key, cmd, Box::new(start));
        }
        self.start(key, start, cmd);
        Ok(())
    }

    /// Puts `cmd` in `slot`'s inbox.
    fn hand(&self, slot: &Slot<C>, cmd: C) -> Result<(), (C, Refused)> {
        slot.last_used.set(Instant::now());
        // The inbox is an unbounded channel (a bounded one reserves its whole capacity up
        // front, per actor) bounded here by count.
        if slot.tx.len() >= self.limits.inbox_max {
            self.inbox_full.set(self.inbox_full.get() + 1);
            return Err((cmd, Refused::InboxFull));
        }
        match slot.tx.try_send(Msg::Command(cmd)) {
            Ok(()) => Ok(()),
            Err(glommio::GlommioError::Closed(glommio::ResourceType::Channel(Msg::Command(c)))) => {
                Err((c, Refused::Closing))
            }
            Err(e) => unreachable!("an unbounded channel refuses only when closed: {e:?}"),
        }
    }

    /// `cmd` waits for room for its key's actor, or is refused past `waiting_max`.
    fn wait(&self, key: &K, cmd: C, start: Box<dyn FnOnce(Inbox<C>)>) -> Result<(), (C, Refused)> {
        if self.waiting_len.get() >= self.limits.waiting_max {
            self.refused_at_limit.set(self.refused_at_limit.get() + 1);
            return Err((cmd, Refused::AtLimit));
        }
        *self
            .waiting_keys
            .borrow_mut()
            .entry(key.clone())
            .or_insert(0) += 1;
        self.waiting.borrow_mut().push_back(Waiting {
            key: key.clone(),
            cmd,
            start,
            since: Instant::now(),
        });
        self.waiting_len.set(self.waiting_len.get() + 1);
        debug_assert_eq!(
            self.waiting_len.get(),
            self.waiting.borrow().len(),
            "the count follows the queue"
        );
        debug_assert!(
            self.waiting_len.get() <= self.limits.waiting_max,
            "waits stay within their bound"
        );
        self.waited.set(self.waited.get() + 1);
        // Short of descriptors: idle actors close at once, each freeing its own.
        if self.short.get() {
            for slot in self.slots.borrow().values() {
                if slot.is_idle() && slot.tell_close() {
                    self.evicted.set(self.evicted.get() + 1);
                }
            }
        }
        Ok(())
    }

    /// Starts the waiting keys' actors in the order they came, while there is room; the
    /// commands that could not be handed (their actor gone meanwhile) come back.
    fn start_waiting(&self, back: &mut Vec<C>) {
        loop {
            let front_live = {
                let waiting = self.waiting.borrow();
                let Some(front) = waiting.front() else { return };
                self.slots.borrow().get(&front.key).cloned()
            };
            if front_live.is_none() && !self.make_room() {
                return;
            }
            let w = self
                .waiting
                .borrow_mut()
                .pop_front()
                .expect("a front was seen");
            self.waiting_len.set(self.waiting_len.get() - 1);
            self.uncount_waiting(&w.key);
            match front_live {
                Some(slot) => {
                    if let Err((cmd, _)) = self.hand(&slot, w.cmd) {
                        back.push(cmd);
                    }
                }
                None => self.start(&w.key, w.start, w.cmd),
            }
        }
    }

    /// A new actor for `key` with `cmd` in its inbox, its task started (room was made
    /// first). The command is queued before the task starts: a task may run at once, as far
    /// as its first wait, and may end there.
    fn start(&self, key: &K, start: impl FnOnce(Inbox<C>), cmd: C) {
        let (tx, rx) = local_channel::new_unbounded();
        let slot = Rc::new(Slot {
            tx,
            last_used: Cell::new(Instant::now()),
            busy: Cell::new(false),
            idle: Cell::new(false),
            evicting: Cell::new(false),
            short: Cell::new(false),
            waiting: self.waiting_len.clone(),
        });
        slot.tx
            .try_send(Msg::Command(cmd))
            .unwrap_or_else(|_| unreachable!("a new unbounded channel takes a command"));
        let replaced = self.slots.borrow_mut().insert(key.clone(), slot.clone());
        assert!(replaced.is_none(), "a key has one live actor");
        start(Inbox { rx, slot });
    }

    /// Descriptors ran short: the actor of `inbox` could not open. Until another actor
    /// ends, new keys wait instead of starting (when none is live they start, and fail);
    /// the commands this one leaves when it ends wait too.
    pub fn short_of_room(&self, inbox: &Inbox<C>) {
        inbox.slot.short.set(true);
        self.short.set(true);
    }

    /// Whether one more actor may start: the live ones (closing ones too: they hold what an
    /// actor holds until they end) are fewer than `open_max`. At the limit, the least recently
    /// used idle ones (a [`EVICT_BATCH_DIVISOR`]th of the limit at a time) are told to close,
    /// and the new key waits for them to end.
    fn make_room(&self) -> bool {
        let slots = self.slots.borrow();
        if self.short.get() {
            return slots.is_empty();
        }
        if slots.len() < self.limits.open_max {
            return true;
        }
        let closing = slots.values().filter(|s| s.evicting.get()).count();
        let batch = (self.limits.open_max / EVICT_BATCH_DIVISOR).max(1);
        if closing >= batch {
            return false; // room is on its way
        }
        let mut idle: Vec<(Instant, &Rc<Slot<C>>)> = slots
            .values()
            .filter(|s| s.is_idle())
            .map(|s| (s.last_used.get(), s))
            .collect();
        if idle.is_empty() {
            return false;
        }
        let batch = (self.limits.open_max / EVICT_BATCH_DIVISOR).max(1);
        if idle.len() > batch {
            idle.select_nth_unstable_by_key(batch - 1, |(t, _)| *t);
            idle.truncate(batch);
        }
        assert!(!idle.is_empty() && idle.len() <= batch);
        for (_, slot) in idle {
            slot.tell_close();
            self.evicted.set(self.evicted.get() + 1);
        }
        false
    }

    /// The actor of `key` has ended: its slot goes, the keys waiting for room start while
    /// there is room, and the commands that came in meanwhile come back (in order) for the
    /// caller to route again.
    pub async fn ended(&self, key: &K, inbox: &Inbox<C>) -> Vec<C> {
        let removed = self.slots.borrow_mut().remove(key);
        assert!(
            removed.is_some_and(|s| Rc::ptr_eq(&s, &inbox.slot)),
            "the actor that ends is the key's live one"
        );
        if !inbox.slot.short.get() {
            self.short.set(false); // its descriptors are free
        }
        let mut left = Vec::new();
        while let Some(msg) = inbox.queued().await {
            if let Msg::Command(c) = msg {
                left.push(c);
            }
        }
        if !self.closing.get() {
            self.start_waiting(&mut left);
        }
        left
    }

    /// The shard stops: no actor takes new work after what it has in hand; every live actor
    /// is told [`Msg::Shutdown`]. The commands waiting for room come back, for the caller to
    /// refuse.
    pub fn shutdown_all(&self) -> Vec<C> {
        self.closing.set(true);
        let slots: Vec<_> = self.slots.borrow().values().cloned().collect();
        for slot in slots {
            let _ = slot.tx.try_send(Msg::Shutdown);
        }
        self.waiting_keys.borrow_mut().clear();
        self.waiting_len.set(0);
        let waiting = std::mem::take(&mut *self.waiting.borrow_mut());
        waiting.into_iter().map(|w| w.cmd).collect()
    }

    /// Waits until no actor is live, at most `bound`.
    pub async fn wait_empty(&self, bound: Duration) {
        const POLL: Duration = Duration::from_millis(10);
        let until = Instant::now() + bound;
        while !self.slots.borrow().is_empty() && Instant::now() < until {
            glommio::timer::sleep(POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An actor that records what it hears and ends on Close or Shutdown.
    fn spawn_recorder(
        reg: &Rc<Registry<u32, &'static str>>,
        key: u32,
        heard: &Rc<RefCell<Vec<(u32, &'static str)>>>,
    ) -> impl FnOnce(Inbox<&'static str>) + 'static {
        let (reg, heard) = (reg.clone(), heard.clone());
        move |inbox| {
            glommio::spawn_local(async move {
                while let Some(Msg::Command(c)) = inbox.recv().await {
                    heard.borrow_mut().push((key, c));
                }
                assert!(reg.ended(&key, &inbox).await.is_empty());
            })
            .detach();
        }
    }

    fn limits(open_max: usize, inbox_max: usize) -> Limits {
        Limits {
            open_max,
            waiting_max: 64,
            inbox_max,
            idle: Duration::from_secs(60),
        }
    }

    #[test]
    fn commands_reach_their_key_in_order_and_an_inbox_past_its_bound_refuses() {
        crate::run_local(async {
            let reg = Rc::new(Registry::new(limits(8, 2)));
            let heard = Rc::new(RefCell::new(Vec::new()));
            reg.route(&1, "a", spawn_recorder(&reg, 1, &heard)).unwrap();
            // The new actor ran at once as far as its first wait (glommio runs a spawned
            // task right away), taking "a". Two more wait: the third is refused.
            for cmd in ["b", "c"] {
                reg.route(&1, cmd, |_| unreachable!("key 1 is live"))
                    .unwrap();
            }
            assert_eq!(
                reg.route(&1, "d", |_| unreachable!()),
                Err(("d", Refused::InboxFull))
            );
            reg.route(&2, "x", spawn_recorder(&reg, 2, &heard)).unwrap();
            futures_lite::future::yield_now().await;
            glommio::yield_if_needed().await;
            glommio::timer::sleep(Duration::from_millis(5)).await;
            let of = |key| -> Vec<_> {
                heard
                    .borrow()
                    .iter()
                    .filter(|(k, _)| *k == key)
                    .map(|(_, c)| *c)
                    .collect()
            };
            assert_eq!((of(1), of(2)), (vec!["a", "b", "c"], vec!["x"]));
            assert_eq!(reg.stats().inbox_full, 1);
            assert_eq!(reg.stats().live, 2);
            reg.shutdown_all();
            reg.wait_empty(Duration::from_secs(5)).await;
            assert_eq!(reg.stats().live, 0);
        })
        .unwrap();
    }

    #[test]
    fn past_open_max_the_least_recently_used_idle_actor_makes_room() {
        crate::run_local(async {
            let reg = Rc::new(Registry::new(limits(2, 4)));
            let heard = Rc::new(RefCell::new(Vec::new()));
            reg.route(&1, "a", spawn_recorder(&reg, 1, &heard)).unwrap();
            glommio::timer::sleep(Duration::from_millis(2)).await;
            reg.route(&2, "b", spawn_recorder(&reg, 2, &heard)).unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            // A third key: key 1, used least lately, is told to close, and key 3 waits for it
            // to end. A fourth waits too: key 1 holds its place until it has closed (the live
            // actors, closing ones too, never pass open_max).
            reg.route(&3, "c", spawn_recorder(&reg, 3, &heard)).unwrap();
            reg.route(&4, "d", spawn_recorder(&reg, 4, &heard)).unwrap();
            assert!(
                reg.is_live(&1) && !reg.is_live(&3) && !reg.is_live(&4),
                "the live actors never pass open_max"
            );
            assert_eq!(reg.stats().waiting_for_room, 2);
            // Key 1 closes and key 3 starts; key 2 is then the least lately used idle one,
            // and makes room for key 4.
            glommio::timer::sleep(Duration::from_millis(10)).await;
            assert!(!reg.is_live(&1) && !reg.is_live(&2));
            assert!(reg.is_live(&3) && reg.is_live(&4));
            assert_eq!(reg.stats().evicted, 2);
            assert_eq!(reg.stats().waiting_for_room, 0);
            assert_eq!(heard.borrow().len(), 4);
            reg.shutdown_all();
            reg.wait_empty(Duration::from_secs(5)).await;
        })
        .unwrap();
    }

    /// Starts an actor for `key` that records what it hears and is busy with its first
    /// command until `gate` is signalled; it then closes when told (or at shutdown).
    fn spawn_gated(
        reg: &Rc<Registry<u32, &'static str>>,
        key: u32,
        gate: &Rc<glommio::sync::Semaphore>,
        heard: &Rc<RefCell<Vec<(u32, &'static str)>>>,
    ) -> impl FnOnce(Inbox<&'static str>) + 'static {
        let (reg, gate, heard) = (reg.clone(), gate.clone(), heard.clone());
        move |inbox| {
            glommio::spawn_local(async move {
                while let Some(Msg::Command(c)) = inbox.recv().await {
                    heard.borrow_mut().push((key, c));
                    let work = async {
                        let _ = gate.acquire(1).await;
                    };
                    inbox.busy(work).await;
                }
                assert!(reg.ended(&key, &inbox).await.is_empty());
            })
            .detach();
        }
    }

    #[test]
    fn when_every_live_actor_is_busy_a_new_key_waits_and_starts_once_one_finishes() {
        crate::run_local(async {
            let reg = Rc::new(Registry::<u32, &'static str>::new(limits(1, 4)));
            let gate = Rc::new(glommio::sync::Semaphore::new(0));
            let heard = Rc::new(RefCell::new(Vec::new()));
            reg.route(&1, "work", spawn_gated(&reg, 1, &gate, &heard))
                .unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            // No room: key 2's commands wait, in order, and nothing is refused or evicted.
            reg.route(&2, "first", spawn_gated(&reg, 2, &gate, &heard))
                .unwrap();
            reg.route(&2, "second", spawn_gated(&reg, 2, &gate, &heard))
                .unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            assert!(!reg.is_live(&2));
            let stats = reg.stats();
            assert_eq!((stats.waiting_for_room, stats.waited_for_room), (2, 2));
            assert_eq!((stats.refused_at_limit, stats.evicted), (0, 0));
            assert_eq!(*heard.borrow(), vec![(1, "work")]);
            // Key 1's work ends: it closes to make room, and key 2 starts with both commands.
            gate.signal(1);
            glommio::timer::sleep(Duration::from_millis(10)).await;
            assert!(!reg.is_live(&1) && reg.is_live(&2));
            assert_eq!(reg.stats().waiting_for_room, 0);
            gate.signal(2);
            glommio::timer::sleep(Duration::from_millis(10)).await;
            assert_eq!(
                *heard.borrow(),
                vec![(1, "work"), (2, "first"), (2, "second")]
            );
            assert!(reg.shutdown_all().is_empty());
            reg.wait_empty(Duration::from_secs(5)).await;
        })
        .unwrap();
    }

    #[test]
    fn a_command_that_waited_too_long_is_handed_back_and_the_others_go_on_waiting() {
        crate::run_local(async {
            let reg = Rc::new(Registry::<u32, &'static str>::new(limits(1, 4)));
            let gate = Rc::new(glommio::sync::Semaphore::new(0));
            let heard = Rc::new(RefCell::new(Vec::new()));
            reg.route(&1, "work", spawn_gated(&reg, 1, &gate, &heard))
                .unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            reg.route(&2, "old", spawn_gated(&reg, 2, &gate, &heard))
                .unwrap();
            glommio::timer::sleep(Duration::from_millis(30)).await;
            reg.route(&3, "young", spawn_gated(&reg, 3, &gate, &heard))
                .unwrap();
            assert!(reg.expire_waiting(Duration::from_secs(60)).is_empty());
            assert_eq!(reg.expire_waiting(Duration::from_millis(20)), vec!["old"]);
            let stats = reg.stats();
            assert_eq!((stats.waiting_for_room, stats.waited_too_long), (1, 1));
            // Room comes: the one still waiting starts; the one handed back never does.
            gate.signal(1);
            glommio::timer::sleep(Duration::from_millis(10)).await;
            assert!(reg.is_live(&3) && !reg.is_live(&2));
            gate.signal(1);
            glommio::timer::sleep(Duration::from_millis(10)).await;
            assert_eq!(*heard.borrow(), vec![(1, "work"), (3, "young")]);
            assert!(reg.shutdown_all().is_empty());
            reg.wait_empty(Duration::from_secs(5)).await;
        })
        .unwrap();
    }

    #[test]
    fn past_waiting_max_a_new_key_is_refused_and_shutdown_hands_back_the_waiting() {
        crate::run_local(async {
            let reg = Rc::new(Registry::<u32, &'static str>::new(Limits {
                waiting_max: 1,
                ..limits(1, 4)
            }));
            let gate = Rc::new(glommio::sync::Semaphore::new(0));
            let heard = Rc::new(RefCell::new(Vec::new()));
            reg.route(&1, "work", spawn_gated(&reg, 1, &gate, &heard))
                .unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            reg.route(&2, "waits", |_| unreachable!("no room yet"))
                .unwrap();
            let refused = reg.route(&3, "new", |_| unreachable!("no room"));
            assert_eq!(refused, Err(("new", Refused::AtLimit)));
            assert_eq!(reg.stats().refused_at_limit, 1);
            assert_eq!(reg.stats().evicted, 0, "a busy actor is never evicted");
            assert_eq!(reg.shutdown_all(), vec!["waits"]);
            assert_eq!(reg.stats().waiting_for_room, 0);
            gate.signal(1);
            reg.wait_empty(Duration::from_secs(5)).await;
            assert!(!reg.is_live(&1) && !reg.is_live(&2));
        })
        .unwrap();
    }

    #[test]
    fn short_of_descriptors_new_keys_wait_until_an_actor_ends() {
        crate::run_local(async {
            let reg = Rc::new(Registry::<u32, &'static str>::new(limits(8, 4)));
            let gate = Rc::new(glommio::sync::Semaphore::new(0));
            let heard = Rc::new(RefCell::new(Vec::new()));
            reg.route(&1, "work", spawn_gated(&reg, 1, &gate, &heard))
                .unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            // Key 9's actor could not open: it ends (freeing nothing), and key 2 waits.
            reg.route(&9, "fails", {
                let reg = reg.clone();
                move |inbox| {
                    glommio::spawn_local(async move {
                        reg.short_of_room(&inbox);
                        let left = reg.ended(&9, &inbox).await;
                        assert_eq!(left, vec!["fails"], "its commands come back");
                    })
                    .detach();
                }
            })
            .unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            reg.route(&2, "waits", spawn_gated(&reg, 2, &gate, &heard))
                .unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            assert!(!reg.is_live(&2), "room is short although under open_max");
            gate.signal(1);
            glommio::timer::sleep(Duration::from_millis(10)).await;
            assert!(!reg.is_live(&1) && reg.is_live(&2));
            assert_eq!(*heard.borrow(), vec![(1, "work"), (2, "waits")]);
            gate.signal(1);
            reg.shutdown_all();
            reg.wait_empty(Duration::from_secs(5)).await;
        })
        .unwrap();
    }
}
