//! Node configuration: a builder in code, a TOML file, environment overrides.
//!
//! Every option, its default and its environment variable are listed in the README's
//! configuration table. Precedence: builder/CLI flags over environment over file over defaults,
//! as applied by the caller ([`Config::from_toml`], then [`Config::apply_env`], then setters).

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::id::{DEFAULT_CHANNEL, MEMBERSHIP_CHANNEL};
use crate::membership::MembershipConfig;

/// A duration in whole milliseconds.
fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}
use crate::overlay::{ClientServerConfig, ParseRoleError, Role, MAX_SERVERS_PER_CLIENT};

/// Which overlay decides the node's connections and membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OverlayKind {
    /// Connections only to the configured `peers` and to nodes joined explicitly; no gossip.
    Static,
    /// Everyone connects to everyone; membership spreads by gossip.
    FullMesh,
    /// HyParView partial views (a few neighbours each) with Plumtree broadcast; members are
    /// learned from heartbeats, and sends to non-neighbours are routed hop by hop. `hyparview`
    /// is accepted as another name.
    #[serde(rename = "peer-to-peer", alias = "hyparview")]
    PeerToPeer,
    /// Servers in a full mesh, each client connected to `client_server_servers_per_client`
    /// servers only; every node knows every member, and a message between two clients is
    /// relayed by a server.
    ClientServer,
}

impl OverlayKind {
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

impl std::str::FromStr for OverlayKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "static" => Ok(OverlayKind::Static),
            "full-mesh" | "fullmesh" | "full_mesh" => Ok(OverlayKind::FullMesh),
            "peer-to-peer" | "hyparview" => Ok(OverlayKind::PeerToPeer),
            "client-server" => Ok(OverlayKind::ClientServer),
            other => Err(ConfigError::Invalid {
                key: "overlay",
                reason: format!(
                    "unknown overlay {other:?} (expected static, full-mesh, peer-to-peer or \
                     client-server)"
                ),
            }),
        }
    }
}

/// A named channel and how many parallel lanes (TCP connections) it has to each peer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    /// The channel's name.
    pub name: String,
    /// Lanes per peer; `None` takes the node-wide `parallelism`.
    #[serde(default)]
    pub parallelism: Option<u16>,
}

/// A bad configuration value.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A value is out of range or malformed.
    #[error("{key}: {reason}")]
    Invalid {
        /// The option's name.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The TOML file could not be parsed.
    #[error("config file: {0}")]
    File(String),
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// Everything a node needs to start. See the README for each option's meaning and default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The node's name, unique in the cluster.
    pub name: String,
    /// The address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Optional admin HTTP address serving `/status` and `/metrics`.
    pub admin: Option<SocketAddr>,
    /// The cluster secret; both ends of a connection must know it.
    pub cookie: String,
    /// The overlay.
    pub overlay: OverlayKind,
    /// Addresses to connect to at start (static overlay: the fixed peers; full-mesh: contacts).
    pub peers: Vec<SocketAddr>,
    /// Named channels besides `default` and `membership`.
    pub channels: Vec<ChannelConfig>,
    /// Lanes per peer for every channel that does not set its own (`membership` always has 1).
    pub parallelism: u16,
    /// Pick the lane by hash(sender, receiver) when a send has no partition key.
    pub affinity: bool,
    /// Messages a mailbox holds before senders wait (or `try_send` fails).
    pub mailbox_capacity: usize,
    /// Bytes a lane's outbound queue holds before senders wait (or `try_send` fails).
    pub lane_queue_bytes: usize,
    /// Bytes the outbound queues of all lanes of the node hold together before senders wait
    /// (or `try_send` fails): the bound on queued outbound data whatever the number of peers.
    pub node_queue_bytes: usize,
    /// Largest frame accepted or sent; larger frames close the connection.
    pub max_frame_bytes: usize,
    /// Heartbeat period on the membership channel, in milliseconds.
    pub heartbeat_interval_ms: u64,
    /// A peer silent for this long is declared down, in milliseconds.
    pub heartbeat_timeout_ms: u64,
    /// First reconnect delay, in milliseconds (doubles up to `reconnect_max_ms`).
    pub reconnect_min_ms: u64,
    /// Largest reconnect delay, in milliseconds.
    pub reconnect_max_ms: u64,
    /// A handshake that takes longer is aborted, in milliseconds.
    pub handshake_timeout_ms: u64,
    /// Handshakes in progress at once; further connections are closed at once.
    pub max_pending_handshakes: usize,
    /// Full-mesh anti-entropy gossip period, in milliseconds.
    pub gossip_interval_ms: u64,
    /// Membership events buffered for each subscriber before it lags.
    pub event_buffer: usize,
    /// Peer-to-peer overlay: active view size (neighbours with an open connection).
    pub hyparview_active_size: usize,
    /// Peer-to-peer overlay: passive view size (known identities kept in reserve).
    pub hyparview_passive_size: usize,
    /// Peer-to-peer overlay: active random walk length (ARWL) of a join.
    pub hyparview_arwl: u8,
    /// Peer-to-peer overlay: passive random walk length (PRWL), at most `hyparview_arwl`.
    pub hyparview_prwl: u8,
    /// Peer-to-peer overlay: active-view identities a shuffle carries.
    pub hyparview_shuffle_active: usize,
    /// Peer-to-peer overlay: passive-view identities a shuffle carries.
    pub hyparview_shuffle_passive: usize,
    /// Peer-to-peer overlay: shuffle period, in milliseconds.
    pub hyparview_shuffle_period_ms: u64,
    /// Peer-to-peer overlay: period of the heartbeat each node broadcasts (members and routes
    /// are learned from them), in milliseconds.
    pub member_heartbeat_ms: u64,
    /// Peer-to-peer overlay: a member whose heartbeats stopped for this long is dropped from
    /// the members (and reported down), in milliseconds.
    pub member_timeout_ms: u64,
    /// Peer-to-peer overlay: a routed message is dropped after this many hops.
    pub hop_limit: u16,
    /// Broadcast messages a topic subscription buffers; when it is full the oldest is dropped
    /// (and counted).
    pub subscription_capacity: usize,
    /// Client-server overlay: this node's role, `server` or `client`.
    pub client_server_role: Role,
    /// Client-server overlay: how many servers a client connects to.
    pub client_server_servers_per_client: usize,
    /// Client-server overlay: how often a server sends the membership records that changed to
    /// its neighbours, batched, in milliseconds.
    pub client_server_sync_interval_ms: u64,
    /// Client-server overlay: anti-entropy period (a server's whole state to one server and
    /// one client; a client tops up its servers), in milliseconds.
    pub client_server_gossip_interval_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            name: "maquis".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: None,
            cookie: "maquis".into(),
            overlay: OverlayKind::FullMesh,
            peers: Vec::new(),
            channels: Vec::new(),
            parallelism: 1,
            affinity: true,
            mailbox_capacity: 1024,
            lane_queue_bytes: 8 * 1024 * 1024,
            node_queue_bytes: 512 * 1024 * 1024,
            max_frame_bytes: crate::wire::frame::DEFAULT_MAX_FRAME,
            heartbeat_interval_ms: 500,
            heartbeat_timeout_ms: 3000,
            reconnect_min_ms: 50,
            reconnect_max_ms: 2000,
            handshake_timeout_ms: 5000,
            max_pending_handshakes: 128,
            gossip_interval_ms: 2000,
            event_buffer: 1024,
            hyparview_active_size: 5,
            hyparview_passive_size: 30,
            hyparview_arwl: 6,
            hyparview_prwl: 3,
            hyparview_shuffle_active: 3,
            hyparview_shuffle_passive: 4,
            hyparview_shuffle_period_ms: 1000,
            member_heartbeat_ms: ms(MembershipConfig::default().plumtree.heartbeat_every),
            member_timeout_ms: ms(MembershipConfig::default().member_timeout),
            hop_limit: crate::membership::DEFAULT_HOP_LIMIT,
            subscription_capacity: 1024,
            client_server_role: Role::Server,
            client_server_servers_per_client: 1,
            client_server_sync_interval_ms: 100,
            client_server_gossip_interval_ms: 1000,
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

impl Config {
    /// A default configuration with the given node name.
    pub fn new(name: impl Into<String>) -> Self {
        Config {
            name: name.into(),
            ..Config::default()
        }
    }

    /// Sets the listen address.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Sets the admin address.
    pub fn admin(mut self, addr: SocketAddr) -> Self {
        self.admin = Some(addr);
        self
    }

    /// Sets the cluster secret.
    pub fn cookie(mut self, cookie: impl Into<String>) -> Self {
        self.cookie = cookie.into();
        self
    }

    /// Sets the overlay.
    pub fn overlay(mut self, overlay: OverlayKind) -> Self {
        self.overlay = overlay;
        self
    }

    /// Adds a peer address to connect to at start.
    pub fn peer(mut self, addr: SocketAddr) -> Self {
        self.peers.push(addr);
        self
    }

    /// Adds a named channel; `parallelism` `None` takes the node-wide value.
    pub fn channel(mut self, name: impl Into<String>, parallelism: Option<u16>) -> Self {
        self.channels.push(ChannelConfig {
            name: name.into(),
            parallelism,
        });
        self
    }

    /// Sets the node-wide parallelism.
    pub fn parallelism(mut self, n: u16) -> Self {
        self.parallelism = n;
        self
    }

    /// Turns affinity on or off.
    pub fn affinity(mut self, on: bool) -> Self {
        self.affinity = on;
        self
    }

    /// Sets the mailbox capacity.
    pub fn mailbox_capacity(mut self, n: usize) -> Self {
        self.mailbox_capacity = n;
        self
    }

    /// Sets the per-lane outbound queue limit in bytes.
    pub fn lane_queue_bytes(mut self, n: usize) -> Self {
        self.lane_queue_bytes = n;
        self
    }

    /// Sets the limit of the bytes queued on all lanes together.
    pub fn node_queue_bytes(mut self, n: usize) -> Self {
        self.node_queue_bytes = n;
        self
    }

    /// Sets the heartbeat interval and timeout.
    pub fn heartbeat(mut self, interval: Duration, timeout: Duration) -> Self {
        self.heartbeat_interval_ms = interval.as_millis() as u64;
        self.heartbeat_timeout_ms = timeout.as_millis() as u64;
        self
    }

    /// Sets the peer-to-peer overlay's view sizes (active, passive).
    pub fn hyparview_views(mut self, active: usize, passive: usize) -> Self {
        self.hyparview_active_size = active;
        self.hyparview_passive_size = passive;
        self
    }

    /// Sets the peer-to-peer overlay's member heartbeat period and member timeout.
    pub fn member_heartbeat(mut self, every: Duration, timeout: Duration) -> Self {
        self.member_heartbeat_ms = every.as_millis() as u64;
        self.member_timeout_ms = timeout.as_millis() as u64;
        self
    }

    /// Sets the client-server overlay's role of this node.
    pub fn client_server_role(mut self, role: Role) -> Self {
        self.client_server_role = role;
        self
    }

    /// Sets how many servers a client of the client-server overlay connects to.
    pub fn servers_per_client(mut self, n: usize) -> Self {
        self.client_server_servers_per_client = n;
        self
    }

    /// Sets the client-server overlay's sync and anti-entropy gossip periods.
    pub fn client_server_intervals(mut self, sync: Duration, gossip: Duration) -> Self {
        self.client_server_sync_interval_ms = sync.as_millis() as u64;
        self.client_server_gossip_interval_ms = gossip.as_millis() as u64;
        self
    }

    /// Sets how many broadcast messages a topic subscription buffers.
    pub fn subscription_capacity(mut self, n: usize) -> Self {
        self.subscription_capacity = n;
        self
    }

    /// Parses a TOML document (unknown keys are an error).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::File(e.to_string()))
    }

    /// Reads a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::File(format!("{}: {e}", path.display())))?;
        Config::from_toml(&text)
    }

    /// Applies `MAQUIS_*` environment variables (see the README).
    pub fn apply_env(self) -> Result<Config, ConfigError> {
        self.apply_vars(std::env::vars())
    }

    /// Applies `MAQUIS_*` overrides from an iterator of (name, value) pairs; names without the
    /// prefix are ignored, an unknown `MAQUIS_*` name is an error (as unknown TOML keys are).
    pub fn apply_vars(
        mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        for (key, value) in vars {
            let Some(opt) = key.strip_prefix("MAQUIS_") else {
                continue;
            };
            let v = value.trim();
            match opt {
                "NAME" => self.name = v.to_string(),
                "LISTEN" => self.listen = parse(v, "listen")?,
                "ADMIN" => self.admin = Some(parse(v, "admin")?),
                "COOKIE" => self.cookie = v.to_string(),
                "OVERLAY" => self.overlay = v.parse()?,
                "PEERS" => self.peers = parse_list(v, "peers")?,
                "CHANNELS" => self.channels = parse_channels(v)?,
                "PARALLELISM" => self.parallelism = parse(v, "parallelism")?,
                "AFFINITY" => self.affinity = parse_switch(v)?,
                "MAILBOX_CAPACITY" => self.mailbox_capacity = parse(v, "mailbox_capacity")?,
                "LANE_QUEUE_BYTES" => self.lane_queue_bytes = parse(v, "lane_queue_bytes")?,
                "NODE_QUEUE_BYTES" => self.node_queue_bytes = parse(v, "node_queue_bytes")?,
                "MAX_FRAME_BYTES" => self.max_frame_bytes = parse(v, "max_frame_bytes")?,
                "HEARTBEAT_INTERVAL_MS" => {
                    self.heartbeat_interval_ms = parse(v, "heartbeat_interval_ms")?
                }
                "HEARTBEAT_TIMEOUT_MS" => {
                    self.heartbeat_timeout_ms = parse(v, "heartbeat_timeout_ms")?
                }
                "RECONNECT_MIN_MS" => self.reconnect_min_ms = parse(v, "reconnect_min_ms")?,
                "RECONNECT_MAX_MS" => self.reconnect_max_ms = parse(v, "reconnect_max_ms")?,
                "HANDSHAKE_TIMEOUT_MS" => {
                    self.handshake_timeout_ms = parse(v, "handshake_timeout_ms")?
                }
                "MAX_PENDING_HANDSHAKES" => {
                    self.max_pending_handshakes = parse(v, "max_pending_handshakes")?
                }
                "GOSSIP_INTERVAL_MS" => self.gossip_interval_ms = parse(v, "gossip_interval_ms")?,
                "EVENT_BUFFER" => self.event_buffer = parse(v, "event_buffer")?,
                "HYPARVIEW_ACTIVE_SIZE" => {
                    self.hyparview_active_size = parse(v, "hyparview_active_size")?
                }
                "HYPARVIEW_PASSIVE_SIZE" => {
                    self.hyparview_passive_size = parse(v, "hyparview_passive_size")?
                }
                "HYPARVIEW_ARWL" => self.hyparview_arwl = parse(v, "hyparview_arwl")?,
                "HYPARVIEW_PRWL" => self.hyparview_prwl = parse(v, "hyparview_prwl")?,
                "HYPARVIEW_SHUFFLE_ACTIVE" => {
                    self.hyparview_shuffle_active = parse(v, "hyparview_shuffle_active")?
                }
                "HYPARVIEW_SHUFFLE_PASSIVE" => {
                    self.hyparview_shuffle_passive = parse(v, "hyparview_shuffle_passive")?
                }
                "HYPARVIEW_SHUFFLE_PERIOD_MS" => {
                    self.hyparview_shuffle_period_ms = parse(v, "hyparview_shuffle_period_ms")?
                }
                "MEMBER_HEARTBEAT_MS" => {
                    self.member_heartbeat_ms = parse(v, "member_heartbeat_ms")?
                }
                "MEMBER_TIMEOUT_MS" => self.member_timeout_ms = parse(v, "member_timeout_ms")?,
                "HOP_LIMIT" => self.hop_limit = parse(v, "hop_limit")?,
                "SUBSCRIPTION_CAPACITY" => {
                    self.subscription_capacity = parse(v, "subscription_capacity")?
                }
                "CLIENT_SERVER_ROLE" => {
                    self.client_server_role = v
                        .parse()
                        .map_err(|e: ParseRoleError| invalid("client_server_role", e.to_string()))?
                }
                "CLIENT_SERVER_SERVERS_PER_CLIENT" => {
                    self.client_server_servers_per_client =
                        parse(v, "client_server_servers_per_client")?
                }
                "CLIENT_SERVER_SYNC_INTERVAL_MS" => {
                    self.client_server_sync_interval_ms =
                        parse(v, "client_server_sync_interval_ms")?
                }
                "CLIENT_SERVER_GOSSIP_INTERVAL_MS" => {
                    self.client_server_gossip_interval_ms =
                        parse(v, "client_server_gossip_interval_ms")?
                }
                _ => {
                    return Err(ConfigError::Invalid {
                        key: "environment",
                        reason: format!("unknown variable {key} (a typo?)"),
                    })
                }
            }
        }
        Ok(self)
    }

    /// Checks ranges and names; [`crate::Node::start`] calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() || self.name.len() > 255 {
            return Err(invalid("name", "must be 1 to 255 bytes"));
        }
        if self.cookie.is_empty() {
            return Err(invalid("cookie", "must not be empty"));
        }
        if self.parallelism == 0 || self.parallelism > 1024 {
            return Err(invalid("parallelism", "must be 1 to 1024"));
        }
        if self.mailbox_capacity == 0 {
            return Err(invalid("mailbox_capacity", "must be at least 1"));
        }
        if self.lane_queue_bytes < 1024 || self.lane_queue_bytes > u32::MAX as usize {
            return Err(invalid("lane_queue_bytes", "must be 1 KiB to 4 GiB"));
        }
        if self.node_queue_bytes < 1024 || self.node_queue_bytes > u32::MAX as usize {
            return Err(invalid("node_queue_bytes", "must be 1 KiB to 4 GiB"));
        }
        if self.max_frame_bytes < 1024 || self.max_frame_bytes > (u32::MAX as usize) {
            return Err(invalid("max_frame_bytes", "must be 1 KiB to 4 GiB"));
        }
        if self.heartbeat_interval_ms == 0
            || self.heartbeat_timeout_ms <= self.heartbeat_interval_ms
        {
            return Err(invalid(
                "heartbeat_timeout_ms",
                "interval must be > 0 and timeout larger than the interval",
            ));
        }
        if self.reconnect_min_ms == 0 || self.reconnect_max_ms < self.reconnect_min_ms {
            return Err(invalid(
                "reconnect_max_ms",
                "need 0 < reconnect_min_ms <= reconnect_max_ms",
            ));
        }
        if self.handshake_timeout_ms == 0 || self.max_pending_handshakes == 0 {
            return Err(invalid(
                "handshake_timeout_ms",
                "handshake limits must be > 0",
            ));
        }
        if self.gossip_interval_ms == 0 || self.event_buffer == 0 {
            return Err(invalid(
                "gossip_interval_ms",
                "gossip interval and event buffer must be > 0",
            ));
        }
        self.validate_peer_to_peer()?;
        self.validate_client_server()?;
        let mut seen = std::collections::HashSet::new();
        for c in &self.channels {
            if c.name.is_empty() || c.name.len() > 64 {
                return Err(invalid("channels", "a channel name must be 1 to 64 bytes"));
            }
            if c.name == MEMBERSHIP_CHANNEL {
                return Err(invalid(
                    "channels",
                    "membership is reserved for overlay traffic",
                ));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(invalid(
                    "channels",
                    format!("channel {:?} listed twice", c.name),
                ));
            }
            if matches!(c.parallelism, Some(0)) || c.parallelism.unwrap_or(1) > 1024 {
                return Err(invalid(
                    "channels",
                    "a channel's parallelism must be 1 to 1024",
                ));
            }
        }
        Ok(())
    }

    fn validate_peer_to_peer(&self) -> Result<(), ConfigError> {
        if self.hyparview_active_size == 0 || self.hyparview_active_size > 1024 {
            return Err(invalid("hyparview_active_size", "must be 1 to 1024"));
        }
        if self.hyparview_passive_size == 0 || self.hyparview_passive_size > 65_536 {
            return Err(invalid("hyparview_passive_size", "must be 1 to 65536"));
        }
        if self.hyparview_arwl == 0 || self.hyparview_arwl > 32 {
            return Err(invalid("hyparview_arwl", "must be 1 to 32"));
        }
        if self.hyparview_prwl > self.hyparview_arwl {
            return Err(invalid("hyparview_prwl", "must be at most hyparview_arwl"));
        }
        if self.hyparview_shuffle_active > 1024 || self.hyparview_shuffle_passive > 1024 {
            return Err(invalid(
                "hyparview_shuffle_active",
                "shuffle sizes must be at most 1024",
            ));
        }
        if self.hyparview_shuffle_period_ms == 0 {
            return Err(invalid("hyparview_shuffle_period_ms", "must be > 0"));
        }
        if self.member_heartbeat_ms == 0 || self.member_timeout_ms <= self.member_heartbeat_ms {
            return Err(invalid(
                "member_timeout_ms",
                "member_heartbeat_ms must be > 0 and member_timeout_ms larger",
            ));
        }
        if self.hop_limit == 0 {
            return Err(invalid("hop_limit", "must be at least 1"));
        }
        if self.subscription_capacity == 0 {
            return Err(invalid("subscription_capacity", "must be at least 1"));
        }
        Ok(())
    }

    fn validate_client_server(&self) -> Result<(), ConfigError> {
        let k = self.client_server_servers_per_client;
        if k == 0 || k > MAX_SERVERS_PER_CLIENT {
            return Err(invalid(
                "client_server_servers_per_client",
                format!("must be 1 to {MAX_SERVERS_PER_CLIENT}"),
            ));
        }
        if self.client_server_sync_interval_ms == 0 {
            return Err(invalid("client_server_sync_interval_ms", "must be > 0"));
        }
        if self.client_server_gossip_interval_ms == 0 {
            return Err(invalid("client_server_gossip_interval_ms", "must be > 0"));
        }
        Ok(())
    }

    /// The parameters of the client-server overlay.
    pub fn client_server(&self) -> ClientServerConfig {
        ClientServerConfig {
            role: self.client_server_role,
            servers_per_client: self.client_server_servers_per_client,
            sync_interval: Duration::from_millis(self.client_server_sync_interval_ms),
            gossip_interval: Duration::from_millis(self.client_server_gossip_interval_ms),
            seed: None,
        }
    }

    /// The HyParView parameters of the peer-to-peer overlay.
    pub fn hyparview(&self) -> crate::overlay::HyParViewConfig {
        crate::overlay::HyParViewConfig {
            active_size: self.hyparview_active_size,
            passive_size: self.hyparview_passive_size,
            arwl: self.hyparview_arwl,
            prwl: self.hyparview_prwl,
            shuffle_ttl: self.hyparview_arwl,
            shuffle_active: self.hyparview_shuffle_active,
            shuffle_passive: self.hyparview_shuffle_passive,
            shuffle_period: Duration::from_millis(self.hyparview_shuffle_period_ms),
            ..crate::overlay::HyParViewConfig::default()
        }
    }

    /// The Plumtree parameters broadcast runs with (member heartbeats and route lifetime from
    /// this configuration, the rest Plumtree's defaults).
    pub(crate) fn plumtree(&self) -> crate::broadcast::PlumtreeConfig {
        crate::broadcast::PlumtreeConfig {
            heartbeat_every: Duration::from_millis(self.member_heartbeat_ms),
            route_ttl: Duration::from_millis(self.member_timeout_ms),
            ..crate::broadcast::PlumtreeConfig::default()
        }
    }

    /// The resolved channel table: `membership` (1 lane) first, then `default`, then the named ones.
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

fn parse<T: std::str::FromStr>(v: &str, key: &'static str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    v.parse::<T>()
        .map_err(|e| invalid(key, format!("{v:?}: {e}")))
}

fn parse_list<T: std::str::FromStr>(v: &str, key: &'static str) -> Result<Vec<T>, ConfigError>
where
    T::Err: std::fmt::Display,
{
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse(s, key))
        .collect()
}

/// Parses `on`/`off` (also `true`/`false`, `1`/`0`, `yes`/`no`).
pub fn parse_switch(v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(invalid("affinity", format!("{v:?}: expected on or off"))),
    }
}

/// Parses `a,b:4,c`: channel names, each optionally with its own parallelism.
pub fn parse_channels(v: &str) -> Result<Vec<ChannelConfig>, ConfigError> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.split_once(':') {
            Some((name, p)) => Ok(ChannelConfig {
                name: name.trim().into(),
                parallelism: Some(parse(p.trim(), "channels")?),
            }),
            None => Ok(ChannelConfig {
                name: s.into(),
                parallelism: None,
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_env_and_validation() {
        let c = Config::from_toml(
            "name = \"n1\"\nparallelism = 4\noverlay = \"static\"\n[[channels]]\nname = \"vnode\"\nparallelism = 16\n",
        )
        .unwrap();
        assert_eq!(c.name, "n1");
        assert_eq!(c.overlay, OverlayKind::Static);
        let c = c
            .apply_vars([
                ("MAQUIS_AFFINITY".to_string(), "off".to_string()),
                ("MAQUIS_CHANNELS".to_string(), "gossip,vnode:8".to_string()),
                ("OTHER".to_string(), "x".to_string()),
            ])
            .unwrap();
        assert!(!c.affinity);
        let specs = c.channel_specs();
        let names: Vec<_> = specs
            .iter()
            .map(|s| (s.name.as_str(), s.parallelism, s.offset))
            .collect();
        assert_eq!(
            names,
            vec![
                ("membership", 1, 0),
                ("default", 4, 1),
                ("gossip", 4, 5),
                ("vnode", 8, 9)
            ]
        );
        c.validate().unwrap();
        assert!(Config::from_toml("bogus = 1").is_err());
        assert!(Config::new("x").parallelism(0).validate().is_err());
        assert!(Config::new("x")
            .channel("membership", None)
            .validate()
            .is_err());
        assert!(Config::default()
            .apply_vars([("MAQUIS_PARALLELISM".to_string(), "many".to_string())])
            .is_err());
        assert!(Config::default()
            .apply_vars([("MAQUIS_PARALELISM".to_string(), "4".to_string())])
            .is_err());
        let c = Config::default()
            .apply_vars([("MAQUIS_NODE_QUEUE_BYTES".to_string(), "65536".to_string())])
            .unwrap();
        assert_eq!(c.node_queue_bytes, 65536);
        c.validate().unwrap();
        assert_eq!(Config::default().node_queue_bytes, 512 << 20);
        assert!(Config::default().node_queue_bytes(100).validate().is_err());
    }

    #[test]
    fn peer_to_peer_selection_and_parameters() {
        for name in ["peer-to-peer", "hyparview"] {
            let c = Config::from_toml(&format!(
                "overlay = \"{name}\"\nhyparview_active_size = 3\n"
            ))
            .unwrap();
            assert_eq!(c.overlay, OverlayKind::PeerToPeer);
            assert_eq!(c.hyparview().active_size, 3);
            assert_eq!(
                name.parse::<OverlayKind>().unwrap(),
                OverlayKind::PeerToPeer
            );
        }
        assert_eq!(OverlayKind::PeerToPeer.as_str(), "peer-to-peer");
        let err = Config::from_toml("overlay = \"gossip\"").unwrap_err();
        assert!(matches!(err, ConfigError::File(_)), "{err}");
        let err = "gossip".parse::<OverlayKind>().unwrap_err();
        assert!(err.to_string().contains("peer-to-peer"), "{err}");
        let c = Config::default()
            .apply_vars([
                ("MAQUIS_OVERLAY".to_string(), "hyparview".to_string()),
                ("MAQUIS_HYPARVIEW_PASSIVE_SIZE".to_string(), "6".to_string()),
                (
                    "MAQUIS_HYPARVIEW_SHUFFLE_PERIOD_MS".to_string(),
                    "250".to_string(),
                ),
                ("MAQUIS_HOP_LIMIT".to_string(), "8".to_string()),
                ("MAQUIS_MEMBER_TIMEOUT_MS".to_string(), "3000".to_string()),
            ])
            .unwrap();
        assert_eq!(c.overlay, OverlayKind::PeerToPeer);
        let hv = c.hyparview();
        assert_eq!((hv.active_size, hv.passive_size), (5, 6));
        assert_eq!((hv.arwl, hv.prwl), (6, 3), "the paper's walk lengths");
        assert_eq!(hv.shuffle_period, Duration::from_millis(250));
        assert_eq!(c.hop_limit, 8);
        assert_eq!(c.plumtree().route_ttl, Duration::from_secs(3));
        c.validate().unwrap();
        assert!(Config::default()
            .apply_vars([("MAQUIS_OVERLAY".to_string(), "p2p-ish".to_string())])
            .is_err());
        let bad = Config {
            hyparview_prwl: 7,
            ..Config::default()
        };
        assert!(bad.validate().is_err());
        let bad =
            Config::default().member_heartbeat(Duration::from_secs(2), Duration::from_secs(1));
        assert!(bad.validate().is_err());
        assert!(Config::default()
            .subscription_capacity(0)
            .validate()
            .is_err());
    }

    #[test]
    fn client_server_selection_and_parameters() {
        let d = Config::default();
        assert_eq!(d.client_server_role, Role::Server);
        let cs = d.client_server();
        assert_eq!(cs.servers_per_client, 1);
        assert_eq!(cs.sync_interval, Duration::from_millis(100));
        assert_eq!(cs.gossip_interval, Duration::from_millis(1000));
        let c = Config::from_toml(
            "overlay = \"client-server\"\nclient_server_role = \"client\"\n\
             client_server_servers_per_client = 2\nclient_server_sync_interval_ms = 50\n\
             client_server_gossip_interval_ms = 500\n",
        )
        .unwrap();
        assert_eq!(c.overlay, OverlayKind::ClientServer);
        assert_eq!(OverlayKind::ClientServer.as_str(), "client-server");
        let cs = c.client_server();
        assert_eq!(cs.role, Role::Client);
        assert_eq!(cs.servers_per_client, 2);
        assert_eq!(cs.sync_interval, Duration::from_millis(50));
        assert_eq!(cs.gossip_interval, Duration::from_millis(500));
        c.validate().unwrap();
        // The config round-trips through TOML with the role spelled in lower case.
        let text = toml::to_string(&c).unwrap();
        assert!(text.contains("client_server_role = \"client\""), "{text}");
        assert_eq!(Config::from_toml(&text).unwrap(), c);

        let c = Config::default()
            .apply_vars([
                ("MAQUIS_OVERLAY".to_string(), "client-server".to_string()),
                (
                    "MAQUIS_CLIENT_SERVER_ROLE".to_string(),
                    "Client".to_string(),
                ),
                (
                    "MAQUIS_CLIENT_SERVER_SERVERS_PER_CLIENT".to_string(),
                    "3".to_string(),
                ),
                (
                    "MAQUIS_CLIENT_SERVER_SYNC_INTERVAL_MS".to_string(),
                    "20".to_string(),
                ),
                (
                    "MAQUIS_CLIENT_SERVER_GOSSIP_INTERVAL_MS".to_string(),
                    "200".to_string(),
                ),
            ])
            .unwrap();
        assert_eq!(c.overlay, OverlayKind::ClientServer);
        assert_eq!(c.client_server_role, Role::Client);
        assert_eq!(c.client_server_servers_per_client, 3);
        assert_eq!(c.client_server_sync_interval_ms, 20);
        assert_eq!(c.client_server_gossip_interval_ms, 200);
        c.validate().unwrap();

        let b = Config::new("b")
            .overlay(OverlayKind::ClientServer)
            .client_server_role(Role::Client)
            .servers_per_client(2)
            .client_server_intervals(Duration::from_millis(10), Duration::from_millis(300));
        assert_eq!(b.client_server().servers_per_client, 2);
        assert_eq!(b.client_server().sync_interval, Duration::from_millis(10));
        assert_eq!(
            b.client_server().gossip_interval,
            Duration::from_millis(300)
        );

        // Errors name the option.
        let err = Config::default()
            .apply_vars([("MAQUIS_CLIENT_SERVER_ROLE".to_string(), "peer".to_string())])
            .unwrap_err();
        assert!(err.to_string().starts_with("client_server_role:"), "{err}");
        assert!(err.to_string().contains("server or client"), "{err}");
        let err = Config::default()
            .apply_vars([(
                "MAQUIS_CLIENT_SERVER_SERVERS_PER_CLIENT".to_string(),
                "two".to_string(),
            )])
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("client_server_servers_per_client:"),
            "{err}"
        );
        assert!(Config::from_toml("client_server_role = \"peer\"").is_err());
        let err = Config::default()
            .servers_per_client(0)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("1 to 16"), "{err}");
        assert!(Config::default().servers_per_client(17).validate().is_err());
        assert!(Config::default().servers_per_client(16).validate().is_ok());
        let err = Config::default()
            .client_server_intervals(Duration::ZERO, Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("client_server_sync_interval_ms"),
            "{err}"
        );
        assert!(Config::default()
            .client_server_intervals(Duration::from_millis(1), Duration::ZERO)
            .validate()
            .is_err());
        let err = "client/server".parse::<OverlayKind>().unwrap_err();
        assert!(err.to_string().contains("client-server"), "{err}");
    }
}
