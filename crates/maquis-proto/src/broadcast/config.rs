//! Plumtree's parameters and bounds.

use std::time::Duration;

/// Plumtree's parameters. Every buffer has a limit here, with what happens when it is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlumtreeConfig {
    /// How often queued announcements go out as IHAVE batches, and missing messages are checked.
    pub lazy_tick: Duration,
    /// How long after the first IHAVE of an unknown message it is grafted from the announcer
    /// (the eager copy may still be on its way).
    pub graft_timeout: Duration,
    /// How long to wait for a grafted message before grafting it from the next announcer.
    pub graft_retry: Duration,
    /// Tree optimisation: when an IHAVE had a hop count smaller than the eager copy's by at least
    /// this much, the lazy link is grafted and the eager one pruned. 0 turns it off (the
    /// default): it suits one sender, but with senders all over the cluster each one pulls the
    /// shared tree its own way and the tree never settles (measured at 1,000 nodes, 10
    /// broadcasts a second from random nodes: RMR 0.14 with threshold 3, 0.04 with 6, 0 off).
    pub optimization_threshold: u16,
    /// Every first copy an eager link brings earns it one credit, up to this many; a duplicate
    /// over a link with credit spends one instead of pruning it. 0: every duplicate prunes, as
    /// in the paper. With many concurrent senders, a duplicate is often an artefact of messages
    /// crossing a cycle that is being repaired, not a sign of a redundant link; without credit
    /// such cycles are cut twice and the tree keeps breaking (measured in `maquis-sim`).
    pub prune_credit: u8,
    /// Message cache, in messages: what answers GRAFTs and recognises duplicates. Full: the
    /// oldest is evicted (a duplicate of it arriving later would be delivered again).
    pub cache_max: usize,
    /// Message cache, in age: older messages are evicted.
    pub cache_ttl: Duration,
    /// Lazy queue, in announcements waiting for the next tick. Full: new announcements are
    /// dropped (the neighbours concerned may then miss the message if the tree is broken).
    pub lazy_queue_max: usize,
    /// The most announcements in one IHAVE (longer batches are split; longer received ones are
    /// cut).
    pub ihave_batch_max: usize,
    /// Missing table, in messages announced but not received. Full: announcements of further
    /// unknown messages are ignored until entries are resolved or given up.
    pub missing_max: usize,
    /// Announcers remembered per missing message (more are ignored).
    pub announcers_max: usize,
    /// When a neighbour comes up, the ids of up to this many recent messages are offered to it
    /// (an IHAVE), so that a node that gets a new neighbour after a failure can fetch what it
    /// missed. 0 turns it off.
    pub offer_recent: usize,
    /// Only messages received within this window are offered to a new neighbour.
    pub offer_window: Duration,
    /// How often a node broadcasts its heartbeat (once started with `start_heartbeats`). All
    /// heartbeats share one tree: keep the cluster-wide rate (nodes / `heartbeat_every`) near
    /// 100 a second or below. Far above it the tree keeps being repaired while delivery holds
    /// (measured: 3,000 nodes at 300 heartbeats a second, 470,000 GRAFTs in 10 s; 1,000 nodes at
    /// 100 a second, none).
    pub heartbeat_every: Duration,
    /// Routes learned from heartbeats are forgotten when not refreshed for this long.
    pub route_ttl: Duration,
    /// Routing table, in origins. Full: heartbeats of new origins are not recorded (nor
    /// relayed), until stale entries expire.
    pub routes_max: usize,
    /// Seed of the random choices (heartbeat phase); `None` derives one from the node identity.
    pub seed: Option<u64>,
}

impl Default for PlumtreeConfig {
    fn default() -> Self {
        PlumtreeConfig {
            lazy_tick: Duration::from_millis(100),
            graft_timeout: Duration::from_millis(500),
            graft_retry: Duration::from_millis(250),
            optimization_threshold: 0,
            prune_credit: 2,
            cache_max: 4096,
            cache_ttl: Duration::from_secs(60),
            lazy_queue_max: 65_536,
            ihave_batch_max: 1024,
            missing_max: 4096,
            announcers_max: 8,
            offer_recent: 64,
            offer_window: Duration::from_secs(30),
            heartbeat_every: Duration::from_secs(5),
            route_ttl: Duration::from_secs(20),
            routes_max: 100_000,
            seed: None,
        }
    }
}
