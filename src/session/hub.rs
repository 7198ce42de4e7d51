//! A session's subscribers and what waits for them. The reliable control lane is projected
//! from the WAL: a subscriber first reads the log from its cursor (the replay,
//! `crate::subscription`), then receives each record as it becomes durable; every unit
//! carries its cursor, so a reconnect resumes with no gap and no duplicate, across restarts
//! too. The display lane carries token deltas: lossy, bounded per subscriber, never replayed,
//! a gap reported in-band. A slow subscriber never slows a run: its display deltas are
//! dropped (and counted), and if its control queue overflows it is told to reconnect, which
//! it does from its cursor, reading the WAL.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use broca_io::log::DurableWatch;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};

use broca_read::project::units;
use broca_wal::Record;
use broca_wire::Cursor;

pub use broca_wire::{Delta, SubFrom, SubItem};

use broca_core::{DeltaKind, DisplayDelta};
use cortexkit_role_llm_runner::live::{LiveEvent, TextDelta, ToolInputDelta};

/// Control units a subscriber may have queued before it is told to reconnect.
pub const CONTROL_QUEUE_MAX: usize = 4096;
/// Display deltas a subscriber may have queued before new ones are dropped.
pub const DISPLAY_QUEUE_MAX: usize = 256;

/// One subscriber's queues, filled by the hub and drained by its connection's task.
pub(crate) struct Sub {
    pub(crate) control: RefCell<VecDeque<Queued>>,
    pub(crate) display: RefCell<VecDeque<Delta>>,
    pub(crate) dropped: Cell<u64>,
    pub(crate) overflow: Cell<bool>,
    wake: LocalSender<()>,
}

impl Sub {
    fn poke(&self) {
        let _ = self.wake.try_send(());
    }
}

/// A control unit waiting for a subscriber: its cursor, its JSON text and its typed event's.
pub(crate) type Queued = (Cursor, String, Option<String>);

/// The subscribers of one session and the records waiting to become durable for them.
#[derive(Default)]
pub struct Hub {
    subs: RefCell<Vec<Rc<Sub>>>,
    pending: RefCell<VecDeque<(u64, u64, Record)>>,
    pumping: Cell<bool>,
    watch: RefCell<Option<DurableWatch>>,
    seeks: RefCell<SeekPoints>,
    /// The step in flight as it has streamed so far, for a subscriber that attaches now.
    step: RefCell<LiveStep>,
}

/// The message a step in flight streams: its id and each part so far, coalesced.
#[derive(Default)]
struct LiveStep {
    mid: Option<u64>,
    /// Each part's index, what kind of part it is, and its text so far.
    parts: Vec<(u32, DeltaKind, String)>,
}

/// The display item of `text` of part `part` (of `kind`) of message `mid`.
fn delta(mid: u64, part: u32, kind: &DeltaKind, text: &str) -> Delta {
    let (mid, part) = (mid.to_string(), part.to_string());
    let event = match kind {
        DeltaKind::Text => LiveEvent::TextDelta(TextDelta::new("", text, mid, part)),
        DeltaKind::Reasoning => LiveEvent::ReasoningDelta(TextDelta::new("", text, mid, part)),
        DeltaKind::ToolInput(id) => {
            LiveEvent::ToolInputDelta(ToolInputDelta::new(id.clone(), text, mid, part))
        }
    };
    Delta {
        event: serde_json::to_string(&event).expect("events serialize"),
        text: matches!(kind, DeltaKind::Text).then(|| text.to_string()),
    }
}

/// The display item that drops the live state of the step in flight.
fn reset() -> Delta {
    Delta {
        event: serde_json::to_string(&LiveEvent::DisplayReset).expect("events serialize"),
        text: None,
    }
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
pub struct SeekPoints {
    points: VecDeque<(u64, u64)>,
    next: Option<(u64, u64)>,
}

impl SeekPoints {
    /// The seq of the last record appended in this process, if any.
    pub fn last_seq(&self) -> Option<u64> {
        self.next.map(|(next, _)| next.saturating_sub(1))
    }

    fn keep(&mut self, seq: u64, offset: u64) {
        assert!(self.points.len() <= SEEK_POINTS);
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
    /// The seq of the session's last record appended in this process, if any.
    pub fn last_seq(&self) -> Option<u64> {
        self.seeks.borrow().last_seq()
    }

    pub fn is_idle(&self) -> bool {
        self.subs.borrow().is_empty() && self.pending.borrow().is_empty()
    }

    /// The log whose durability gates publishing (set when the session's actor opens it).
    pub fn set_watch(&self, watch: DurableWatch) {
        *self.watch.borrow_mut() = Some(watch);
    }

    /// Runs `then` once the session's log is durable up to `end`; never, when the log fails
    /// first (or no log is watched yet). Nothing waits for it.
    pub fn when_durable(&self, end: u64, then: impl FnOnce() + 'static) {
        let Some(watch) = self.watch.borrow().clone() else {
            return;
        };
        glommio::spawn_local(async move {
            if watch.wait_durable(end).await.is_ok() {
                then();
            }
        })
        .detach();
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
    pub(crate) fn seek_for(&self, seq: u64) -> Option<(u64, u64)> {
        let seeks = self.seeks.borrow();
        seeks.points.iter().rev().find(|p| p.0 <= seq).copied()
    }

    /// A record was appended: publish it once durable, if anyone listens.
    pub fn on_append(self: &Rc<Self>, seq: u64, end: u64, record: &Record) {
        {
            let mut seeks = self.seeks.borrow_mut();
            if let Some((next, offset)) = seeks.next {
                assert!(seq >= next, "records are appended in seq order");
                assert!(end > offset, "a record ends after where it starts");
            }
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
        // The step's message is stored: it is no longer in flight.
        if matches!(
            record,
            Record::ModelStepFinished(_) | Record::RunFinished(_) | Record::RunPaused(_)
        ) {
            *self.step.borrow_mut() = LiveStep::default();
        }
        let units: Vec<(String, Option<String>)> = units(seq, record)
            .into_iter()
            .map(|u| (u.body.to_string(), u.event.map(|e| e.to_string())))
            .collect();
        if units.is_empty() {
            return;
        }
        for s in self.subs.borrow().iter() {
            let mut q = s.control.borrow_mut();
            for (i, (u, event)) in units.iter().enumerate() {
                if q.len() >= CONTROL_QUEUE_MAX {
                    s.overflow.set(true);
                    break;
                }
                let cursor = Cursor { seq, sub: i as u32 };
                assert!(
                    q.back().is_none_or(|(last, _, _)| *last < cursor),
                    "units queue in order"
                );
                q.push_back((cursor, u.clone(), event.clone()));
            }
            assert!(
                q.len() <= CONTROL_QUEUE_MAX,
                "a control queue keeps its bound"
            );
            drop(q);
            s.poke();
        }
    }

    /// A display delta of the step in flight, for every subscriber; kept, coalesced by part,
    /// for one that attaches while the step streams.
    pub fn display(&self, d: &DisplayDelta) {
        let item = match d {
            DisplayDelta::Reset { mid } => {
                *self.step.borrow_mut() = LiveStep {
                    mid: *mid,
                    parts: Vec::new(),
                };
                reset()
            }
            DisplayDelta::Chunk {
                mid,
                part,
                kind,
                text,
            } => {
                // A step whose message has no id yet shows nothing: a delta names its message.
                let Some(mid) = *mid else { return };
                let mut step = self.step.borrow_mut();
                if step.mid != Some(mid) {
                    *step = LiveStep {
                        mid: Some(mid),
                        parts: Vec::new(),
                    };
                }
                match step.parts.iter_mut().find(|p| p.0 == *part) {
                    Some(p) => p.2.push_str(text),
                    None => step.parts.push((*part, kind.clone(), text.clone())),
                }
                delta(mid, *part, kind, text)
            }
        };
        self.fan_out(item);
    }

    /// Queues a display item for every subscriber (dropped, and counted, past its bound).
    fn fan_out(&self, item: Delta) {
        for s in self.subs.borrow().iter() {
            let mut q = s.display.borrow_mut();
            if q.len() >= DISPLAY_QUEUE_MAX {
                s.dropped.set(s.dropped.get() + 1);
            } else {
                q.push_back(item.clone());
            }
            assert!(
                q.len() <= DISPLAY_QUEUE_MAX,
                "a display queue keeps its bound"
            );
            drop(q);
            s.poke();
        }
    }

    pub(crate) fn add(&self) -> (Rc<Sub>, LocalReceiver<()>) {
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

    /// A subscriber attaches to the live lanes: its display queue becomes the step in flight
    /// as it stands (`display_reset`, then one coalesced delta per part so far), which covers
    /// every delta queued for it before.
    pub(crate) fn attach(&self, sub: &Sub) {
        let step = self.step.borrow();
        let mut q = sub.display.borrow_mut();
        q.clear();
        sub.dropped.set(0);
        let Some(mid) = step.mid else {
            return;
        };
        q.push_back(reset());
        for (part, kind, text) in &step.parts {
            if q.len() >= DISPLAY_QUEUE_MAX {
                break;
            }
            q.push_back(delta(mid, *part, kind, text));
        }
    }

    pub(crate) fn remove(&self, sub: &Rc<Sub>) {
        self.subs.borrow_mut().retain(|s| !Rc::ptr_eq(s, sub));
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
