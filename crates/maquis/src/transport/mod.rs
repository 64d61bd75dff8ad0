//! Transport: one TCP connection per lane (TLS over it when `transport.tls` is on), handshakes,
//! writers that batch, readers that hand frames on, and dialers that reconnect with backoff.
//!
//! The transport knows nothing of actors or membership: it serves a [`Host`] (the node), which
//! gives it its identity and settings, the peer a connection belongs to, and takes the frames
//! that arrive and the lanes' ups and downs.
//!
//! # Peers and lanes
//!
//! A [`Peer`] (one per remote node incarnation) has a fixed table of lanes: slot 0 is `membership`
//! (one lane), then `default`, then the configured channels, each with its lane count
//! (`TransportConfig::channel_specs`, `Dispatcher`). A lane (`lane::Lane`) is one TCP connection at
//! a time (plain or TLS, `stream::Stream`), used in both directions; its outbound queue and writer task outlive connections, so
//! frames queued while it is down wait for the next connection. The writer (`lane::run_writer`)
//! takes up to 256 frames at once and writes them with vectored writes: headers and payloads up to
//! 16 KiB are copied into one buffer, larger payloads are written from their own. A write with
//! large buffers in it is paced: while the socket takes everything at once (loopback, a fast
//! link), the writer hands it at most 256 KiB a call and lets the other tasks of its thread run
//! after each 256 KiB, so that a lane moving megabytes does not hold a worker thread for
//! milliseconds while the small frames of other lanes and the actors wait. While it waits
//! with nothing queued, it lends the write half to senders, who write a small frame themselves
//! unless frames come in bursts ([`direct`]): one frame at a time costs no hand-off to the
//! writer task. With striping
//! (`transport.stripe_bytes`), a channel's first lane carries its small frames and the commits
//! of its large ones, whose parts go over its other lanes ([`stripe`]); readers put them back
//! together per peer and hand the frame on at its commit.
//!
//! # Who dials
//!
//! Both nodes run a dialer (`connector::run`) for every lane. Whenever the lane has no connection
//! (and, on overlays with membership liveness, for lanes other than `membership`, once a frame is
//! queued on it: most connections of a peer-to-peer overlay carry only a shuffle or a
//! neighbour's protocol traffic) the dialer dials: at once if this node wins the tie against the peer
//! (`NodeId::wins_tie_against`: the smaller `(name, incarnation, addr)` wins), after
//! `transport.reconnect_min_ms` otherwise, so that usually only the winner dials; after a failure
//! the delay doubles up to `transport.reconnect_max_ms`. A failed dial of the membership lane is
//! reported (`LaneEvent::DialFailed`) and declares the peer down; failures of other lanes only back
//! off.
//!
//! When both dial anyway, the acceptor settles it (`Lane::offer_incoming`, once the dialer is
//! authenticated): with no connection and no dial of its own in flight it accepts; when the
//! live connection was dialed by the peer it accepts, and the new one replaces it (the peer
//! would not dial again unless it had lost it); otherwise it accepts only if the peer wins the
//! tie, and answers `Rejected { code: Superseded }` if not, and that dialer backs off.
//! The dialer's end keeps the same one: its own connection, once accepted, does not replace a
//! live one the peer dialed if the peer wins the tie (`Lane::install`; it is closed instead).
//! A connection in hand (authenticated, accepted or dialed for a join, not yet installed)
//! marks its lane arriving (`peer::Arriving`) before the peer's dialers can start, so a node
//! does not dial a lane it is about to get a connection for.
//! `conn::install` makes an accepted connection the lane's (cancelling the one it replaces),
//! hands its write half to the writer, spawns the reader and reports `LaneEvent::Up`; when
//! the reader ends the lane forgets the connection and its dialer wakes up.
//!
//! # Closing
//!
//! A peer closed on purpose (`Peer::close_then_cut`) loses nothing in either direction: each
//! writer writes what its lane has queued (on the connection it has, or one handed to it as
//! the close comes: a peer is often closed the moment it connects), shuts its side of the
//! connection and ends; the
//! readers go on. The other end reads to the end of the stream and then lets that connection go
//! once the write it has in progress is out (`ConnInfo::ended`), so what it sent until then
//! (replies among it) is read here. The peer's goodbye (`Bye`, read before that end of stream on
//! the membership lane) marks it `said_bye`, and its lanes are not dialed again; a dial already
//! in flight is finished and its connection shut the same way, since the other end may have
//! written on it. Everything is cut `CLOSE_GRACE` (5 s) after the close. A lane's writer that
//! ends with frames unwritten (no connection, or the peer cut) hands them to its `UnsentSink`
//! when it has one (see `router::waiting`).

pub(crate) mod conn;
pub(crate) mod connector;
pub(crate) mod direct;
pub(crate) mod lane;
pub(crate) mod listener;
pub(crate) mod peer;
pub(crate) mod schedule;
pub(crate) mod stream;
pub(crate) mod stripe;
pub(crate) mod watch;
pub(crate) mod widen;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub(crate) use lane::QueueBudget;
pub(crate) use peer::{Peer, PeerRefused};

use crate::config::Config;
use crate::counters::Counters;
use crate::dispatch::Dispatcher;
use crate::id::NodeId;
use crate::tls::Tls;
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
        /// Whether the failure is evidence that the peer is down
        /// (`ConnError::is_evidence_of_down`).
        evidence: bool,
    },
}

/// What the transport needs from the node it serves.
pub(crate) trait Host: Send + Sync + 'static {
    /// This node.
    fn id(&self) -> &NodeId;
    /// The cluster cookie.
    fn cookie(&self) -> &[u8];
    /// The TLS configurations, when `transport.tls` is on.
    fn tls(&self) -> Option<&Tls>;
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
    /// The node's stages, when it sizes them (lane readers run in the receive stage).
    fn stages(&self) -> Option<&Arc<crate::stages::Stages>> {
        None
    }
    /// Whether data lanes are dialed only when they have a frame to carry (overlays whose
    /// connections come and go, where most are never used for data) rather than at once.
    fn dials_on_demand(&self) -> bool;
    /// The peer a node's connections belong to, created if needed; `Err` if it may not
    /// connect (an older incarnation than one known, another node of its name connected, the
    /// node is stopping); with a connection for the lane in `slot` in hand until the guard is dropped.
    fn peer_for(
        self: &Arc<Self>,
        id: &NodeId,
        slot: usize,
    ) -> Result<(Arc<Peer>, peer::Arriving), PeerRefused>;
    /// A frame arrived from `peer`.
    fn on_frame(&self, peer: &Arc<Peer>, frame: Frame) -> impl Future<Output = ()> + Send;
    /// A lane changed.
    fn on_lane(&self, event: LaneEvent) -> impl Future<Output = ()> + Send;
    /// A handshake with `addr` was refused, by this node when `by_us` (every refusal of an
    /// incoming connection counts as this node's), else by the other: a wrong cookie, an
    /// incompatible configuration, a certificate refused, a refusal with a reason. `Some(n)`
    /// when a warning about it is due, covering `n` refusals (the host keeps one address from
    /// filling the log).
    fn on_refused(&self, addr: SocketAddr, by_us: bool, reason: &str) -> Option<u64>;
}
