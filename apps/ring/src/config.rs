//! Ring configuration.

use std::time::Duration;

use crate::storage::StorageConfig;

use crate::error::RingError;

/// Largest number of partitions a ring may have.
pub const MAX_PARTITIONS: u32 = 1024;

/// Settings of the ring, its vnodes and its key-value store. Every node of a cluster must use
/// the same `partitions`, `n_val`, `r` and `w`.
#[derive(Clone, Debug, PartialEq)]
pub struct RingConfig {
    /// Number of partitions (vnodes) of the hash space, 1 to 1,024. Default 64.
    pub partitions: u32,
    /// Replicas per key (`N`). Default 3.
    pub n_val: usize,
    /// Replies a read waits for (`R`). Default 2.
    pub r: usize,
    /// Acknowledgements a write waits for (`W`). Default 2.
    pub w: usize,
    /// Simulated storage latency of each vnode read or write (the paper uses 1 ms). Default 0.
    pub storage_delay: Duration,
    /// Deadline of one client request (echo, get, put, delete). Default 5 s.
    pub request_timeout: Duration,
    /// Period of ring gossip, claimant decisions and handoff scheduling. Default 200 ms.
    pub gossip_interval: Duration,
    /// Most entries in one handoff chunk. Default 256.
    pub handoff_chunk_entries: usize,
    /// Most value bytes in one handoff chunk (a single larger object still travels alone).
    /// Default 1 MiB.
    pub handoff_chunk_bytes: usize,
    /// Handoffs a node runs at once. Default 2.
    pub handoff_concurrency: usize,
    /// Client requests a node coordinates at once; further requests wait. Default 4,096.
    pub max_inflight: usize,
    /// Coordinators still working after they answered, at once: a read waiting for the
    /// slowest replicas to repair them, a write waiting for the replicas beyond its quorum
    /// (a fallback may need its vnode started first). Beyond this, a read repairs only from
    /// the replies it already has and a write leaves the remaining replicas to read repair.
    /// Default 1,024.
    pub max_background: usize,
    /// How long a read keeps listening for the remaining replicas after its quorum, to repair
    /// them. Default 100 ms.
    pub read_repair_wait: Duration,
    /// How long a vnode that has handed its data off keeps forwarding requests before it
    /// stops, and how long an idle, empty fallback vnode lives. Default 5 s.
    pub forward_grace: Duration,
    /// Remove a member that has been down this long from the ring (its partitions are claimed
    /// by the others, without its data). `None` (the default): a down node keeps its
    /// partitions, requests use fallbacks, as in Riak.
    pub remove_down_after: Option<Duration>,
    /// Lanes per peer of the `vnode` channel; `None` takes the node's parallelism.
    pub vnode_parallelism: Option<u16>,
    /// Whether this node may own partitions. A node with `false` (a client node, e.g. a load
    /// generator) follows the ring and coordinates requests but holds no data. Default true.
    pub claim: bool,
    /// Where vnodes keep their objects: in memory only (the default; a restarted node comes
    /// back empty) or durable in a directory (see [`crate::storage`]).
    pub storage: StorageConfig,
    /// Active anti-entropy: how often this node starts an exchange with the next of its
    /// replica pairs (one exchange at a time; see [`crate::aae`]). Default 1 s. `None` turns
    /// anti-entropy off, and with it recovery: a node that comes back empty then answers
    /// reads as if it had its data, and only read repair refills it.
    pub aae_interval: Option<Duration>,
    /// Objects one anti-entropy exchange moves at most (both ways together). Default 10,000.
    pub aae_max_objects: usize,
    /// Recovering vnodes whose exchanges run at once (each vnode's one after the other).
    /// Default 8. The periodic round robin always runs one exchange at a time.
    pub aae_recovery_concurrency: usize,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            partitions: 64,
            n_val: 3,
            r: 2,
            w: 2,
            storage_delay: Duration::ZERO,
            request_timeout: Duration::from_secs(5),
            gossip_interval: Duration::from_millis(200),
            handoff_chunk_entries: 256,
            handoff_chunk_bytes: 1024 * 1024,
            handoff_concurrency: 2,
            max_inflight: 4096,
            max_background: 1024,
            read_repair_wait: Duration::from_millis(100),
            forward_grace: Duration::from_secs(5),
            remove_down_after: None,
            vnode_parallelism: None,
            claim: true,
            storage: StorageConfig::Memory,
            aae_interval: Some(Duration::from_secs(1)),
            aae_max_objects: 10_000,
            aae_recovery_concurrency: 8,
        }
    }
}

impl RingConfig {
    /// Sets the number of partitions.
    pub fn partitions(mut self, p: u32) -> Self {
        self.partitions = p;
        self
    }

    /// Sets the simulated storage delay.
    pub fn storage_delay(mut self, d: Duration) -> Self {
        self.storage_delay = d;
        self
    }

    /// Sets the gossip (and scheduling) period.
    pub fn gossip_interval(mut self, d: Duration) -> Self {
        self.gossip_interval = d;
        self
    }

    /// Sets the request deadline.
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// Sets the handoff chunk limits.
    pub fn handoff_chunk(mut self, entries: usize, bytes: usize) -> Self {
        self.handoff_chunk_entries = entries;
        self.handoff_chunk_bytes = bytes;
        self
    }

    /// Sets how long a handed-off vnode forwards.
    pub fn forward_grace(mut self, d: Duration) -> Self {
        self.forward_grace = d;
        self
    }

    /// Sets where vnodes keep their objects.
    pub fn storage(mut self, storage: StorageConfig) -> Self {
        self.storage = storage;
        self
    }

    /// Sets whether this node may own partitions.
    pub fn claim(mut self, on: bool) -> Self {
        self.claim = on;
        self
    }

    /// Checks ranges.
    pub fn validate(&self) -> Result<(), RingError> {
        let bad = |what: &str| Err(RingError::Config(what.to_string()));
        if self.partitions == 0 || self.partitions > MAX_PARTITIONS {
            return bad("partitions must be 1 to 1024");
        }
        if self.n_val == 0 || self.n_val > 16 {
            return bad("n_val must be 1 to 16");
        }
        if self.r == 0 || self.r > self.n_val || self.w == 0 || self.w > self.n_val {
            return bad("r and w must be 1 to n_val");
        }
        if self.request_timeout.is_zero() || self.gossip_interval.is_zero() {
            return bad("request_timeout and gossip_interval must be > 0");
        }
        if self.handoff_chunk_entries == 0
            || self.handoff_chunk_bytes == 0
            || self.handoff_concurrency == 0
        {
            return bad("handoff chunk limits and concurrency must be > 0");
        }
        if self.max_inflight == 0 {
            return bad("max_inflight must be > 0");
        }
        if matches!(self.vnode_parallelism, Some(0)) {
            return bad("vnode_parallelism must be > 0");
        }
        if self.aae_max_objects == 0 || !(1..=256).contains(&self.aae_recovery_concurrency) {
            return bad("aae_max_objects must be > 0 and aae_recovery_concurrency 1 to 256");
        }
        Ok(())
    }
}
