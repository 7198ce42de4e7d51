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
use futures_channel::{mpsc, oneshot};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use broca_core::project::{units, Cursor};
use broca_wal::reader::PagedReader;
use broca_wal::Record;

/// Control units a subscriber may have queued before it is told to reconnect.
const CONTROL_QUEUE_MAX: usize = 4096;
/// Display deltas a subscriber may have queued before new ones are dropped.
const DISPLAY_QUEUE_MAX: usize = 256;

/// What a subscription delivers to its connection.
pub(crate) enum SubItem {
    /// The subscription is accepted: control units follow (always the first item, unless
    /// [`SubItem::Refused`]).
    Ready,
    /// The subscription is refused (the only item).
    Refused(String),
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
    seeks: RefCell<SeekPoints>,
}

/// A record is kept as a seek point once this many records followed the last one.
const SEEK_EVERY: u64 = 256;
/// Seek points kept per session (the newest): a reconnect near the head reads at most about
/// `SEEK_EVERY` records before its cursor.
const SEEK_POINTS: usize = 8;

/// Where records of the session's WAL start, as its writer appended them: (seq, offset) of a
/// record every [`SEEK_EVERY`], and where the next one starts. A subscriber resuming from a
/// cursor reads from the nearest point at or before it instead of from the first record
/// (the reader checks the point, and reads from the start when it does not hold).
#[derive(Default)]
pub(crate) struct SeekPoints {
    points: VecDeque<(u64, u64)>,
    next: Option<(u64, u64)>,
}

impl SeekPoints {
    fn keep(&mut self, seq: u64, offset: u64) {
        if self
            .points
            .back()
            .is_none_or(|&(last, _)| seq >= last + SEEK_EVERY)
        {
            self.points.push_back((seq, offset));
            if self.points.len() > SEEK_POINTS {
                self.points.pop_front();
            }
        }
    }
}

impl Hub {
    pub fn is_idle(&self) -> bool {
        self.subs.borrow().is_empty() && self.pending.borrow().is_empty()
    }

    /// The log whose durability gates publishing (set when the session's actor opens it).
    pub fn set_watch(&self, watch: DurableWatch) {
        *self.watch.borrow_mut() = Some(watch);
    }

    /// The seek points, taken (the hub is going; the registry keeps them for the next one).
    pub fn take_seeks(&self) -> SeekPoints {
        let mut seeks = std::mem::take(&mut *self.seeks.borrow_mut());
        // Where the next record starts holds only while a writer of this process appends.
        seeks.next = None;
        seeks
    }

    /// Seek points a former hub of the session kept.
    pub fn restore_seeks(&self, seeks: SeekPoints) {
        *self.seeks.borrow_mut() = seeks;
    }

    /// The session's actor opened its WAL: its next record, `seq`, starts at `offset`.
    pub fn set_start(&self, seq: u64, offset: u64) {
        let mut seeks = self.seeks.borrow_mut();
        seeks.keep(seq, offset);
        seeks.next = Some((seq, offset));
    }

    /// The nearest seek point at or before record `seq`.
    fn seek_for(&self, seq: u64) -> Option<(u64, u64)> {
        let seeks = self.seeks.borrow();
        seeks.points.iter().rev().find(|p| p.0 <= seq).copied()
    }

    /// A record was appended: publish it once durable, if anyone listens.
    pub fn on_append(self: &Rc<Self>, seq: u64, end: u64, record: &Record) {
        {
            let mut seeks = self.seeks.borrow_mut();
            if let Some((next, offset)) = seeks.next {
                if next == seq {
                    seeks.keep(seq, offset);
                }
            }
            seeks.next = Some((seq + 1, end));
        }
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

/// Items a subscription's connection may have queued: with [`REPLAY_PAGE_BYTES`], what bounds
/// a subscriber's memory (a page of records being replayed, its units, and this many items
/// waiting for the socket), however long the WAL it replays.
pub(crate) const SUB_CHANNEL_ITEMS: usize = 32;
/// Payload bytes of WAL records read per page while replaying.
pub(crate) const REPLAY_PAGE_BYTES: usize = 64 * 1024;

/// Reads the next page of `reader` on the blocking pool (the file is read with plain reads).
async fn next_page(mut reader: PagedReader) -> (PagedReader, Result<Vec<(u64, Record)>, String>) {
    glommio::executor()
        .spawn_blocking(move || {
            let page = reader
                .next_records(REPLAY_PAGE_BYTES)
                .map_err(|e| e.to_string());
            (reader, page)
        })
        .await
}

/// Runs one subscription on the session's shard. `barrier` makes everything the session's
/// live actor appended durable and answers its last seq (`None` when no actor is live)
/// before the WAL is read; a `live` subscription to a live session reads no WAL at all. The first
/// item is [`SubItem::Ready`] (or [`SubItem::Refused`]: a cursor beyond the session's head);
/// then the replay, page by page with backpressure; then the live units. `gone` resolves
/// when the connection ends.
pub(crate) async fn run(
    hub: Rc<Hub>,
    wal: std::path::PathBuf,
    from: SubFrom,
    barrier: impl std::future::Future<Output = Option<u64>>,
    mut tx: mpsc::Sender<SubItem>,
    gone: oneshot::Receiver<()>,
) {
    // Register first: what becomes durable from now on is queued; what is durable before the
    // read below is in the WAL. The cursor drops what both deliver.
    let (sub, woken) = hub.add();
    let head = barrier.await;
    let replayed = match (from, head) {
        (SubFrom::Live, Some(seq)) => match send(&mut tx, SubItem::Ready).await {
            true => Ok(Some(Cursor::end_of(seq))),
            false => Ok(None),
        },
        _ => {
            let start = match from {
                SubFrom::After(c) => hub.seek_for(c.seq),
                _ => None,
            };
            replay(&wal, from, start, &mut tx).await
        }
    };
    let last = match replayed {
        Ok(Some(last)) => last,
        Ok(None) => {
            hub.remove(&sub);
            return; // the connection went, or the cursor was refused
        }
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
    live(&sub, woken, tx, gone, last).await;
    hub.remove(&sub);
}

/// Sends the units of the durable records after `from`, page by page (from the seek point
/// `start` when the hub has one at or before the cursor). Answers the cursor of
/// the last unit sent (or the head, for `live`); `None` when the connection went or the
/// cursor was refused.
async fn replay(
    wal: &std::path::Path,
    from: SubFrom,
    start: Option<(u64, u64)>,
    tx: &mut mpsc::Sender<SubItem>,
) -> Result<Option<Cursor>, String> {
    let path = wal.to_path_buf();
    let opened = glommio::executor()
        .spawn_blocking(move || match start {
            Some((seq, offset)) => PagedReader::open_from(&path, seq, offset),
            None => PagedReader::open_if_any(&path),
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut last = match from {
        SubFrom::Start | SubFrom::Live => Cursor::START,
        SubFrom::After(c) => c,
    };
    let mut ready = false;
    if let Some(mut reader) = opened {
        loop {
            let (r, page) = next_page(reader).await;
            reader = r;
            let page = page?;
            if page.is_empty() {
                break;
            }
            if from == SubFrom::Live {
                continue; // only the head matters
            }
            for (seq, record) in &page {
                for (i, u) in units(record).iter().enumerate() {
                    let cursor = Cursor {
                        seq: *seq,
                        sub: i as u32,
                    };
                    if cursor <= last {
                        continue;
                    }
                    if !ready {
                        ready = true;
                        if !send(tx, SubItem::Ready).await {
                            return Ok(None);
                        }
                    }
                    let unit = u.to_string();
                    if !send(tx, SubItem::Control { cursor, unit }).await {
                        return Ok(None);
                    }
                    last = cursor;
                }
            }
        }
        if from == SubFrom::Live {
            last = Cursor::end_of(reader.last_seq());
        }
        if let SubFrom::After(c) = from {
            if c.seq > reader.last_seq() {
                let _ = send(tx, SubItem::Refused(beyond_head(c, reader.last_seq()))).await;
                return Ok(None);
            }
        }
    } else if let SubFrom::After(c) = from {
        if c.seq > 0 {
            let _ = send(tx, SubItem::Refused(beyond_head(c, 0))).await;
            return Ok(None);
        }
    }
    if !ready && !send(tx, SubItem::Ready).await {
        return Ok(None);
    }
    Ok(Some(last))
}

fn beyond_head(c: Cursor, head: u64) -> String {
    format!(
        "cursor {c} is beyond the session's head (seq {head}): it is not from this session's \
         WAL; subscribe from=start or from=live"
    )
}

/// Forwards what the hub queues for `sub`, as fast as the connection takes it; never waits
/// on anything but new items, room in the connection's queue, and the connection's end.
async fn live(
    sub: &Rc<Sub>,
    woken: LocalReceiver<()>,
    mut tx: mpsc::Sender<SubItem>,
    gone: oneshot::Receiver<()>,
    mut last: Cursor,
) {
    let mut gone = gone;
    loop {
        if sub.overflow.get() {
            let _ = tx.try_send(SubItem::End(
                "this subscriber fell behind; reconnect with Last-Event-ID to catch up from the WAL".into(),
            ));
            return;
        }
        let mut full = false;
        // Control units first, in order; a unit that does not fit waits for room.
        loop {
            let Some((cursor, unit)) = sub.control.borrow_mut().pop_front() else {
                break;
            };
            if cursor <= last {
                continue;
            }
            match tx.try_send(SubItem::Control { cursor, unit }) {
                Ok(()) => last = cursor,
                Err(e) if e.is_disconnected() => return,
                Err(e) => {
                    let SubItem::Control { cursor, unit } = e.into_inner() else {
                        unreachable!("the item sent comes back")
                    };
                    sub.control.borrow_mut().push_front((cursor, unit));
                    full = true;
                    break;
                }
            }
        }
        // Display deltas only when the control lane is through; they wait in their own
        // bounded queue (new ones dropped and counted past it).
        while !full {
            let Some(text) = sub.display.borrow_mut().pop_front() else {
                break;
            };
            match tx.try_send(SubItem::Display(text)) {
                Ok(()) => {}
                Err(e) if e.is_disconnected() => return,
                Err(e) => {
                    let SubItem::Display(text) = e.into_inner() else {
                        unreachable!("the item sent comes back")
                    };
                    sub.display.borrow_mut().push_front(text);
                    full = true;
                }
            }
        }
        if !full && sub.dropped.get() > 0 && tx.try_send(SubItem::Gap(sub.dropped.get())).is_ok() {
            sub.dropped.set(0);
        }
        enum Wake {
            Items,
            Room(bool),
            Gone,
        }
        let wake = futures_lite::future::or(
            async {
                woken.recv().await;
                Wake::Items
            },
            futures_lite::future::or(
                async {
                    if full {
                        let ok = futures_lite::future::poll_fn(|cx| tx.poll_ready(cx))
                            .await
                            .is_ok();
                        Wake::Room(ok)
                    } else {
                        futures_lite::future::pending().await
                    }
                },
                async {
                    let _ = (&mut gone).await;
                    Wake::Gone
                },
            ),
        )
        .await;
        match wake {
            Wake::Items | Wake::Room(true) => {}
            Wake::Room(false) | Wake::Gone => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seek_points_are_sparse_recent_and_never_after_the_cursor() {
        let hub = Rc::new(Hub::default());
        hub.set_start(2, 4096);
        // Records 2.. appended as the writer reports them (each 100 bytes): no subscriber.
        let record = Record::LeaseAcquired(broca_wal::record::LeaseAcquired {
            epoch: 1,
            pid: 1,
            at_unix_ms: 0,
            cut: None,
        });
        for seq in 2..3000u64 {
            hub.on_append(seq, 4096 + (seq - 1) * 100, &record);
        }
        let points: Vec<(u64, u64)> = hub.seeks.borrow().points.iter().copied().collect();
        assert_eq!(points.len(), SEEK_POINTS, "{points:?}");
        assert!(points.windows(2).all(|w| w[1].0 >= w[0].0 + SEEK_EVERY));
        assert!(points
            .iter()
            .all(|&(seq, offset)| offset == 4096 + (seq - 2) * 100));
        // The nearest at or before: never a record after the cursor.
        let last = *points.last().unwrap();
        assert_eq!(hub.seek_for(last.0 + 5), Some(last));
        assert_eq!(hub.seek_for(last.0), Some(last));
        assert!(hub.seek_for(last.0 - 1).unwrap().0 < last.0);
        // Older than every point kept: no point (the replay reads from the first record).
        assert_eq!(hub.seek_for(points[0].0 - 1), None);
        // The points outlive the hub: a later hub of the session seeks the same way.
        let later = Hub::default();
        later.restore_seeks(hub.take_seeks());
        assert_eq!(later.seek_for(last.0 + 5), Some(last));
        assert!(
            later.seeks.borrow().next.is_none(),
            "no writer appends for it yet"
        );
    }
}
