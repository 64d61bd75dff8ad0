//! HyParView nodes driven together through the `Overlay` trait, every message delivered at
//! once: joins, failures, leave, shuffles.

use std::collections::{BTreeSet, VecDeque};

use maquis_proto::id::NodeId;
use maquis_proto::overlay::{
    Effect, Effects, HyParView, HyParViewConfig, HyParViewMsg as Msg, Overlay,
};

fn id(i: usize) -> NodeId {
    NodeId::new(
        format!("n{i}"),
        format!("127.0.0.1:{}", 1000 + i).parse().unwrap(),
        1,
    )
}

fn idx(n: &NodeId) -> usize {
    n.name[1..].parse().unwrap()
}

/// Nodes whose effects are carried out at once; `dead` nodes lose what they are sent, and the
/// sender sees them down.
struct Net {
    nodes: Vec<HyParView>,
    dead: Vec<bool>,
    log: Vec<(NodeId, NodeId, Msg)>,
    shuffle_timer: maquis_proto::overlay::TimerId,
}

impl Net {
    fn new(n: usize) -> Net {
        let cfg = |i: usize| HyParViewConfig {
            active_size: 3,
            passive_size: 6,
            shuffle_active: 2,
            shuffle_passive: 2,
            seed: Some(i as u64),
            ..HyParViewConfig::default()
        };
        let mut nodes: Vec<HyParView> = (0..n).map(|i| HyParView::new(id(i), cfg(i))).collect();
        let mut fx = Effects::default();
        nodes[0].on_start(&mut fx);
        let shuffle_timer = fx
            .drain()
            .find_map(|e| match e {
                Effect::SetTimer(t, _) => Some(t),
                _ => None,
            })
            .expect("a shuffle timer");
        let mut net = Net {
            nodes,
            dead: vec![false; n],
            log: Vec::new(),
            shuffle_timer,
        };
        for i in 1..n {
            net.call(i, |h, fx| h.on_join(&id((i * 7 + 3) % i), fx));
        }
        net
    }

    fn call(&mut self, i: usize, f: impl FnOnce(&mut HyParView, &mut Effects<Msg>)) {
        let mut fx = Effects::default();
        f(&mut self.nodes[i], &mut fx);
        let mut queue: VecDeque<(usize, Effect<Msg>)> = fx.drain().map(|e| (i, e)).collect();
        let mut steps = 0;
        while let Some((from, e)) = queue.pop_front() {
            steps += 1;
            assert!(steps < 100_000, "does not settle");
            let Effect::Send(to, msg) = e else { continue };
            let j = idx(&to);
            self.log.push((id(from), to.clone(), msg.clone()));
            let mut fx = Effects::default();
            if self.dead[j] {
                self.nodes[from].on_connection(&to, false, &mut fx);
                queue.extend(fx.drain().map(|e| (from, e)));
            } else {
                self.nodes[j].on_message(&id(from), msg, &mut fx);
                queue.extend(fx.drain().map(|e| (j, e)));
            }
        }
    }

    fn shuffle_round(&mut self) {
        let t = self.shuffle_timer;
        for i in 0..self.nodes.len() {
            if !self.dead[i] {
                self.call(i, |h, fx| h.on_timer(t, fx));
            }
        }
    }

    fn assert_symmetric(&self) {
        for (i, n) in self
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.dead[*i])
        {
            for a in n.neighbors() {
                let j = idx(a);
                let back = self.nodes[j].neighbors().contains(&id(i));
                assert!(self.dead[j] || back, "{i} -> {j} only");
            }
        }
    }
}

#[test]
fn joins_build_symmetric_bounded_connected_views() {
    let mut net = Net::new(20);
    net.shuffle_round();
    net.assert_symmetric();
    for n in &net.nodes {
        assert!(!n.neighbors().is_empty() && n.neighbors().len() <= 3);
        assert!(n.passive().len() <= 6 && !n.passive().contains(n.me()));
        assert!(n.neighbors().iter().all(|a| !n.passive().contains(a)));
    }
    let mut seen = BTreeSet::from([0usize]);
    let mut stack = vec![0usize];
    while let Some(i) = stack.pop() {
        for a in net.nodes[i].neighbors() {
            if seen.insert(idx(a)) {
                stack.push(idx(a));
            }
        }
    }
    assert_eq!(seen.len(), 20, "connected");
}

#[test]
fn failed_neighbour_is_replaced_from_passive() {
    let mut net = Net::new(12);
    net.shuffle_round();
    let victim = net.nodes[0].neighbors()[0].clone();
    net.dead[idx(&victim)] = true;
    let before = net.nodes[0].neighbors().len();
    net.call(0, |h, fx| h.on_connection(&victim, false, fx));
    let a = &net.nodes[0];
    assert!(!a.neighbors().contains(&victim) && !a.passive().contains(&victim));
    assert_eq!(
        a.neighbors().len(),
        before,
        "replaced from the passive view"
    );
    let asked = net
        .log
        .iter()
        .any(|(f, _, m)| *f == id(0) && matches!(m, Msg::Neighbor { .. }));
    assert!(asked);
    net.assert_symmetric();
}

#[test]
fn leave_tells_neighbours_which_replace_it() {
    let mut net = Net::new(12);
    net.shuffle_round();
    let leaver = 3;
    let old: Vec<usize> = net.nodes[leaver].neighbors().iter().map(idx).collect();
    net.call(leaver, |h, fx| h.on_leave(fx));
    net.dead[leaver] = true;
    assert_eq!(net.nodes[leaver].members(), vec![id(leaver)]);
    for j in old {
        let n = &net.nodes[j];
        assert!(!n.neighbors().contains(&id(leaver)) && !n.passive().contains(&id(leaver)));
        assert!(!n.neighbors().is_empty(), "node {j} replaced the leaver");
    }
    net.assert_symmetric();
}

#[test]
fn shuffle_reply_goes_to_the_originator() {
    let mut net = Net::new(16);
    net.log.clear();
    let t = net.shuffle_timer;
    net.call(0, |h, fx| h.on_timer(t, fx));
    let last_hop = net
        .log
        .iter()
        .rfind(|(_, _, m)| matches!(m, Msg::Shuffle { .. }))
        .map(|(_, to, _)| to.clone())
        .expect("a shuffle");
    let (from, to, nodes) = net
        .log
        .iter()
        .find_map(|(f, t, m)| match m {
            Msg::ShuffleReply { nodes } => Some((f.clone(), t.clone(), nodes.clone())),
            _ => None,
        })
        .expect("a reply");
    assert_eq!(to, id(0), "straight to the originator");
    assert_eq!(from, last_hop, "from where the walk ended");
    let a = &net.nodes[0];
    let kept = |n: &NodeId| a.passive().contains(n) || a.neighbors().contains(n) || n == a.me();
    assert!(nodes.iter().all(kept), "merged into the passive view");
}
