use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;
use crate::broadcast::{decide_forward, DropReason, ForwardDecision};

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

enum Ev {
    Msg(u32, u32, PlumtreeMsg<u32>),
    Timer(u32, PlumtreeTimer),
}

/// Nodes on a fixed graph; every hop takes 1 ms plus 0–3 ms decided by the pair.
struct Net {
    nodes: Vec<Plumtree<u32>>,
    edges: Vec<Vec<u32>>,
    now: Duration,
    seq: u64,
    queue: BinaryHeap<Reverse<(Duration, u64, usize)>>,
    events: Vec<Option<Ev>>,
    delivered: Vec<Vec<MsgId>>,
    gossip_received: usize,
    cut: Vec<(u32, u32)>,
}

impl Net {
    fn new(edges: Vec<Vec<u32>>) -> Net {
        let n = edges.len() as u32;
        let mut net = Net {
            nodes: (0..n).map(|i| Plumtree::new(i, cfg())).collect(),
            edges: vec![Vec::new(); n as usize],
            now: Duration::ZERO,
            seq: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            delivered: vec![Vec::new(); n as usize],
            gossip_received: 0,
            cut: Vec::new(),
        };
        for (a, list) in edges.iter().enumerate() {
            for &b in list {
                net.link(a as u32, b);
            }
        }
        net
    }

    /// A ring plus chords: connected, with cycles.
    fn ring(n: u32) -> Net {
        Net::new(
            (0..n)
                .map(|i| vec![(i + 1) % n, (i + n / 2 + 1) % n])
                .collect(),
        )
    }

    fn link(&mut self, a: u32, b: u32) {
        if self.edges[a as usize].contains(&b) {
            return;
        }
        self.edges[a as usize].push(b);
        self.edges[b as usize].push(a);
        self.call(a, |p, now, out| p.on_neighbor_up(b, now, out));
        self.call(b, |p, now, out| p.on_neighbor_up(a, now, out));
    }

    fn push(&mut self, after: Duration, ev: Ev) {
        self.seq += 1;
        self.events.push(Some(ev));
        let slot = self.events.len() - 1;
        self.queue.push(Reverse((self.now + after, self.seq, slot)));
    }

    fn call(
        &mut self,
        i: u32,
        f: impl FnOnce(&mut Plumtree<u32>, Duration, &mut Vec<PlumtreeEffect<u32>>),
    ) {
        let mut out = Vec::new();
        f(&mut self.nodes[i as usize], self.now, &mut out);
        for e in out {
            match e {
                PlumtreeEffect::Send(to, m) => {
                    let lat = MS * (1 + (i * 7 + to * 13) % 4);
                    self.push(lat, Ev::Msg(i, to, m));
                }
                PlumtreeEffect::Deliver { id, .. } => self.delivered[i as usize].push(id),
                PlumtreeEffect::SetTimer(t, d) => self.push(d, Ev::Timer(i, t)),
            }
        }
    }

    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while let Some(Reverse((t, _, slot))) = self.queue.peek().copied() {
            if t > end {
                break;
            }
            self.queue.pop();
            self.now = t;
            match self.events[slot].take() {
                Some(Ev::Msg(from, to, m)) => {
                    if self.cut.contains(&(from, to)) {
                        continue;
                    }
                    if matches!(m, PlumtreeMsg::Gossip { .. }) {
                        self.gossip_received += 1;
                    }
                    self.call(to, |p, now, out| p.on_message(&from, m, now, out));
                }
                Some(Ev::Timer(i, tm)) => self.call(i, |p, now, out| p.on_timer(tm, now, out)),
                None => {}
            }
        }
        self.now = end;
    }

    fn broadcast(&mut self, from: u32) -> MsgId {
        let mut id = None;
        self.call(from, |p, now, out| {
            id = Some(p.broadcast(Topic::from("t"), Bytes::from_static(b"x"), now, out))
        });
        id.unwrap()
    }

    fn reached(&self, id: MsgId) -> usize {
        self.delivered.iter().filter(|d| d.contains(&id)).count()
    }
}

#[test]
fn tree_prunes_duplicates_and_settles_to_no_redundancy() {
    let mut net = Net::ring(40);
    // Grafts wait for the slowest eager path through the tree.
    for p in &mut net.nodes {
        p.cfg.graft_timeout = 100 * MS;
    }
    let first = net.broadcast(0);
    net.run_for(500 * MS);
    assert_eq!(net.reached(first), 40);
    assert!(net.gossip_received > 39, "the first broadcast floods");
    // Eager links now form a spanning tree: n - 1 links, both ends agree.
    let eager: usize = net.nodes.iter().map(|p| p.eager_peers().len()).sum();
    assert_eq!(eager, 2 * 39);
    for origin in [0, 7, 23] {
        net.gossip_received = 0;
        let id = net.broadcast(origin);
        net.run_for(500 * MS);
        assert_eq!(net.reached(id), 40);
        assert_eq!(net.gossip_received, 39, "RMR 0 from origin {origin}");
    }
    for (i, d) in net.delivered.iter().enumerate() {
        assert_eq!(d.len(), 4, "node {i} delivered each message once");
    }
}

#[test]
fn graft_fetches_a_missing_message() {
    let mut net = Net::ring(12);
    net.run_for(10 * MS);
    let warm = net.broadcast(0);
    net.run_for(300 * MS);
    assert_eq!(net.reached(warm), 12);
    // Break every eager link into node 5: it only hears IHAVEs, and must graft.
    let parents: Vec<u32> = net.nodes[5].eager_peers().to_vec();
    assert!(!parents.is_empty());
    for p in &parents {
        net.cut.push((*p, 5));
    }
    let id = net.broadcast(0);
    net.run_for(20 * MS);
    assert!(!net.delivered[5].contains(&id));
    net.cut.clear();
    net.run_for(300 * MS);
    assert_eq!(net.reached(id), 12);
    assert!(net.delivered[5].contains(&id));
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
    let c = PlumtreeConfig {
        optimization_threshold: 3,
        ..cfg()
    };
    let mut p = Plumtree::new(0u32, c);
    let mut out = Vec::new();
    p.on_neighbor_up(1, Duration::ZERO, &mut out);
    p.on_neighbor_up(2, Duration::ZERO, &mut out);
    p.on_message(&2, PlumtreeMsg::Prune, Duration::ZERO, &mut out);
    let id = MsgId { origin: 9, seq: 1 };
    let ann = vec![Announce {
        key: Key::Msg(id),
        round: 2,
    }];
    p.on_message(&2, PlumtreeMsg::IHave(ann), Duration::ZERO, &mut out);
    out.clear();
    let gossip = PlumtreeMsg::Gossip {
        id,
        topic: Topic::from("t"),
        payload: Bytes::new(),
        round: 6,
    };
    p.on_message(&1, gossip, MS, &mut out);
    assert!(out.contains(&PlumtreeEffect::Send(
        2,
        PlumtreeMsg::Graft {
            key: None,
            round: 2
        }
    )));
    assert!(out.contains(&PlumtreeEffect::Send(1, PlumtreeMsg::Prune)));
    assert_eq!((p.eager_peers(), p.lazy_peers()), (&[2][..], &[1][..]));
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
    let mut net = Net::ring(8);
    let id = net.broadcast(3);
    net.run_for(200 * MS);
    net.nodes.push(Plumtree::new(8, cfg()));
    net.edges.push(Vec::new());
    net.delivered.push(Vec::new());
    net.link(8, 2);
    net.run_for(200 * MS);
    assert!(net.delivered[8].contains(&id));
}

#[test]
fn heartbeats_give_next_hops_and_routed_sends_respect_the_hop_limit() {
    // A line 0 - 1 - 2 - 3 - 4.
    let mut net = Net::new(
        (0..5)
            .map(|i| if i < 4 { vec![i + 1] } else { vec![] })
            .collect(),
    );
    for i in 0..5 {
        net.call(i, |p, _, out| p.start_heartbeats(out));
    }
    net.run_for(150 * MS);
    assert_eq!(net.nodes[4].next_hop(&0), Some(3));
    assert_eq!(net.nodes[0].next_hop(&4), Some(1));
    assert_eq!(
        net.nodes[2].next_hop(&3),
        Some(3),
        "a neighbour is its own next hop"
    );
    let info = net.nodes[4].route_info(&0, net.now).unwrap();
    assert_eq!((info.via, info.hops), (3, 4));
    let mut alive = net.nodes[2].alive_origins(Duration::from_secs(1), net.now);
    alive.sort();
    assert_eq!(alive, vec![0, 1, 3, 4]);
    // Walk a routed message from 0 to 4, each hop deciding with its own next hops.
    let (mut at, mut hops) = (0u32, 0u16);
    loop {
        let node = &net.nodes[at as usize];
        match decide_forward(&at, &4, hops, 128, |d| node.next_hop(d)) {
            ForwardDecision::Deliver => break,
            ForwardDecision::ForwardTo(n) => {
                hops += 1;
                at = n;
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
    net.call(4, |p, _, _| p.on_neighbor_down(&3));
    assert_eq!(net.nodes[4].next_hop(&0), None);
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
