//! The admin HTTP endpoint of a Maquis node, and a small client for it.
//!
//! A node that enables the admin endpoint runs [`serve`] on a TCP listener. It answers:
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /status` | [`Status`] as JSON (`application/json`) |
//! | `GET /metrics` | Prometheus text exposition format, see [`render_metrics`] |
//! | `GET` or `POST /ping?to=NAME&count=N&size=BYTES` | [`PingReport`] as JSON |
//!
//! The [`client`] module holds the functions the `maquis` CLI uses to talk to that endpoint,
//! and [`Status::render_table`] turns a status into text for people.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

pub mod client;
mod metrics;
mod server;
mod table;
#[cfg(test)]
mod tests;

pub use metrics::render_metrics;
pub use server::serve;

/// Largest `count` accepted by `/ping`.
pub const MAX_PING_COUNT: u32 = 100_000;

/// Largest `size` (payload bytes per echo call) accepted by `/ping`.
pub const MAX_PING_SIZE: usize = 16 * 1024 * 1024;

/// How many admin connections [`serve`] serves at once; further connections wait (unaccepted, in
/// the listener's backlog) until one of those closes.
pub const MAX_ADMIN_CONNECTIONS: usize = 64;

/// Connections the admin endpoint serves at once from one IP address: a source that holds more
/// (idle connections, say) cannot lock the others out. Further ones are closed at once.
pub const MAX_ADMIN_CONNECTIONS_PER_SOURCE: usize = 16;

/// Payload bytes of all `/ping` requests in progress together: a request whose `size` does not
/// fit beside the others is answered 503 at once, so no burst of requests makes the node (or
/// the pinged one) hold more than this in ping payloads.
pub const MAX_PING_BYTES_IN_FLIGHT: usize = 64 * 1024 * 1024;

/// JSON shape of `GET /status`: a snapshot of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The node's name.
    pub name: String,
    /// The node's incarnation (changes on every restart).
    pub incarnation: u64,
    /// The overlay the node runs (its configured name).
    pub overlay: String,
    /// The address the node's transport listens on.
    pub listen: String,
    /// The names of the members of the cluster as this node sees it.
    pub members: Vec<String>,
    /// One entry per peer this node knows of.
    pub peers: Vec<PeerStatus>,
    /// Node-level counters (monotonic), by name.
    pub counters: BTreeMap<String, u64>,
    /// Node-level gauges (current values: actors, pending calls, …), by name.
    #[serde(default)]
    pub gauges: BTreeMap<String, u64>,
    /// Handshakes refused lately (a wrong cookie, an incompatible configuration), the most
    /// recent first; at most 32 addresses.
    #[serde(default)]
    pub refusals: Vec<RefusalStatus>,
}

/// Handshakes refused with one address, as part of [`Status`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalStatus {
    /// The other end's address (as connected from, or dialed).
    pub addr: String,
    /// `true`: this node refused the other; `false`: the other refused this node.
    pub by_us: bool,
    /// How many times.
    pub count: u64,
    /// The last reason.
    pub reason: String,
    /// Milliseconds since the last one.
    pub ago_ms: u64,
}

/// The state of one peer, as part of [`Status`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// The peer's name.
    pub name: String,
    /// The peer's transport address.
    pub addr: String,
    /// The peer's incarnation as last seen.
    pub incarnation: u64,
    /// Whether the peer is considered up.
    pub up: bool,
    /// Last measured heartbeat round-trip time in microseconds, if any.
    pub rtt_us: Option<u64>,
    /// Bytes of striped messages the peer lets this node have in flight to it (the window it
    /// announced, its `transport.stripe_window_bytes`); none until it has announced one on the
    /// current connection (until then this node's large messages to it go whole).
    #[serde(default)]
    pub stripe_window_bytes: Option<u64>,
    /// The lanes (connections) to this peer.
    pub lanes: Vec<LaneStatus>,
}

/// The state of one lane (one connection of one channel) to a peer, as part of [`PeerStatus`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneStatus {
    /// The name of the channel the lane belongs to.
    pub channel: String,
    /// The lane's index within its channel.
    pub index: u16,
    /// Whether the lane's connection is currently established.
    pub connected: bool,
    /// Messages sent on the lane.
    pub msgs_out: u64,
    /// Of `msgs_out`, the messages their senders wrote to the socket themselves, while the
    /// lane had nothing queued (the others went through the lane's writer task).
    #[serde(default)]
    pub direct_out: u64,
    /// Bytes sent on the lane.
    pub bytes_out: u64,
    /// Messages received on the lane.
    pub msgs_in: u64,
    /// Bytes received on the lane.
    pub bytes_in: u64,
    /// Bytes queued for sending right now.
    pub queued_bytes: u64,
    /// Frames discarded on the lane: a write that failed (the whole batch), or frames still
    /// queued when the peer was dropped. A full queue never drops: senders wait or get
    /// `Backpressure`.
    pub dropped: u64,
    /// Whether messages under `transport.stripe_bytes` take the lane now: every lane of a
    /// channel that does not stripe; of one that does, the lanes of its width (its first, or
    /// its first 2, 4, … once it has widened).
    #[serde(default)]
    pub small: bool,
    /// Whether the parts of striped messages take the lane now: of a channel that stripes, the
    /// lanes of its spread (its second, or its second to its `spread + 1`-th), as many as the
    /// round trip and the bytes written ask for.
    #[serde(default)]
    pub striped: bool,
}

/// Result of a ping: the node calls the `echo` service on node `to` `count` times with
/// `size`-byte payloads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingReport {
    /// The node that was pinged.
    pub to: String,
    /// How many calls were made.
    pub count: u32,
    /// The payload size of each call, in bytes.
    pub size: usize,
    /// How many calls succeeded.
    pub ok: u32,
    /// How many calls failed.
    pub failed: u32,
    /// Median round-trip time of the successful calls, in microseconds.
    pub p50_us: u64,
    /// 99th percentile round-trip time of the successful calls, in microseconds.
    pub p99_us: u64,
    /// Largest round-trip time of the successful calls, in microseconds.
    pub max_us: u64,
    /// Distinct error messages of the failed calls (at most 10).
    pub errors: Vec<String>,
}

/// What the admin server needs from a running node (implemented by the node).
pub trait AdminSource: Send + Sync + 'static {
    /// A snapshot of the node's state. Called once per `/status` or `/metrics` request, on the
    /// runtime's worker threads, so it should be cheap and must not block for long.
    fn status(&self) -> Status;

    /// Calls the `echo` service on node `to` `count` times with `size`-byte payloads and reports
    /// the outcome. `count` is in `1..=MAX_PING_COUNT` and `size` at most [`MAX_PING_SIZE`].
    /// The future is dropped if the requesting client goes away or the server shuts down.
    fn ping(
        &self,
        to: String,
        count: u32,
        size: usize,
    ) -> Pin<Box<dyn Future<Output = PingReport> + Send>>;
}

/// Numbers of the application running on a node, shown in `/status` and `/metrics` beside
/// the node's own (see [`crate::Node::add_metrics`]).
pub trait AppMetrics: Send + Sync + 'static {
    /// Adds the application's counters (monotonic; exported as `maquis_<name>_total`) and
    /// gauges (current values; `maquis_<name>`). A name the node already uses keeps the
    /// node's value. Called once per `/status` or `/metrics` request: cheap, never blocking.
    fn collect(&self, counters: &mut BTreeMap<String, u64>, gauges: &mut BTreeMap<String, u64>);
}

/// At most this many [`AppMetrics`] sources on one node.
pub const MAX_METRICS_SOURCES: usize = 16;

/// Errors of the admin [`client`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// Connecting to or talking with the admin endpoint failed.
    #[error("admin endpoint i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The endpoint answered with a status other than 200 OK.
    #[error("admin endpoint answered HTTP {status}: {body}")]
    Http {
        /// The HTTP status code.
        status: u16,
        /// The body of the answer (the server's reason, as plain text).
        body: String,
    },
    /// The answer was not the JSON expected.
    #[error("admin endpoint sent invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// HTTP protocol error.
    #[error("admin endpoint HTTP error: {0}")]
    Hyper(#[from] hyper::Error),
    /// Connecting (or, for status and metrics, the whole request) took too long.
    #[error("admin endpoint timed out")]
    Timeout,
    /// The address given is not a usable `host:port` (or `http://host:port`).
    #[error("invalid admin address {0:?}")]
    InvalidAddress(String),
    /// The answer's body could not be read (e.g. it was larger than the client accepts).
    #[error("admin endpoint response body: {0}")]
    Body(String),
}

/// Percentile `p` (0..=100) of sorted samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
