//! HyParView (Leitão, Pereira, Rodrigues, DSN 2007): a peer-to-peer overlay with two partial views.
//!
//! The *active view* (a few nodes, symmetric, one open connection each) is what broadcast runs
//! over; the *passive view* (a few dozen identities, no connection) is the reserve that repairs
//! it. A new node sends JOIN to a contact, which adds it and starts a FORWARDJOIN random walk
//! through each of its other neighbours: the walk ends (after `arwl` hops, or earlier at a node
//! with a single neighbour) at a node that adds the newcomer to its active view, and the node
//! at hop `arwl - prwl` puts it in its passive view. A node whose active view is full drops a
//! random neighbour (DISCONNECT; the dropped one keeps it as passive). A neighbour declared down
//! is replaced by a NEIGHBOR request to a random passive node: high priority (always accepted)
//! when the active view is empty, low priority (accepted only into a free slot) otherwise; a
//! refused request moves on to another passive node. Every shuffle period a node sends SHUFFLE
//! (itself, `shuffle_active` active and `shuffle_passive` passive identities) on a random walk;
//! where the walk ends, the receiver answers the originator directly with as many of its own
//! passive identities, and both merge what they got into their passive views, evicting first the
//! identities they sent. A leaving node tells its neighbours, which forget it and replace it.
//!
//! Beyond the paper, each one documented at its place: replacements for several failed
//! neighbours run in parallel; an active view below its size is topped up from the passive view
//! every shuffle period; nodes recently declared down or no longer heard from are
//! remembered (a few) and re-dialed one per period, so that when a partition heals, or active
//! views have closed into separate full groups, the sides find each other again; and a member
//! whose heartbeats are half the member timeout late ([`Overlay::on_silent`]) is dialed at
//! once and asked to be a neighbour, so that groups closed that way join again before the
//! member timeout declares the other group down. A node that gets a walk (SHUFFLE,
//! FORWARDJOIN) from a node outside its active view, which only a node that holds it as a
//! neighbour sends, tells that node to drop it (DISCONNECT): a view left one-sided by a lost
//! message is mended within a few shuffle periods, at no cost when views agree.
//!
//! Members are this node, its active view, and the nodes the broadcast layer reports routes to
//! (see [`HyParView::set_routes`]); a node in the active view is reached directly, another one
//! through the neighbour its route names.

use std::collections::{BTreeMap, VecDeque};
use std::hash::{DefaultHasher, Hasher};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{Effects, Liveness, Overlay, Route, TimerId};
use crate::id::{NodeId, PeerId};

const SHUFFLE: TimerId = TimerId(1);
/// Random walks longer than this are cut short (the length comes from the network).
const MAX_TTL: u8 = 32;

/// HyParView's parameters; the defaults are the paper's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HyParViewConfig {
    /// Active view size: log10(n) + c in the paper; 5 suits clusters up to about 10,000 nodes.
    pub active_size: usize,
    /// Passive view size (the paper uses 6 × the active size).
    pub passive_size: usize,
    /// Active random walk length of FORWARDJOIN.
    pub arwl: u8,
    /// Passive random walk length: the walk's node at this many hops left adds the newcomer to
    /// its passive view.
    pub prwl: u8,
    /// Random walk length of SHUFFLE.
    pub shuffle_ttl: u8,
    /// How many active-view identities a SHUFFLE carries (ka).
    pub shuffle_active: usize,
    /// How many passive-view identities a SHUFFLE carries (kp).
    pub shuffle_passive: usize,
    /// How often a node shuffles (and tops up its active view, and re-dials one suspect).
    pub shuffle_period: Duration,
    /// How many nodes recently declared down are remembered and re-dialed (0 turns it off).
    pub suspects: usize,
    /// The most routes to non-neighbours kept from [`HyParView::set_routes`].
    pub max_routes: usize,
    /// Seed of the random choices; `None` derives one from the node's identity.
    pub seed: Option<u64>,
}

impl Default for HyParViewConfig {
    fn default() -> Self {
        HyParViewConfig {
            active_size: 5,
            passive_size: 30,
            arwl: 6,
            prwl: 3,
            shuffle_ttl: 6,
            shuffle_active: 3,
            shuffle_passive: 4,
            shuffle_period: Duration::from_secs(1),
            suspects: 8,
            max_routes: 100_000,
            seed: None,
        }
    }
}

/// HyParView protocol messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HyParViewMsg<P = NodeId> {
    /// The sender joins through the receiver.
    Join,
    /// A random walk introducing `node`, with `ttl` hops left.
    ForwardJoin {
        /// The joining node.
        node: P,
        /// Hops left.
        ttl: u8,
    },
    /// The end of a FORWARDJOIN walk: the sender added the receiver to its active view.
    ForwardJoinReply,
    /// Asks the receiver to take the sender into its active view.
    Neighbor {
        /// High priority (the sender has no neighbour left): always accepted.
        high: bool,
    },
    /// The answer to [`HyParViewMsg::Neighbor`].
    NeighborReply {
        /// Whether the sender took the receiver into its active view.
        accepted: bool,
    },
    /// The sender removed the receiver from its active view.
    Disconnect {
        /// The sender leaves the cluster (otherwise it only dropped the receiver).
        leaving: bool,
    },
    /// A random walk carrying a sample of `origin`'s views.
    Shuffle {
        /// The node that started the shuffle; the reply goes to it directly.
        origin: P,
        /// Hops left.
        ttl: u8,
        /// The origin and some of its active and passive identities.
        nodes: Vec<P>,
    },
    /// The answer to a shuffle: a sample of the sender's passive view.
    ShuffleReply {
        /// The identities.
        nodes: Vec<P>,
    },
}

type Msg<P = NodeId> = HyParViewMsg<P>;

/// A random element of `from` not in `skip`.
fn pick<'a, P: PartialEq>(rng: &mut StdRng, from: &'a [P], skip: &[&P]) -> Option<&'a P> {
    let n = from.iter().filter(|n| !skip.contains(n)).count();
    if n == 0 {
        return None;
    }
    from.iter()
        .filter(|n| !skip.contains(n))
        .nth(rng.gen_range(0..n))
}

/// Up to `k` distinct random elements of `from`, other than `skip`.
fn sample<P: Clone + PartialEq>(rng: &mut StdRng, from: &[P], k: usize, skip: &P) -> Vec<P> {
    let mut pool: Vec<&P> = from.iter().filter(|n| *n != skip).collect();
    let mut out = Vec::with_capacity(k.min(pool.len()));
    while out.len() < k && !pool.is_empty() {
        let i = rng.gen_range(0..pool.len());
        out.push(pool.swap_remove(i).clone());
    }
    out
}

/// A NEIGHBOR request awaiting its reply.
#[derive(Debug)]
struct Pending<P> {
    node: P,
    high: bool,
    /// Already waiting at the previous shuffle period: given up at the next one.
    old: bool,
}

/// The HyParView overlay.
#[derive(Debug)]
pub struct HyParView<P = NodeId> {
    me: P,
    cfg: HyParViewConfig,
    rng: StdRng,
    active: Vec<P>,
    passive: Vec<P>,
    /// NEIGHBOR requests awaiting a reply.
    pending: Vec<Pending<P>>,
    /// Refused this period: not asked again until the next shuffle period.
    tried: Vec<P>,
    /// Recently declared down (oldest first), re-dialed one per period.
    suspects: VecDeque<P>,
    /// A member whose heartbeats stopped, dialed to join a part of the overlay this node's
    /// part may have split from (`Overlay::on_silent`): one at a time, until its connection
    /// comes up or the next shuffle period.
    late: Option<P>,
    /// The identities sent in the last shuffle (evicted first when the reply is merged).
    sent: Vec<P>,
    routes: BTreeMap<P, P>,
    version: u64,
    /// Bumped whenever a destination is added to the routes or leaves them (`set_routes`,
    /// `update_route`, a routed member that leaves); with `version`, the overlay's epoch. A
    /// route that only moves to another neighbour changes no member and no neighbour, so it
    /// leaves the epoch alone (the route table follows it by itself).
    routes_version: u64,
    left: bool,
}

impl<P: PeerId> HyParView<P> {
    /// A node with empty views.
    pub fn new(me: P, cfg: HyParViewConfig) -> Self {
        let seed = cfg.seed.unwrap_or_else(|| {
            let mut h = DefaultHasher::new();
            me.hash(&mut h);
            h.finish()
        });
        HyParView {
            me,
            rng: StdRng::seed_from_u64(seed),
            cfg,
            active: Vec::new(),
            passive: Vec::new(),
            pending: Vec::new(),
            tried: Vec::new(),
            suspects: VecDeque::new(),
            late: None,
            sent: Vec::new(),
            routes: BTreeMap::new(),
            version: 0,
            routes_version: 0,
            left: false,
        }
    }

    /// This node.
    pub fn me(&self) -> &P {
        &self.me
    }

    /// The parameters.
    pub fn config(&self) -> &HyParViewConfig {
        &self.cfg
    }

    /// The active view: the neighbours broadcast runs over.
    pub fn neighbors(&self) -> &[P] {
        &self.active
    }

    /// The passive view.
    pub fn passive(&self) -> &[P] {
        &self.passive
    }

    /// A number that changes whenever the active view does (to notice changes cheaply).
    pub fn view_version(&self) -> u64 {
        self.version
    }

    /// Replaces the routes to non-neighbours, `(destination, neighbour to go through)`, as the
    /// broadcast layer learns them from heartbeats (`Plumtree::routes`). Their destinations
    /// count as members; at most `max_routes` are kept.
    ///
    /// A node whose route is gone (its heartbeats stopped arriving) and that is not a
    /// neighbour becomes a suspect, re-dialed like a neighbour declared down (beyond the
    /// paper). Active views can close into separate groups that are each full (two groups of
    /// `active_size + 1` nodes, every node a neighbour of every other in its group): no view
    /// has a free slot, so nothing in the paper's protocol ever asks across, and each group
    /// loses the other's routes for good. A suspect that answers and is still unreachable is
    /// asked with high priority, which joins the groups again.
    pub fn set_routes(&mut self, routes: impl IntoIterator<Item = (P, P)>) {
        let me = &self.me;
        // One destination per route (heartbeats give one way to each origin): the table is
        // built in one go rather than insert by insert.
        let fresh: BTreeMap<P, P> = routes
            .into_iter()
            .filter(|(dst, _)| dst != me)
            .take(self.cfg.max_routes)
            .collect();
        let old = std::mem::replace(&mut self.routes, fresh);
        if !self.routes.keys().eq(old.keys()) {
            self.routes_version += 1;
        }
        // Both tables are sorted: one pass finds the destinations that lost their route.
        let mut kept = self.routes.keys().peekable();
        let mut lost = Vec::new();
        for dst in old.into_keys() {
            while kept.next_if(|k| **k < dst).is_some() {}
            if kept.peek() != Some(&&dst) {
                lost.push(dst);
            }
        }
        for dst in lost {
            if !self.is_active(&dst) {
                self.suspect(dst);
            }
        }
    }

    fn is_active(&self, n: &P) -> bool {
        self.active.contains(n)
    }

    fn is_pending(&self, n: &P) -> bool {
        self.pending.iter().any(|p| p.node == *n)
    }

    fn add_passive(&mut self, n: P) {
        if n == self.me || self.is_active(&n) || self.passive.contains(&n) {
            return;
        }
        if self.passive.len() >= self.cfg.passive_size.max(1) {
            let i = self.rng.gen_range(0..self.passive.len());
            self.passive.swap_remove(i);
        }
        self.passive.push(n);
    }

    /// Adds a node to the active view, dropping a random neighbour if it is full.
    fn add_active(&mut self, n: P, fx: &mut Effects<Msg<P>, P>) {
        if n == self.me || self.is_active(&n) {
            return;
        }
        self.passive.retain(|p| *p != n);
        self.suspects.retain(|p| *p != n);
        self.pending.retain(|p| p.node != n);
        if self.active.len() >= self.cfg.active_size.max(1) {
            let i = self.rng.gen_range(0..self.active.len());
            let dropped = self.active.swap_remove(i);
            fx.send(dropped.clone(), Msg::Disconnect { leaving: false });
            fx.disconnect(dropped.clone());
            self.add_passive(dropped);
        }
        fx.connect(n.clone());
        self.active.push(n);
        self.version += 1;
    }

    fn remove_active(&mut self, n: &P) -> bool {
        let before = self.active.len();
        self.active.retain(|a| a != n);
        let removed = self.active.len() != before;
        if removed {
            self.version += 1;
        }
        removed
    }

    fn suspect(&mut self, n: P) {
        if self.cfg.suspects == 0 {
            return;
        }
        self.suspects.retain(|s| *s != n);
        self.suspects.push_back(n);
        while self.suspects.len() > self.cfg.suspects {
            self.suspects.pop_front();
        }
    }

    /// Asks passive nodes to fill the free active slots, one request per slot, in parallel (the
    /// paper starts one replacement per failed neighbour). High priority only when the active
    /// view is empty, and then for one request at a time.
    fn fill(&mut self, fx: &mut Effects<Msg<P>, P>) {
        while self.active.len() + self.pending.len() < self.cfg.active_size {
            let busy: Vec<P> = self.pending.iter().map(|p| p.node.clone()).collect();
            let skip: Vec<&P> = busy.iter().chain(self.tried.iter()).collect();
            let q = pick(&mut self.rng, &self.passive, &skip).cloned();
            let Some(q) = q else { return };
            let high = self.active.is_empty() && !self.pending.iter().any(|p| p.high);
            self.pending.push(Pending {
                node: q.clone(),
                high,
                old: false,
            });
            fx.connect(q.clone());
            fx.send(q, Msg::Neighbor { high });
        }
    }

    /// Merges identities into the passive view, evicting first those in `sent`.
    fn integrate(&mut self, nodes: Vec<P>, sent: &[P]) {
        let cap = self.cfg.passive_size.max(1);
        let mut fresh: Vec<P> = Vec::with_capacity(nodes.len());
        for n in nodes {
            if n != self.me
                && !self.is_active(&n)
                && !self.passive.contains(&n)
                && !fresh.contains(&n)
            {
                fresh.push(n);
            }
        }
        fresh.truncate(cap);
        let mut excess = (self.passive.len() + fresh.len()).saturating_sub(cap);
        if excess > 0 {
            // Evict the identities just sent away first, then random ones.
            self.passive.retain(|p| {
                let evict = excess > 0 && sent.contains(p);
                excess -= usize::from(evict);
                !evict
            });
            while excess > 0 && !self.passive.is_empty() {
                let i = self.rng.gen_range(0..self.passive.len());
                self.passive.swap_remove(i);
                excess -= 1;
            }
        }
        self.passive.extend(fresh);
    }

    fn shuffle(&mut self, fx: &mut Effects<Msg<P>, P>) {
        let Some(q) = pick(&mut self.rng, &self.active, &[]).cloned() else {
            return;
        };
        let mut nodes = vec![self.me.clone()];
        let (ka, kp) = (self.cfg.shuffle_active, self.cfg.shuffle_passive);
        nodes.extend(sample(&mut self.rng, &self.active, ka, &q));
        nodes.extend(sample(&mut self.rng, &self.passive, kp, &q));
        self.sent = nodes.clone();
        let ttl = self.cfg.shuffle_ttl.min(MAX_TTL);
        fx.send(
            q,
            Msg::Shuffle {
                origin: self.me.clone(),
                ttl,
                nodes,
            },
        );
    }

    /// Re-dials the oldest suspect (beyond the paper): if it answers, the connection comes up
    /// and `on_connection` asks it to be a neighbour, which joins partitions that healed.
    fn probe(&mut self, fx: &mut Effects<Msg<P>, P>) {
        if let Some(s) = self.suspects.pop_front() {
            fx.connect(s.clone());
            self.suspects.push_back(s);
        }
    }

    fn on_forward_join(&mut self, from: &P, node: P, ttl: u8, fx: &mut Effects<Msg<P>, P>) {
        if node == self.me {
            return;
        }
        if ttl == 0 || self.active.len() <= 1 {
            return self.accept_walk(node, fx);
        }
        if ttl == self.cfg.prwl {
            self.add_passive(node.clone());
        }
        match pick(&mut self.rng, &self.active, &[from, &node]) {
            Some(next) => fx.send(
                next.clone(),
                Msg::ForwardJoin {
                    node,
                    ttl: ttl.min(MAX_TTL) - 1,
                },
            ),
            None => self.accept_walk(node, fx),
        }
    }

    fn accept_walk(&mut self, node: P, fx: &mut Effects<Msg<P>, P>) {
        if !self.is_active(&node) {
            self.add_active(node.clone(), fx);
            fx.send(node, Msg::ForwardJoinReply);
        }
    }

    fn on_shuffle(
        &mut self,
        from: &P,
        origin: P,
        ttl: u8,
        mut nodes: Vec<P>,
        fx: &mut Effects<Msg<P>, P>,
    ) {
        if origin == self.me {
            return;
        }
        nodes.truncate(1 + self.cfg.shuffle_active + self.cfg.shuffle_passive);
        let ttl = ttl.min(MAX_TTL).saturating_sub(1);
        if ttl > 0 && self.active.len() > 1 {
            if let Some(next) = pick(&mut self.rng, &self.active, &[from, &origin]) {
                let msg = Msg::Shuffle { origin, ttl, nodes };
                return fx.send(next.clone(), msg);
            }
        }
        let reply = sample(&mut self.rng, &self.passive, nodes.len(), &origin);
        fx.connect(origin.clone());
        fx.send(
            origin.clone(),
            Msg::ShuffleReply {
                nodes: reply.clone(),
            },
        );
        if !self.is_active(&origin) && !self.is_pending(&origin) {
            fx.disconnect(origin);
        }
        self.integrate(nodes, &reply);
    }

    fn on_neighbor(&mut self, from: &P, high: bool, fx: &mut Effects<Msg<P>, P>) {
        let accepted =
            self.is_active(from) || high || self.active.len() < self.cfg.active_size.max(1);
        if accepted {
            self.add_active(from.clone(), fx);
        } else {
            self.add_passive(from.clone());
            fx.connect(from.clone());
        }
        fx.send(from.clone(), Msg::NeighborReply { accepted });
    }

    fn on_neighbor_reply(&mut self, from: &P, accepted: bool, fx: &mut Effects<Msg<P>, P>) {
        let asked = self.is_pending(from);
        self.pending.retain(|p| p.node != *from);
        if accepted && asked {
            self.add_active(from.clone(), fx);
        } else if accepted && !self.is_active(from) {
            // An answer to a request given up, or overtaken (we took the sender in and dropped it
            // since): the sender has us, we do not have it; undo its side.
            fx.connect(from.clone());
            fx.send(from.clone(), Msg::Disconnect { leaving: false });
            fx.disconnect(from.clone());
        } else if !accepted {
            self.tried.push(from.clone());
            if !self.is_active(from) {
                fx.disconnect(from.clone());
            }
            self.fill(fx);
        }
    }

    /// A walk arrived from `from`, which sends walks only to its neighbours: when it is not
    /// one here (nor asked to be), the views disagree (a message between the two was lost,
    /// or one was dropped a moment ago and its DISCONNECT is on its way), and `from` is told
    /// to drop this node. The walk itself goes on.
    fn one_sided(&mut self, from: &P, fx: &mut Effects<Msg<P>, P>) {
        if self.is_active(from) || self.is_pending(from) {
            return;
        }
        fx.send(from.clone(), Msg::Disconnect { leaving: false });
        fx.disconnect(from.clone());
    }

    fn on_disconnect(&mut self, from: &P, leaving: bool, fx: &mut Effects<Msg<P>, P>) {
        let was_active = self.remove_active(from);
        if leaving {
            self.passive.retain(|p| p != from);
            self.pending.retain(|p| p.node != *from);
            if self.routes.remove(from).is_some() {
                self.routes_version += 1;
            }
            fx.left(from.clone());
            self.fill(fx);
        } else if was_active {
            self.add_passive(from.clone());
        }
    }
}

impl<P: PeerId> Overlay<P> for HyParView<P> {
    type Msg = HyParViewMsg<P>;

    fn name(&self) -> &'static str {
        "peer-to-peer"
    }

    fn on_start(&mut self, fx: &mut Effects<Msg<P>, P>) {
        // A random phase, so that nodes started together do not shuffle in lockstep.
        let period = self.cfg.shuffle_period;
        let first = period.mul_f64(0.5 + self.rng.gen::<f64>());
        fx.timer(SHUFFLE, first);
    }

    fn on_join(&mut self, contact: &P, fx: &mut Effects<Msg<P>, P>) {
        self.left = false;
        if *contact == self.me {
            return;
        }
        self.add_active(contact.clone(), fx);
        fx.send(contact.clone(), Msg::Join);
    }

    fn on_leave(&mut self, fx: &mut Effects<Msg<P>, P>) {
        for a in std::mem::take(&mut self.active) {
            fx.send(a.clone(), Msg::Disconnect { leaving: true });
            fx.left(a.clone());
            fx.disconnect(a);
        }
        for p in std::mem::take(&mut self.pending) {
            fx.disconnect(p.node);
        }
        for (dst, _) in std::mem::take(&mut self.routes) {
            fx.left(dst);
        }
        self.passive.clear();
        self.suspects.clear();
        self.tried.clear();
        self.version += 1;
        self.left = true;
    }

    fn on_message(&mut self, from: &P, msg: Msg<P>, fx: &mut Effects<Msg<P>, P>) {
        if *from == self.me || (self.left && msg != Msg::Join) {
            return;
        }
        match msg {
            Msg::Join => {
                self.left = false;
                self.add_active(from.clone(), fx);
                let ttl = self.cfg.arwl.min(MAX_TTL);
                for a in self.active.iter().filter(|a| *a != from) {
                    let node = from.clone();
                    fx.send(a.clone(), Msg::ForwardJoin { node, ttl });
                }
            }
            Msg::ForwardJoin { node, ttl } => {
                self.one_sided(from, fx);
                self.on_forward_join(from, node, ttl, fx)
            }
            Msg::ForwardJoinReply => self.add_active(from.clone(), fx),
            Msg::Neighbor { high } => self.on_neighbor(from, high, fx),
            Msg::NeighborReply { accepted } => self.on_neighbor_reply(from, accepted, fx),
            Msg::Disconnect { leaving } => self.on_disconnect(from, leaving, fx),
            Msg::Shuffle { origin, ttl, nodes } => {
                self.one_sided(from, fx);
                self.on_shuffle(from, origin, ttl, nodes, fx)
            }
            Msg::ShuffleReply { mut nodes } => {
                nodes.truncate(1 + self.cfg.shuffle_active + self.cfg.shuffle_passive);
                let sent = std::mem::take(&mut self.sent);
                self.integrate(nodes, &sent);
            }
        }
    }

    fn on_connection(&mut self, peer: &P, up: bool, fx: &mut Effects<Msg<P>, P>) {
        if self.left {
            return;
        }
        // A dial to a silent member that fails keeps the slot until the next shuffle period:
        // at most one such dial a period, whatever the number of silent members (after a
        // crash that no neighbour reported, every node may find the dead one silent).
        let late = up && self.late.as_ref() == Some(peer);
        if late {
            self.late = None;
        }
        if up {
            // A suspect answered a probe (or dialed us): it was wrongly declared down. Unless
            // its heartbeats reach this node again by now, it is asked to be a neighbour. So
            // is a member whose heartbeats stopped though its route stays (this node's part
            // of the overlay may have split from its part, each with its views full): one
            // link joins the parts again.
            let suspect = self.suspects.iter().position(|s| s == peer);
            if let Some(i) = suspect {
                self.suspects.remove(i);
            }
            if suspect.is_some() || late {
                let unreachable = self.route(peer) == Route::Unreachable;
                if (unreachable || late) && !self.is_pending(peer) && !self.is_active(peer) {
                    self.pending.push(Pending {
                        node: peer.clone(),
                        high: true,
                        old: false,
                    });
                    // Wanted now, whatever this node said of the connection before (it may
                    // have let it go once a shuffle reply was out): otherwise the request
                    // would go out with the goodbye, the peer would take this node as a
                    // neighbour and then drop it, and the reply would make this node keep
                    // the peer on its own.
                    fx.connect(peer.clone());
                    fx.send(peer.clone(), Msg::Neighbor { high: true });
                }
            }
            return;
        }
        let was_pending = self.is_pending(peer);
        if was_pending {
            self.pending.retain(|p| p.node != *peer);
            self.passive.retain(|p| p != peer);
        }
        if was_pending || self.remove_active(peer) {
            self.suspect(peer.clone());
            self.fill(fx);
        }
    }

    fn on_timer(&mut self, timer: TimerId, fx: &mut Effects<Msg<P>, P>) {
        if timer != SHUFFLE {
            return;
        }
        if !self.left {
            self.tried.clear();
            // A dial to a silent member that neither connected nor failed: another may go.
            self.late = None;
            // A request unanswered for a whole period is given up (its answer may be lost),
            // so that it does not hold an active slot forever.
            for p in std::mem::take(&mut self.pending) {
                if !p.old {
                    self.pending.push(Pending { old: true, ..p });
                } else if !self.is_active(&p.node) {
                    fx.disconnect(p.node);
                }
            }
            // Beyond the paper: an active view below its size is topped up every period.
            self.fill(fx);
            self.shuffle(fx);
            self.probe(fx);
        }
        fx.timer(SHUFFLE, self.cfg.shuffle_period);
    }

    fn members(&self) -> Vec<P> {
        // The routes' destinations come sorted; the few neighbours and this node go in place.
        let mut all: Vec<P> = Vec::with_capacity(self.routes.len() + self.active.len() + 1);
        all.extend(self.routes.keys().cloned());
        for n in self.active.iter().chain(std::iter::once(&self.me)) {
            if let Err(i) = all.binary_search(n) {
                all.insert(i, n.clone());
            }
        }
        all
    }

    fn route(&self, dst: &P) -> Route<P> {
        if *dst == self.me || self.is_active(dst) {
            return Route::Direct;
        }
        match self.routes.get(dst) {
            Some(via) if self.is_active(via) => Route::Via(via.clone()),
            _ => Route::Unreachable,
        }
    }

    fn neighbors(&self) -> Option<Vec<P>> {
        Some(self.active.clone())
    }

    fn liveness(&self) -> Liveness {
        Liveness::Membership
    }

    fn set_routes(&mut self, routes: Vec<(P, P)>) {
        if !self.left {
            HyParView::set_routes(self, routes);
        }
    }

    fn update_route(&mut self, dst: P, via: P) {
        let room = self.routes.contains_key(&dst) || self.routes.len() < self.cfg.max_routes;
        if self.left || dst == self.me || !room {
            return;
        }
        if self.routes.insert(dst, via).is_none() {
            self.routes_version += 1;
        }
    }

    fn on_silent(&mut self, peer: &P, fx: &mut Effects<Msg<P>, P>) {
        let busy = self.late.is_some() || self.is_active(peer) || self.is_pending(peer);
        if self.left || busy || *peer == self.me {
            return;
        }
        self.late = Some(peer.clone());
        fx.connect(peer.clone());
    }

    /// The active view's version plus the routes' destinations': members and neighbours
    /// depend on nothing else.
    fn epoch(&self) -> Option<u64> {
        Some(self.version.wrapping_add(self.routes_version))
    }
}

// Tests of several nodes together (joins, failures, leave, shuffles) drive the overlay through
// the `Overlay` trait in `maquis-sim/tests/hyparview.rs`.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::overlay::Effect;

    fn id(i: usize) -> NodeId {
        NodeId::new(
            format!("n{i}"),
            format!("127.0.0.1:{}", 1000 + i).parse().unwrap(),
            1,
        )
    }

    fn cfg() -> HyParViewConfig {
        HyParViewConfig {
            active_size: 3,
            passive_size: 6,
            shuffle_active: 2,
            shuffle_passive: 2,
            ..HyParViewConfig::default()
        }
    }

    #[test]
    fn the_epoch_moves_with_the_active_view_and_the_routes() {
        let mut a = HyParView::new(id(0), cfg());
        let mut fx = Effects::default();
        let e0 = a.epoch();
        a.on_message(&id(1), Msg::Join, &mut fx);
        let e1 = a.epoch();
        assert_ne!(e1, e0, "a neighbour came");
        // A shuffle changes only the passive view.
        let nodes = vec![id(5), id(6)];
        a.on_message(&id(1), Msg::ShuffleReply { nodes }, &mut fx);
        assert_eq!(a.epoch(), e1);
        Overlay::set_routes(&mut a, vec![(id(2), id(1))]);
        let e2 = a.epoch();
        assert_ne!(e2, e1, "a route came");
        Overlay::set_routes(&mut a, vec![(id(2), id(1))]);
        assert_eq!(a.epoch(), e2, "the same routes");
        a.on_message(&id(2), Msg::Disconnect { leaving: true }, &mut fx);
        assert_ne!(a.epoch(), e2, "a routed member left");
    }

    #[test]
    fn empty_active_view_asks_with_high_priority() {
        let mut a = HyParView::new(id(0), cfg());
        a.passive = vec![id(1), id(2)];
        a.active = vec![id(3)];
        let mut fx = Effects::default();
        a.on_connection(&id(3), false, &mut fx);
        let highs: Vec<bool> = fx
            .drain()
            .filter_map(|e| match e {
                Effect::Send(_, Msg::Neighbor { high }) => Some(high),
                _ => None,
            })
            .collect();
        assert_eq!(highs, vec![true, false]);
        // A full node refuses low priority and accepts high priority.
        let mut full = HyParView::new(id(5), cfg());
        full.active = vec![id(6), id(7), id(8)];
        let mut fx = Effects::default();
        full.on_message(&id(0), Msg::Neighbor { high: false }, &mut fx);
        assert!(!full.is_active(&id(0)) && full.passive().contains(&id(0)));
        full.on_message(&id(0), Msg::Neighbor { high: true }, &mut fx);
        assert!(full.is_active(&id(0)) && full.neighbors().len() == 3);
        let sent: Vec<Msg> = fx
            .drain()
            .filter_map(|e| match e {
                Effect::Send(_, m) => Some(m),
                _ => None,
            })
            .collect();
        assert!(sent.contains(&Msg::NeighborReply { accepted: false }));
        assert!(sent.contains(&Msg::Disconnect { leaving: false }));
        assert!(sent.contains(&Msg::NeighborReply { accepted: true }));
    }

    #[test]
    fn forward_join_walk_ends_in_active_and_passes_passive() {
        let mut a = HyParView::new(id(0), cfg());
        a.active = vec![id(1), id(2)];
        let mut fx = Effects::default();
        a.on_message(
            &id(1),
            Msg::ForwardJoin {
                node: id(9),
                ttl: 3,
            },
            &mut fx,
        );
        assert!(a.passive().contains(&id(9)), "added at ttl == prwl");
        let e: Vec<_> = fx.drain().collect();
        assert!(e.contains(&Effect::Send(
            id(2),
            Msg::ForwardJoin {
                node: id(9),
                ttl: 2
            }
        )));
        a.on_message(
            &id(1),
            Msg::ForwardJoin {
                node: id(9),
                ttl: 0,
            },
            &mut fx,
        );
        assert!(a.is_active(&id(9)) && !a.passive().contains(&id(9)));
        assert!(fx
            .drain()
            .any(|e| e == Effect::Send(id(9), Msg::ForwardJoinReply)));
    }

    #[test]
    fn routes_and_members() {
        let mut a = HyParView::new(id(0), cfg());
        let mut fx = Effects::default();
        a.on_join(&id(1), &mut fx);
        a.set_routes([(id(5), id(1)), (id(6), id(4))]);
        assert_eq!(a.route(&id(1)), Route::Direct);
        assert_eq!(a.route(&id(5)), Route::Via(id(1)));
        assert_eq!(
            a.route(&id(6)),
            Route::Unreachable,
            "via is not a neighbour"
        );
        assert_eq!(a.route(&id(7)), Route::Unreachable);
        assert_eq!(a.members(), vec![id(0), id(1), id(5), id(6)]);
    }

    #[test]
    fn suspect_that_answers_is_asked_to_be_a_neighbour() {
        let mut a = HyParView::new(id(0), cfg());
        let mut fx = Effects::default();
        a.on_join(&id(1), &mut fx);
        a.on_connection(&id(1), false, &mut fx);
        fx.drain().for_each(drop);
        a.on_timer(SHUFFLE, &mut fx);
        assert!(fx.drain().any(|e| e == Effect::Connect(id(1))), "re-dialed");
        a.on_connection(&id(1), true, &mut fx);
        assert!(fx
            .drain()
            .any(|e| e == Effect::Send(id(1), Msg::Neighbor { high: true })));
    }

    #[test]
    fn a_node_no_longer_heard_from_is_probed_and_asked_only_while_unreachable() {
        let mut a = HyParView::new(id(0), cfg());
        let mut fx = Effects::default();
        a.on_join(&id(1), &mut fx);
        a.set_routes([(id(5), id(1)), (id(6), id(1))]);
        a.set_routes([(id(6), id(1))]);
        fx.drain().for_each(drop);
        a.on_timer(SHUFFLE, &mut fx);
        assert!(fx.drain().any(|e| e == Effect::Connect(id(5))), "re-dialed");
        a.on_connection(&id(5), true, &mut fx);
        assert!(fx
            .drain()
            .any(|e| e == Effect::Send(id(5), Msg::Neighbor { high: true })));
        // Heard from again (through a neighbour) before it answered: not asked.
        a.set_routes([]);
        a.set_routes([(id(6), id(1))]);
        fx.drain().for_each(drop);
        a.on_connection(&id(6), true, &mut fx);
        assert!(!fx
            .drain()
            .any(|e| matches!(e, Effect::Send(_, Msg::Neighbor { .. }))));
        // A neighbour's route going away does not make it a suspect.
        a.set_routes([(id(1), id(1))]);
        a.set_routes([]);
        assert!(!a.suspects.contains(&id(1)));
    }

    /// A member whose heartbeats stopped while its route stays (this node's group of full
    /// views may have closed off from its own) is dialed at once, one at a time, and asked to
    /// be a neighbour with high priority when the connection comes up, route or not.
    #[test]
    fn a_silent_member_is_dialed_and_asked_one_at_a_time() {
        let mut a = HyParView::new(id(0), cfg());
        let mut fx = Effects::default();
        for n in 1..=3 {
            a.on_join(&id(n), &mut fx);
        }
        a.set_routes([(id(5), id(1)), (id(6), id(2))]);
        fx.drain().for_each(drop);
        a.on_silent(&id(1), &mut fx);
        assert!(fx.drain().next().is_none(), "a neighbour is not dialed");
        a.on_silent(&id(5), &mut fx);
        assert_eq!(fx.drain().collect::<Vec<_>>(), vec![Effect::Connect(id(5))]);
        a.on_silent(&id(6), &mut fx);
        assert!(fx.drain().next().is_none(), "one at a time");
        a.on_connection(&id(5), true, &mut fx);
        assert!(
            fx.drain()
                .any(|e| e == Effect::Send(id(5), Msg::Neighbor { high: true })),
            "asked though a route to it remains"
        );
        // The next one may go; one that fails (or never answers) holds the slot until the
        // next shuffle period.
        a.on_silent(&id(6), &mut fx);
        assert_eq!(fx.drain().collect::<Vec<_>>(), vec![Effect::Connect(id(6))]);
        a.on_connection(&id(6), false, &mut fx);
        a.on_silent(&id(7), &mut fx);
        assert!(fx.drain().next().is_none(), "one a period");
        a.on_timer(SHUFFLE, &mut fx);
        fx.drain().for_each(drop);
        a.on_silent(&id(7), &mut fx);
        assert_eq!(fx.drain().collect::<Vec<_>>(), vec![Effect::Connect(id(7))]);
        // A connection that comes up from a member not dialed this way asks nothing.
        a.on_connection(&id(6), true, &mut fx);
        assert!(!fx
            .drain()
            .any(|e| matches!(e, Effect::Send(_, Msg::Neighbor { .. }))));
    }

    /// A suspect whose shuffle walk ended here is dialed for the reply and let go after it;
    /// when that connection comes up and the suspect has no route, it is asked to be a
    /// neighbour, and the connection is wanted again (the membership machine closes a
    /// connection let go as soon as it is up, unless the overlay connects it again).
    #[test]
    fn a_suspect_asked_on_a_connection_let_go_wants_it_again() {
        let mut a = HyParView::new(id(0), cfg());
        let mut fx = Effects::default();
        for n in 1..=2 {
            a.on_join(&id(n), &mut fx);
        }
        a.set_routes([(id(5), id(1))]);
        a.set_routes([]);
        fx.drain().for_each(drop);
        let shuffle = Msg::Shuffle {
            origin: id(5),
            ttl: 1,
            nodes: vec![id(5)],
        };
        a.on_message(&id(1), shuffle, &mut fx);
        let e: Vec<_> = fx.drain().collect();
        assert!(e.contains(&Effect::Disconnect(id(5))), "{e:?}");
        a.on_connection(&id(5), true, &mut fx);
        let e: Vec<_> = fx.drain().collect();
        let connect = e.iter().position(|x| *x == Effect::Connect(id(5)));
        let ask = e
            .iter()
            .position(|x| *x == Effect::Send(id(5), Msg::Neighbor { high: true }));
        assert!(connect.is_some() && ask.is_some(), "{e:?}");
        // The same for a member dialed because it was silent.
        a.on_silent(&id(6), &mut fx);
        a.on_message(
            &id(1),
            Msg::Shuffle {
                origin: id(6),
                ttl: 1,
                nodes: vec![id(6)],
            },
            &mut fx,
        );
        fx.drain().for_each(drop);
        a.on_connection(&id(6), true, &mut fx);
        let e: Vec<_> = fx.drain().collect();
        assert!(e.contains(&Effect::Connect(id(6))), "{e:?}");
        assert!(e.contains(&Effect::Send(id(6), Msg::Neighbor { high: true })));
    }

    /// Walks come only from neighbours: one from a node outside the active view means the
    /// views disagree, and that node is told to drop this one; the walk goes on either way.
    #[test]
    fn a_walk_from_a_node_outside_the_view_is_answered_with_a_disconnect() {
        let mut a = HyParView::new(id(0), cfg());
        let mut fx = Effects::default();
        for n in 1..=2 {
            a.on_join(&id(n), &mut fx);
        }
        fx.drain().for_each(drop);
        let walk = |origin: usize| Msg::Shuffle {
            origin: id(origin),
            ttl: 1,
            nodes: vec![id(origin)],
        };
        a.on_message(&id(1), walk(1), &mut fx);
        let e: Vec<_> = fx.drain().collect();
        assert!(
            !e.iter()
                .any(|x| matches!(x, Effect::Send(_, Msg::Disconnect { .. }))),
            "{e:?}"
        );
        a.on_message(&id(7), walk(7), &mut fx);
        let e: Vec<_> = fx.drain().collect();
        assert!(e.contains(&Effect::Send(id(7), Msg::Disconnect { leaving: false })));
        assert!(e.contains(&Effect::Disconnect(id(7))));
        assert!(
            e.iter()
                .any(|x| matches!(x, Effect::Send(to, Msg::ShuffleReply { .. }) if *to == id(7))),
            "the walk is answered too: {e:?}"
        );
        let join = Msg::ForwardJoin {
            node: id(9),
            ttl: 3,
        };
        a.on_message(&id(8), join, &mut fx);
        let e: Vec<_> = fx.drain().collect();
        assert!(e.contains(&Effect::Send(id(8), Msg::Disconnect { leaving: false })));
        assert_eq!(a.neighbors(), &[id(1), id(2)]);
    }

    #[test]
    fn unanswered_neighbor_request_is_given_up_after_a_period() {
        let mut a = HyParView::new(id(0), cfg());
        a.passive = vec![id(1)];
        let mut fx = Effects::default();
        a.on_timer(SHUFFLE, &mut fx);
        assert!(fx
            .drain()
            .any(|e| e == Effect::Send(id(1), Msg::Neighbor { high: true })));
        assert!(a.is_pending(&id(1)));
        a.on_timer(SHUFFLE, &mut fx);
        assert!(a.is_pending(&id(1)), "still within its period");
        fx.drain().for_each(drop);
        a.on_timer(SHUFFLE, &mut fx);
        let e: Vec<_> = fx.drain().collect();
        assert!(e.contains(&Effect::Disconnect(id(1))), "given up");
        assert!(
            e.contains(&Effect::Send(id(1), Msg::Neighbor { high: true })),
            "asked again"
        );
        assert!(a.passive().contains(&id(1)));
    }
}
