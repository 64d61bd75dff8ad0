//! A peer: one remote node (one incarnation) and its lanes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::lane::Lane;
use super::stripe::{StripesIn, StripesOut};
use super::widen::{BarriersIn, Widen};
use crate::id::NodeId;

/// Why a node gets no peer entry (its connection is refused).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PeerRefused {
    /// This node is stopping.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// A newer incarnation of that name is known.
    #[error("stale incarnation of {0}")]
    Stale(String),
    /// Another node of that name is connected, from another address.
    #[error("a node named {name} is already connected from {addr}")]
    Duplicate {
        /// The name.
        name: String,
        /// Where the connected one is.
        addr: std::net::SocketAddr,
    },
}

/// A remote node and the lanes to it.
pub(crate) struct Peer {
    /// Which node (and which life of it).
    pub id: NodeId,
    /// All lanes, indexed by slot (see `Dispatcher`).
    pub lanes: Vec<Arc<Lane>>,
    /// Whether its membership lane has connected (cleared when it is declared down, and when
    /// it says goodbye).
    pub up: AtomicBool,
    /// It said goodbye: its lanes are not dialed again (the connections it closes end with the
    /// goodbye; the control loop drops the peer).
    pub said_bye: AtomicBool,
    /// When a frame last arrived from it, in microseconds since the node started.
    pub last_seen_us: AtomicU64,
    /// Last heartbeat round trip in microseconds (0 until measured); shared with the lanes'
    /// width drivers ([`super::widen`]).
    pub rtt_us: Arc<AtomicU64>,
    /// The frames written to it, all lanes, as the last heartbeat tick counted them (only the
    /// control loop reads and writes it).
    pub written_at_tick: AtomicU64,
    /// The largest frame the peer accepts, as its last handshake said (`u64::MAX` until one
    /// has completed: then only this node's own limit applies).
    pub max_frame: AtomicU64,
    /// Striped frames sent to it.
    pub stripes_out: StripesOut,
    /// Striped frames from it being put together.
    pub stripes_in: StripesIn,
    /// By slot: at the first lane of each channel whose small frames may take several lanes,
    /// how many do now ([`super::widen`]).
    pub widths: Vec<Option<Arc<Widen>>>,
    /// The barriers it wrote across its channels' lanes, as they arrive.
    pub barriers_in: BarriersIn,
    /// Aborts everything (frames queued are dropped).
    pub abort: CancellationToken,
    /// Closes gracefully (frames queued are written first).
    pub close: CancellationToken,
    /// Signalled when a lane loses its connection (connectors wait on it).
    pub changed: Notify,
    /// Its data lanes' dials in progress (connect and handshake), at most half of
    /// `transport.max_pending_handshakes_per_source` at once: a peer with the same settings
    /// then never refuses them for coming too many at once from one address, with room left
    /// for a second node behind it ([`super::connector`]).
    pub dials: Semaphore,
    /// The lanes' writer tasks (they end once `close` has drained them, or on `abort`).
    pub writers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Peer {
    /// The widening channel of the lane at `slot`, and the lane's index in it.
    fn widening(&self, slot: usize) -> Option<(&Widen, usize)> {
        let index = usize::from(self.lanes.get(slot)?.id.index);
        let first = slot.checked_sub(index)?;
        self.widths.get(first)?.as_deref().map(|w| (w, index))
    }

    /// Whether frames under the striping size take the lane at `slot` now: every lane of a
    /// channel that does not widen, the lanes of the width of one that does.
    pub(crate) fn carries_small(&self, slot: usize) -> bool {
        self.widening(slot)
            .is_none_or(|(w, index)| index < w.seen().width())
    }

    /// Whether striped frames' pieces take the lane at `slot` now (the lanes of its channel's
    /// spread).
    pub(crate) fn carries_striped(&self, slot: usize) -> bool {
        self.widening(slot)
            .is_some_and(|(w, index)| index >= 1 && index <= w.spread())
    }

    /// Whether the peer's membership lane is up.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Closes gracefully (the writers write what is queued, then shut their side) and cuts
    /// both directions after `grace`, however far they got.
    pub(crate) fn close_then_cut(&self, grace: std::time::Duration) {
        self.close.cancel();
        let abort = self.abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            abort.cancel();
        });
    }

    /// Frames written to it so far, all lanes together.
    pub(crate) fn frames_written(&self) -> u64 {
        self.lanes
            .iter()
            .map(|l| l.metrics.msgs_out.load(Ordering::Relaxed))
            .sum()
    }

    /// The largest frame the peer accepts, as far as this node knows.
    pub(crate) fn max_frame(&self) -> usize {
        usize::try_from(self.max_frame.load(Ordering::Relaxed)).unwrap_or(usize::MAX)
    }

    /// Marks a connection for the lane in `slot` as in hand (authenticated, not yet
    /// installed) while the guard lives: the lane's dialer does not dial meanwhile.
    pub(crate) fn arriving(self: &Arc<Self>, slot: usize) -> Arriving {
        self.lanes[slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .arriving += 1;
        Arriving {
            peer: self.clone(),
            slot,
        }
    }

    /// Waits until the lane in `slot` is connected; false on timeout or abort.
    pub(crate) async fn wait_connected(&self, slot: usize, limit: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lanes[slot].is_connected() {
                return true;
            }
            tokio::select! {
                _ = self.abort.cancelled() => return false,
                _ = tokio::time::sleep_until(deadline) => return false,
                _ = &mut changed => {}
            }
        }
    }

    /// Waits (up to `limit`) until every lane's writer has ended: after `close`, that is when
    /// the frames queued before it have been written.
    pub(crate) async fn drained(&self, limit: std::time::Duration) {
        let writers = std::mem::take(&mut *self.writers.lock().unwrap_or_else(|e| e.into_inner()));
        let _ = tokio::time::timeout(limit, futures::future::join_all(writers)).await;
    }
}

/// A connection in hand for one of a peer's lanes ([`Peer::arriving`]). Taken before the
/// peer's dialers can start (a new peer's dialer of the tie winner dials at once), and let go
/// once the connection is installed or dropped, so that a node never dials a lane it is
/// about to get a connection for: its two connections would race to replace each other, and
/// the two ends could keep different ones.
pub(crate) struct Arriving {
    peer: Arc<Peer>,
    slot: usize,
}

impl Drop for Arriving {
    fn drop(&mut self) {
        let mut st = self.peer.lanes[self.slot]
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        st.arriving = st.arriving.saturating_sub(1);
        drop(st);
        self.peer.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use crate::dispatch::Dispatcher;
    use crate::id::NodeId;
    use crate::overlay::Liveness;
    use crate::router::{PeerEntry, Router, RouterLimits};

    fn id(name: &str) -> NodeId {
        NodeId::new(name, ([127, 0, 0, 1], 9).into(), 1)
    }

    #[tokio::test]
    async fn a_lane_with_a_connection_in_hand_is_served_until_the_last_guard_goes() {
        let specs = crate::config::TransportConfig::default().channel_specs();
        let limits = RouterLimits::for_tests();
        let (router, _) = Router::new(
            id("a"),
            Dispatcher::new(specs, true, false),
            Liveness::Membership,
            limits,
        );
        let PeerEntry::New { peer, .. } = router.peer_entry(&id("b")).unwrap() else {
            panic!("a new peer");
        };
        let (lane, other) = (&peer.lanes[0], &peer.lanes[1]);
        assert!(!lane.is_served(), "no connection, none in hand");
        let first = peer.arriving(0);
        let second = peer.arriving(0);
        assert!(lane.is_served(), "a dialer would wait");
        assert!(!other.is_served(), "only the lane the connection is for");
        drop(first);
        assert!(lane.is_served(), "one connection still in hand");
        // A dialer waiting for the lane to lose its service is woken when the last guard goes.
        let changed = peer.changed.notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        assert!(changed.as_mut().now_or_never().is_none());
        drop(second);
        assert!(!lane.is_served(), "its dialer may dial again");
        assert!(changed.now_or_never().is_some(), "the dialer is woken");
    }
}
