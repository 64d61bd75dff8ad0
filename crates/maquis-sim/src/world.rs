//! The simulated world: nodes running the real HyParView and Plumtree state machines, simulated
//! connections, and the effects of both carried out with latency and failure detection.
//!
//! Connections: `Connect` to a live, reachable node opens a connection at once at both ends and
//! each end hears `on_connection(up)` one latency later; to a dead or unreachable node it fails
//! after the detection delay. `Send` needs a connection (as in the runtime, it is dropped
//! otherwise) and arrives after a latency, in order per connection. A node that crashes, or a
//! partition, closes its connections; the other ends hear `on_connection(down)` after the
//! detection delay, and what was sent meanwhile is lost. `Disconnect` closes both ends; the
//! other one hears it after what was already sent.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use maquis_proto::broadcast::{
    Forward, ForwardDecision, MsgId, Plumtree, PlumtreeEffect, PlumtreeMsg, PlumtreeTimer, Topic,
};
use maquis_proto::id::NodeId;
use maquis_proto::overlay::{Effect, Effects, HyParView, HyParViewMsg, Overlay, TimerId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::queue::{Micros, Queue};
use crate::scenario::Scenario;

/// A message between nodes.
pub(crate) enum SimMsg {
    Hv(HyParViewMsg),
    Pt(PlumtreeMsg<u32>),
    Fwd(Forward<u32>),
}

pub(crate) enum Ev {
    Msg {
        from: u32,
        to: u32,
        msg: SimMsg,
    },
    /// A connection came up; stale if the node's connection has another generation.
    Up {
        node: u32,
        peer: u32,
        gen: u32,
    },
    /// A connection went down; stale if the node has a connection of another generation
    /// (unless `gen` is `None`).
    Down {
        node: u32,
        peer: u32,
        gen: Option<u32>,
    },
    HvTimer {
        node: u32,
        timer: TimerId,
    },
    PtTimer {
        node: u32,
        timer: PlumtreeTimer,
    },
}

struct Conn {
    peer: u32,
    gen: u32,
    /// Arrival time of the last message sent on it (to keep order).
    fifo: Micros,
    /// One-sided: a connection attempt to a node that cannot be reached.
    failing: bool,
}

pub(crate) struct Node {
    pub hv: HyParView,
    pub pt: Plumtree<u32>,
    /// The active view as Plumtree last heard it.
    nbrs: Vec<u32>,
    version: u64,
    conns: Vec<Conn>,
}

/// One tracked broadcast.
pub(crate) struct Bcast {
    pub at: Micros,
    pub delivered: Vec<u64>,
    pub reached: u32,
    pub received: u64,
    pub max_hops: u16,
}

/// Counters of what happened in the network.
#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct Counters {
    pub messages: u64,
    pub lost: u64,
    pub unconnected: u64,
    pub routed_ok: u64,
    pub routed_no_route: u64,
    pub routed_hop_limit: u64,
    pub prunes: u64,
    pub grafts: u64,
}

pub(crate) struct World {
    pub q: Queue<Ev>,
    pub nodes: Vec<Node>,
    pub ids: Vec<NodeId>,
    pub alive: Vec<bool>,
    pub born: Vec<Micros>,
    /// Which side of a partition each node is on, while one lasts.
    pub side: Option<Vec<bool>>,
    pub rng: StdRng,
    pub bcasts: Vec<Bcast>,
    by_id: HashMap<MsgId, usize>,
    pub counters: Counters,
    scenario: Scenario,
    latency: Micros,
    jitter: Micros,
    detect: Micros,
    gen: u32,
    slots: usize,
    out: Vec<PlumtreeEffect<u32>>,
}

fn us(d: Duration) -> Micros {
    d.as_micros().min(u128::from(u64::MAX)) as Micros
}

fn idx(id: &NodeId) -> u32 {
    match id.addr.ip() {
        IpAddr::V4(v) => u32::from(v) & 0x00FF_FFFF,
        IpAddr::V6(_) => u32::MAX,
    }
}

/// The identity of simulated node `i` (its index is in the address).
pub(crate) fn node_id(i: u32) -> NodeId {
    let ip = Ipv4Addr::from(0x0A00_0000 | i);
    NodeId::new(format!("n{i}"), SocketAddr::new(IpAddr::V4(ip), 7000), 1)
}

impl World {
    /// A world with room for `slots` nodes (none started yet).
    pub fn new(s: &Scenario, slots: usize) -> World {
        World {
            q: Queue::new(),
            nodes: Vec::with_capacity(slots),
            ids: Vec::with_capacity(slots),
            alive: Vec::with_capacity(slots),
            born: Vec::with_capacity(slots),
            side: None,
            rng: StdRng::seed_from_u64(s.seed),
            bcasts: Vec::new(),
            by_id: HashMap::new(),
            counters: Counters::default(),
            latency: us(s.latency),
            jitter: us(s.jitter),
            detect: us(s.detect),
            scenario: s.clone(),
            gen: 0,
            slots,
            out: Vec::new(),
        }
    }

    /// The index of a simulated node's identity.
    pub fn index(&self, id: &NodeId) -> usize {
        idx(id) as usize
    }

    pub fn now(&self) -> Micros {
        self.q.now
    }

    fn now_d(&self) -> Duration {
        Duration::from_micros(self.q.now)
    }

    fn cut(&self, a: u32, b: u32) -> bool {
        self.side
            .as_ref()
            .is_some_and(|s| s[a as usize] != s[b as usize])
    }

    fn lat(&mut self) -> Micros {
        self.latency
            + if self.jitter > 0 {
                self.rng.gen_range(0..self.jitter)
            } else {
                0
            }
    }

    /// Starts a new node; returns its index.
    pub fn spawn(&mut self) -> u32 {
        let i = self.nodes.len() as u32;
        let id = node_id(i);
        let mix = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.scenario.seed;
        let hv_cfg = maquis_proto::overlay::HyParViewConfig {
            seed: Some(mix),
            ..self.scenario.hyparview.clone()
        };
        let pt_cfg = maquis_proto::broadcast::PlumtreeConfig {
            seed: Some(mix.rotate_left(17)),
            ..self.scenario.plumtree.clone()
        };
        self.nodes.push(Node {
            hv: HyParView::new(id.clone(), hv_cfg),
            pt: Plumtree::new(i, pt_cfg),
            nbrs: Vec::new(),
            version: 0,
            conns: Vec::new(),
        });
        self.ids.push(id);
        self.alive.push(true);
        self.born.push(self.q.now);
        self.hv_call(i, |hv, fx| hv.on_start(fx));
        i
    }

    /// Node `i` joins through `contact` (connected first, as the runtime does).
    pub fn join(&mut self, i: u32, contact: u32) {
        self.connect(i, contact);
        let c = self.ids[contact as usize].clone();
        self.hv_call(i, |hv, fx| hv.on_join(&c, fx));
    }

    /// Node `i` crashes: its connections close, the other ends notice after the detection delay.
    pub fn crash(&mut self, i: u32) {
        self.alive[i as usize] = false;
        let conns = std::mem::take(&mut self.nodes[i as usize].conns);
        let at = self.q.now + self.detect;
        for c in conns {
            if self.remove_conn(c.peer, i, c.gen) {
                let (node, peer, gen) = (c.peer, i, Some(c.gen));
                self.q.push(at, Ev::Down { node, peer, gen });
            }
        }
    }

    /// Splits the live nodes in two (`side[i]`), closing the connections across.
    pub fn partition(&mut self, side: Vec<bool>) {
        let at = self.q.now + self.detect;
        for i in 0..self.nodes.len() as u32 {
            let across: Vec<(u32, u32)> = self.nodes[i as usize]
                .conns
                .iter()
                .filter(|c| side[i as usize] != side[c.peer as usize])
                .map(|c| (c.peer, c.gen))
                .collect();
            for (peer, gen) in across {
                self.remove_conn(i, peer, gen);
                self.q.push(
                    at,
                    Ev::Down {
                        node: i,
                        peer,
                        gen: Some(gen),
                    },
                );
            }
        }
        self.side = Some(side);
    }

    pub fn heal(&mut self) {
        self.side = None;
    }

    fn remove_conn(&mut self, node: u32, peer: u32, gen: u32) -> bool {
        let conns = &mut self.nodes[node as usize].conns;
        match conns.iter().position(|c| c.peer == peer && c.gen == gen) {
            Some(p) => {
                conns.swap_remove(p);
                true
            }
            None => false,
        }
    }

    fn conn(&mut self, node: u32, peer: u32) -> Option<&mut Conn> {
        self.nodes[node as usize]
            .conns
            .iter_mut()
            .find(|c| c.peer == peer)
    }

    fn connect(&mut self, i: u32, j: u32) {
        if i == j || j as usize >= self.nodes.len() || self.conn(i, j).is_some() {
            return;
        }
        self.gen += 1;
        let gen = self.gen;
        let now = self.q.now;
        if !self.alive[j as usize] || self.cut(i, j) {
            let c = Conn {
                peer: j,
                gen,
                fifo: 0,
                failing: true,
            };
            self.nodes[i as usize].conns.push(c);
            let d = Ev::Down {
                node: i,
                peer: j,
                gen: Some(gen),
            };
            self.q.push(now + self.detect, d);
            return;
        }
        // A failed attempt of j towards i is superseded: j hears of its failure first.
        if let Some(p) = self.nodes[j as usize]
            .conns
            .iter()
            .position(|c| c.peer == i)
        {
            self.nodes[j as usize].conns.swap_remove(p);
            let d = Ev::Down {
                node: j,
                peer: i,
                gen: None,
            };
            self.q.push(now, d);
        }
        for (a, b) in [(i, j), (j, i)] {
            let c = Conn {
                peer: b,
                gen,
                fifo: 0,
                failing: false,
            };
            self.nodes[a as usize].conns.push(c);
            let at = now + self.lat();
            self.q.push(
                at,
                Ev::Up {
                    node: a,
                    peer: b,
                    gen,
                },
            );
        }
    }

    fn disconnect(&mut self, i: u32, j: u32) {
        let Some(p) = self.nodes[i as usize]
            .conns
            .iter()
            .position(|c| c.peer == j)
        else {
            return;
        };
        let c = self.nodes[i as usize].conns.swap_remove(p);
        if !c.failing && self.remove_conn(j, i, c.gen) {
            let at = (self.q.now + self.lat()).max(c.fifo);
            let (node, peer, gen) = (j, i, Some(c.gen));
            self.q.push(at, Ev::Down { node, peer, gen });
        }
    }

    fn send(&mut self, i: u32, j: u32, msg: SimMsg) {
        let now = self.q.now;
        let lat = self.lat();
        let detect = self.detect;
        let dead = j as usize >= self.nodes.len() || !self.alive[j as usize] || self.cut(i, j);
        let Some(c) = self.conn(i, j) else {
            self.counters.unconnected += 1;
            return;
        };
        if c.failing {
            self.counters.lost += 1;
            return;
        }
        if dead {
            // Cannot happen for crashes and partitions (they close connections), kept for safety.
            c.failing = true;
            let gen = Some(c.gen);
            self.counters.lost += 1;
            self.q.push(
                now + detect,
                Ev::Down {
                    node: i,
                    peer: j,
                    gen,
                },
            );
            return;
        }
        let at = (now + lat).max(c.fifo);
        c.fifo = at;
        self.counters.messages += 1;
        self.q.push(
            at,
            Ev::Msg {
                from: i,
                to: j,
                msg,
            },
        );
    }

    /// Runs one HyParView handler of node `i` and carries out its effects.
    pub fn hv_call(&mut self, i: u32, f: impl FnOnce(&mut HyParView, &mut Effects<HyParViewMsg>)) {
        let mut fx = Effects::default();
        f(&mut self.nodes[i as usize].hv, &mut fx);
        let now = self.q.now;
        for e in fx.drain() {
            match e {
                Effect::Connect(id) => self.connect(i, idx(&id)),
                Effect::Dial(addr) => {
                    if let IpAddr::V4(v) = addr.ip() {
                        self.connect(i, u32::from(v) & 0x00FF_FFFF);
                    }
                }
                Effect::Disconnect(id) => self.disconnect(i, idx(&id)),
                Effect::Send(id, m) => self.send(i, idx(&id), SimMsg::Hv(m)),
                Effect::SetTimer(timer, d) => {
                    self.q.push(now + us(d), Ev::HvTimer { node: i, timer })
                }
                Effect::Left(_) => {}
            }
        }
        self.sync_neighbors(i);
    }

    /// Tells Plumtree about the active view's changes.
    fn sync_neighbors(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        let v = n.hv.view_version();
        if v == n.version {
            return;
        }
        n.version = v;
        let new: Vec<u32> = n.hv.neighbors().iter().map(idx).collect();
        let old = std::mem::replace(&mut n.nbrs, new.clone());
        for o in old.iter().filter(|o| !new.contains(o)) {
            n.pt.on_neighbor_down(o);
        }
        for x in new.into_iter().filter(|x| !old.contains(x)) {
            self.pt_call(i, |pt, now, out| pt.on_neighbor_up(x, now, out));
        }
    }

    /// Runs one Plumtree handler of node `i` and carries out its effects.
    pub fn pt_call<R>(
        &mut self,
        i: u32,
        f: impl FnOnce(&mut Plumtree<u32>, Duration, &mut Vec<PlumtreeEffect<u32>>) -> R,
    ) -> R {
        let mut out = std::mem::take(&mut self.out);
        let now = self.now_d();
        let r = f(&mut self.nodes[i as usize].pt, now, &mut out);
        self.apply_pt(i, &mut out);
        self.out = out;
        r
    }

    fn apply_pt(&mut self, i: u32, out: &mut Vec<PlumtreeEffect<u32>>) {
        let now = self.q.now;
        for e in out.drain(..) {
            match e {
                PlumtreeEffect::Send(to, m) => {
                    match &m {
                        PlumtreeMsg::Prune => self.counters.prunes += 1,
                        PlumtreeMsg::Graft { .. } => self.counters.grafts += 1,
                        _ => {}
                    }
                    self.send(i, to, SimMsg::Pt(m))
                }
                PlumtreeEffect::Deliver { id, hops, .. } => {
                    if let Some(&b) = self.by_id.get(&id) {
                        let b = &mut self.bcasts[b];
                        let (w, bit) = (i as usize / 64, i as usize % 64);
                        if b.delivered[w] & (1 << bit) == 0 {
                            b.delivered[w] |= 1 << bit;
                            b.reached += 1;
                            b.max_hops = b.max_hops.max(hops);
                        }
                    }
                }
                PlumtreeEffect::SetTimer(timer, d) => {
                    self.q.push(now + us(d), Ev::PtTimer { node: i, timer })
                }
            }
        }
    }

    /// Node `i` broadcasts a tracked message; returns its index in `bcasts`.
    pub fn broadcast(&mut self, i: u32) -> usize {
        let mut out = std::mem::take(&mut self.out);
        let now = self.now_d();
        let payload = Bytes::from_static(b"payload");
        let id = self.nodes[i as usize]
            .pt
            .broadcast(Topic::from("sim"), payload, now, &mut out);
        self.bcasts.push(Bcast {
            at: self.q.now,
            delivered: vec![0; self.slots.div_ceil(64)],
            reached: 0,
            received: 0,
            max_hops: 0,
        });
        self.by_id.insert(id, self.bcasts.len() - 1);
        self.apply_pt(i, &mut out);
        self.out = out;
        self.bcasts.len() - 1
    }

    /// Whether node `i` delivered broadcast `b`.
    pub fn delivered(&self, b: usize, i: usize) -> bool {
        self.bcasts[b].delivered[i / 64] & (1 << (i % 64)) != 0
    }

    /// Starts a routed message from `src` to `dst`.
    pub fn route(&mut self, src: u32, dst: u32) {
        self.forward(src, Forward::new(dst, Bytes::from_static(b"routed")));
    }

    fn forward(&mut self, at: u32, mut fwd: Forward<u32>) {
        match self.nodes[at as usize].pt.route_forward(&fwd) {
            ForwardDecision::Deliver => self.counters.routed_ok += 1,
            ForwardDecision::ForwardTo(next) => {
                fwd.hops += 1;
                self.send(at, next, SimMsg::Fwd(fwd));
            }
            ForwardDecision::Drop(maquis_proto::broadcast::DropReason::NoRoute) => {
                self.counters.routed_no_route += 1
            }
            ForwardDecision::Drop(maquis_proto::broadcast::DropReason::HopLimit) => {
                self.counters.routed_hop_limit += 1
            }
        }
    }

    /// Processes events up to time `until`.
    pub fn run_until(&mut self, until: Micros) {
        while let Some(ev) = self.q.pop_until(until) {
            self.handle(ev);
        }
        self.q.now = self.q.now.max(until);
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Msg { from, to, msg } => {
                if !self.alive[to as usize] || self.cut(from, to) {
                    self.counters.lost += 1;
                    return;
                }
                match msg {
                    SimMsg::Hv(m) => {
                        let from = self.ids[from as usize].clone();
                        self.hv_call(to, |hv, fx| hv.on_message(&from, m, fx));
                    }
                    SimMsg::Pt(m) => {
                        if let PlumtreeMsg::Gossip { id, .. } = &m {
                            if let Some(&b) = self.by_id.get(id) {
                                self.bcasts[b].received += 1;
                            }
                        }
                        self.pt_call(to, |pt, now, out| pt.on_message(&from, m, now, out));
                    }
                    SimMsg::Fwd(f) => self.forward(to, f),
                }
            }
            Ev::Up { node, peer, gen } => {
                let current = self.nodes[node as usize]
                    .conns
                    .iter()
                    .any(|c| c.peer == peer && c.gen == gen);
                if current && self.alive[node as usize] {
                    let p = self.ids[peer as usize].clone();
                    self.hv_call(node, |hv, fx| hv.on_connection(&p, true, fx));
                }
            }
            Ev::Down { node, peer, gen } => {
                if !self.alive[node as usize] {
                    return;
                }
                if let Some(g) = gen {
                    let conns = &mut self.nodes[node as usize].conns;
                    match conns.iter().position(|c| c.peer == peer) {
                        Some(p) if conns[p].gen == g => {
                            conns.swap_remove(p);
                        }
                        Some(_) => return,
                        None => {}
                    }
                }
                let p = self.ids[peer as usize].clone();
                self.hv_call(node, |hv, fx| hv.on_connection(&p, false, fx));
            }
            Ev::HvTimer { node, timer } => {
                if self.alive[node as usize] {
                    self.hv_call(node, |hv, fx| hv.on_timer(timer, fx));
                }
            }
            Ev::PtTimer { node, timer } => {
                if self.alive[node as usize] {
                    self.pt_call(node, |pt, now, out| pt.on_timer(timer, now, out));
                }
            }
        }
    }
}
