//! Transport: one TCP connection per lane, handshakes, writers that batch, readers that hand
//! frames on, and dialers that reconnect with backoff.
//!
//! The transport knows nothing of actors or membership: it serves a [`Host`] (the node), which
//! gives it its identity and settings, the peer a connection belongs to, and takes the frames
//! that arrive and the lanes' ups and downs.

pub(crate) mod conn;
pub(crate) mod connector;
pub(crate) mod lane;
pub(crate) mod listener;
pub(crate) mod peer;

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub(crate) use lane::QueueBudget;
pub(crate) use peer::Peer;

use crate::config::Config;
use crate::counters::Counters;
use crate::dispatch::Dispatcher;
use crate::id::NodeId;
use crate::wire::frame::Frame;

/// A change of one lane that the host hears of.
#[derive(Debug)]
pub(crate) enum LaneEvent {
    /// The lane `slot` of `peer` has a connection.
    Up { peer: NodeId, slot: usize },
    /// It lost it (its dialer tries again).
    Down { peer: NodeId, slot: usize },
    /// A dial of it failed.
    DialFailed {
        peer: NodeId,
        slot: usize,
        error: String,
    },
}

/// What the transport needs from the node it serves.
pub(crate) trait Host: Send + Sync + 'static {
    /// This node.
    fn id(&self) -> &NodeId;
    /// The cluster cookie.
    fn cookie(&self) -> &[u8];
    /// Timeouts, frame limit, reconnection backoff.
    fn config(&self) -> &Config;
    /// The channel table and lane slots.
    fn dispatch(&self) -> &Dispatcher;
    /// Where failures are counted.
    fn counters(&self) -> &Counters;
    /// Cancelled when the node stops.
    fn shutdown(&self) -> &CancellationToken;
    /// Handshakes allowed at once.
    fn handshakes(&self) -> &Arc<Semaphore>;
    /// A fresh connection id.
    fn next_conn_id(&self) -> u64;
    /// Microseconds since the node started.
    fn now_us(&self) -> u64;
    /// The peer a node's connections belong to, created if needed; `Err` if it may not
    /// connect (an older incarnation than one known, the node is stopping).
    fn peer_for(self: &Arc<Self>, id: &NodeId) -> Result<Arc<Peer>, String>;
    /// A frame arrived from `peer`.
    fn on_frame(&self, peer: &Arc<Peer>, frame: Frame) -> impl Future<Output = ()> + Send;
    /// A lane changed.
    fn on_lane(&self, event: LaneEvent) -> impl Future<Output = ()> + Send;
}
