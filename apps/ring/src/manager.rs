//! The ring manager: one actor per node, registered as `ring-manager`.
//!
//! It gossips the ring on the `gossip` channel, makes the claimant's decisions when this node
//! is the claimant, starts and stops the local vnodes, and schedules handoffs.
//!
//! **Claimant.** The claimant is the lowest-named live member that runs a ring manager (a node
//! proves it does by gossiping). Only the claimant changes ownership; everyone else adopts the
//! highest ring it hears of. This keeps claim incremental (a join moves about `P/m` partitions,
//! a leave moves only the leaver's) while every node still ends up with the same ring: the
//! claim function is deterministic over (previous ring, sorted members), and if two nodes both
//! act as claimant for a moment (membership views differ during a join), the ring order of
//! [`RingState::supersedes`] picks one of their rings everywhere and the surviving claimant
//! recomputes from it.
//!
//! **Membership.** A member that joins (and gossips) is added to the ring. A member that is
//! *down* keeps its partitions (requests use fallbacks, as in Riak) unless
//! `remove_down_after` is set. A member that *left* without handing off is removed and its
//! partitions claimed by the others. A member that asks to leave ([`crate::RingNode::leave`])
//! is marked leaving: its partitions get new owners through handoff, and once it owns nothing
//! it is removed (recorded as departed so that it is not re-added while still connected).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use maquis::{ActorRef, Inbox, MembershipEvent, ReplyTo, SendOpts};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::aae::Scheduler;
use crate::handoff::{self, HandoffJob};
use crate::node::Shared;
use crate::ring::{claim, RingState, Role};
use crate::vnode::{self, idle_for, Mode, VnodeMsg, VnodeView};

/// The name the ring manager is registered under on every node.
pub const MANAGER_NAME: &str = "ring-manager";

/// The channel carrying ring gossip and claimant requests.
pub const GOSSIP_CHANNEL: &str = "gossip";

/// How long a failed handoff waits before it is tried again.
const HANDOFF_RETRY: Duration = Duration::from_millis(500);

/// What the ring manager takes.
#[derive(Debug, Serialize, Deserialize)]
pub enum ManagerMsg {
    /// A node's ring (also tells that the node runs the ring).
    Gossip {
        /// The sender.
        from: String,
        /// Whether the sender may own partitions (`RingConfig::claim`).
        claims: bool,
        /// Its ring.
        ring: RingState,
    },
    /// To the claimant: this node wants to leave.
    Leaving {
        /// The node.
        name: String,
    },
    /// To the claimant: the owner has handed partition `partition` off to `to`.
    TransferDone {
        /// The partition.
        partition: u32,
        /// The current owner.
        from: String,
        /// The next owner.
        to: String,
    },
    /// Make sure the vnode of a partition runs here (before a handoff or a fallback write).
    EnsureVnode {
        /// The partition.
        partition: u32,
        /// The asker's ring version; an older local ring answers `StaleRing`.
        ring_version: u64,
        /// The answer.
        reply: ReplyTo<EnsureReply>,
    },
    /// This node's status.
    Status {
        /// The answer.
        reply: ReplyTo<NodeStatus>,
    },
    /// Local, from a handoff task: it ended.
    HandoffFinished {
        /// The partition.
        partition: u32,
        /// The receiving node.
        to: String,
        /// Whether every entry was acknowledged.
        ok: bool,
    },
    /// Local: run a scheduling round now.
    Kick,
}

/// Answer to [`ManagerMsg::EnsureVnode`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnsureReply {
    /// The vnode runs.
    Ready,
    /// The local ring (version given) is older than the asker's: send it and ask again.
    StaleRing(u64),
}

/// A node's view of the ring and of its vnodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The node.
    pub name: String,
    /// Version of its ring.
    pub ring_version: u64,
    /// Digest of its ring's content.
    pub ring_digest: u64,
    /// Who made that ring.
    pub claimant: String,
    /// Ring members.
    pub nodes: Vec<String>,
    /// Partitions in the ring.
    pub partitions: u32,
    /// Partitions this node owns.
    pub owned: usize,
    /// Transfers planned in the ring and not completed.
    pub pending_transfers: usize,
    /// Vnodes running here.
    pub vnodes: usize,
    /// Vnodes still loading their stored objects (a node that starts on a durable store):
    /// their keys are not counted in `keys` yet.
    pub loading: usize,
    /// Keys stored here (all vnodes, tombstones included).
    pub keys: usize,
    /// Value bytes stored here.
    pub bytes: usize,
    /// Handoffs running (or waiting for a slot) here.
    pub handoffs: usize,
    /// Keys held here for partitions this node neither owns nor will own (fallback data not
    /// yet handed back).
    pub stray_keys: usize,
    /// Vnodes that handed their data off and forward requests.
    pub forwarding: usize,
    /// Whether this node may own partitions (`RingConfig::claim`).
    pub claims: bool,
    /// Vnodes recovering (their not-found answers do not count until anti-entropy has brought
    /// them up to their replicas).
    pub recovering: usize,
}

struct Vn {
    actor: ActorRef<VnodeMsg>,
    view: Arc<VnodeView>,
}

struct Task {
    to: String,
    handle: JoinHandle<()>,
}

struct Manager {
    shared: Arc<Shared>,
    me: ActorRef<ManagerMsg>,
    vnodes: BTreeMap<u32, Vn>,
    tasks: BTreeMap<u32, Task>,
    retry_after: BTreeMap<u32, Instant>,
    capable: BTreeSet<String>,
    candidates: BTreeSet<String>,
    leave_requests: BTreeSet<String>,
    dones: Vec<(u32, String, String)>,
    down_since: BTreeMap<String, Instant>,
    left: BTreeSet<String>,
    slots: Arc<Semaphore>,
    aae: Scheduler,
    /// Whether a ring from another node has been adopted since this node started.
    foreign: bool,
}

/// Starts the manager and registers it.
pub(crate) fn spawn(shared: Arc<Shared>) -> ActorRef<ManagerMsg> {
    let node = shared.node.clone();
    let actor = node.spawn_fn(move |inbox: Inbox<ManagerMsg>| async move {
        let mut m = Manager {
            me: inbox.myself(),
            slots: Arc::new(Semaphore::new(shared.config.handoff_concurrency)),
            shared,
            vnodes: BTreeMap::new(),
            tasks: BTreeMap::new(),
            retry_after: BTreeMap::new(),
            capable: BTreeSet::new(),
            candidates: BTreeSet::new(),
            leave_requests: BTreeSet::new(),
            dones: Vec::new(),
            down_since: BTreeMap::new(),
            left: BTreeSet::new(),
            aae: Scheduler::new(),
            foreign: false,
        };
        m.run(inbox).await;
    });
    if let Err(e) = node.register(MANAGER_NAME, &actor) {
        tracing::error!(error = %e, "cannot register the ring manager");
    }
    actor
}

impl Manager {
    async fn run(&mut self, mut inbox: Inbox<ManagerMsg>) {
        let mut events = self.shared.node.subscribe();
        let mut tick = tokio::time::interval(self.shared.config.gossip_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Partitions with stored objects (a durable backend, after a restart) get their vnodes
        // at once: owned ones serve them, the others hand them off once the ring is known.
        let storage = self.shared.storage.clone();
        match tokio::task::spawn_blocking(move || storage.partitions()).await {
            Ok(Ok(stored)) => {
                if !stored.is_empty() {
                    tracing::info!(partitions = stored.len(), "stored partitions found");
                }
                let partitions = self.shared.config.partitions;
                for p in stored.into_iter().filter(|p| *p < partitions) {
                    self.ensure_vnode(p);
                }
            }
            Ok(Err(e)) => tracing::error!(error = %e, "cannot list the stored partitions"),
            Err(e) => tracing::error!(error = %e, "listing the stored partitions failed"),
        }
        self.reconcile();
        self.broadcast();
        loop {
            tokio::select! {
                msg = inbox.recv() => match msg {
                    Some(m) => self.handle(m).await,
                    None => break,
                },
                ev = events.recv() => match ev {
                    Ok(ev) => self.on_event(ev),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
                _ = tick.tick() => self.on_tick(),
            }
            if self.shared.node.is_stopped() {
                break;
            }
        }
        for (_, t) in std::mem::take(&mut self.tasks) {
            t.handle.abort();
        }
        self.aae.abort();
        tracing::debug!(node = %self.shared.name, "ring manager stopped");
    }

    fn name(&self) -> &str {
        &self.shared.name
    }

    fn live(&self) -> BTreeMap<String, u64> {
        self.shared
            .node
            .members()
            .into_iter()
            .map(|m| (m.name.to_string(), m.incarnation))
            .collect()
    }

    fn claimant(&self, live: &BTreeMap<String, u64>) -> String {
        self.capable
            .iter()
            .filter(|n| live.contains_key(*n))
            .chain(std::iter::once(&self.shared.name))
            .min()
            .cloned()
            .unwrap_or_else(|| self.shared.name.clone())
    }

    fn manager_of(&self, node: &str) -> Option<ActorRef<ManagerMsg>> {
        self.shared.node.remote(node, MANAGER_NAME)
    }

    fn send_to(&self, node: &str, msg: ManagerMsg) {
        if let Some(m) = self.manager_of(node) {
            if let Err(e) = m.try_send_with(msg, &SendOpts::on(GOSSIP_CHANNEL)) {
                tracing::debug!(to = node, error = %e, "gossip message dropped");
            }
        }
    }

    fn gossip_to(&self, node: &str) {
        let ring = (*self.shared.ring()).clone();
        self.send_to(
            node,
            ManagerMsg::Gossip {
                from: self.shared.name.clone(),
                claims: self.shared.config.claim,
                ring,
            },
        );
    }

    /// Sends the ring to every live member.
    fn broadcast(&self) {
        for n in self.live().keys() {
            if n != self.name() {
                self.gossip_to(n);
            }
        }
    }

    fn adopt(&mut self, ring: RingState) {
        tracing::debug!(
            node = %self.shared.name,
            version = ring.version,
            claimant = %ring.claimant,
            pending = ring.pending_transfers(),
            "ring adopted"
        );
        self.shared.ring.send_replace(Arc::new(ring));
        self.reconcile();
    }

    async fn handle(&mut self, msg: ManagerMsg) {
        match msg {
            ManagerMsg::Gossip { from, claims, ring } => {
                if !ring.is_well_formed() || ring.partitions != self.shared.config.partitions {
                    tracing::warn!(
                        from = %from,
                        partitions = ring.partitions,
                        "ignoring a malformed ring or one with another partition count"
                    );
                    return;
                }
                self.capable.insert(from.clone());
                if claims {
                    self.candidates.insert(from.clone());
                } else {
                    self.candidates.remove(&from);
                }
                let mine = self.shared.ring();
                if ring.supersedes(&mine) {
                    self.adopt(ring);
                    self.check_authority();
                } else if mine.supersedes(&ring) {
                    self.gossip_to(&from);
                }
            }
            ManagerMsg::Leaving { name } => {
                self.leave_requests.insert(name);
            }
            ManagerMsg::TransferDone {
                partition,
                from,
                to,
            } => {
                if self.dones.len() < 4 * self.shared.config.partitions as usize {
                    self.dones.push((partition, from, to));
                }
            }
            ManagerMsg::EnsureVnode {
                partition,
                ring_version,
                reply,
            } => {
                let mine = self.shared.ring();
                let answer = if mine.version < ring_version || partition >= mine.partitions {
                    EnsureReply::StaleRing(mine.version)
                } else {
                    self.ensure_vnode(partition);
                    EnsureReply::Ready
                };
                let _ = reply.send(answer).await;
            }
            ManagerMsg::Status { reply } => {
                let s = self.status();
                let _ = reply.send(s).await;
            }
            ManagerMsg::HandoffFinished { partition, to, ok } => {
                if self.tasks.get(&partition).is_some_and(|t| t.to == to) {
                    self.tasks.remove(&partition);
                }
                if ok {
                    let ring = self.shared.ring();
                    if ring.role(partition, self.name()) == Role::Owner(Some(to.clone())) {
                        let live = self.live();
                        self.report_done(&live, partition, to);
                    }
                } else {
                    self.retry_after
                        .insert(partition, Instant::now() + HANDOFF_RETRY);
                }
                self.reconcile();
            }
            ManagerMsg::Kick => self.on_tick(),
        }
    }

    fn on_event(&mut self, ev: MembershipEvent) {
        match ev {
            MembershipEvent::Up(id) => {
                self.down_since.remove(&*id.name);
                self.left.remove(&*id.name);
                self.gossip_to(&id.name);
            }
            MembershipEvent::Down(id) => {
                self.down_since
                    .entry(id.name.to_string())
                    .or_insert_with(Instant::now);
            }
            MembershipEvent::Left(id) => {
                self.down_since.remove(&*id.name);
                self.capable.remove(&*id.name);
                self.candidates.remove(&*id.name);
                self.left.insert(id.name.to_string());
            }
        }
    }

    fn report_done(&mut self, live: &BTreeMap<String, u64>, partition: u32, to: String) {
        let claimant = self.claimant(live);
        if claimant == self.shared.name {
            self.dones.push((partition, self.shared.name.clone(), to));
        } else {
            self.send_to(
                &claimant,
                ManagerMsg::TransferDone {
                    partition,
                    from: self.shared.name.clone(),
                    to,
                },
            );
        }
    }

    fn on_tick(&mut self) {
        let live = self.live();
        self.capable.retain(|n| live.contains_key(n));
        self.capable.insert(self.shared.name.clone());
        self.candidates.retain(|n| live.contains_key(n));
        if self.shared.config.claim {
            self.candidates.insert(self.shared.name.clone());
        } else {
            self.candidates.remove(&self.shared.name);
        }
        self.down_since.retain(|n, _| !live.contains_key(n));
        self.left.retain(|n| !live.contains_key(n));
        let claimant = self.claimant(&live);
        if claimant == self.shared.name {
            self.claimant_step(&live);
        } else {
            self.dones.clear();
            self.leave_requests.clear();
        }
        let ring = self.shared.ring();
        let me = self.shared.name.clone();
        if self.shared.is_leaving() && ring.has_node(&me) && !ring.leaving.contains(&me) {
            if claimant == me {
                self.leave_requests.insert(me.clone());
            } else {
                self.send_to(&claimant, ManagerMsg::Leaving { name: me.clone() });
            }
        }
        // Transfers complete here but not yet committed: tell the claimant (again).
        let done: Vec<(u32, String)> = self
            .vnodes
            .iter()
            .filter_map(|(&p, vn)| match (ring.role(p, &me), vn.view.mode()) {
                (Role::Owner(Some(to)), Mode::Forwarding(t, _)) if t == to => Some((p, to)),
                _ => None,
            })
            .collect();
        for (p, to) in done {
            self.report_done(&live, p, to);
        }
        // A node that joins a cluster does not know the cluster's ring yet: no handoff and no
        // anti-entropy by the ring it started with (it would move data it does not own).
        let ready = self.shared.ready.load(std::sync::atomic::Ordering::Relaxed);
        if ready {
            self.reconcile();
        }
        let vnodes = &self.vnodes;
        let trusted = if ready {
            self.aae.tick(&self.shared, &ring, &live, |p| {
                vnodes.get(&p).map(|vn| vn.actor.clone())
            })
        } else {
            Vec::new()
        };
        self.shared.recovering.store(
            self.aae.recovering_count(),
            std::sync::atomic::Ordering::Relaxed,
        );
        for p in trusted {
            if let Some(vn) = self.vnodes.get(&p) {
                if vn.actor.try_send(VnodeMsg::Trust).is_ok() {
                    self.shared.stats.aae_recovered.inc();
                    tracing::info!(partition = p, "vnode recovered: in sync with its replicas");
                } else {
                    self.aae.recovering(p);
                }
            }
        }
        // Gossip: the ring to one random member.
        let others: Vec<&String> = live.keys().filter(|n| **n != me).collect();
        if let Some(n) = others.choose(&mut rand::thread_rng()) {
            self.gossip_to(n);
        }
    }

    /// The claimant's decision: membership changes, leaves, committed transfers, new claim.
    fn claimant_step(&mut self, live: &BTreeMap<String, u64>) {
        let ring = self.shared.ring();
        let cfg = &self.shared.config;
        let now = Instant::now();
        let mut nodes: BTreeSet<String> = ring.nodes.iter().cloned().collect();
        let mut departed: Vec<(String, u64)> = ring
            .departed
            .iter()
            .filter(|(n, _)| live.contains_key(n))
            .cloned()
            .collect();
        let leaving_before: BTreeSet<String> = ring
            .leaving
            .iter()
            .chain(self.leave_requests.iter())
            .filter(|n| nodes.contains(*n))
            .cloned()
            .collect();
        let mut owners = ring.owner_names();
        let mut next = ring.next_names();
        for (p, from, to) in self.dones.drain(..) {
            let i = p as usize;
            if i < owners.len() && owners[i] == from && next[i].as_deref() == Some(to.as_str()) {
                owners[i] = to;
                next[i] = None;
            }
        }
        // Removals.
        let mut removed = BTreeSet::new();
        for n in &nodes {
            if live.contains_key(n) || *n == self.shared.name {
                continue;
            }
            let since = *self.down_since.entry(n.clone()).or_insert(now);
            let expired = cfg
                .remove_down_after
                .is_some_and(|d| now.duration_since(since) >= d);
            if self.left.contains(n) || expired {
                removed.insert(n.clone());
            }
        }
        for n in &leaving_before {
            let owns = owners.iter().any(|o| o == n) || next.iter().any(|x| x.as_ref() == Some(n));
            if !owns && !removed.contains(n) {
                removed.insert(n.clone());
                if let Some(inc) = live.get(n) {
                    departed.push((n.clone(), *inc));
                }
            }
        }
        for n in &removed {
            nodes.remove(n);
        }
        // Additions: live nodes that run the ring, may own partitions, and have not departed.
        for n in self.candidates.iter() {
            let Some(inc) = live.get(n) else { continue };
            let gone = departed.iter().any(|(d, i)| d == n && *i >= *inc);
            if !gone {
                nodes.insert(n.clone());
            }
        }
        if nodes.is_empty() {
            return;
        }
        let leaving: BTreeSet<String> = leaving_before
            .into_iter()
            .filter(|n| nodes.contains(n))
            .collect();
        self.leave_requests
            .retain(|n| nodes.contains(n) && !leaving.contains(n));
        let targets: Vec<String> = nodes
            .iter()
            .filter(|n| !leaving.contains(*n))
            .cloned()
            .collect();
        for x in next.iter_mut() {
            if x.as_ref().is_some_and(|n| !nodes.contains(n)) {
                *x = None;
            }
        }
        if targets.is_empty() {
            let first = nodes.iter().next().cloned().unwrap_or_default();
            for (o, x) in owners.iter_mut().zip(next.iter_mut()) {
                if !nodes.contains(o) {
                    *o = first.clone();
                    *x = None;
                }
            }
        } else {
            let is_target = |n: &String| targets.binary_search(n).is_ok();
            let base: Vec<Option<String>> = owners
                .iter()
                .zip(&next)
                .map(|(o, x)| {
                    x.clone()
                        .filter(is_target)
                        .or_else(|| Some(o.clone()).filter(is_target))
                })
                .collect();
            let target = claim(&base, &targets, cfg.n_val);
            for ((o, x), t) in owners.iter_mut().zip(next.iter_mut()).zip(target) {
                if !nodes.contains(o) {
                    *o = t;
                    *x = None;
                } else if *o == t {
                    *x = None;
                } else {
                    *x = Some(t);
                }
            }
        }
        let mut candidate = RingState::from_names(
            ring.version,
            &ring.claimant,
            &nodes,
            &owners,
            &next,
            &leaving,
            departed,
        );
        if candidate.digest() == ring.digest() && candidate.departed == ring.departed {
            return;
        }
        candidate.version = ring.version + 1;
        candidate.claimant = self.shared.name.clone();
        tracing::info!(
            node = %self.shared.name,
            version = candidate.version,
            nodes = ?candidate.nodes,
            leaving = ?candidate.leaving,
            pending = candidate.pending_transfers(),
            "claimant published a new ring"
        );
        self.adopt(candidate);
        // A ring this node made as claimant, from the members it sees: it knows the ring.
        self.shared
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.broadcast();
    }

    fn ensure_vnode(&mut self, p: u32) {
        if !self.vnodes.contains_key(&p) {
            let recovering = self.starts_recovering(p);
            let (actor, view) = vnode::spawn(&self.shared, p, recovering);
            if recovering {
                self.aae.recovering(p);
            }
            self.vnodes.insert(p, Vn { actor, view });
        }
    }

    /// Whether a vnode starting now may hold less than its replicas: it owns the partition
    /// without having received it by handoff, in a cluster that existed before (this node
    /// joins one at start, or has heard another node's ring). The first node of a new cluster
    /// has nothing to recover; a node that receives a partition by handoff gets all of it.
    fn starts_recovering(&self, p: u32) -> bool {
        let owner = matches!(self.shared.ring().role(p, self.name()), Role::Owner(_));
        let joining = !self.shared.node.config().node.peers.is_empty();
        self.shared.config.aae_interval.is_some() && owner && (self.foreign || joining)
    }

    /// After adopting another node's ring: the first time, a vnode this node owns in it was
    /// this node's before it started (it came back): it is recovering. Always: a recovering
    /// vnode of a partition this node does not own (any more) is not, the data comes by
    /// handoff or belongs elsewhere.
    fn check_authority(&mut self) {
        let first = !self.foreign && self.shared.config.aae_interval.is_some();
        self.foreign = true;
        self.shared
            .ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let ring = self.shared.ring();
        let me = self.shared.name.clone();
        for (&p, vn) in &self.vnodes {
            let owner = matches!(ring.role(p, &me), Role::Owner(_));
            if owner
                && first
                && !vn
                    .view
                    .recovering
                    .load(std::sync::atomic::Ordering::Relaxed)
            {
                self.aae.recovering(p);
                let _ = vn.actor.try_send(VnodeMsg::Recover);
            } else if !owner && self.aae.forget(p) {
                let _ = vn.actor.try_send(VnodeMsg::Trust);
            }
        }
    }

    fn stop_vnode(&mut self, p: u32) {
        self.aae.forget(p);
        if let Some(t) = self.tasks.remove(&p) {
            t.handle.abort();
        }
        if let Some(vn) = self.vnodes.get(&p) {
            if vn.actor.try_send(VnodeMsg::Stop).is_ok() {
                self.shared.node.unregister(&vnode::vnode_name(p));
                self.vnodes.remove(&p);
            }
        }
    }

    fn cancel_task(&mut self, p: u32) {
        if let Some(t) = self.tasks.remove(&p) {
            t.handle.abort();
        }
    }

    fn resume(&self, p: u32) {
        if let Some(vn) = self.vnodes.get(&p) {
            let _ = vn.actor.try_send(VnodeMsg::Resume { only_to: None });
        }
    }

    /// Brings the local vnodes in line with the ring: start owned ones, hand off what belongs
    /// elsewhere, stop what is done.
    fn reconcile(&mut self) {
        let ring = self.shared.ring();
        let me = self.shared.name.clone();
        for p in 0..ring.partitions {
            if matches!(ring.role(p, &me), Role::Owner(_) | Role::Next) {
                self.ensure_vnode(p);
            }
        }
        let live = self.live();
        let grace = self.shared.config.forward_grace;
        let now = Instant::now();
        let ps: Vec<u32> = self.vnodes.keys().copied().collect();
        for p in ps {
            if p >= ring.partitions {
                self.stop_vnode(p);
                continue;
            }
            if !self.vnodes[&p]
                .view
                .loaded
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                // Still loading its stored objects: nothing to decide yet.
                continue;
            }
            let (mode, keys, idle) = {
                let vn = &self.vnodes[&p];
                (
                    vn.view.mode(),
                    vn.view.keys.load(std::sync::atomic::Ordering::Relaxed),
                    idle_for(&self.shared, &vn.view),
                )
            };
            let role = ring.role(p, &me);
            let want: Option<String> = match &role {
                Role::Owner(next) => next.clone(),
                Role::Next => None,
                Role::Other => (keys > 0 || matches!(mode, Mode::HandingOff(_)))
                    .then(|| ring.next_owner(p).unwrap_or(ring.owner(p)).to_string()),
            };
            match (want, mode) {
                (None, Mode::Serving) => {
                    self.cancel_task(p);
                    if role == Role::Other && keys == 0 && idle >= grace {
                        self.stop_vnode(p);
                    }
                }
                (None, Mode::HandingOff(_)) => {
                    self.cancel_task(p);
                    self.resume(p);
                }
                (None, Mode::Forwarding(_, since)) => {
                    self.cancel_task(p);
                    if role == Role::Other {
                        if since.elapsed() >= grace {
                            self.stop_vnode(p);
                        }
                    } else {
                        self.resume(p);
                    }
                }
                (Some(t), Mode::Forwarding(to, since)) => {
                    self.cancel_task(p);
                    if t == to {
                        if role == Role::Other && since.elapsed() >= grace {
                            self.stop_vnode(p);
                        }
                    } else {
                        self.resume(p);
                    }
                }
                (Some(t), _) => {
                    if t == me || !live.contains_key(&t) {
                        self.cancel_task(p);
                        continue;
                    }
                    if let Some(task) = self.tasks.get(&p) {
                        if task.to == t && !task.handle.is_finished() {
                            continue;
                        }
                        self.cancel_task(p);
                    }
                    if self.retry_after.get(&p).is_some_and(|at| *at > now) {
                        continue;
                    }
                    self.retry_after.remove(&p);
                    let vn = &self.vnodes[&p];
                    let job = HandoffJob {
                        shared: self.shared.clone(),
                        partition: p,
                        to: t.clone(),
                        vnode: vn.actor.clone(),
                        manager: self.me.clone(),
                        slots: self.slots.clone(),
                    };
                    tracing::debug!(node = %me, partition = p, to = %t, "handoff scheduled");
                    let handle = tokio::spawn(handoff::run(job));
                    self.tasks.insert(p, Task { to: t, handle });
                }
            }
        }
    }

    fn status(&self) -> NodeStatus {
        let ring = self.shared.ring();
        let me = self.name();
        let mut keys = 0;
        let mut bytes = 0;
        let mut stray = 0;
        let mut forwarding = 0;
        let mut loading = 0;
        for (&p, vn) in &self.vnodes {
            if !vn.view.loaded.load(std::sync::atomic::Ordering::Relaxed) {
                loading += 1;
            }
            let k = vn.view.keys.load(std::sync::atomic::Ordering::Relaxed);
            keys += k;
            bytes += vn.view.bytes.load(std::sync::atomic::Ordering::Relaxed);
            if p >= ring.partitions || ring.role(p, me) == Role::Other {
                stray += k;
            }
            if matches!(vn.view.mode(), Mode::Forwarding(..)) {
                forwarding += 1;
            }
        }
        NodeStatus {
            name: me.to_string(),
            ring_version: ring.version,
            ring_digest: ring.digest(),
            claimant: ring.claimant.clone(),
            nodes: ring.nodes.clone(),
            partitions: ring.partitions,
            owned: ring.owned_by(me).len(),
            pending_transfers: ring.pending_transfers(),
            vnodes: self.vnodes.len(),
            loading,
            keys,
            bytes,
            handoffs: self.tasks.len(),
            stray_keys: stray,
            forwarding,
            claims: self.shared.config.claim,
            recovering: self.aae.recovering_count(),
        }
    }
}
