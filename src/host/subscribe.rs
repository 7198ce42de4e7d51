//! The subscription handshake, written once for every front: admission open, the session's
//! shard told (its queue may be full), and its first answer read (ready, refused for a cursor
//! beyond the session's head, or the session gone). A front then only encodes the items.

use futures_channel::{mpsc, oneshot};
use futures_lite::StreamExt;

use broca_session::hub::{SubFrom, SubItem};
use broca_wal::SessionTriple;
use broca_wire::{Code, RpcError};

use crate::{Host, ShardMsg};

/// A subscription its session's shard accepted: the items that follow [`SubItem::Ready`].
/// Dropping it (or its `alive` half) ends it on the shard at once.
pub struct Subscription {
    items: mpsc::Receiver<SubItem>,
    alive: oneshot::Sender<()>,
}

impl Subscription {
    /// The next item; `None` once the subscription ended.
    pub async fn next(&mut self) -> Option<SubItem> {
        self.items.next().await
    }

    /// An item already queued, without waiting.
    pub fn try_next(&mut self) -> Option<SubItem> {
        self.items.try_recv().ok()
    }

    /// The items, and the half whose drop ends the subscription.
    pub fn into_parts(self) -> (mpsc::Receiver<SubItem>, oneshot::Sender<()>) {
        (self.items, self.alive)
    }
}

impl Host {
    /// Subscribes to the session `triple` from `from`, on the session's shard.
    pub async fn subscribe(
        &self,
        triple: SessionTriple,
        from: SubFrom,
    ) -> Result<Subscription, RpcError> {
        if self.is_stopping() {
            return Err(RpcError::refusal(&broca_wire::Refusal::ShuttingDown));
        }
        // An expired session serves nothing of what it held.
        self.unexpired(&triple).await?;
        let (tx, mut items) = mpsc::channel::<SubItem>(broca_session::SUB_CHANNEL_ITEMS);
        // Dropped when the subscriber's connection ends: the hub stops serving it at once.
        let (alive, gone) = oneshot::channel::<()>();
        let shard = self.shard_of(&triple);
        let msg = ShardMsg::Subscribe {
            triple,
            from,
            tx,
            gone,
        };
        self.mesh
            .try_send(shard, msg)
            .map_err(crate::replies::unrouted)?;
        match items.next().await {
            Some(SubItem::Ready) => Ok(Subscription { items, alive }),
            Some(SubItem::Refused(why)) => {
                Err(RpcError::new(Code::InvalidParams, why).with_field("from"))
            }
            _ => Err(RpcError::new(
                Code::SessionUnavailable,
                "the session went away; retry",
            )),
        }
    }
}
