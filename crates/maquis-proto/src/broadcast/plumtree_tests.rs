use std::collections::BTreeSet;

use super::*;
use crate::broadcast::{decide_forward, DropReason, ForwardDecision};
use crate::harness::{Micros, NetConfig, Network, Observer, SimId};
use crate::membership::{MembershipConfig, Output, Protocol};
use crate::overlay::{Effects, Erased, Liveness, Overlay, Route, TimerId};

const MS: Duration = Duration::from_millis(1);

fn cfg() -> PlumtreeConfig {
    PlumtreeConfig {
        lazy_tick: 5 * MS,
        graft_timeout: 20 * MS,
        graft_retry: 10 * MS,
        heartbeat_every: 100 * MS,
        ..PlumtreeConfig::default()
    }
}

/// The graph a test draws: a node's neighbours are the nodes it has a connection with (opened
/// by `Network::join`), and they are its only members. With `Membership` liveness the machine
/// broadcasts member heartbeats over it.
struct Links {
    me: SimId,
    liveness: Liveness,
    up: BTreeSet<SimId>,
}

impl Overlay<SimId> for Links {
    type Msg = ();
    fn name(&self) -> &'static str {
        "links"
    }
    fn on_join(&mut self, _contact: &SimId, _fx: &mut Effects<(), SimId>) {}
    fn on_leave(&mut self, _fx: &mut Effects<(), SimId>) {}
    fn on_message(&mut self, _from: &SimId, _msg: (), _fx: &mut Effects<(), SimId>) {}
    fn on_connection(&mut self, peer: &SimId, up: bool, _fx: &mut Effects<(), SimId>) {
        if up {
            self.up.insert(*peer);
        } else {
            self.up.remove(peer);
        }
    }
    fn on_timer(&mut self, _timer: TimerId, _fx: &mut Effects<(), SimId>) {}
    fn members(&self) -> Vec<SimId> {
        std::iter::once(self.me)
            .chain(self.up.iter().copied())
            .collect()
    }
    fn route(&self, dst: &SimId) -> Route<SimId> {
        if *dst == self.me || self.up.contains(dst) {
            Route::Direct
        } else {
            Route::Unreachable
        }
    }
    fn liveness(&self) -> Liveness {
        self.liveness
    }
}

/// What the tests watch: deliveries and payloads on the wire; and the links they cut.
#[derive(Default)]
struct Watch {
    /// Per node, the payloads it delivered, in order.
    delivered: Vec<Vec<Bytes>>,
    /// Payloads (GOSSIP messages) received.
    gossip_received: usize,
    /// Messages from the first node to the second are lost.
    cut: Vec<(u32, u32)>,
}

impl Observer for Watch {
    fn on_output(&mut self, _now: Micros, node: u32, output: &Output<SimId>) {
        if let Output::Deliver { payload, .. } = output {
            self.delivered[node as usize].push(payload.clone());
        }
    }

    fn on_message(&mut self, _from: u32, _to: u32, protocol: Protocol, payload: &[u8]) {
        if protocol == Protocol::Broadcast {
            let msg: PlumtreeMsg<SimId> = postcard::from_bytes(payload).expect("Plumtree");
            if matches!(msg, PlumtreeMsg::Gossip { .. }) {
                self.gossip_received += 1;
            }
        }
    }

    fn lose(&mut self, from: u32, to: u32, _protocol: Protocol, _payload: &[u8]) -> bool {
        self.cut.contains(&(from, to))
    }
}

/// Every hop takes 1 ms plus up to 4 ms more.
fn net_config() -> NetConfig {
    NetConfig {
        latency: MS,
        jitter: 4 * MS,
        ..NetConfig::default()
    }
}

fn sid(i: u32) -> SimId {
    SimId {
        index: i,
        incarnation: 1,
    }
}

/// Starts a node of the graph.
fn add(net: &mut Network<Watch>, liveness: Liveness, plumtree: PlumtreeConfig) -> u32 {
    let me = net.next_id();
    let links = Links {
        me,
        liveness,
        up: BTreeSet::new(),
    };
    let cfg = MembershipConfig {
        plumtree,
        ..MembershipConfig::default()
    };
    net.observer.delivered.push(Vec::new());
    net.spawn(Box::new(Erased(links)), cfg)
}

/// `n` nodes linked by `edges`, once the links are up.
fn network(n: u32, edges: &[(u32, u32)], liveness: Liveness, pt: PlumtreeConfig) -> Network<Watch> {
    let mut net = Network::new(net_config(), Watch::default());
    for _ in 0..n {
        add(&mut net, liveness, pt.clone());
    }
    for &(a, b) in edges {
        net.join(a, b);
    }
    net.run_for(10 * MS);
    net
}

/// A ring plus chords: connected, with cycles.
fn ring(n: u32) -> Vec<(u32, u32)> {
    let mut edges = Vec::new();
    for a in 0..n {
        for b in [(a + 1) % n, (a + n / 2 + 1) % n] {
            if !edges.contains(&(a, b)) && !edges.contains(&(b, a)) {
                edges.push((a, b));
            }
        }
    }
    edges
}

/// Node `from` broadcasts a payload that names the broadcast.
fn broadcast(net: &mut Network<Watch>, from: u32, name: &str) -> Bytes {
    let payload = Bytes::from(name.to_owned());
    net.broadcast(from, Topic::from("t"), payload.clone());
    payload
}

fn reached(net: &Network<Watch>, payload: &Bytes) -> usize {
    let delivered = &net.observer.delivered;
    delivered.iter().filter(|d| d.contains(payload)).count()
}

fn pt(net: &Network<Watch>, i: u32) -> &Plumtree<SimId> {
    net.node(i).machine.plumtree()
}

#[test]
fn tree_prunes_duplicates_and_settles_to_no_redundancy() {
    // Grafts wait for the slowest eager path through the tree.
    let c = PlumtreeConfig {
        graft_timeout: 100 * MS,
        ..cfg()
    };
    let mut net = network(40, &ring(40), Liveness::Connection, c);
    let first = broadcast(&mut net, 0, "first");
    net.run_for(500 * MS);
    assert_eq!(reached(&net, &first), 40);
    assert!(
        net.observer.gossip_received > 39,
        "the first broadcast floods"
    );
    // Eager links now form a spanning tree: n - 1 links, both ends agree.
    let eager: usize = (0..40).map(|i| pt(&net, i).eager_peers().len()).sum();
    assert_eq!(eager, 2 * 39);
    for origin in [0, 7, 23] {
        net.observer.gossip_received = 0;
        let m = broadcast(&mut net, origin, &format!("from {origin}"));
        net.run_for(500 * MS);
        assert_eq!(reached(&net, &m), 40);
        assert_eq!(
            net.observer.gossip_received, 39,
            "RMR 0 from origin {origin}"
        );
    }
    for (i, d) in net.observer.delivered.iter().enumerate() {
        assert_eq!(d.len(), 4, "node {i} delivered each message once");
    }
}

#[test]
fn graft_fetches_a_missing_message() {
    let mut net = network(12, &ring(12), Liveness::Connection, cfg());
    let warm = broadcast(&mut net, 0, "warm");
    net.run_for(300 * MS);
    assert_eq!(reached(&net, &warm), 12);
    // Break every eager link into node 5: it only hears IHAVEs, and must graft.
    let parents: Vec<u32> = pt(&net, 5).eager_peers().iter().map(|p| p.index).collect();
    assert!(!parents.is_empty());
    net.observer.cut = parents.iter().map(|p| (*p, 5)).collect();
    let m = broadcast(&mut net, 0, "m");
    net.run_for(20 * MS);
    assert!(!net.observer.delivered[5].contains(&m));
    net.observer.cut.clear();
    net.run_for(300 * MS);
    assert_eq!(reached(&net, &m), 12);
    assert!(net.observer.delivered[5].contains(&m));
}

#[test]
fn graft_timer_sends_graft_to_announcer_then_next() {
    let mut p = Plumtree::new(0u32, cfg());
    let mut out = Vec::new();
    p.on_neighbor_up(1, Duration::ZERO, &mut out);
    p.on_neighbor_up(2, Duration::ZERO, &mut out);
    let key = Key::Msg(MsgId { origin: 9, seq: 1 });
    for from in [1, 2] {
        let ann = vec![Announce {
            key: key.clone(),
            round: 3,
            way: None,
        }];
        p.on_message(&from, PlumtreeMsg::IHave(ann), Duration::ZERO, &mut out);
    }
    out.clear();
    p.on_timer(PlumtreeTimer::Tick, 25 * MS, &mut out);
    let graft = |to| {
        PlumtreeEffect::Send(
            to,
            PlumtreeMsg::Graft {
                key: Some(key.clone()),
                round: 3,
            },
        )
    };
    assert!(out.contains(&graft(1)), "{out:?}");
    out.clear();
    p.on_timer(PlumtreeTimer::Tick, 40 * MS, &mut out);
    assert!(out.contains(&graft(2)), "retried with the next announcer");
    assert_eq!(p.stats().missing, 1);
}

#[test]
fn optimisation_grafts_the_shorter_lazy_path() {
    // For a broadcast, and for a heartbeat whose ways say the opposite of its rounds: the
    // tree follows the rounds (hops travelled), the route the ways.
    let id = MsgId { origin: 9, seq: 1 };
    let cases = [
        (
            Key::Msg(id),
            None,
            PlumtreeMsg::Gossip {
                id,
                topic: Topic::from("t"),
                payload: Bytes::new(),
                round: 6,
            },
            None,
        ),
        (
            Key::Beat { origin: 9, seq: 1 },
            Some(5),
            PlumtreeMsg::Heartbeat {
                origin: 9,
                seq: 1,
                round: 6,
                way: 2,
            },
            Some(1),
        ),
    ];
    for (key, way, copy, route) in cases {
        let c = PlumtreeConfig {
            optimization_threshold: 3,
            ..cfg()
        };
        let mut p = Plumtree::new(0u32, c);
        let mut out = Vec::new();
        p.on_neighbor_up(1, Duration::ZERO, &mut out);
        p.on_neighbor_up(2, Duration::ZERO, &mut out);
        p.on_message(&2, PlumtreeMsg::Prune, Duration::ZERO, &mut out);
        let ann = vec![Announce { key, round: 2, way }];
        p.on_message(&2, PlumtreeMsg::IHave(ann), Duration::ZERO, &mut out);
        out.clear();
        p.on_message(&1, copy, MS, &mut out);
        assert!(out.contains(&PlumtreeEffect::Send(
            2,
            PlumtreeMsg::Graft {
                key: None,
                round: 2
            }
        )));
        assert!(out.contains(&PlumtreeEffect::Send(1, PlumtreeMsg::Prune)));
        assert_eq!((p.eager_peers(), p.lazy_peers()), (&[2][..], &[1][..]));
        assert_eq!(p.route_info(&9, MS).map(|i| i.via), route);
    }
}

#[test]
fn new_neighbour_is_offered_recent_ids() {
    let mut p = Plumtree::new(
        0u32,
        PlumtreeConfig {
            offer_recent: 2,
            ..cfg()
        },
    );
    let mut out = Vec::new();
    let s = Duration::from_secs;
    let old = p.broadcast(Topic::from("t"), Bytes::new(), s(0), &mut out);
    let a = p.broadcast(Topic::from("t"), Bytes::new(), s(40), &mut out);
    let b = p.broadcast(Topic::from("t"), Bytes::new(), s(41), &mut out);
    let c = p.broadcast(Topic::from("t"), Bytes::new(), s(42), &mut out);
    out.clear();
    p.on_neighbor_up(7, s(43), &mut out);
    let ann = |id, round| Announce {
        key: Key::Msg(id),
        round,
        way: None,
    };
    assert_eq!(
        out,
        vec![PlumtreeEffect::Send(
            7,
            PlumtreeMsg::IHave(vec![ann(c, 1), ann(b, 1)])
        )]
    );
    assert_ne!(old, a);
    // End to end: a node that joins after a broadcast still gets it.
    let mut net = network(8, &ring(8), Liveness::Connection, cfg());
    let m = broadcast(&mut net, 3, "m");
    net.run_for(200 * MS);
    let late = add(&mut net, Liveness::Connection, cfg());
    net.join(late, 2);
    net.run_for(200 * MS);
    assert!(net.observer.delivered[late as usize].contains(&m));
}

#[test]
fn heartbeats_give_next_hops_and_routed_sends_respect_the_hop_limit() {
    // A line 0 - 1 - 2 - 3 - 4, whose nodes send member heartbeats.
    let line: Vec<(u32, u32)> = (0..4).map(|i| (i, i + 1)).collect();
    let mut net = network(5, &line, Liveness::Membership, cfg());
    net.run_for(150 * MS);
    assert_eq!(pt(&net, 4).next_hop(&sid(0)), Some(sid(3)));
    assert_eq!(pt(&net, 0).next_hop(&sid(4)), Some(sid(1)));
    assert_eq!(
        pt(&net, 2).next_hop(&sid(3)),
        Some(sid(3)),
        "a neighbour is its own next hop"
    );
    let now = Duration::from_micros(net.now());
    let info = pt(&net, 4).route_info(&sid(0), now).unwrap();
    assert_eq!((info.via, info.hops), (sid(3), 4));
    let mut alive = pt(&net, 2).alive_origins(Duration::from_secs(1), now);
    alive.sort();
    assert_eq!(alive, vec![sid(0), sid(1), sid(3), sid(4)]);
    // Walk a routed message from 0 to 4, each hop deciding with its own next hops.
    let (mut at, mut hops) = (0u32, 0u16);
    loop {
        let node = pt(&net, at);
        match decide_forward(&sid(at), &sid(4), hops, 128, |d| node.next_hop(d)) {
            ForwardDecision::Deliver => break,
            ForwardDecision::ForwardTo(n) => {
                hops += 1;
                at = n.index;
            }
            ForwardDecision::Drop(r) => panic!("dropped: {r}"),
        }
    }
    assert_eq!((at, hops), (4, 4));
    let limited = Plumtree::new(0u32, cfg());
    assert_eq!(
        decide_forward(&0, &4, 2, 2, |d| limited.next_hop(d)),
        ForwardDecision::Drop(DropReason::HopLimit)
    );
    assert_eq!(
        decide_forward(&0, &4, 0, 2, |d| limited.next_hop(d)),
        ForwardDecision::Drop(DropReason::NoRoute)
    );
    // A route through a neighbour that went down is not used.
    net.crash(3);
    net.run_for(net_config().detect + 10 * MS);
    assert!(pt(&net, 4).route_seq(&sid(0)).is_some(), "still known");
    assert_eq!(pt(&net, 4).next_hop(&sid(0)), None);
}

#[test]
fn buffers_are_bounded() {
    let c = PlumtreeConfig {
        lazy_queue_max: 3,
        missing_max: 2,
        cache_max: 4,
        ..cfg()
    };
    let mut p = Plumtree::new(0u32, c);
    let mut out = Vec::new();
    for n in 1..=2 {
        p.on_neighbor_up(n, Duration::ZERO, &mut out);
        p.on_message(&n, PlumtreeMsg::Prune, Duration::ZERO, &mut out);
    }
    for _ in 0..10 {
        p.broadcast(Topic::from("t"), Bytes::new(), Duration::ZERO, &mut out);
    }
    let s = p.stats();
    assert_eq!((s.cached, s.lazy_queued, s.lazy_dropped), (4, 3, 17));
    let list = (0..5)
        .map(|seq| Announce {
            key: Key::Msg(MsgId { origin: 5, seq }),
            round: 1,
            way: None,
        })
        .collect();
    p.on_message(&1, PlumtreeMsg::IHave(list), Duration::ZERO, &mut out);
    let s = p.stats();
    assert_eq!((s.missing, s.missing_dropped), (2, 3));
}

#[test]
fn duplicates_prune_a_link_only_once_its_credit_is_spent() {
    let gossip = |seq| PlumtreeMsg::Gossip {
        id: MsgId { origin: 9, seq },
        topic: Topic::from("t"),
        payload: Bytes::new(),
        round: 2,
    };
    let mut p = Plumtree::new(
        0u32,
        PlumtreeConfig {
            prune_credit: 1,
            ..cfg()
        },
    );
    let mut out = Vec::new();
    for n in [1, 2, 3] {
        p.on_neighbor_up(n, Duration::ZERO, &mut out);
    }
    // Node 1 brings a first copy (one credit); 2 and 3 bring duplicates.
    p.on_message(&1, gossip(1), Duration::ZERO, &mut out);
    out.clear();
    p.on_message(&2, gossip(1), Duration::ZERO, &mut out);
    assert_eq!(
        out,
        vec![PlumtreeEffect::Send(2, PlumtreeMsg::Prune)],
        "no credit: pruned"
    );
    // 3 brings the next first copy, then 1 a duplicate: 1 spends its credit and stays eager.
    p.on_message(&3, gossip(2), Duration::ZERO, &mut out);
    out.clear();
    p.on_message(&1, gossip(2), Duration::ZERO, &mut out);
    assert!(out.is_empty() && p.eager_peers().contains(&1));
    p.on_message(&1, gossip(1), Duration::ZERO, &mut out);
    assert_eq!(out, vec![PlumtreeEffect::Send(1, PlumtreeMsg::Prune)]);
    assert_eq!(p.lazy_peers(), &[2, 1]);
    // With no credit at all (the paper), the first duplicate prunes.
    let mut q = Plumtree::new(
        0u32,
        PlumtreeConfig {
            prune_credit: 0,
            ..cfg()
        },
    );
    q.on_neighbor_up(1, Duration::ZERO, &mut out);
    q.on_neighbor_up(2, Duration::ZERO, &mut out);
    q.on_message(&1, gossip(1), Duration::ZERO, &mut out);
    q.on_message(&2, gossip(2), Duration::ZERO, &mut out);
    out.clear();
    q.on_message(&1, gossip(2), Duration::ZERO, &mut out);
    assert_eq!(out, vec![PlumtreeEffect::Send(1, PlumtreeMsg::Prune)]);
}

#[test]
fn routes_come_from_neighbours_and_their_moves_are_reported() {
    // Rounds (hops travelled) shape the tree only; ways make the routes.
    let beat = |origin, seq, way| PlumtreeMsg::Heartbeat {
        origin,
        seq,
        round: 4,
        way,
    };
    let t = Duration::ZERO;
    let mut p = Plumtree::new(0u32, cfg());
    let mut out = Vec::new();
    for n in [1, 2, 3] {
        p.on_neighbor_up(n, t, &mut out);
    }
    // Node 7 still takes 0 for its neighbour: what it brings makes no route.
    p.on_message(&7, beat(9, 1, 3), t, &mut out);
    assert_eq!(p.next_hop(&9), None);
    assert_eq!(p.stats().strangers_ignored, 1);
    assert!(p.take_moved_routes().is_empty());
    p.on_message(&1, beat(9, 1, 3), t, &mut out);
    p.on_message(&1, beat(8, 1, 3), t, &mut out);
    let mut moved = p.take_moved_routes();
    moved.sort();
    assert_eq!(moved, vec![(8, 1), (9, 1)], "first routes");
    // The next heartbeat of 9 comes first through 2, from as far: the way stays; then 3
    // announces it nearer, and the way moves there.
    p.on_message(&2, beat(9, 2, 3), t, &mut out);
    p.on_message(&1, beat(8, 2, 3), t, &mut out);
    assert!(p.take_moved_routes().is_empty());
    let ihave = |way| {
        PlumtreeMsg::IHave(vec![Announce {
            key: Key::Beat { origin: 9, seq: 2 },
            round: 9,
            way: Some(way),
        }])
    };
    p.on_message(&3, ihave(2), t, &mut out);
    assert_eq!(p.take_moved_routes(), vec![(9, 3)]);
    assert!(p.take_moved_routes().is_empty(), "taken");
    assert_eq!(p.stats().route_moves, 3);
    assert_eq!(p.next_hop(&9), Some(3));
    // What this node passes on is its own way's length plus one; the neighbour its way goes
    // through hears that it is no way at all. The round is the copy's plus one for both.
    out.clear();
    p.on_message(&2, beat(9, 3, 5), t, &mut out);
    let mut sent: Vec<(u32, u16, u16)> = out
        .iter()
        .filter_map(|e| match e {
            PlumtreeEffect::Send(to, PlumtreeMsg::Heartbeat { round, way, .. }) => {
                Some((*to, *round, *way))
            }
            _ => None,
        })
        .collect();
    sent.sort();
    assert_eq!(sent, vec![(1, 5, 3), (3, 5, NO_WAY)]);
    // Its neighbour gone, the best offer of the newest heartbeat takes over, and the new
    // way is told at once that this node is no way back (its earlier offer is stale).
    out.clear();
    p.on_neighbor_down(&3, &mut out);
    assert_eq!(p.take_moved_routes(), vec![(9, 2)]);
    assert_eq!(p.route_info(&9, t).map(|i| i.hops), Some(5));
    out.clear();
    p.on_timer(PlumtreeTimer::Tick, t, &mut out);
    let no_way = Announce {
        key: Key::Beat { origin: 9, seq: 3 },
        round: u16::MAX,
        way: Some(NO_WAY),
    };
    assert!(out.iter().any(|e| matches!(
        e,
        PlumtreeEffect::Send(2, PlumtreeMsg::IHave(list)) if list.contains(&no_way)
    )));
}
