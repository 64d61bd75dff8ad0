//! The control loop's broadcast driver: runs the [`Plumtree`] state machine over the overlay's
//! neighbours and carries out its effects (protocol frames on the membership lane, deliveries
//! to local subscribers, timers).
//!
//! On overlays with [`Liveness::Membership`](crate::overlay::Liveness) every node broadcasts a
//! heartbeat; the routes the heartbeats reveal (per origin, the neighbour its heartbeat first
//! came from) tell which nodes are alive and how to reach them. A node that leaves broadcasts a
//! notice first, so that every member reports it `Left` at once; routes from before a departure
//! are ignored until a newer heartbeat of that node arrives (it joined again).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::control::Control;
use super::inner::Inner;
use crate::broadcast::{Plumtree, PlumtreeEffect, PlumtreeMsg, PlumtreeTimer, Topic};
use crate::id::NodeId;
use crate::wire::frame::Header;

/// Topics starting with this are the runtime's own; they are never handed to subscribers.
pub(crate) const RESERVED_PREFIX: &str = "$maquis/";

/// The topic of leave notices: the payload is the leaving node and its last heartbeat number.
const LEAVE_TOPIC: &str = "$maquis/left";

pub(crate) struct Bcast {
    pt: Plumtree<NodeId>,
    /// The neighbours Plumtree knows.
    nbrs: Vec<NodeId>,
    /// Nodes gone on purpose, with the last heartbeat number heard from them then: their
    /// routes count again only from a newer heartbeat. Entries go once the route has expired.
    departed: HashMap<NodeId, u32>,
    /// Nodes that announced their departure since the last call to `take_left`.
    left: Vec<NodeId>,
    /// Former neighbours, with when they stopped being neighbours: a neighbour is alive
    /// evidence too, so a node dropped from the views before its first heartbeat arrived stays
    /// a member for the member timeout, like one whose heartbeats stopped.
    former: HashMap<NodeId, Duration>,
    /// This node left (and has not joined again): it keeps no former neighbours.
    quiet: bool,
    out: Vec<PlumtreeEffect<NodeId>>,
}

impl Bcast {
    pub fn new(inner: &Inner) -> Self {
        Bcast {
            pt: Plumtree::new(inner.id.clone(), inner.config.plumtree()),
            nbrs: Vec::new(),
            departed: HashMap::new(),
            left: Vec::new(),
            former: HashMap::new(),
            quiet: false,
            out: Vec::new(),
        }
    }

    fn now(inner: &Inner) -> Duration {
        inner.started.elapsed()
    }

    /// Makes `want` the neighbours; returns whether they changed.
    pub fn sync_neighbors(&mut self, inner: &Arc<Inner>, mut want: Vec<NodeId>) -> bool {
        want.retain(|n| *n != inner.id);
        want.sort();
        want.dedup();
        if want == self.nbrs {
            return false;
        }
        let now = Self::now(inner);
        // Both lists are sorted: binary searches keep a large neighbourhood (a server with a
        // thousand clients) linear-logarithmic instead of quadratic.
        for gone in self.nbrs.iter().filter(|n| want.binary_search(n).is_err()) {
            self.pt.on_neighbor_down(gone);
            if !self.quiet && !self.departed.contains_key(gone) {
                self.former.insert(gone.clone(), now);
            }
        }
        for new in want.iter().filter(|n| self.nbrs.binary_search(n).is_err()) {
            self.pt.on_neighbor_up(new.clone(), now, &mut self.out);
        }
        self.nbrs = want.clone();
        *inner.neighbors.write().unwrap_or_else(|e| e.into_inner()) = want;
        self.flush(inner);
        true
    }

    /// Broadcasts an encoded message on a topic.
    pub fn broadcast(&mut self, inner: &Arc<Inner>, topic: Topic, payload: Bytes) {
        let now = Self::now(inner);
        self.pt.broadcast(topic, payload, now, &mut self.out);
        self.flush(inner);
    }

    /// A Plumtree message from a neighbour; `Err` if it does not decode.
    pub fn on_message(
        &mut self,
        inner: &Arc<Inner>,
        from: &NodeId,
        bytes: &[u8],
    ) -> Result<(), postcard::Error> {
        let msg: PlumtreeMsg<NodeId> = postcard::from_bytes(bytes)?;
        let now = Self::now(inner);
        self.pt.on_message(from, msg, now, &mut self.out);
        self.flush(inner);
        Ok(())
    }

    /// A timer Plumtree asked for fired.
    pub fn on_timer(&mut self, inner: &Arc<Inner>, t: PlumtreeTimer) {
        let now = Self::now(inner);
        self.pt.on_timer(t, now, &mut self.out);
        self.flush(inner);
    }

    /// Starts this node's heartbeats (idempotent).
    pub fn start_heartbeats(&mut self, inner: &Arc<Inner>) {
        self.quiet = false;
        self.pt.start_heartbeats(&mut self.out);
        self.flush(inner);
    }

    /// This node leaves: a notice to every member, then no more heartbeats; the routes known
    /// now are forgotten (they count again from newer heartbeats, after a join).
    pub fn leave(&mut self, inner: &Arc<Inner>) {
        let notice = (inner.id.clone(), self.pt.heartbeat_seq());
        if let Ok(bytes) = crate::encode(&notice) {
            self.broadcast(inner, Topic::from(LEAVE_TOPIC), Bytes::from(bytes));
        }
        self.pt.stop_heartbeats();
        let now = Self::now(inner);
        for (origin, _) in self.pt.routes(Duration::MAX, now) {
            let seq = self.pt.route_seq(&origin).unwrap_or(0);
            self.departed.insert(origin, seq);
        }
        self.former.clear();
        self.quiet = true;
    }

    /// Marks a node as gone on purpose (see `departed`).
    pub fn departed(&mut self, node: &NodeId) {
        self.former.remove(node);
        let seq = self.pt.route_seq(node).unwrap_or(0);
        let e = self.departed.entry(node.clone()).or_insert(seq);
        *e = (*e).max(seq);
    }

    /// The nodes that announced their departure since the last call.
    pub fn take_left(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.left)
    }

    /// `(destination, neighbour to go through)` for every node heard from within `max_age`,
    /// except the departed; a former neighbour without a route goes through itself (which
    /// makes it a member, not reachable).
    pub fn routes(&mut self, inner: &Inner, max_age: Duration) -> Vec<(NodeId, NodeId)> {
        let now = Self::now(inner);
        self.pt.expire(now);
        self.former
            .retain(|_, at| now.saturating_sub(*at) <= max_age);
        let pt = &self.pt;
        self.departed.retain(|n, _| pt.route_seq(n).is_some());
        let mut out: Vec<(NodeId, NodeId)> = pt
            .routes(max_age, now)
            .into_iter()
            .filter(|(origin, _)| *origin != inner.id)
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

    /// Carries out the effects Plumtree pushed.
    fn flush(&mut self, inner: &Arc<Inner>) {
        for e in std::mem::take(&mut self.out) {
            match e {
                PlumtreeEffect::Send(to, msg) => {
                    let peer = inner.peer(&to.name).filter(|p| p.id == to);
                    match (peer, crate::encode(&msg)) {
                        (Some(p), Ok(bytes)) => {
                            inner.send_control(&p, &Header::Broadcast, Bytes::from(bytes))
                        }
                        _ => inner.counters.control_drops.inc(),
                    }
                }
                PlumtreeEffect::Deliver { topic, payload, .. } => {
                    if topic.as_str() == LEAVE_TOPIC {
                        self.on_leave_notice(inner, &payload);
                    } else if !topic.as_str().starts_with(RESERVED_PREFIX) {
                        let dropped = inner.topics.deliver(&topic, &payload);
                        for _ in 0..dropped {
                            inner.counters.subscription_drops.inc();
                        }
                    }
                }
                PlumtreeEffect::SetTimer(t, after) => {
                    let inner = inner.clone();
                    tokio::spawn(async move {
                        tokio::select! {
                            _ = inner.shutdown.cancelled() => {}
                            _ = tokio::time::sleep(after) => {
                                let _ = inner.control.send(Control::BroadcastTimer(t)).await;
                            }
                        }
                    });
                }
            }
        }
    }

    fn on_leave_notice(&mut self, inner: &Inner, payload: &[u8]) {
        let Ok((node, seq)) = postcard::from_bytes::<(NodeId, u32)>(payload) else {
            inner.counters.decode_errors.inc();
            return;
        };
        if node == inner.id {
            return;
        }
        let known = self.pt.route_seq(&node).unwrap_or(0);
        let e = self.departed.entry(node.clone()).or_insert(0);
        *e = (*e).max(seq).max(known);
        self.former.remove(&node);
        self.left.push(node);
    }
}
