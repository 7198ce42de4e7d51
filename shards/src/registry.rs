//! One shard's actors of a kind: one per key, started on the first command routed to it,
//! handed its commands in order through its inbox, closed when it has been idle a while or
//! to make room, so an idle key costs no memory (its next command starts it again). Every
//! queue and count has a named limit ([`Limits`]); a command past one is handed back with
//! the reason ([`Refused`]) for the caller to answer.
//!
//! The registry knows nothing of what an actor does: the caller's `start` spawns the actor's
//! task with its [`Inbox`], the actor reads [`Msg`]s from it and, when it ends, gives the
//! inbox back with [`Registry::ended`], which answers the commands that came meanwhile (the
//! caller routes them again: to a new actor, or refused).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::Hash;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

/// The limits of one registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Actors live at once; past it the least recently used idle ones are told to close, and
    /// when every live actor is busy a new key is refused ([`Refused::AtLimit`]).
    pub open_max: usize,
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
    /// No actor is live for the key, and every live actor is busy at `open_max`.
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
    /// Told to close; not counted against `open_max` any more.
    evicting: Cell<bool>,
}

/// A live actor's inbox.
pub struct Inbox<C> {
    rx: LocalReceiver<Msg<C>>,
    slot: Rc<Slot<C>>,
}

impl<C> Inbox<C> {
    /// The next message; `None` once every sender is gone.
    pub async fn recv(&self) -> Option<Msg<C>> {
        self.rx.recv().await
    }

    /// The next message, or `None` once no message came for `idle` (or every sender is gone).
    pub async fn next_or_idle(&self, idle: Duration) -> Option<Msg<C>> {
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
        }
    }

    /// Hands `cmd` to the actor of `key`, first starting one when none is live: `start` is
    /// given the new actor's inbox and spawns its task. A refused command comes back with
    /// the reason.
    pub fn route(&self, key: &K, cmd: C, start: impl FnOnce(Inbox<C>)) -> Result<(), (C, Refused)> {
        let live = self.slots.borrow().get(key).cloned();
        let slot = match live {
            Some(slot) => slot,
            None => match self.start(key, start) {
                Some(slot) => slot,
                None => {
                    self.refused_at_limit.set(self.refused_at_limit.get() + 1);
                    return Err((cmd, Refused::AtLimit));
                }
            },
        };
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

    /// A new actor's slot for `key`, its task started; `None` when `open_max` leaves no room.
    fn start(&self, key: &K, start: impl FnOnce(Inbox<C>)) -> Option<Rc<Slot<C>>> {
        if !self.make_room() {
            return None;
        }
        let (tx, rx) = local_channel::new_unbounded();
        let slot = Rc::new(Slot {
            tx,
            last_used: Cell::new(Instant::now()),
            busy: Cell::new(false),
            evicting: Cell::new(false),
        });
        let replaced = self.slots.borrow_mut().insert(key.clone(), slot.clone());
        assert!(replaced.is_none(), "a key has one live actor");
        start(Inbox {
            rx,
            slot: slot.clone(),
        });
        Some(slot)
    }

    /// Keeps the live actors within `open_max` before one more starts: past it, the least
    /// recently used idle ones (a [`EVICT_BATCH_DIVISOR`]th of the limit at a time) are told
    /// to close. `false` when every live actor is busy, so nothing can make room.
    fn make_room(&self) -> bool {
        let slots = self.slots.borrow();
        let closing = slots.values().filter(|s| s.evicting.get()).count();
        assert!(closing <= slots.len());
        if slots.len() - closing < self.limits.open_max {
            return true;
        }
        let mut idle: Vec<(Instant, &Rc<Slot<C>>)> = slots
            .values()
            .filter(|s| !s.busy.get() && !s.evicting.get())
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
            slot.evicting.set(true);
            let _ = slot.tx.try_send(Msg::Close);
            self.evicted.set(self.evicted.get() + 1);
        }
        true
    }

    /// The actor of `key` has ended: its slot goes, and the commands that came in meanwhile
    /// come back (in order) for the caller to route again.
    pub async fn ended(&self, key: &K, inbox: &Inbox<C>) -> Vec<C> {
        let removed = self.slots.borrow_mut().remove(key);
        assert!(
            removed.is_some_and(|s| Rc::ptr_eq(&s, &inbox.slot)),
            "the actor that ends is the key's live one"
        );
        let mut left = Vec::new();
        while let Some(msg) = inbox.queued().await {
            if let Msg::Command(c) = msg {
                left.push(c);
            }
        }
        left
    }

    /// The shard stops: no actor takes new work after what it has in hand; every live actor
    /// is told [`Msg::Shutdown`].
    pub fn shutdown_all(&self) {
        self.closing.set(true);
        let slots: Vec<_> = self.slots.borrow().values().cloned().collect();
        for slot in slots {
            let _ = slot.tx.try_send(Msg::Shutdown);
        }
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
    ) -> impl FnOnce(Inbox<&'static str>) {
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
            reg.route(&1, "b", |_| unreachable!("key 1 is live"))
                .unwrap();
            // Two wait (the actor has not run yet): the third is refused and handed back.
            assert_eq!(
                reg.route(&1, "c", |_| unreachable!()),
                Err(("c", Refused::InboxFull))
            );
            reg.route(&2, "x", spawn_recorder(&reg, 2, &heard)).unwrap();
            futures_lite::future::yield_now().await;
            glommio::yield_if_needed().await;
            glommio::timer::sleep(Duration::from_millis(5)).await;
            assert_eq!(*heard.borrow(), vec![(1, "a"), (1, "b"), (2, "x")]);
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
            // A third key: key 1, used least lately, is told to close.
            reg.route(&3, "c", spawn_recorder(&reg, 3, &heard)).unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            assert!(!reg.is_live(&1) && reg.is_live(&2) && reg.is_live(&3));
            assert_eq!(reg.stats().evicted, 1);
            assert_eq!(heard.borrow().len(), 3);
            reg.shutdown_all();
            reg.wait_empty(Duration::from_secs(5)).await;
        })
        .unwrap();
    }

    #[test]
    fn when_every_live_actor_is_busy_a_new_key_is_refused_and_none_is_evicted() {
        crate::run_local(async {
            let reg = Rc::new(Registry::<u32, &'static str>::new(limits(1, 4)));
            let gate = Rc::new(glommio::sync::Semaphore::new(0));
            let (r, g) = (reg.clone(), gate.clone());
            reg.route(&1, "work", move |inbox| {
                glommio::spawn_local(async move {
                    let work = async {
                        let _ = g.acquire(1).await;
                    };
                    inbox.busy(work).await;
                    let _ = r.ended(&1, &inbox).await;
                })
                .detach();
            })
            .unwrap();
            glommio::timer::sleep(Duration::from_millis(5)).await;
            let refused = reg.route(&2, "new", |_| unreachable!("no room"));
            assert_eq!(refused, Err(("new", Refused::AtLimit)));
            assert_eq!(reg.stats().refused_at_limit, 1);
            assert_eq!(reg.stats().evicted, 0, "a busy actor is never evicted");
            gate.signal(1);
            reg.wait_empty(Duration::from_secs(5)).await;
            assert!(!reg.is_live(&1));
        })
        .unwrap();
    }
}
