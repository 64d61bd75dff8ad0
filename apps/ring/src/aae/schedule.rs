//! Which exchange a node runs next (the manager asks on every tick).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use maquis::ActorRef;
use tokio::task::JoinHandle;

use super::{exchange, pairs_by_partition, Outcome, Pair};
use crate::node::Shared;
use crate::ring::RingState;
use crate::vnode::VnodeMsg;

/// How long a recovering vnode waits after a failed exchange before the next one.
const RECOVERY_RETRY: Duration = Duration::from_millis(500);

/// Recovering vnodes one job takes up, per vnode it runs at once.
const RECOVERY_BATCH_PER_SLOT: usize = 4;

/// What a job of exchanges returns: each pair with its outcome.
type Results = Vec<(Pair, Result<Outcome, String>)>;

/// Every local vnode's pairs, by partition.
type PairsByPartition = Arc<BTreeMap<u32, Vec<Pair>>>;

/// The anti-entropy state of one node: the exchange running, the periodic round robin, and
/// the recovering vnodes with the pairs they have been in sync with.
pub(crate) struct Scheduler {
    job: Option<JoinHandle<Results>>,
    next_at: Instant,
    cursor: usize,
    retry_at: Instant,
    /// Recovering vnodes, with the pairs an exchange has found in sync since.
    recovering: BTreeMap<u32, BTreeSet<Pair>>,
    /// The pairs of the ring version they were computed for.
    pairs: Option<(u64, PairsByPartition)>,
}

impl Scheduler {
    pub fn new() -> Scheduler {
        let now = Instant::now();
        Scheduler {
            job: None,
            next_at: now,
            cursor: 0,
            retry_at: now,
            recovering: BTreeMap::new(),
            pairs: None,
        }
    }

    /// Partition `p`'s vnode is recovering.
    pub fn recovering(&mut self, p: u32) {
        self.recovering.entry(p).or_default();
    }

    /// Partition `p`'s vnode is trusted (or gone); returns whether it was recovering.
    pub fn forget(&mut self, p: u32) -> bool {
        self.recovering.remove(&p).is_some()
    }

    /// Recovering vnodes.
    pub fn recovering_count(&self) -> usize {
        self.recovering.len()
    }

    /// Stops the running exchange.
    pub fn abort(&mut self) {
        if let Some(h) = self.job.take() {
            h.abort();
        }
    }

    fn pairs(&mut self, ring: &RingState, shared: &Shared) -> PairsByPartition {
        match &self.pairs {
            Some((v, pairs)) if *v == ring.version => pairs.clone(),
            _ => {
                let pairs = Arc::new(pairs_by_partition(ring, &shared.name, shared.config.n_val));
                self.pairs = Some((ring.version, pairs.clone()));
                pairs
            }
        }
    }

    /// Collects a finished exchange, starts the next one if it is time, and returns the
    /// recovering vnodes that are now in sync with every live replica (to be trusted).
    pub fn tick(
        &mut self,
        shared: &Arc<Shared>,
        ring: &RingState,
        live: &BTreeMap<String, u64>,
        vnode: impl Fn(u32) -> Option<ActorRef<VnodeMsg>>,
    ) -> Vec<u32> {
        let now = Instant::now();
        if let Some(handle) = self.job.take() {
            if !handle.is_finished() {
                self.job = Some(handle);
                return Vec::new();
            }
            self.collect(shared, handle, now);
        }
        let pairs = self.pairs(ring, shared);
        let me = &shared.name;
        // Recovering vnodes: trusted once in sync with every live replica; else the next
        // exchanges are theirs: up to `aae_recovery_concurrency` vnodes at once, each one's
        // pairs one after the other.
        let slots = shared.config.aae_recovery_concurrency.max(1);
        let batch = slots * RECOVERY_BATCH_PER_SLOT;
        let mut trusted = Vec::new();
        let mut next: Vec<Vec<Pair>> = Vec::new();
        for (p, done) in &self.recovering {
            let todo: Vec<Pair> = pairs
                .get(p)
                .into_iter()
                .flatten()
                .filter(|pr| pr.peer == *me || live.contains_key(&pr.peer))
                .filter(|pr| !done.contains(pr))
                .cloned()
                .collect();
            if todo.is_empty() {
                trusted.push(*p);
            } else if next.len() < batch && now >= self.retry_at {
                next.push(todo);
            }
        }
        for p in &trusted {
            self.recovering.remove(p);
        }
        if next.is_empty() {
            if let Some(every) = shared.config.aae_interval {
                if now >= self.next_at {
                    self.next_at = now + every;
                    let owned: Vec<&Pair> = ring
                        .owned_by(me)
                        .iter()
                        .filter_map(|p| pairs.get(p))
                        .flatten()
                        .filter(|pr| pr.peer == *me || live.contains_key(&pr.peer))
                        .collect();
                    if !owned.is_empty() {
                        next.push(vec![owned[self.cursor % owned.len()].clone()]);
                        self.cursor = self.cursor.wrapping_add(1);
                    }
                }
            }
        }
        let groups: Vec<(ActorRef<VnodeMsg>, Vec<Pair>)> = next
            .into_iter()
            .filter_map(|pairs| Some((vnode(pairs.first()?.local)?, pairs)))
            .collect();
        if !groups.is_empty() {
            let shared = shared.clone();
            self.job = Some(tokio::spawn(async move {
                use futures::StreamExt;
                futures::stream::iter(groups)
                    .map(|(local, pairs)| {
                        let shared = shared.clone();
                        async move {
                            let mut results = Vec::with_capacity(pairs.len());
                            for pair in pairs {
                                let r = exchange(shared.clone(), pair.clone(), local.clone()).await;
                                results.push((pair, r));
                            }
                            results
                        }
                    })
                    .buffer_unordered(slots)
                    .concat()
                    .await
            }));
        }
        trusted
    }

    fn collect(&mut self, shared: &Shared, handle: JoinHandle<Results>, now: Instant) {
        let results = match futures::FutureExt::now_or_never(handle) {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "anti-entropy task failed");
                shared.stats.aae_errors.inc();
                return;
            }
            None => return,
        };
        for (pair, result) in results {
            self.record(shared, pair, result, now);
        }
    }

    fn record(
        &mut self,
        shared: &Shared,
        pair: Pair,
        result: Result<Outcome, String>,
        now: Instant,
    ) {
        let stats = &shared.stats;
        match result {
            Ok(out) => {
                stats.aae_exchanges.inc();
                stats.aae_objects.add(out.pulled + out.pushed);
                if out.pulled + out.pushed > 0 {
                    tracing::debug!(?pair, ?out, "anti-entropy repaired");
                }
                if out.in_sync {
                    stats.aae_in_sync.inc();
                    if let Some(done) = self.recovering.get_mut(&pair.local) {
                        done.insert(pair);
                    }
                }
            }
            Err(e) => {
                stats.aae_errors.inc();
                tracing::debug!(?pair, error = %e, "anti-entropy exchange failed");
                if self.recovering.contains_key(&pair.local) {
                    self.retry_at = now + RECOVERY_RETRY;
                }
            }
        }
    }
}
