//! Starting a ring node and using it: [`Ring::start`] gives a [`RingNode`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use maquis::{ActorRef, ChannelConfig, Config, Node};
use rand::Rng;
use tokio::sync::{watch, Semaphore};

use crate::config::RingConfig;
use crate::error::RingError;
use crate::handoff::HANDOFF_CHANNEL;
use crate::hash::key_hash;
use crate::manager::{self, ManagerMsg, NodeStatus, GOSSIP_CHANNEL, MANAGER_NAME};
use crate::object::Clock;
use crate::ring::RingState;
use crate::storage::{Durable, DurableConfig, Memory, Storage, StorageConfig, StorageStats};
use crate::vnode::{vnode_name, vnode_opts, VnodeMsg, VNODE_CHANNEL};

/// A monotonically increasing counter (the runtime's).
pub use maquis::Counter;

/// Request counters of a ring node.
#[derive(Debug, Default)]
pub struct Stats {
    /// Quorum reads that succeeded.
    pub reads: Counter,
    /// Quorum writes (puts and deletes) that succeeded.
    pub writes: Counter,
    /// Writes sent again because a replica kept a newer version (stamped by a node whose
    /// clock ran ahead, or within the same instant of the hybrid clocks).
    pub write_retries: Counter,
    /// Echo round trips that succeeded.
    pub echoes: Counter,
    /// Read repairs sent.
    pub read_repairs: Counter,
    /// Anti-entropy exchanges completed (in sync or not).
    pub aae_exchanges: Counter,
    /// Exchanges that ended with both trees equal.
    pub aae_in_sync: Counter,
    /// Exchanges that failed (a peer down, a timeout, a vnode gone).
    pub aae_errors: Counter,
    /// Objects anti-entropy copied between replicas.
    pub aae_objects: Counter,
    /// Recovering vnodes that anti-entropy made trusted again.
    pub aae_recovered: Counter,
}

/// State shared by the node's manager, vnodes, coordinators and handoffs.
pub(crate) struct Shared {
    pub node: Node,
    pub name: String,
    pub config: RingConfig,
    pub ring: watch::Sender<Arc<RingState>>,
    pub clock: Clock,
    pub inflight: Arc<Semaphore>,
    pub background: Arc<Semaphore>,
    pub leaving: AtomicBool,
    pub stats: Stats,
    pub started: Instant,
    pub storage: Arc<dyn Storage>,
    /// Vnodes recovering, as the manager last counted.
    pub recovering: std::sync::atomic::AtomicUsize,
    /// Whether the node knows the cluster's ring: it started alone, or has heard another
    /// node's ring, or has published one as claimant. Until then it coordinates no request
    /// (its own fresh ring would send them to its own vnodes).
    pub ready: AtomicBool,
}

/// The ring's numbers in the node's `/status` and `/metrics` (`maquis_ring_…`).
struct RingMetrics(std::sync::Weak<Shared>);

impl maquis::admin::AppMetrics for RingMetrics {
    fn collect(
        &self,
        counters: &mut std::collections::BTreeMap<String, u64>,
        gauges: &mut std::collections::BTreeMap<String, u64>,
    ) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let s = &shared.stats;
        let st = shared.storage.stats();
        for (name, value) in [
            ("ring_reads", s.reads.get()),
            ("ring_writes", s.writes.get()),
            ("ring_write_retries", s.write_retries.get()),
            ("ring_echoes", s.echoes.get()),
            ("ring_read_repairs", s.read_repairs.get()),
            ("ring_aae_exchanges", s.aae_exchanges.get()),
            ("ring_aae_in_sync", s.aae_in_sync.get()),
            ("ring_aae_errors", s.aae_errors.get()),
            ("ring_aae_objects_repaired", s.aae_objects.get()),
            ("ring_aae_vnodes_recovered", s.aae_recovered.get()),
            ("ring_storage_commits", st.commits),
            ("ring_storage_objects_written", st.objects),
            ("ring_storage_errors", st.errors),
            ("ring_storage_corrupt_objects", st.corrupt),
            ("ring_storage_replayed_records", st.replayed),
            ("ring_storage_checkpoints", st.checkpoints),
        ] {
            counters.insert(name.to_string(), value);
        }
        gauges.insert(
            "ring_recovering_vnodes".to_string(),
            shared.recovering.load(Ordering::Relaxed) as u64,
        );
    }
}

impl Shared {
    pub fn ring(&self) -> Arc<RingState> {
        self.ring.borrow().clone()
    }

    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn is_leaving(&self) -> bool {
        self.leaving.load(Ordering::Relaxed)
    }
}

/// Entry point: starts ring nodes.
#[derive(Debug)]
pub struct Ring;

impl Ring {
    /// Starts a Maquis node from `node_config` (adding the `vnode`, `gossip` and `handoff`
    /// channels if it does not list them) and runs the ring on it, with the storage
    /// `config.storage` names.
    pub async fn start(node_config: Config, config: RingConfig) -> Result<RingNode, RingError> {
        config.validate()?;
        let storage = open_storage(&config.storage)?;
        Ring::start_with_storage(node_config, config, storage).await
    }

    /// Like [`Ring::start`], with a storage backend of the caller's (`config.storage` is
    /// ignored).
    pub async fn start_with_storage(
        node_config: Config,
        config: RingConfig,
        storage: Arc<dyn Storage>,
    ) -> Result<RingNode, RingError> {
        config.validate()?;
        let node = Node::start(with_ring_channels(node_config, &config)).await?;
        Ok(Ring::run(node, config, storage))
    }

    /// Runs the ring on a node that is already started. Its configuration should contain the
    /// `vnode`, `gossip` and `handoff` channels (see [`with_ring_channels`]); traffic for a
    /// channel the node lacks travels on `default`.
    pub fn start_on(node: Node, config: RingConfig) -> Result<RingNode, RingError> {
        config.validate()?;
        let storage = open_storage(&config.storage)?;
        Ok(Ring::run(node, config, storage))
    }

    fn run(node: Node, config: RingConfig, storage: Arc<dyn Storage>) -> RingNode {
        let alone = node.config().node.peers.is_empty();
        let name = node.id().name.to_string();
        let ring = RingState::fresh(&name, config.partitions);
        let (ring_tx, _) = watch::channel(Arc::new(ring));
        let shared = Arc::new(Shared {
            clock: Clock::new(key_hash(name.as_bytes())),
            inflight: Arc::new(Semaphore::new(config.max_inflight)),
            background: Arc::new(Semaphore::new(config.max_background.max(1))),
            leaving: AtomicBool::new(false),
            stats: Stats::default(),
            started: Instant::now(),
            ring: ring_tx,
            config,
            name,
            node,
            recovering: Default::default(),
            ready: AtomicBool::new(alone),
            storage,
        });
        let metrics = Arc::new(RingMetrics(Arc::downgrade(&shared)));
        if let Err(e) = shared.node.add_metrics(metrics) {
            tracing::warn!(error = %e, "the ring's numbers are not in /metrics");
        }
        let manager = manager::spawn(shared.clone());
        RingNode { shared, manager }
    }
}

/// Opens the backend a configuration names.
fn open_storage(config: &StorageConfig) -> Result<Arc<dyn Storage>, RingError> {
    Ok(match config {
        StorageConfig::Memory => Arc::new(Memory),
        StorageConfig::Durable(dir) => Arc::new(Durable::open(dir, DurableConfig::default())?),
    })
}

/// Adds the ring's channels to a node configuration, unless it lists them already: `vnode`
/// (`vnode_parallelism` lanes, or the node's parallelism), `gossip` (1 lane) and `handoff`
/// (1 lane).
pub fn with_ring_channels(mut config: Config, ring: &RingConfig) -> Config {
    let wanted = [
        (VNODE_CHANNEL, ring.vnode_parallelism),
        (GOSSIP_CHANNEL, Some(1)),
        (HANDOFF_CHANNEL, Some(1)),
    ];
    for (name, parallelism) in wanted {
        if !config.transport.channels.iter().any(|c| c.name == name) {
            config.transport.channels.push(ChannelConfig {
                name: name.to_string(),
                parallelism,
            });
        }
    }
    config
}

/// A running ring node: a Maquis node with a ring manager and vnodes. Cheap to clone.
#[derive(Clone)]
pub struct RingNode {
    shared: Arc<Shared>,
    manager: ActorRef<ManagerMsg>,
}

impl std::fmt::Debug for RingNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RingNode({})", self.shared.name)
    }
}

impl RingNode {
    /// The Maquis node underneath.
    pub fn node(&self) -> &Node {
        &self.shared.node
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The ring configuration.
    pub fn config(&self) -> &RingConfig {
        &self.shared.config
    }

    /// Request counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// The storage backend's name (`memory`, `redb`) and counters.
    pub fn storage_stats(&self) -> (&'static str, StorageStats) {
        (self.shared.storage.name(), self.shared.storage.stats())
    }

    /// The ring this node currently uses.
    pub fn ring(&self) -> Arc<RingState> {
        self.shared.ring()
    }

    /// Notified on every ring change.
    pub fn subscribe_ring(&self) -> watch::Receiver<Arc<RingState>> {
        self.shared.ring.subscribe()
    }

    /// Joins the cluster that `contact` belongs to (the ring follows by gossip).
    pub async fn join(&self, contact: SocketAddr, timeout: Duration) -> Result<(), RingError> {
        self.shared.node.join_wait(contact, timeout).await?;
        let _ = self.manager.try_send(ManagerMsg::Kick);
        Ok(())
    }

    /// The partition that owns `key`.
    pub fn partition_of(&self, key: &[u8]) -> u32 {
        self.ring().partition_of(key)
    }

    /// The preference list of `key`: (partition, owner), N entries.
    pub fn preflist(&self, key: &[u8]) -> Vec<(u32, String)> {
        let ring = self.ring();
        ring.preflist(ring.partition_of(key), self.shared.config.n_val)
    }

    /// The replicas a request for `key` goes to now (fallbacks standing in for primaries
    /// that are not live).
    pub fn targets(&self, key: &[u8]) -> Vec<crate::kv::Target> {
        crate::kv::targets(&self.shared, key)
    }

    /// Echo service: sends `payload` to the vnode owning a key drawn uniformly from
    /// `max(1024, P)` keys, which sends it back.
    pub async fn echo(&self, payload: Bytes) -> Result<Bytes, RingError> {
        let space = self.shared.config.partitions.max(1024) as u64;
        let k: u64 = rand::thread_rng().gen_range(0..space);
        self.echo_key(&k.to_be_bytes(), payload).await
    }

    /// Echo service with a chosen key.
    pub async fn echo_key(&self, key: &[u8], payload: Bytes) -> Result<Bytes, RingError> {
        let _permit = self
            .shared
            .inflight
            .acquire()
            .await
            .map_err(|_| RingError::Overloaded)?;
        // The owner of the key's partition; if it is not live, the first live replica.
        let ring = self.ring();
        let p = ring.partition_of(key);
        let (partition, vnode) = match self.shared.node.remote(ring.owner(p), &vnode_name(p)) {
            Some(v) => (p, v),
            None => {
                let t = self
                    .targets(key)
                    .into_iter()
                    .next()
                    .ok_or(RingError::Unavailable(p))?;
                let v: ActorRef<VnodeMsg> = self
                    .shared
                    .node
                    .remote(&t.node, &vnode_name(t.partition))
                    .ok_or(RingError::Unavailable(t.partition))?;
                (t.partition, v)
            }
        };
        let back = vnode
            .call_with(
                |reply| VnodeMsg::Echo { payload, reply },
                self.shared.config.request_timeout,
                &vnode_opts(partition),
            )
            .await
            .map_err(|e| match e {
                maquis::CallError::Timeout => RingError::Timeout,
                e => RingError::Call(e),
            })?;
        self.shared.stats.echoes.inc();
        Ok(back.into_bytes())
    }

    /// Quorum read (R of N).
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, RingError> {
        crate::kv::get(&self.shared, Bytes::copy_from_slice(key.as_ref())).await
    }

    /// Quorum write (W of N).
    pub async fn put(&self, key: impl AsRef<[u8]>, value: Bytes) -> Result<(), RingError> {
        crate::kv::put(
            &self.shared,
            Bytes::copy_from_slice(key.as_ref()),
            Some(value),
        )
        .await
        .map(|_| ())
    }

    /// Quorum delete (a tombstone, W of N); returns whether a replica that acknowledged held
    /// a live value.
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<bool, RingError> {
        crate::kv::put(&self.shared, Bytes::copy_from_slice(key.as_ref()), None).await
    }

    /// This node's status (ring version, owned partitions, keys, handoffs).
    pub async fn status(&self) -> Result<NodeStatus, RingError> {
        Ok(self
            .manager
            .call(
                |reply| ManagerMsg::Status { reply },
                self.shared.config.request_timeout,
            )
            .await?)
    }

    /// The status of every live member (in name order), as each reports it.
    pub async fn cluster_status(&self) -> Vec<(String, Result<NodeStatus, RingError>)> {
        let mut out = Vec::new();
        let mut members: Vec<String> = self
            .shared
            .node
            .members()
            .into_iter()
            .map(|m| m.name.to_string())
            .collect();
        members.sort();
        for m in members {
            let res = match self.shared.node.remote::<ManagerMsg>(&m, MANAGER_NAME) {
                None => Err(RingError::NotConverged(format!("{m} is not a member"))),
                Some(mgr) => mgr
                    .call_with(
                        |reply| ManagerMsg::Status { reply },
                        Duration::from_secs(2).min(self.shared.config.request_timeout),
                        &maquis::SendOpts::on(GOSSIP_CHANNEL),
                    )
                    .await
                    .map_err(RingError::from),
            };
            out.push((m, res));
        }
        out
    }

    /// Checks once whether the cluster has converged: the ring lists exactly the live
    /// members that may own partitions, all live members report the same ring, no transfer is pending, nobody is leaving,
    /// no handoff runs and no fallback data waits to be handed back. `Err` says what is
    /// missing. (A member that is down but still in the ring keeps the cluster from
    /// converging until it returns or is removed.)
    pub async fn check_converged(&self) -> Result<(), String> {
        let ring = self.ring();
        if !ring.is_settled() {
            return Err(format!(
                "{} transfers pending, leaving {:?}",
                ring.pending_transfers(),
                ring.leaving
            ));
        }
        let mut owners = Vec::new();
        for (name, st) in self.cluster_status().await {
            let st = st.map_err(|e| format!("{name}: {e}"))?;
            if st.ring_version != ring.version || st.ring_digest != ring.digest() {
                return Err(format!(
                    "{name} has ring v{} (here v{})",
                    st.ring_version, ring.version
                ));
            }
            if st.handoffs > 0 || st.stray_keys > 0 {
                return Err(format!(
                    "{name}: {} handoffs, {} keys to hand back",
                    st.handoffs, st.stray_keys
                ));
            }
            if st.claims {
                owners.push(name);
            }
        }
        if owners != ring.nodes {
            return Err(format!(
                "ring nodes {:?}, live owners {owners:?}",
                ring.nodes
            ));
        }
        Ok(())
    }

    /// Waits until [`RingNode::check_converged`] succeeds.
    pub async fn wait_converged(&self, timeout: Duration) -> Result<(), RingError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.check_converged().await {
                Ok(()) => return Ok(()),
                Err(why) if Instant::now() >= deadline => return Err(RingError::NotConverged(why)),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Leaves the cluster cleanly: asks the claimant to move this node's partitions to the
    /// others, waits (up to `timeout`) until every one is handed off and the ring no longer
    /// lists this node, then leaves the Maquis cluster and stops the node. After a timeout it
    /// leaves and stops all the same, and returns `NotConverged` (the data not handed off is
    /// then only on the other replicas).
    pub async fn leave(&self, timeout: Duration) -> Result<(), RingError> {
        self.shared.leaving.store(true, Ordering::Relaxed);
        let _ = self.manager.try_send(ManagerMsg::Kick);
        let deadline = Instant::now() + timeout;
        let alone = || self.shared.node.members().len() <= 1;
        let mut result = Ok(());
        while !alone() {
            let ring = self.ring();
            let gone = !ring.has_node(self.name());
            let idle = self
                .status()
                .await
                .map(|s| s.handoffs == 0 && s.stray_keys == 0)
                .unwrap_or(false);
            if gone && idle {
                break;
            }
            if Instant::now() >= deadline {
                result = Err(RingError::NotConverged(format!(
                    "leave: {} partitions still owned here",
                    ring.owned_by(self.name()).len()
                )));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.shared.node.leave().await;
        self.shared.node.shutdown().await;
        result
    }

    /// Stops the node at once (as a crash would: peers see it go down).
    pub async fn shutdown(&self) {
        self.shared.node.shutdown().await;
    }

    /// Starts a Redis-protocol (RESP2) front on `addr`.
    pub async fn serve_resp(
        &self,
        addr: SocketAddr,
        config: crate::resp::RespConfig,
    ) -> Result<crate::resp::RespServer, RingError> {
        crate::resp::serve(self.clone(), addr, config).await
    }
}
