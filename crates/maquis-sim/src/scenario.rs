//! What to simulate.

use std::time::Duration;

use maquis_proto::broadcast::PlumtreeConfig;
use maquis_proto::membership::{MembershipConfig, DEFAULT_HOP_LIMIT};
use maquis_proto::overlay::HyParViewConfig;

/// The overlay every simulated node runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimOverlay {
    /// HyParView membership, Plumtree broadcast, member heartbeats and routed sends.
    PeerToPeer,
    /// The first `servers` nodes are servers (a full mesh among them); the others are clients
    /// that join through a random live server and attach to `servers_per_client` servers.
    ClientServer {
        /// How many of the nodes are servers.
        servers: usize,
        /// How many servers a client attaches to.
        servers_per_client: usize,
    },
    /// Every node connects to every other.
    FullMesh,
}

impl SimOverlay {
    /// The name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            SimOverlay::PeerToPeer => "peer-to-peer",
            SimOverlay::ClientServer { .. } => "client-server",
            SimOverlay::FullMesh => "full-mesh",
        }
    }
}

/// What happens to the overlay once it is built and settled.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Nothing: a stable overlay.
    None,
    /// This fraction of the live nodes crash at the same instant.
    MassiveFailure {
        /// Between 0 and 1.
        fraction: f64,
    },
    /// For `periods` shuffle periods, at the start of each one this fraction of the live nodes
    /// crash, and as many new nodes join during the period, each through a random live node.
    Churn {
        /// Between 0 and 1, per period.
        fraction: f64,
        /// How many periods it lasts.
        periods: u32,
    },
    /// The live nodes split into two random halves that cannot reach each other for `periods`
    /// shuffle periods; then the network heals.
    Partition {
        /// How many periods it lasts.
        periods: u32,
    },
}

/// A simulation: an overlay of `nodes` nodes is built (each new node joins a random existing
/// one), settles, sees `fault`, and is measured.
///
/// Timeline: bootstrap (one join every `join_every`), `stabilize_periods` shuffle periods,
/// `warmup_broadcasts` broadcasts (the tree forms), the fault, then `1 + broadcasts`
/// broadcasts from random live nodes every `broadcast_every` (the first is sent right after
/// the failure, or the heal); broadcasts go on until the healing window is over; then, if
/// `routed_sends > 0`, one member-heartbeat period passes (every live node announces itself
/// along the current trees) and that many messages are routed, as the runtime routes actor
/// messages, from random live nodes to `route_destinations` random live ones.
///
/// Every node runs the membership machine a real node runs (`maquis_proto::membership`), with
/// member heartbeats on the peer-to-peer overlay from the start.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// A label for the report.
    pub name: String,
    /// Nodes in the bootstrap.
    pub nodes: usize,
    /// Seed of every random choice: the same scenario gives the same report.
    pub seed: u64,
    /// What happens.
    pub fault: Fault,
    /// Fixed part of one message's delay.
    pub latency: Duration,
    /// Random extra delay of one message, uniform in `[0, jitter)`.
    pub jitter: Duration,
    /// Time until a connection's failure (crash, partition, unreachable dial) is noticed.
    pub detect: Duration,
    /// How long a node accused of being down is suspected before it is declared down
    /// (`broadcast.suspicion_ms`).
    pub suspicion: Duration,
    /// Time between two joins during the bootstrap.
    pub join_every: Duration,
    /// Shuffle periods between the last join and the warm-up broadcasts.
    pub stabilize_periods: u32,
    /// Broadcasts before the fault, not measured (the tree settles).
    pub warmup_broadcasts: usize,
    /// Broadcasts measured after the first one following the fault (the mean is over these).
    pub broadcasts: usize,
    /// Time between two broadcasts.
    pub broadcast_every: Duration,
    /// Shuffle periods after the fault during which healing is watched.
    pub healing_window: u32,
    /// Time after the last broadcast before deliveries are counted.
    pub drain: Duration,
    /// Routed messages at the end (0: no routing phase), each from a random live node to one
    /// of `route_destinations` random live nodes.
    pub routed_sends: usize,
    /// How many random live nodes the routed messages go to (0: any live node).
    pub route_destinations: usize,
    /// Routed messages are dropped after this many hops (the runtime's `broadcast.hop_limit`).
    pub hop_limit: u16,
    /// The overlay.
    pub overlay: SimOverlay,
    /// How often every node broadcasts its member heartbeat (peer-to-peer overlay). `None`:
    /// one second per 20 nodes (at least 1 s), which keeps the cluster-wide rate at 20
    /// heartbeats a second. At 100 a second the shared tree never settles (200 nodes: RMR
    /// 0.43, 40,000 GRAFTs, 14 % of routed messages find no route).
    pub member_heartbeat: Option<std::time::Duration>,
    /// Full mesh: how often a node gossips its state to one peer.
    pub gossip_every: Duration,
    /// Full mesh: how often a node retries peers it lost.
    pub retry_every: Duration,
    /// HyParView's parameters (the seed is set per node).
    pub hyparview: HyParViewConfig,
    /// Plumtree's parameters (the seed is set per node).
    pub plumtree: PlumtreeConfig,
}

impl Scenario {
    /// A scenario with the simulator's defaults: 5–15 ms per message, failures noticed in
    /// 200 ms, one join every 5 ms, 1 s shuffle period, 100 broadcasts 100 ms apart.
    pub fn new(name: impl Into<String>, nodes: usize, fault: Fault) -> Scenario {
        let ms = Duration::from_millis;
        Scenario {
            name: name.into(),
            nodes,
            seed: 42,
            fault,
            latency: ms(5),
            jitter: ms(10),
            detect: ms(200),
            suspicion: ms(1000),
            join_every: ms(5),
            stabilize_periods: 10,
            warmup_broadcasts: 20,
            broadcasts: 100,
            broadcast_every: ms(100),
            healing_window: 10,
            drain: ms(3000),
            routed_sends: 1000,
            route_destinations: 1000,
            hop_limit: DEFAULT_HOP_LIMIT,
            overlay: SimOverlay::PeerToPeer,
            member_heartbeat: None,
            gossip_every: Duration::from_secs(1),
            retry_every: Duration::from_secs(1),
            hyparview: HyParViewConfig::default(),
            plumtree: PlumtreeConfig {
                lazy_tick: ms(50),
                graft_timeout: ms(400),
                graft_retry: ms(200),
                cache_max: 1024,
                offer_recent: 64,
                offer_window: Duration::from_secs(10),
                ..PlumtreeConfig::default()
            },
        }
    }

    /// The member-heartbeat period (see [`Scenario::member_heartbeat`]).
    pub fn heartbeat_every(&self) -> Duration {
        self.member_heartbeat
            .unwrap_or_else(|| Duration::from_secs_f64((self.nodes as f64 / 20.0).max(1.0)))
    }

    /// The membership machine's parameters: the runtime's ratios, scaled to the heartbeat
    /// period (a member is dropped after 5 missed heartbeats; heartbeat routes are handed to
    /// the overlay twice a period, at most every 500 ms).
    pub fn membership(&self) -> MembershipConfig {
        let every = self.heartbeat_every();
        let member_timeout = every * 5;
        MembershipConfig {
            plumtree: PlumtreeConfig {
                heartbeat_every: every,
                route_ttl: member_timeout,
                ..self.plumtree.clone()
            },
            member_timeout,
            refresh_every: (every / 2).max(Duration::from_millis(500)),
            linger: self.detect.max(Duration::from_secs(1)),
            suspicion: self.suspicion,
        }
    }

    /// The standard set at `nodes` nodes: no failure; massive failure of 20, 40, 60, 70, 80 and
    /// 90 %; churn of 2 % per period for 10 periods; a partition of 5 periods.
    pub fn standard(nodes: usize) -> Vec<Scenario> {
        let mut all = vec![Scenario::new("stable", nodes, Fault::None)];
        for f in [0.2, 0.4, 0.6, 0.7, 0.8, 0.9] {
            let fault = Fault::MassiveFailure { fraction: f };
            all.push(Scenario::new(
                format!("fail-{:.0}%", f * 100.0),
                nodes,
                fault,
            ));
        }
        let churn = Fault::Churn {
            fraction: 0.02,
            periods: 10,
        };
        all.push(Scenario::new("churn-2%", nodes, churn));
        let part = Fault::Partition { periods: 5 };
        all.push(Scenario::new("partition", nodes, part));
        all
    }
}
