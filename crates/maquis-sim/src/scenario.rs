//! What to simulate.

use std::time::Duration;

use maquis_proto::broadcast::PlumtreeConfig;
use maquis_proto::overlay::HyParViewConfig;

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
/// `routed_sends > 0`, `heartbeat_origins` live nodes (or all) start heartbeats, routes form for
/// one heartbeat period, and that many messages are routed from random live nodes to random
/// heartbeating ones.
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
    /// Routed messages at the end (0: no routing phase), each from a random live node to a
    /// random heartbeating node.
    pub routed_sends: usize,
    /// How many random live nodes heartbeat in the routing phase (0: all of them). Heartbeats
    /// cost n² messages a period cluster-wide (and every node keeps a route per origin), so a
    /// sample keeps large runs short; a route to a node depends only on that node's heartbeats.
    pub heartbeat_origins: usize,
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
            join_every: ms(5),
            stabilize_periods: 10,
            warmup_broadcasts: 20,
            broadcasts: 100,
            broadcast_every: ms(100),
            healing_window: 10,
            drain: ms(3000),
            routed_sends: 1000,
            heartbeat_origins: 1000,
            hyparview: HyParViewConfig::default(),
            plumtree: PlumtreeConfig {
                lazy_tick: ms(50),
                graft_timeout: ms(400),
                graft_retry: ms(200),
                cache_max: 1024,
                offer_recent: 64,
                offer_window: Duration::from_secs(10),
                heartbeat_every: Duration::from_secs(10),
                route_ttl: Duration::from_secs(60),
                ..PlumtreeConfig::default()
            },
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
