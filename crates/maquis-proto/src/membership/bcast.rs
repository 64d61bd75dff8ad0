//! Broadcast inside the membership machine: [`Plumtree`] over the overlay's neighbours, plus
//! what membership learns from it.
//!
//! On overlays with [`Liveness::Membership`](crate::overlay::Liveness) every node broadcasts a
//! heartbeat; the heartbeats tell which nodes are alive, and the routes they carry (per origin,
//! the neighbour that offers the shortest way: see `broadcast::routing`) how to reach them. A node that leaves broadcasts a
//! notice first, so that every member reports it `Left` at once; routes from before a departure
//! are ignored until a newer heartbeat of that node arrives (it joined again).
//!
//! A node that loses its connection to a neighbour without a goodbye *accuses* it (after a
//! wait of its own, and only if no other neighbour's notice came first; a dial that fails
//! accuses too, but only a node that is still a member): a down notice (the neighbour and the
//! newest heartbeat number heard from it) to every member. A
//! member that has heard a newer heartbeat ignores the notice; the others *suspect* the node
//! for the suspicion time and then declare it down, unless a newer heartbeat arrives first.
//! The accused node, if it is alive, refutes it with a heartbeat as soon as it hears the notice
//! (the suspicion, 1 s by default, outlasts Plumtree's repair of a broken tree, 0.6 s, so the
//! notice reaches it and its heartbeat reaches the others in time). So a crash is reported everywhere within the suspicion time instead of the
//! member timeout, while a node that only lost one connection stays a member.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;

use crate::broadcast::{
    Plumtree, PlumtreeConfig, PlumtreeEffect, PlumtreeMsg, PlumtreeTimer, Topic,
};
use crate::id::PeerId;

use super::MembershipStats;

/// Topics starting with this are the runtime's own; they are never handed to subscribers.
pub const RESERVED_PREFIX: &str = "$maquis/";

/// The topic of leave notices: the payload is the leaving node and its last heartbeat number.
pub(super) const LEAVE_TOPIC: &str = "$maquis/left";

/// The topic of down notices: the accused node and the newest heartbeat number its accuser
/// heard from it.
pub(super) const DOWN_TOPIC: &str = "$maquis/down";

/// A node suspected down: the heartbeat number it was accused with, and when it is declared
/// down unless a newer one arrives.
#[derive(Clone, Copy, Debug)]
pub(super) struct Suspicion {
    seq: u32,
    until: Duration,
}

pub(super) type PtOut<P> = Vec<PlumtreeEffect<P>>;

pub(super) struct Bcast<P> {
    pt: Plumtree<P>,
    /// The neighbours Plumtree knows, sorted.
    nbrs: Vec<P>,
    /// Nodes gone on purpose, with the last heartbeat number heard from them then: their
    /// routes count again only from a newer heartbeat. Entries go once the route has expired.
    departed: HashMap<P, u32>,
    /// Nodes that announced their departure since the last call to `take_left`.
    left: Vec<P>,
    /// Former neighbours, with when they stopped being neighbours: a neighbour is alive
    /// evidence too, so a node dropped from the views before its first heartbeat arrived stays
    /// a member for the member timeout, like one whose heartbeats stopped.
    former: HashMap<P, Duration>,
    /// This node left (and has not joined again): it keeps no former neighbours.
    quiet: bool,
    /// Nodes accused of being down, until they are declared down or refute it. Only nodes
    /// this node hears from (or heard from) are suspected, so it holds at most the members.
    suspects: HashMap<P, Suspicion>,
    stats: MembershipStats,
}

impl<P: PeerId> Bcast<P> {
    pub fn new(me: P, cfg: PlumtreeConfig) -> Self {
        Bcast {
            pt: Plumtree::new(me, cfg),
            nbrs: Vec::new(),
            departed: HashMap::new(),
            left: Vec::new(),
            former: HashMap::new(),
            quiet: false,
            suspects: HashMap::new(),
            stats: MembershipStats::default(),
        }
    }

    pub fn stats(&self) -> MembershipStats {
        self.stats
    }

    pub fn plumtree(&self) -> &Plumtree<P> {
        &self.pt
    }

    /// The neighbours broadcast runs over, sorted.
    pub fn neighbors(&self) -> &[P] {
        &self.nbrs
    }

    /// Makes `want` the neighbours; returns whether they changed.
    pub fn sync_neighbors(&mut self, mut want: Vec<P>, now: Duration, out: &mut PtOut<P>) -> bool {
        let me = self.pt.me().clone();
        want.retain(|n| *n != me);
        want.sort();
        want.dedup();
        if want == self.nbrs {
            return false;
        }
        // Both lists are sorted: binary searches keep a large neighbourhood (a server with a
        // thousand clients) linear-logarithmic instead of quadratic.
        for gone in self.nbrs.iter().filter(|n| want.binary_search(n).is_err()) {
            self.pt.on_neighbor_down(gone, out);
            if !self.quiet && !self.departed.contains_key(gone) {
                self.former.insert(gone.clone(), now);
            }
        }
        for new in want.iter().filter(|n| self.nbrs.binary_search(n).is_err()) {
            self.pt.on_neighbor_up(new.clone(), now, out);
        }
        self.nbrs = want;
        true
    }

    pub fn broadcast(&mut self, topic: Topic, payload: Bytes, now: Duration, out: &mut PtOut<P>) {
        self.pt.broadcast(topic, payload, now, out);
    }

    pub fn on_message(&mut self, from: &P, msg: PlumtreeMsg<P>, now: Duration, out: &mut PtOut<P>) {
        self.pt.on_message(from, msg, now, out);
    }

    pub fn on_timer(&mut self, t: PlumtreeTimer, now: Duration, out: &mut PtOut<P>) {
        self.pt.on_timer(t, now, out);
    }

    /// Starts this node's heartbeats (idempotent).
    pub fn start_heartbeats(&mut self, out: &mut PtOut<P>) {
        self.quiet = false;
        self.pt.start_heartbeats(out);
    }

    /// This node leaves: a notice to every member, then no more heartbeats; the routes known
    /// now are forgotten (they count again from newer heartbeats, after a join).
    pub fn leave(&mut self, now: Duration, out: &mut PtOut<P>) {
        let notice = (self.pt.me().clone(), self.pt.heartbeat_seq());
        if let Ok(bytes) = crate::encode(&notice) {
            self.pt
                .broadcast(Topic::from(LEAVE_TOPIC), Bytes::from(bytes), now, out);
        }
        self.pt.stop_heartbeats();
        for (origin, _) in self.pt.routes(Duration::MAX, now) {
            let seq = self.pt.route_seq(&origin).unwrap_or(0);
            self.departed.insert(origin, seq);
        }
        self.former.clear();
        self.quiet = true;
    }

    /// Marks a node as gone on purpose (see `departed`).
    pub fn departed(&mut self, node: &P) {
        self.former.remove(node);
        let seq = self.pt.route_seq(node).unwrap_or(0);
        let e = self.departed.entry(node.clone()).or_insert(seq);
        *e = (*e).max(seq);
    }

    /// The nodes that announced their departure since the last call.
    pub fn take_left(&mut self) -> Vec<P> {
        std::mem::take(&mut self.left)
    }

    /// Accuses `node` of being down (its connection was lost without a goodbye): a notice to
    /// every member, this node included.
    pub fn accuse(&mut self, node: &P, now: Duration, out: &mut PtOut<P>) {
        if self.quiet || self.departed.contains_key(node) || self.suspects.contains_key(node) {
            return;
        }
        if self.pt.route_seq(node).is_none() && !self.former.contains_key(node) {
            // Not a member here (the others would ignore the notice too): a dial that failed
            // to a node long gone, whose id still circulates in passive views and shuffles.
            // Without this, every such dial cost a broadcast to every member: 15,738 notices
            // after 100 of 1,000 simulated nodes crashed, 7 times the cluster's traffic.
            return;
        }
        let notice = (node.clone(), self.pt.route_seq(node).unwrap_or(0));
        tracing::debug!(me = %self.pt.me(), %node, seq = notice.1, "accusing a neighbour lost without a goodbye");
        if let Ok(bytes) = crate::encode(&notice) {
            self.stats.accusations += 1;
            self.pt
                .broadcast(Topic::from(DOWN_TOPIC), Bytes::from(bytes), now, out);
        }
    }

    /// A down notice arrived (the payload of a broadcast on [`DOWN_TOPIC`]): the node is
    /// suspected until `now + suspicion`. Returns whether it accuses this node (which should
    /// then refute it with a heartbeat).
    pub fn on_down_notice(
        &mut self,
        payload: &[u8],
        now: Duration,
        suspicion: Duration,
    ) -> Result<bool, postcard::Error> {
        let (node, seq) = postcard::from_bytes::<(P, u32)>(payload)?;
        if node == *self.pt.me() {
            return Ok(true);
        }
        let heard = self.pt.route_seq(&node);
        let known = heard.is_some() || self.former.contains_key(&node);
        if !known || heard.is_some_and(|s| s > seq) || self.departed.contains_key(&node) {
            // Never a member here, alive since the accusation, or gone already.
            return Ok(false);
        }
        let until = now + suspicion;
        self.suspects
            .entry(node)
            .and_modify(|s| s.seq = s.seq.max(seq))
            .or_insert(Suspicion { seq, until });
        Ok(false)
    }

    /// When the next suspicion ends, if any.
    pub fn next_suspicion_end(&self) -> Option<Duration> {
        self.suspects.values().map(|s| s.until).min()
    }

    /// This node refutes an accusation: a heartbeat now.
    pub fn refute(&mut self, out: &mut PtOut<P>) {
        self.stats.refutations += 1;
        self.pt.beat_now(out);
    }

    /// Ends the suspicions that are over: a suspect heard from since is cleared, one whose
    /// time is up is declared down (gone like a departed node, without a notice of its own).
    /// Returns whether any was declared down (only then do the routes change).
    pub fn judge_suspects(&mut self, now: Duration) -> bool {
        let pt = &self.pt;
        let mut down = Vec::new();
        self.suspects.retain(|node, s| {
            if pt.route_seq(node).is_some_and(|h| h > s.seq) {
                return false;
            }
            if now >= s.until {
                down.push((node.clone(), s.seq));
                return false;
            }
            true
        });
        let any = !down.is_empty();
        self.stats.declared_down += down.len() as u64;
        for (node, seq) in down {
            tracing::debug!(me = %self.pt.me(), %node, seq, "suspicion over: declared down");
            self.former.remove(&node);
            let known = self.pt.route_seq(&node).unwrap_or(0);
            let e = self.departed.entry(node).or_insert(0);
            *e = (*e).max(seq).max(known);
        }
        any
    }

    /// The members not heard from for longer than `min_age`: routed nodes whose heartbeats
    /// stopped, and former neighbours never heard from since they were (not this node, nor
    /// the departed).
    pub fn silent(&self, min_age: Duration, now: Duration) -> Vec<P> {
        let me = self.pt.me();
        let mut out = self.pt.silent(min_age, now);
        for (n, at) in &self.former {
            if now.saturating_sub(*at) > min_age && self.pt.route_seq(n).is_none() {
                out.push(n.clone());
            }
        }
        out.retain(|n| n != me && !self.departed.contains_key(n));
        out
    }

    /// `(destination, neighbour to go through)` for every node heard from within `max_age`,
    /// except the departed; a former neighbour without a route goes through itself (which
    /// makes it a member, not reachable).
    pub fn routes(&mut self, max_age: Duration, now: Duration) -> Vec<(P, P)> {
        self.pt.expire(now);
        self.judge_suspects(now);
        self.former
            .retain(|_, at| now.saturating_sub(*at) <= max_age);
        let pt = &self.pt;
        self.departed.retain(|n, _| pt.route_seq(n).is_some());
        let me = pt.me();
        let mut out: Vec<(P, P)> = pt
            .routes(max_age, now)
            .into_iter()
            .filter(|(origin, _)| origin != me)
            .filter(|(origin, _)| match self.departed.get(origin) {
                Some(seq) => pt.route_seq(origin).is_some_and(|s| s > *seq),
                None => true,
            })
            .collect();
        for n in self.former.keys() {
            if !self.departed.contains_key(n) && !out.iter().any(|(d, _)| d == n) {
                out.push((n.clone(), n.clone()));
            }
        }
        out
    }

    /// The routes heartbeats moved since the last call ([`Plumtree::take_moved_routes`]),
    /// except to the departed (unless from a newer heartbeat).
    pub fn take_moved_routes(&mut self) -> Vec<(P, P)> {
        let mut moved = self.pt.take_moved_routes();
        let pt = &self.pt;
        moved.retain(|(origin, _)| match self.departed.get(origin) {
            Some(seq) => pt.route_seq(origin).is_some_and(|s| s > *seq),
            None => origin != pt.me(),
        });
        moved
    }

    /// A leave notice arrived (the payload of a broadcast on [`LEAVE_TOPIC`]).
    pub fn on_leave_notice(&mut self, payload: &[u8]) -> Result<(), postcard::Error> {
        let (node, seq) = postcard::from_bytes::<(P, u32)>(payload)?;
        if node == *self.pt.me() {
            return Ok(());
        }
        let known = self.pt.route_seq(&node).unwrap_or(0);
        let e = self.departed.entry(node.clone()).or_insert(0);
        *e = (*e).max(seq).max(known);
        self.former.remove(&node);
        self.left.push(node);
        Ok(())
    }
}
