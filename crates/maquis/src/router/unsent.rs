//! Frames a dropped peer's lanes never wrote, sent again by the routes of the moment.
//!
//! When a peer is dropped (closed because the overlay no longer wants it, or lost), each of its
//! lanes' writers hands what it still had queued to [`Router::run_unsent`]. A frame for that
//! peer itself (`Header::Actor`) goes to it again, routed through a neighbour if the
//! connection is gone; a frame this node was forwarding (`Header::Routed`) goes on toward its
//! destination ([`Router::forward`]); protocol frames are dropped (their protocols repair
//! themselves) and counted in `control_drops`. Each batch has `ROUTE_WAIT` to find its ways.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Router, ROUTE_WAIT};
use crate::error::SendError;
use crate::id::NodeId;
use crate::transport::lane::{OutFrame, Unsent};
use crate::wire::frame::{decode_head, ActorHeader, Header};

impl Router {
    /// Sends the unwritten frames of dropped peers again until the node stops. `fail_call`
    /// fails a call of this node whose request found no way (so that it does not wait for its
    /// timeout).
    pub(crate) async fn run_unsent(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<Unsent>,
        fail_call: impl Fn(u64, String) + Send + 'static,
    ) {
        loop {
            let batch = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                b = rx.recv() => match b {
                    Some(b) => b,
                    None => return,
                },
            };
            let deadline = tokio::time::Instant::now() + ROUTE_WAIT;
            for frame in batch.frames {
                if let Some((call, why)) =
                    self.resend(&batch.peer, batch.slot, frame, deadline).await
                {
                    fail_call(call, why);
                }
            }
        }
    }

    /// Sends one frame that `peer`'s lane `slot` never wrote. Returns the call of this node
    /// that fails, if the frame was one and found no way.
    async fn resend(
        &self,
        peer: &NodeId,
        slot: usize,
        frame: OutFrame,
        deadline: tokio::time::Instant,
    ) -> Option<(u64, String)> {
        // The frame's queue permits go back here; sending it again takes new ones.
        let OutFrame { head, payload, .. } = frame;
        let (dst, actor) = match decode_head(&head) {
            Ok(Header::Actor(actor)) => (peer.clone(), actor),
            // This node's own routed frame: routed afresh.
            Ok(Header::Routed {
                to, from, actor, ..
            }) if from == self.id => (to, actor),
            Ok(Header::Routed {
                to,
                from,
                hops,
                lane,
                actor,
            }) => {
                // Forwarded on as if it had just arrived, but not from the dropped peer: that
                // peer may be its destination, reachable again (a frame is only never sent
                // back where it came from, and this one did not come from there).
                self.counters.unsent_resent.inc();
                let me = self.id.clone();
                self.forward(&me, to, from, hops, lane, actor, payload)
                    .await;
                return None;
            }
            Ok(_) => {
                self.counters.control_drops.inc();
                return None;
            }
            Err(e) => {
                // The router wrote every head itself: this cannot happen short of a bug.
                tracing::error!(error = %e, "an unwritten frame's head does not decode");
                self.counters.unsent_dropped.inc();
                return None;
            }
        };
        let own_call = match &actor {
            ActorHeader::Send { call: Some(c), .. } => Some(*c),
            _ => None,
        };
        let sent = async {
            let hop = self.next_hop_by(&dst, deadline).await?;
            let (lane, head) = self.frame_to(hop, &dst, slot, actor, payload.len())?;
            match tokio::time::timeout_at(deadline, lane.enqueue(head, payload)).await {
                Ok(r) => r,
                Err(_) => Err(SendError::Backpressure("lane queue")),
            }
        }
        .await;
        match sent {
            Ok(()) => {
                self.counters.unsent_resent.inc();
                None
            }
            Err(e) => {
                self.counters.unsent_dropped.inc();
                tracing::debug!(%dst, error = %e, "unwritten frame dropped");
                own_call.map(|c| (c, format!("unreachable: {e}")))
            }
        }
    }
}
