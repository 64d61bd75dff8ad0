//! Node configuration: five sections by concern, a TOML file, environment overrides, a few
//! builder setters.
//!
//! [`Config`] has one struct per section: `[node]` ([`NodeConfig`]), `[transport]`
//! ([`TransportConfig`]), `[overlay]` ([`OverlayConfig`]: the overlay chosen by `kind`, with
//! that overlay's own options), `[broadcast]` ([`BroadcastConfig`]) and `[services]`
//! ([`ServicesConfig`]). Each option is declared
//! once, as a documented field whose default is in its section's `Default`; the TOML keys, the
//! `MAQUIS_<SECTION>_<KEY>` environment variables ([`Config::apply_env`]) and the README's tables
//! follow from those declarations (a test holds the README to them).
//!
//! Precedence: builder/CLI flags over environment over file over defaults, as applied by the
//! caller ([`Config::from_toml`], then [`Config::apply_env`], then setters or fields).
//!
//! ```
//! use maquis::config::{Config, ConfigError, OverlayKind, PeerToPeerOptions};
//!
//! // In code: a few setters, and the sections' public fields for the rest.
//! let mut cfg = Config::new("n1").parallelism(4).overlay(PeerToPeerOptions {
//!     active_size: 8,
//!     ..PeerToPeerOptions::default()
//! });
//! cfg.transport.lane_queue_bytes = 1 << 20;
//! cfg.validate()?;
//!
//! // From TOML, then the environment (`MAQUIS_<SECTION>_<KEY>`).
//! let cfg = Config::from_toml("[transport]\nparallelism = 4\n[overlay]\nkind = \"static\"\n")?
//!     .apply_vars([("MAQUIS_NODE_NAME".to_string(), "n2".to_string())])?;
//! assert_eq!((cfg.node.name.as_str(), cfg.transport.parallelism), ("n2", 4));
//! assert_eq!(cfg.overlay.kind(), OverlayKind::Static);
//!
//! // The flat layout of earlier versions says where an option went.
//! let err = Config::from_toml("parallelism = 4").unwrap_err();
//! assert!(matches!(err, ConfigError::Moved { ref key, .. } if key == "transport.parallelism"));
//! # Ok::<(), ConfigError>(())
//! ```

mod env;
mod keys;
mod moved;
#[cfg(test)]
mod readme_tests;
mod services;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::id::{DEFAULT_CHANNEL, MEMBERSHIP_CHANNEL};
use crate::membership::{MembershipConfig, DEFAULT_HOP_LIMIT};
use crate::overlay::{ClientServerConfig, HyParViewConfig, Role, MAX_SERVERS_PER_CLIENT};
pub use crate::tls::TlsFileError;
use crate::tls::{LoadError, Tls, TlsFile, TlsPaths};
pub use services::ServicesConfig;

/// A bad configuration.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A value is out of range or malformed.
    #[error("{key}: {reason}")]
    Invalid {
        /// The option's dotted key, e.g. `transport.parallelism`.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The TOML text could not be parsed, or has an unknown key or a value of the wrong type.
    #[error("config file: {0}")]
    File(String),
    /// An option of the flat layout of earlier versions, which now lives in a section.
    #[error("{old} has moved: write {hint}")]
    Moved {
        /// The old name as it was written: the TOML key or the environment variable.
        old: String,
        /// The option's dotted key now, e.g. `transport.parallelism`.
        key: String,
        /// How to write it now, in TOML and in the environment.
        hint: String,
    },
    /// A `MAQUIS_*` environment variable that names no option.
    #[error("unknown variable {0} (a typo?)")]
    UnknownVariable(String),
    /// `transport.tls` is on and one of its files is not set.
    #[error("{key} is required when transport.tls is on ({what})")]
    TlsMissing {
        /// The option's dotted key: `transport.tls_cert`, `transport.tls_key` or
        /// `transport.tls_ca`.
        key: String,
        /// What the file holds.
        what: &'static str,
    },
    /// One of the TLS files cannot be used.
    #[error("{key} = {}: {problem}", path.display())]
    TlsFile {
        /// The option's dotted key: `transport.tls_cert`, `transport.tls_key` or
        /// `transport.tls_ca`.
        key: String,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: TlsFileError,
    },
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        reason: reason.into(),
    }
}

/// A duration in whole milliseconds.
fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The cookie a node has when none is configured: accepted on loopback addresses only (a node
/// listening beyond them must be given a secret of its own).
pub const DEFAULT_COOKIE: &str = "maquis";

/// Everything a node needs to start, one field per section. See the README for each option's
/// meaning, default and environment variable.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[node]`: the node's identity, addresses, secret, contacts and local buffers.
    pub node: NodeConfig,
    /// `[transport]`: lanes, channels, outbound queues, frames, heartbeats, redials, handshakes.
    pub transport: TransportConfig,
    /// `[overlay]`: which overlay decides the connections and membership, with its options.
    pub overlay: OverlayConfig,
    /// `[broadcast]`: member heartbeats, routing and topic subscriptions, above the overlay.
    pub broadcast: BroadcastConfig,
    /// `[services]`: the cluster services (global names).
    pub services: ServicesConfig,
}

/// `[node]`: the node's identity, addresses, secret, contacts and local buffers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// The node's name, unique in the cluster (1–255 bytes).
    pub name: String,
    /// The address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// The address of the admin HTTP endpoint (`/status`, `/metrics`, `/ping`); none means no
    /// endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<SocketAddr>,
    /// A secret every admin request must carry (`Authorization: Bearer <token>`); none means
    /// no check. Required when `admin` is not a loopback address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<String>,
    /// The cluster secret; both ends of every connection must know it (not empty; the default
    /// is refused unless the node listens on a loopback address).
    pub cookie: String,
    /// Full mesh, peer-to-peer, client-server: contacts joined at start, each retried with
    /// backoff until it answers; static: the fixed peers, redialed every
    /// `transport.reconnect_max_ms` while down.
    pub peers: Vec<SocketAddr>,
    /// Messages a mailbox holds before senders wait (or `try_send` fails).
    pub mailbox_capacity: usize,
    /// Membership events buffered for each subscriber before it lags.
    pub event_buffer: usize,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            name: "maquis".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: None,
            admin_token: None,
            cookie: DEFAULT_COOKIE.into(),
            peers: Vec::new(),
            mailbox_capacity: 1024,
            event_buffer: 1024,
        }
    }
}

impl NodeConfig {
    /// Checks this section's ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() || self.name.len() > 255 {
            return Err(invalid("node.name", "must be 1 to 255 bytes"));
        }
        if self.cookie.is_empty() {
            return Err(invalid("node.cookie", "must not be empty"));
        }
        if self.cookie == DEFAULT_COOKIE && !self.listen.ip().is_loopback() {
            return Err(invalid(
                "node.cookie",
                format!(
                    "the default cookie is refused on {}, which is not a loopback address: \
                     anyone who can reach the node would know it; set node.cookie \
                     (MAQUIS_NODE_COOKIE, --cookie) to a secret the cluster shares",
                    self.listen
                ),
            ));
        }
        if self.admin_token.as_deref() == Some("") {
            return Err(invalid("node.admin_token", "must not be empty when set"));
        }
        if let Some(admin) = self.admin {
            if !admin.ip().is_loopback() && self.admin_token.is_none() {
                return Err(invalid(
                    "node.admin_token",
                    format!(
                        "required when the admin endpoint listens on {admin}, which is not a \
                         loopback address: set node.admin_token (MAQUIS_NODE_ADMIN_TOKEN)"
                    ),
                ));
            }
        }
        if self.mailbox_capacity == 0 {
            return Err(invalid("node.mailbox_capacity", "must be at least 1"));
        }
        if self.event_buffer == 0 {
            return Err(invalid("node.event_buffer", "event buffer must be > 0"));
        }
        Ok(())
    }
}

/// `[transport]`: lanes, channels, outbound queues, frames, heartbeats, redials, handshakes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransportConfig {
    /// Lanes (TCP connections) per peer for every channel that does not set its own (1–1024);
    /// `membership` always has 1.
    pub parallelism: u16,
    /// Without a partition key, pick the lane by hash(sender, receiver); off: round robin
    /// (`on`/`off`, `yes`/`no` and `1`/`0` are accepted too).
    #[serde(deserialize_with = "de_switch")]
    pub affinity: bool,
    /// Named channels besides `default` and `membership`, each `{ name = "vnode", parallelism =
    /// 16 }` or `"vnode:16"` (no lane count: `parallelism`); an entry named `default` sets the
    /// default channel's lane count; `membership` is reserved.
    #[serde(deserialize_with = "de_channels")]
    pub channels: Vec<ChannelConfig>,
    /// Bytes a lane's outbound queue holds before senders wait (1 KiB–4 GiB).
    pub lane_queue_bytes: usize,
    /// Bytes the outbound queues of all lanes of the node hold together before senders wait
    /// (1 KiB–4 GiB): the bound on queued outbound data whatever the number of peers.
    pub node_queue_bytes: usize,
    /// Largest frame sent or accepted; larger frames close the connection (1 KiB–4 GiB).
    pub max_frame_bytes: usize,
    /// A frame larger than this goes in parts of this many bytes, and the lane writes other
    /// frames between them: a small message waits behind at most about one part of a large
    /// one (4 KiB–4 GiB; at `max_frame_bytes` or more, no frame is cut). Only the sender's
    /// setting counts.
    pub part_bytes: usize,
    /// On a channel of several lanes, a frame of at least this many bytes is striped: cut
    /// into parts of `part_bytes`, spread over the channel's lanes but its first, and put back
    /// in order by a small commit on the first lane, which carries every smaller frame of the
    /// channel (so small messages are batched as on one connection, and one large message
    /// gets the bandwidth of all the lanes). `0` turns striping off: lanes are picked by key
    /// for every frame, as PARTISAN does (else at least 4 KiB). Only the sender's setting
    /// counts.
    pub stripe_bytes: usize,
    /// Bytes of striped frames a peer may have sent to this node and not yet had handed on
    /// (this node's window, which it announces to every peer): the most this node holds of a
    /// peer's striped frames. It must cover what one round trip keeps in flight to a peer, or
    /// large messages wait for it (at least twice `max_frame_bytes`, at most 8 GiB). Only the
    /// receiver's setting counts.
    pub stripe_window_bytes: usize,
    /// How many bytes written to a lane's socket but not yet sent the kernel holds before the
    /// lane's writer waits (`TCP_NOTSENT_LOWAT`, Linux; 0 leaves the kernel's default, which
    /// holds up to the whole send buffer). Less lets a small frame wait less behind a large
    /// one's bytes already handed to the kernel; more saves wake-ups on fast links (at most
    /// 2 GiB).
    pub unsent_bytes: usize,
    /// Heartbeat period on the membership lane, in milliseconds: a peer this node wrote
    /// nothing to since the last period gets a heartbeat, so every peer hears from it at least
    /// every two periods.
    pub heartbeat_interval_ms: u64,
    /// A peer silent this long is declared down, in milliseconds (at least three intervals).
    pub heartbeat_timeout_ms: u64,
    /// First redial delay, in milliseconds; doubles after each failure.
    pub reconnect_min_ms: u64,
    /// Largest redial delay, in milliseconds; also the period at which the overlays retry down
    /// or missing peers.
    pub reconnect_max_ms: u64,
    /// A handshake that takes longer is aborted (both roles), in milliseconds.
    pub handshake_timeout_ms: u64,
    /// Incoming handshakes in progress at once; more connections are closed at once.
    pub max_pending_handshakes: usize,
    /// Incoming handshakes in progress at once from one IP address (at most
    /// `max_pending_handshakes`); more from it are closed at once, so that one source cannot
    /// hold every slot.
    pub max_pending_handshakes_per_source: usize,
    /// An incoming connection that has not proved the cookie within this is closed, in
    /// milliseconds (at most `handshake_timeout_ms`); with `tls`, the TLS handshake counts
    /// in it.
    pub unauthenticated_timeout_ms: u64,
    /// Mutual TLS on every lane (`on`/`off` as for `affinity`): each node presents
    /// `tls_cert` and requires the other's certificate to chain to `tls_ca` and to name the
    /// node it says it is; the cookie handshake then runs inside TLS. Every node of a cluster
    /// must agree.
    #[serde(deserialize_with = "de_switch")]
    pub tls: bool,
    /// The node's certificate chain, PEM (its own certificate first, then any
    /// intermediates); it must name `node.name` as a DNS subject alternative name, chain to
    /// `tls_ca` and allow both server and client authentication. Required with `tls`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert`, PEM (PKCS#8, PKCS#1 or SEC1). Required with `tls`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    /// The CA certificates, PEM, that every peer's certificate must chain to. Required with
    /// `tls`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_ca: Option<PathBuf>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            parallelism: 1,
            affinity: true,
            channels: Vec::new(),
            lane_queue_bytes: 8 * 1024 * 1024,
            node_queue_bytes: 512 * 1024 * 1024,
            max_frame_bytes: crate::wire::frame::DEFAULT_MAX_FRAME,
            part_bytes: crate::wire::PART_BYTES,
            stripe_bytes: 256 * 1024,
            stripe_window_bytes: 256 * 1024 * 1024,
            unsent_bytes: 1024 * 1024,
            heartbeat_interval_ms: 500,
            heartbeat_timeout_ms: 3000,
            reconnect_min_ms: 50,
            reconnect_max_ms: 2000,
            handshake_timeout_ms: 5000,
            max_pending_handshakes: 128,
            max_pending_handshakes_per_source: 32,
            unauthenticated_timeout_ms: 1000,
            tls: false,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
        }
    }
}

/// One resolved channel: its name, lane count and where its lanes start in a peer's lane table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChannelSpec {
    /// The channel's name.
    pub name: String,
    /// Lanes per peer.
    pub parallelism: u16,
    /// Index of the channel's first lane in a peer's lane table.
    pub offset: usize,
}

impl TransportConfig {
    /// Checks this section's ranges and the channel table.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.parallelism == 0 || self.parallelism > 1024 {
            return Err(invalid("transport.parallelism", "must be 1 to 1024"));
        }
        if self.lane_queue_bytes < 1024 || self.lane_queue_bytes > u32::MAX as usize {
            return Err(invalid(
                "transport.lane_queue_bytes",
                "must be 1 KiB to 4 GiB",
            ));
        }
        if self.node_queue_bytes < 1024 || self.node_queue_bytes > u32::MAX as usize {
            return Err(invalid(
                "transport.node_queue_bytes",
                "must be 1 KiB to 4 GiB",
            ));
        }
        if self.max_frame_bytes < 1024 || self.max_frame_bytes > (u32::MAX as usize) {
            return Err(invalid(
                "transport.max_frame_bytes",
                "must be 1 KiB to 4 GiB",
            ));
        }
        if self.part_bytes < 4096 || self.part_bytes > (u32::MAX as usize) {
            return Err(invalid("transport.part_bytes", "must be 4 KiB to 4 GiB"));
        }
        if self.stripe_bytes != 0 && self.stripe_bytes < 4096 {
            return Err(invalid(
                "transport.stripe_bytes",
                "must be 0 (no striping) or at least 4 KiB",
            ));
        }
        if self.stripe_window_bytes < self.max_frame_bytes.saturating_mul(2)
            || self.stripe_window_bytes as u64 > 8 << 30
        {
            return Err(invalid(
                "transport.stripe_window_bytes",
                "must be at least twice transport.max_frame_bytes (so that any frame fits) and at most 8 GiB",
            ));
        }
        if self.unsent_bytes > i32::MAX as usize {
            return Err(invalid(
                "transport.unsent_bytes",
                "must be at most 2 GiB (0: the kernel's default)",
            ));
        }
        if self.heartbeat_interval_ms == 0
            || self.heartbeat_timeout_ms < self.heartbeat_interval_ms.saturating_mul(3)
        {
            return Err(invalid(
                "transport.heartbeat_timeout_ms",
                "interval must be > 0 and the timeout at least three intervals (a peer hears from a node at least every two)",
            ));
        }
        if self.reconnect_min_ms == 0 || self.reconnect_max_ms < self.reconnect_min_ms {
            return Err(invalid(
                "transport.reconnect_max_ms",
                "need 0 < reconnect_min_ms <= reconnect_max_ms",
            ));
        }
        if self.handshake_timeout_ms == 0 || self.max_pending_handshakes == 0 {
            return Err(invalid(
                "transport.handshake_timeout_ms",
                "handshake limits must be > 0",
            ));
        }
        let per_source = self.max_pending_handshakes_per_source;
        if per_source == 0 || per_source > self.max_pending_handshakes {
            return Err(invalid(
                "transport.max_pending_handshakes_per_source",
                "must be 1 to transport.max_pending_handshakes",
            ));
        }
        let unauth = self.unauthenticated_timeout_ms;
        if unauth == 0 || unauth > self.handshake_timeout_ms {
            return Err(invalid(
                "transport.unauthenticated_timeout_ms",
                "must be 1 to transport.handshake_timeout_ms",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for c in &self.channels {
            if c.name.is_empty() || c.name.len() > 64 {
                return Err(invalid(
                    "transport.channels",
                    "a channel name must be 1 to 64 bytes",
                ));
            }
            if c.name == MEMBERSHIP_CHANNEL {
                return Err(invalid(
                    "transport.channels",
                    "membership is reserved for overlay traffic",
                ));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(invalid(
                    "transport.channels",
                    format!("channel {:?} listed twice", c.name),
                ));
            }
            if matches!(c.parallelism, Some(0)) || c.parallelism.unwrap_or(1) > 1024 {
                return Err(invalid(
                    "transport.channels",
                    "a channel's parallelism must be 1 to 1024",
                ));
            }
        }
        Ok(())
    }

    /// The resolved channel table: `membership` (1 lane) first, then `default`, then the named
    /// ones.
    pub(crate) fn channel_specs(&self) -> Vec<ChannelSpec> {
        let mut specs = vec![ChannelSpec {
            name: MEMBERSHIP_CHANNEL.into(),
            parallelism: 1,
            offset: 0,
        }];
        let mut push = |name: &str, p: u16| {
            let offset = specs
                .last()
                .map(|s| s.offset + s.parallelism as usize)
                .unwrap_or(0);
            specs.push(ChannelSpec {
                name: name.into(),
                parallelism: p,
                offset,
            });
        };
        let default_p = self
            .channels
            .iter()
            .find(|c| c.name == DEFAULT_CHANNEL)
            .and_then(|c| c.parallelism)
            .unwrap_or(self.parallelism);
        push(DEFAULT_CHANNEL, default_p);
        for c in self.channels.iter().filter(|c| c.name != DEFAULT_CHANNEL) {
            push(&c.name, c.parallelism.unwrap_or(self.parallelism));
        }
        specs
    }

    /// The heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }

    /// The heartbeat timeout.
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.heartbeat_timeout_ms)
    }
}

/// A named channel and how many parallel lanes (TCP connections) it has to each peer.
///
/// In TOML and the environment it is a table `{ name = "vnode", parallelism = 16 }` or the short
/// form `"vnode:16"` (or `"gossip"`, which takes `transport.parallelism`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    /// The channel's name.
    pub name: String,
    /// Lanes per peer; `None` takes `transport.parallelism`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<u16>,
}

/// A channel list entry, as a table or in the short form `name[:lanes]`.
struct ChannelEntry(ChannelConfig);

impl<'de> Deserialize<'de> for ChannelEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ChannelEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a channel: \"name\", \"name:lanes\" or { name, parallelism }")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ChannelEntry, E> {
                parse_channel(v).map(ChannelEntry).map_err(E::custom)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ChannelEntry, A::Error> {
                ChannelConfig::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ChannelEntry)
            }
        }
        d.deserialize_any(V)
    }
}

fn de_channels<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ChannelConfig>, D::Error> {
    let entries = Vec::<ChannelEntry>::deserialize(d)?;
    Ok(entries.into_iter().map(|e| e.0).collect())
}

/// A switch: a boolean, or `on`/`off`, `yes`/`no`, `true`/`false`, `1`/`0`.
fn de_switch<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("on or off")
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<bool, E> {
            match v {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(E::custom(format!("{v}: expected on or off"))),
            }
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<bool, E> {
            self.visit_i64(v.min(2) as i64)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            switch(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V)
}

/// The overlay: `[overlay]` with `kind` and that overlay's options (options of another overlay
/// are an error that names both).
///
/// Without `kind` the overlay is the default one (full mesh). [`OverlayKind`] converts into
/// the overlay with its default options, and so does each options struct with its values:
/// `Config::new("n1").overlay(OverlayKind::PeerToPeer)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum OverlayConfig {
    /// Connections only to `node.peers` and to nodes joined explicitly; no gossip.
    Static,
    /// Everyone connects to everyone; membership spreads by gossip.
    FullMesh(FullMeshOptions),
    /// HyParView partial views (a few neighbours each) with Plumtree broadcast; members are
    /// learned from heartbeats, and sends to non-neighbours are routed hop by hop. `hyparview`
    /// is accepted as another name.
    #[serde(rename = "peer-to-peer")]
    PeerToPeer(PeerToPeerOptions),
    /// Servers in a full mesh, each client connected to `servers_per_client` servers only;
    /// every node knows every member, and a message between two clients is relayed by a
    /// server.
    ClientServer(ClientServerOptions),
}

impl Default for OverlayConfig {
    fn default() -> Self {
        OverlayConfig::FullMesh(FullMeshOptions::default())
    }
}

impl From<OverlayKind> for OverlayConfig {
    /// The overlay with its default options.
    fn from(kind: OverlayKind) -> Self {
        match kind {
            OverlayKind::Static => OverlayConfig::Static,
            OverlayKind::FullMesh => OverlayConfig::FullMesh(FullMeshOptions::default()),
            OverlayKind::PeerToPeer => OverlayConfig::PeerToPeer(PeerToPeerOptions::default()),
            OverlayKind::ClientServer => {
                OverlayConfig::ClientServer(ClientServerOptions::default())
            }
        }
    }
}

impl From<FullMeshOptions> for OverlayConfig {
    fn from(o: FullMeshOptions) -> Self {
        OverlayConfig::FullMesh(o)
    }
}

impl From<PeerToPeerOptions> for OverlayConfig {
    fn from(o: PeerToPeerOptions) -> Self {
        OverlayConfig::PeerToPeer(o)
    }
}

impl From<ClientServerOptions> for OverlayConfig {
    fn from(o: ClientServerOptions) -> Self {
        OverlayConfig::ClientServer(o)
    }
}

impl OverlayConfig {
    /// Which overlay this is.
    pub fn kind(&self) -> OverlayKind {
        match self {
            OverlayConfig::Static => OverlayKind::Static,
            OverlayConfig::FullMesh(_) => OverlayKind::FullMesh,
            OverlayConfig::PeerToPeer(_) => OverlayKind::PeerToPeer,
            OverlayConfig::ClientServer(_) => OverlayKind::ClientServer,
        }
    }

    /// Selects `kind`: with its default options when it is another overlay, keeping the
    /// options when it is this one.
    pub fn switch_to(&mut self, kind: OverlayKind) {
        if self.kind() != kind {
            *self = kind.into();
        }
    }

    /// The full-mesh options, if this is the full mesh.
    pub fn full_mesh(&self) -> Option<&FullMeshOptions> {
        match self {
            OverlayConfig::FullMesh(o) => Some(o),
            _ => None,
        }
    }

    /// The peer-to-peer options, if this is the peer-to-peer overlay.
    pub fn peer_to_peer(&self) -> Option<&PeerToPeerOptions> {
        match self {
            OverlayConfig::PeerToPeer(o) => Some(o),
            _ => None,
        }
    }

    /// The client-server options, if this is the client-server overlay.
    pub fn client_server(&self) -> Option<&ClientServerOptions> {
        match self {
            OverlayConfig::ClientServer(o) => Some(o),
            _ => None,
        }
    }

    /// The client-server options to change, if this is the client-server overlay.
    pub fn client_server_mut(&mut self) -> Option<&mut ClientServerOptions> {
        match self {
            OverlayConfig::ClientServer(o) => Some(o),
            _ => None,
        }
    }

    /// Checks the options' ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            OverlayConfig::Static => Ok(()),
            OverlayConfig::FullMesh(o) => o.validate(),
            OverlayConfig::PeerToPeer(o) => o.validate(),
            OverlayConfig::ClientServer(o) => o.validate(),
        }
    }
}

impl<'de> Deserialize<'de> for OverlayConfig {
    /// Reads `kind` (the default overlay when absent), refuses options of other overlays by
    /// name, then reads the chosen overlay's options.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use de::Error as _;
        let mut table = toml::Table::deserialize(d)?;
        let kind = match table.remove("kind") {
            None => OverlayConfig::default().kind(),
            Some(toml::Value::String(s)) => s.parse::<OverlayKind>().map_err(D::Error::custom)?,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "overlay.kind: expected a string, found {other}"
                )))
            }
        };
        keys::check_overlay_options(kind, table.keys()).map_err(D::Error::custom)?;
        let rest = toml::Value::Table(table);
        let options = match kind {
            OverlayKind::Static => Ok(OverlayConfig::Static),
            OverlayKind::FullMesh => FullMeshOptions::deserialize(rest).map(Into::into),
            OverlayKind::PeerToPeer => PeerToPeerOptions::deserialize(rest).map(Into::into),
            OverlayKind::ClientServer => ClientServerOptions::deserialize(rest).map(Into::into),
        };
        options.map_err(|e| D::Error::custom(e.to_string().trim_end().replace('\n', " ")))
    }
}

/// Options of the full-mesh overlay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FullMeshOptions {
    /// Period of the anti-entropy gossip to one peer, in milliseconds.
    pub gossip_interval_ms: u64,
}

impl Default for FullMeshOptions {
    fn default() -> Self {
        FullMeshOptions {
            gossip_interval_ms: 2000,
        }
    }
}

impl FullMeshOptions {
    /// Checks the options' ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.gossip_interval_ms == 0 {
            return Err(invalid(
                "overlay.gossip_interval_ms",
                "gossip interval must be > 0",
            ));
        }
        Ok(())
    }

    /// The gossip period.
    pub fn gossip_interval(&self) -> Duration {
        Duration::from_millis(self.gossip_interval_ms)
    }
}

/// Options of the peer-to-peer overlay (HyParView). The defaults are [`HyParViewConfig`]'s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeerToPeerOptions {
    /// Active view size: neighbours, each with an open connection (1–1024).
    pub active_size: usize,
    /// Passive view size: identities kept in reserve (1–65536).
    pub passive_size: usize,
    /// Active random walk length (ARWL) of a join (1–32).
    pub arwl: u8,
    /// Passive random walk length (PRWL) of a join, at most `arwl`.
    pub prwl: u8,
    /// Active-view identities a shuffle carries (at most 1024).
    pub shuffle_active: usize,
    /// Passive-view identities a shuffle carries (at most 1024).
    pub shuffle_passive: usize,
    /// Shuffle period (also the period at which the active view is topped up), in milliseconds.
    pub shuffle_period_ms: u64,
}

impl Default for PeerToPeerOptions {
    fn default() -> Self {
        let hv = HyParViewConfig::default();
        PeerToPeerOptions {
            active_size: hv.active_size,
            passive_size: hv.passive_size,
            arwl: hv.arwl,
            prwl: hv.prwl,
            shuffle_active: hv.shuffle_active,
            shuffle_passive: hv.shuffle_passive,
            shuffle_period_ms: ms(hv.shuffle_period),
        }
    }
}

impl PeerToPeerOptions {
    /// Checks the options' ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.active_size == 0 || self.active_size > 1024 {
            return Err(invalid("overlay.active_size", "must be 1 to 1024"));
        }
        if self.passive_size == 0 || self.passive_size > 65_536 {
            return Err(invalid("overlay.passive_size", "must be 1 to 65536"));
        }
        if self.arwl == 0 || self.arwl > 32 {
            return Err(invalid("overlay.arwl", "must be 1 to 32"));
        }
        if self.prwl > self.arwl {
            return Err(invalid("overlay.prwl", "must be at most overlay.arwl"));
        }
        if self.shuffle_active > 1024 || self.shuffle_passive > 1024 {
            return Err(invalid(
                "overlay.shuffle_active",
                "shuffle sizes must be at most 1024",
            ));
        }
        if self.shuffle_period_ms == 0 {
            return Err(invalid("overlay.shuffle_period_ms", "must be > 0"));
        }
        Ok(())
    }

    /// The HyParView parameters (the shuffle's walk as long as a join's, the rest
    /// [`HyParViewConfig`]'s defaults).
    pub fn hyparview(&self) -> HyParViewConfig {
        HyParViewConfig {
            active_size: self.active_size,
            passive_size: self.passive_size,
            arwl: self.arwl,
            prwl: self.prwl,
            shuffle_ttl: self.arwl,
            shuffle_active: self.shuffle_active,
            shuffle_passive: self.shuffle_passive,
            shuffle_period: Duration::from_millis(self.shuffle_period_ms),
            ..HyParViewConfig::default()
        }
    }
}

/// Options of the client-server overlay. The defaults are [`ClientServerConfig`]'s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientServerOptions {
    /// This node's role: `server` or `client`.
    #[serde(deserialize_with = "de_role")]
    pub role: Role,
    /// Servers a client connects to (1–16).
    pub servers_per_client: usize,
    /// Period at which a server sends the membership records that changed, batched, to its
    /// neighbours, in milliseconds.
    pub sync_interval_ms: u64,
    /// Anti-entropy period (a server's whole state to one server and one client; a client tops
    /// up its servers), in milliseconds.
    pub gossip_interval_ms: u64,
}

impl Default for ClientServerOptions {
    fn default() -> Self {
        let cs = ClientServerConfig::default();
        ClientServerOptions {
            role: cs.role,
            servers_per_client: cs.servers_per_client,
            sync_interval_ms: ms(cs.sync_interval),
            gossip_interval_ms: ms(cs.gossip_interval),
        }
    }
}

/// A role, in any case (`server`, `Client`).
fn de_role<'de, D: Deserializer<'de>>(d: D) -> Result<Role, D::Error> {
    String::deserialize(d)?
        .parse()
        .map_err(<D::Error as de::Error>::custom)
}

impl ClientServerOptions {
    /// Checks the options' ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let k = self.servers_per_client;
        if k == 0 || k > MAX_SERVERS_PER_CLIENT {
            return Err(invalid(
                "overlay.servers_per_client",
                format!("must be 1 to {MAX_SERVERS_PER_CLIENT}"),
            ));
        }
        if self.sync_interval_ms == 0 {
            return Err(invalid("overlay.sync_interval_ms", "must be > 0"));
        }
        if self.gossip_interval_ms == 0 {
            return Err(invalid("overlay.gossip_interval_ms", "must be > 0"));
        }
        Ok(())
    }

    /// The parameters of the client-server machine.
    pub fn client_server(&self) -> ClientServerConfig {
        ClientServerConfig {
            role: self.role,
            servers_per_client: self.servers_per_client,
            sync_interval: Duration::from_millis(self.sync_interval_ms),
            gossip_interval: Duration::from_millis(self.gossip_interval_ms),
            seed: None,
        }
    }
}

/// `[broadcast]`: the membership and broadcast layer above the overlay: member heartbeats
/// (peer-to-peer), routing of sends to non-neighbours, topic subscriptions. The defaults are
/// the membership machine's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BroadcastConfig {
    /// Peer-to-peer: period of each node's broadcast heartbeat (members and routes are learned
    /// from them), in milliseconds; keep nodes ÷ period near 100 a second or below.
    pub member_heartbeat_ms: u64,
    /// A member not heard from for this long is dropped from the members (`Down`), in
    /// milliseconds.
    pub member_timeout_ms: u64,
    /// Peer-to-peer: a member accused of being down (a neighbour lost its connection to it
    /// without a goodbye) is declared down after this long unless it is heard from (suspicions
    /// ending close together are judged together: up to a quarter of this later), in
    /// milliseconds; 0: nobody is accused (a member goes when `member_timeout_ms` passes
    /// without its heartbeat).
    pub suspicion_ms: u64,
    /// Routed messages are dropped after this many hops (routes follow the heartbeat trees,
    /// 20–30 hops deep at 200–1,000 nodes in the simulator).
    pub hop_limit: u16,
    /// Broadcast messages a topic subscription buffers; when it is full the oldest is dropped
    /// (and counted).
    pub subscription_capacity: usize,
}

impl Default for BroadcastConfig {
    fn default() -> Self {
        let m = MembershipConfig::default();
        BroadcastConfig {
            member_heartbeat_ms: ms(m.plumtree.heartbeat_every),
            member_timeout_ms: ms(m.member_timeout),
            suspicion_ms: ms(m.suspicion),
            hop_limit: DEFAULT_HOP_LIMIT,
            subscription_capacity: 1024,
        }
    }
}

impl BroadcastConfig {
    /// Checks this section's ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.member_heartbeat_ms == 0 || self.member_timeout_ms <= self.member_heartbeat_ms {
            return Err(invalid(
                "broadcast.member_timeout_ms",
                "member_heartbeat_ms must be > 0 and member_timeout_ms larger",
            ));
        }
        if self.hop_limit == 0 {
            return Err(invalid("broadcast.hop_limit", "must be at least 1"));
        }
        if self.suspicion_ms >= self.member_timeout_ms {
            return Err(invalid(
                "broadcast.suspicion_ms",
                "must be below member_timeout_ms",
            ));
        }
        if self.subscription_capacity == 0 {
            return Err(invalid(
                "broadcast.subscription_capacity",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// How long an accused member is suspected.
    pub fn suspicion(&self) -> Duration {
        Duration::from_millis(self.suspicion_ms)
    }

    /// How long a member whose heartbeats stopped stays a member.
    pub fn member_timeout(&self) -> Duration {
        Duration::from_millis(self.member_timeout_ms)
    }

    /// The Plumtree parameters broadcast runs with (member heartbeats and route lifetime from
    /// this section, the rest Plumtree's defaults).
    pub(crate) fn plumtree(&self) -> crate::broadcast::PlumtreeConfig {
        crate::broadcast::PlumtreeConfig {
            heartbeat_every: Duration::from_millis(self.member_heartbeat_ms),
            route_ttl: Duration::from_millis(self.member_timeout_ms),
            ..crate::broadcast::PlumtreeConfig::default()
        }
    }
}

/// Which overlay decides the node's connections and membership: the `kind` of `[overlay]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OverlayKind {
    /// Connections only to the configured `node.peers` and to nodes joined explicitly.
    Static,
    /// Everyone connects to everyone; membership spreads by gossip.
    FullMesh,
    /// HyParView partial views with Plumtree broadcast and routed sends (`hyparview` is
    /// accepted as another name).
    #[serde(rename = "peer-to-peer", alias = "hyparview")]
    PeerToPeer,
    /// Servers in a full mesh, clients connected to a few servers only.
    ClientServer,
}

impl OverlayKind {
    /// Every overlay, in the order the README lists them.
    pub const ALL: [OverlayKind; 4] = [
        OverlayKind::Static,
        OverlayKind::FullMesh,
        OverlayKind::PeerToPeer,
        OverlayKind::ClientServer,
    ];

    /// The name used in configuration and `/status`.
    pub fn as_str(&self) -> &'static str {
        match self {
            OverlayKind::Static => "static",
            OverlayKind::FullMesh => "full-mesh",
            OverlayKind::PeerToPeer => "peer-to-peer",
            OverlayKind::ClientServer => "client-server",
        }
    }
}

impl std::fmt::Display for OverlayKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for OverlayKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "static" => Ok(OverlayKind::Static),
            "full-mesh" | "fullmesh" | "full_mesh" => Ok(OverlayKind::FullMesh),
            "peer-to-peer" | "hyparview" => Ok(OverlayKind::PeerToPeer),
            "client-server" => Ok(OverlayKind::ClientServer),
            other => Err(invalid(
                "overlay.kind",
                format!(
                    "unknown overlay {other:?} (expected static, full-mesh, peer-to-peer or \
                     client-server)"
                ),
            )),
        }
    }
}

impl Config {
    /// A default configuration with the given node name.
    pub fn new(name: impl Into<String>) -> Self {
        let mut c = Config::default();
        c.node.name = name.into();
        c
    }

    /// Sets the listen address.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.node.listen = addr;
        self
    }

    /// Sets the cluster secret.
    pub fn cookie(mut self, cookie: impl Into<String>) -> Self {
        self.node.cookie = cookie.into();
        self
    }

    /// Sets the overlay: an [`OverlayKind`] (with its default options) or an options struct.
    pub fn overlay(mut self, overlay: impl Into<OverlayConfig>) -> Self {
        self.overlay = overlay.into();
        self
    }

    /// Adds a peer address to connect to at start.
    pub fn peer(mut self, addr: SocketAddr) -> Self {
        self.node.peers.push(addr);
        self
    }

    /// Adds a named channel; `parallelism` `None` takes `transport.parallelism`.
    pub fn channel(mut self, name: impl Into<String>, parallelism: Option<u16>) -> Self {
        self.transport.channels.push(ChannelConfig {
            name: name.into(),
            parallelism,
        });
        self
    }

    /// Sets the node-wide parallelism (`transport.parallelism`).
    pub fn parallelism(mut self, n: u16) -> Self {
        self.transport.parallelism = n;
        self
    }

    /// Turns affinity on or off (`transport.affinity`).
    pub fn affinity(mut self, on: bool) -> Self {
        self.transport.affinity = on;
        self
    }

    /// Parses a TOML document (unknown keys are an error, and so are the keys of the flat layout
    /// of earlier versions, with the error naming where each one is now).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let file = |e: toml::de::Error| ConfigError::File(e.to_string());
        let table: toml::Table = toml::from_str(text).map_err(file)?;
        moved::check_toml(&table)?;
        toml::from_str(text).map_err(file)
    }

    /// Reads a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::File(format!("{}: {e}", path.display())))?;
        Config::from_toml(&text)
    }

    /// The configuration as TOML, every option written out (`node.admin` only when set).
    pub fn to_toml(&self) -> String {
        // Plain data of strings, numbers, booleans and arrays: it always serializes.
        toml::to_string(self).unwrap_or_default()
    }

    /// Checks ranges and names of every section, and with `transport.tls` reads and checks
    /// the TLS files; [`crate::Node::start`] calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.checked().map(|_| ())
    }

    /// [`Config::validate`], returning the TLS configuration `transport.tls` asks for.
    pub(crate) fn checked(&self) -> Result<Option<Tls>, ConfigError> {
        self.node.validate()?;
        self.transport.validate()?;
        self.overlay.validate()?;
        self.broadcast.validate()?;
        self.services.validate()?;
        self.load_tls()
    }

    /// The TLS configuration of the node, read from `transport.tls_cert`, `tls_key` and
    /// `tls_ca` (`None` when `transport.tls` is off).
    fn load_tls(&self) -> Result<Option<Tls>, ConfigError> {
        let t = &self.transport;
        if !t.tls {
            return Ok(None);
        }
        let required = |v: &Option<PathBuf>, key: &str, what| {
            v.clone().ok_or_else(|| ConfigError::TlsMissing {
                key: key.into(),
                what,
            })
        };
        let cert = required(
            &t.tls_cert,
            "transport.tls_cert",
            "the node's PEM certificate chain",
        )?;
        let key = required(&t.tls_key, "transport.tls_key", "its PEM private key")?;
        let ca = required(
            &t.tls_ca,
            "transport.tls_ca",
            "the PEM CA certificates peers must chain to",
        )?;
        if !crate::tls::is_certificate_name(&self.node.name) {
            return Err(invalid(
                "node.name",
                format!(
                    "{:?} is not a DNS name in lower case (letters, digits, '-' and '_', labels \
                     of at most 63 bytes joined by dots), which transport.tls needs: a \
                     certificate names its node by a DNS subject alternative name",
                    self.node.name
                ),
            ));
        }
        let paths = TlsPaths {
            cert: &cert,
            key: &key,
            ca: &ca,
        };
        Tls::load(&paths, &self.node.name).map(Some).map_err(
            |LoadError {
                 file,
                 path,
                 problem,
             }| {
                let key = match file {
                    TlsFile::Cert => "transport.tls_cert",
                    TlsFile::Key => "transport.tls_key",
                    TlsFile::Ca => "transport.tls_ca",
                };
                ConfigError::TlsFile {
                    key: key.into(),
                    path,
                    problem,
                }
            },
        )
    }
}

/// Parses `on`/`off` (also `true`/`false`, `1`/`0`, `yes`/`no`).
pub fn parse_switch(v: &str) -> Result<bool, ConfigError> {
    switch(v).map_err(|reason| invalid("transport.affinity", reason))
}

fn switch(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(format!("{v:?}: expected on or off")),
    }
}

/// Parses `a,b:4,c`: channel names, each optionally with its own parallelism.
pub fn parse_channels(v: &str) -> Result<Vec<ChannelConfig>, ConfigError> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse_channel(s).map_err(|reason| invalid("transport.channels", reason)))
        .collect()
}

/// Parses one channel in the short form: `name` or `name:lanes`.
fn parse_channel(s: &str) -> Result<ChannelConfig, String> {
    match s.split_once(':') {
        Some((name, p)) => Ok(ChannelConfig {
            name: name.trim().into(),
            parallelism: Some(
                p.trim()
                    .parse()
                    .map_err(|e| format!("{s:?}: lane count {p:?}: {e}"))?,
            ),
        }),
        None => Ok(ChannelConfig {
            name: s.trim().into(),
            parallelism: None,
        }),
    }
}
