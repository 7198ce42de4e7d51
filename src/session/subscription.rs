//! One subscription, run on its session's shard: registered with the session's hub first,
//! then the WAL replayed from the subscriber's cursor (page by page, with backpressure), then
//! the hub's live units as they become durable, until the connection ends.

use std::rc::Rc;

use futures_channel::{mpsc, oneshot};
use glommio::channels::local_channel::LocalReceiver;

use broca_read::project::units;
use broca_wal::reader::PagedReader;
use broca_wal::Record;
use broca_wire::{Cursor, SubFrom, SubItem};

use crate::hub::{Hub, Sub};

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
pub const SUB_CHANNEL_ITEMS: usize = 32;
/// Payload bytes of WAL records read per page while replaying.
pub const REPLAY_PAGE_BYTES: usize = 64 * 1024;

/// Reads the next page of `reader` on the blocking pool (the file is read with plain reads).
async fn next_page(
    mut reader: PagedReader,
) -> (PagedReader, Result<Vec<(u64, Record)>, broca_wal::WalError>) {
    broca_io::blocking::run(broca_io::blocking::Kind::SubscriptionRead, move || {
        let page = reader.next_records(REPLAY_PAGE_BYTES);
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
pub async fn subscribe(
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
    let head = Box::pin(barrier).await;
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
            // Boxed: the replay's state lives only while it runs, not for the whole of a
            // subscription that is mostly waiting live.
            Box::pin(replay(&wal, from, start, &mut tx)).await
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
    hub.attach(&sub);
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
) -> Result<Option<Cursor>, broca_wal::WalError> {
    let path = wal.to_path_buf();
    let opened =
        broca_io::blocking::run(
            broca_io::blocking::Kind::SubscriptionRead,
            move || match start {
                Some((seq, offset)) => PagedReader::open_from(&path, seq, offset),
                None => PagedReader::open_if_any(&path),
            },
        )
        .await?;
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
            if !send_page(&page, &mut last, &mut ready, tx).await {
                return Ok(None);
            }
        }
        if from == SubFrom::Live {
            last = Cursor::end_of(reader.last_seq());
        }
        if !within_head(from, reader.last_seq(), tx).await {
            return Ok(None);
        }
    } else if !within_head(from, 0, tx).await {
        return Ok(None);
    }
    if !ready && !send(tx, SubItem::Ready).await {
        return Ok(None);
    }
    Ok(Some(last))
}

/// Sends a page's units after `last` (saying ready before the first), moving `last` on;
/// `false` when the connection went.
async fn send_page(
    page: &[(u64, Record)],
    last: &mut Cursor,
    ready: &mut bool,
    tx: &mut mpsc::Sender<SubItem>,
) -> bool {
    for (seq, record) in page {
        for (i, u) in units(*seq, record).into_iter().enumerate() {
            let cursor = Cursor {
                seq: *seq,
                sub: i as u32,
            };
            if cursor <= *last {
                continue;
            }
            if !*ready {
                *ready = true;
                if !send(tx, SubItem::Ready).await {
                    return false;
                }
            }
            let unit = u.body.to_string();
            let event = u.event.map(|e| e.to_string());
            if !send(
                tx,
                SubItem::Control {
                    cursor,
                    unit,
                    event,
                },
            )
            .await
            {
                return false;
            }
            *last = cursor;
        }
    }
    true
}

/// Whether a subscription's cursor is within the session's head (`head`, the last seq); a
/// cursor beyond it is refused (`false`).
async fn within_head(from: SubFrom, head: u64, tx: &mut mpsc::Sender<SubItem>) -> bool {
    match from {
        SubFrom::After(c) if c.seq > head => {
            let _ = send(tx, SubItem::Refused(beyond_head(c, head))).await;
            false
        }
        _ => true,
    }
}

fn beyond_head(c: Cursor, head: u64) -> String {
    format!(
        "cursor {c} is beyond the session's head (seq {head}): it is not from this session's \
         WAL; subscribe from=start or from=live"
    )
}

/// Hands the connection what `sub` has queued, control units first (in order, after
/// `last`), then display deltas, as much as it takes without waiting. Answers whether the
/// connection's queue is full; `None` once the connection is gone.
fn forward_queued(sub: &Sub, tx: &mut mpsc::Sender<SubItem>, last: &mut Cursor) -> Option<bool> {
    // A unit that does not fit waits for room.
    loop {
        let Some((cursor, unit, event)) = sub.control.borrow_mut().pop_front() else {
            break;
        };
        if cursor <= *last {
            continue;
        }
        match tx.try_send(SubItem::Control {
            cursor,
            unit,
            event,
        }) {
            Ok(()) => *last = cursor,
            Err(e) if e.is_disconnected() => return None,
            Err(e) => {
                let SubItem::Control {
                    cursor,
                    unit,
                    event,
                } = e.into_inner()
                else {
                    unreachable!("the item sent comes back")
                };
                sub.control.borrow_mut().push_front((cursor, unit, event));
                return Some(true);
            }
        }
    }
    // Display deltas only when the control lane is through; they wait in their own bounded
    // queue (new ones dropped and counted past it).
    loop {
        let Some(text) = sub.display.borrow_mut().pop_front() else {
            return Some(false);
        };
        match tx.try_send(SubItem::Display(text)) {
            Ok(()) => {}
            Err(e) if e.is_disconnected() => return None,
            Err(e) => {
                let SubItem::Display(text) = e.into_inner() else {
                    unreachable!("the item sent comes back")
                };
                sub.display.borrow_mut().push_front(text);
                return Some(true);
            }
        }
    }
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
        let Some(full) = forward_queued(sub, &mut tx, &mut last) else {
            return; // the connection went
        };
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
