//! Subscribers of one shard's sessions. The reliable control lane is projected from the WAL:
//! a subscriber first reads the log from its cursor, then receives each record as it becomes
//! durable; every unit carries its cursor, so a reconnect resumes with no gap and no
//! duplicate, across restarts too. The display lane carries token deltas: lossy, bounded per
//! subscriber, never replayed, a gap reported in-band. A slow subscriber never slows a run:
//! its display deltas are dropped (and counted), and if its control queue overflows it is
//! told to reconnect, which it does from its cursor, reading the WAL.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use broca_io::log::DurableWatch;
use futures_channel::mpsc;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use crate::core::project::{units, Cursor};
use crate::wal::Record;

/// Control units a subscriber may have queued before it is told to reconnect.
const CONTROL_QUEUE_MAX: usize = 4096;
/// Display deltas a subscriber may have queued before new ones are dropped.
const DISPLAY_QUEUE_MAX: usize = 256;

/// What a subscription delivers to its connection.
pub(crate) enum SubItem {
    Control {
        cursor: Cursor,
        unit: String,
    },
    Display(String),
    /// Display deltas were dropped (this many since the last report).
    Gap(u64),
    /// The subscription ends (the reason says what the client should do).
    End(String),
}

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubFrom {
    Start,
    Live,
    After(Cursor),
}

pub(crate) struct Sub {
    control: RefCell<VecDeque<(Cursor, String)>>,
    display: RefCell<VecDeque<String>>,
    dropped: Cell<u64>,
    overflow: Cell<bool>,
    wake: LocalSender<()>,
}

impl Sub {
    fn poke(&self) {
        let _ = self.wake.try_send(());
    }
}

/// The subscribers of one session and the records waiting to become durable for them.
#[derive(Default)]
pub(crate) struct Hub {
    subs: RefCell<Vec<Rc<Sub>>>,
    pending: RefCell<VecDeque<(u64, u64, Record)>>,
    pumping: Cell<bool>,
    watch: RefCell<Option<DurableWatch>>,
}

impl Hub {
    pub fn is_idle(&self) -> bool {
        self.subs.borrow().is_empty() && self.pending.borrow().is_empty()
    }

    /// The log whose durability gates publishing (set when the session's actor opens it).
    pub fn set_watch(&self, watch: DurableWatch) {
        *self.watch.borrow_mut() = Some(watch);
    }

    /// A record was appended: publish it once durable, if anyone listens.
    pub fn on_append(self: &Rc<Self>, seq: u64, end: u64, record: &Record) {
        if self.subs.borrow().is_empty() {
            return; // a later subscriber reads it from the WAL
        }
        self.pending
            .borrow_mut()
            .push_back((seq, end, record.clone()));
        if !self.pumping.replace(true) {
            glommio::spawn_local(self.clone().pump()).detach();
        }
    }

    async fn pump(self: Rc<Self>) {
        loop {
            let Some(end) = self.pending.borrow().front().map(|p| p.1) else {
                self.pumping.set(false);
                return;
            };
            let watch = self.watch.borrow().clone();
            let durable = match watch {
                Some(w) => w.wait_durable(end).await.is_ok(),
                None => false,
            };
            if !durable {
                // The log failed: nothing more becomes durable; subscribers reconnect.
                self.pending.borrow_mut().clear();
                for s in self.subs.borrow().iter() {
                    s.overflow.set(true);
                    s.poke();
                }
                self.pumping.set(false);
                return;
            }
            loop {
                let next = {
                    let mut p = self.pending.borrow_mut();
                    match p.front() {
                        Some(&(_, e, _)) if e <= end => p.pop_front(),
                        _ => None,
                    }
                };
                let Some((seq, _, record)) = next else { break };
                self.publish(seq, &record);
            }
        }
    }

    fn publish(&self, seq: u64, record: &Record) {
        let units: Vec<String> = units(record).iter().map(|u| u.to_string()).collect();
        if units.is_empty() {
            return;
        }
        for s in self.subs.borrow().iter() {
            let mut q = s.control.borrow_mut();
            for (i, u) in units.iter().enumerate() {
                if q.len() >= CONTROL_QUEUE_MAX {
                    s.overflow.set(true);
                    break;
                }
                q.push_back((Cursor { seq, sub: i as u32 }, u.clone()));
            }
            drop(q);
            s.poke();
        }
    }

    /// A display delta (token text) for every subscriber.
    pub fn display(&self, text: &str) {
        for s in self.subs.borrow().iter() {
            let mut q = s.display.borrow_mut();
            if q.len() >= DISPLAY_QUEUE_MAX {
                s.dropped.set(s.dropped.get() + 1);
            } else {
                q.push_back(text.to_string());
            }
            drop(q);
            s.poke();
        }
    }

    fn add(&self) -> (Rc<Sub>, LocalReceiver<()>) {
        let (wake, woken) = local_channel::new_bounded(1);
        let sub = Rc::new(Sub {
            control: RefCell::new(VecDeque::new()),
            display: RefCell::new(VecDeque::new()),
            dropped: Cell::new(0),
            overflow: Cell::new(false),
            wake,
        });
        self.subs.borrow_mut().push(sub.clone());
        (sub, woken)
    }

    fn remove(&self, sub: &Rc<Sub>) {
        self.subs.borrow_mut().retain(|s| !Rc::ptr_eq(s, sub));
    }
}

/// Sends `item`, waiting for room; `false` when the connection is gone.
async fn send(tx: &mut mpsc::Sender<SubItem>, item: SubItem) -> bool {
    if futures_lite::future::poll_fn(|cx| tx.poll_ready(cx))
        .await
        .is_err()
    {
        return false;
    }
    tx.start_send(item).is_ok()
}

/// Runs one subscription on the session's shard. `barrier` makes everything the session's
/// live actor appended durable (and answers its last seq) before the WAL is read.
pub(crate) async fn run(
    hub: Rc<Hub>,
    wal: std::path::PathBuf,
    from: SubFrom,
    barrier: impl std::future::Future<Output = ()>,
    mut tx: mpsc::Sender<SubItem>,
) {
    // Register first: what becomes durable from now on is queued; what is durable before the
    // read below is in the WAL. The cursor drops what both deliver.
    let (sub, woken) = hub.add();
    barrier.await;
    let read = glommio::executor()
        .spawn_blocking(move || -> Result<Vec<(u64, Record)>, String> {
            let found =
                crate::wal::verify::read_and_scan_if_any(&wal).map_err(|e| e.to_string())?;
            let Some((bytes, scan)) = found else {
                return Ok(Vec::new()); // not created yet: everything comes live
            };
            let decoded = scan
                .decode(&bytes)
                .map_err(|(seq, why)| format!("record {seq}: {why}"))?;
            Ok(decoded.records)
        })
        .await;
    let records = match read {
        Ok(r) => r,
        Err(e) => {
            send(
                &mut tx,
                SubItem::End(format!("the session's WAL cannot be read: {e}")),
            )
            .await;
            hub.remove(&sub);
            return;
        }
    };
    let mut last = match from {
        SubFrom::Start => Cursor::START,
        SubFrom::After(c) => c,
        SubFrom::Live => Cursor::end_of(records.last().map_or(0, |r| r.0)),
    };
    for (seq, record) in &records {
        for (i, u) in units(record).iter().enumerate() {
            let cursor = Cursor {
                seq: *seq,
                sub: i as u32,
            };
            if cursor > last {
                if !send(
                    &mut tx,
                    SubItem::Control {
                        cursor,
                        unit: u.to_string(),
                    },
                )
                .await
                {
                    hub.remove(&sub);
                    return;
                }
                last = cursor;
            }
        }
    }
    drop(records);
    // Live: forward what the hub queues; never wait on the connection here.
    loop {
        if sub.overflow.get() {
            let _ = tx.try_send(SubItem::End(
                "this subscriber fell behind; reconnect with Last-Event-ID to catch up from the WAL".into(),
            ));
            break;
        }
        let control: Vec<_> = sub.control.borrow_mut().drain(..).collect();
        let mut gone = false;
        for (cursor, unit) in control {
            if cursor > last {
                match tx.try_send(SubItem::Control { cursor, unit }) {
                    Ok(()) => last = cursor,
                    Err(e) if e.is_disconnected() => gone = true,
                    Err(_) => sub.overflow.set(true),
                }
            }
        }
        let display: Vec<_> = sub.display.borrow_mut().drain(..).collect();
        for text in display {
            match tx.try_send(SubItem::Display(text)) {
                Ok(()) => {}
                Err(e) if e.is_disconnected() => gone = true,
                Err(_) => sub.dropped.set(sub.dropped.get() + 1),
            }
        }
        if sub.dropped.get() > 0 && tx.try_send(SubItem::Gap(sub.dropped.get())).is_ok() {
            sub.dropped.set(0);
        }
        if gone || tx.is_closed() {
            break;
        }
        if sub.overflow.get() {
            continue;
        }
        // Wake on new items, or now and then to notice a closed connection.
        futures_lite::future::or(async { woken.recv().await.is_some() }, async {
            glommio::timer::sleep(std::time::Duration::from_millis(500)).await;
            true
        })
        .await;
    }
    hub.remove(&sub);
}
