//! HyParView inside the membership machine, on the deterministic network of
//! `maquis_proto::harness`: joins, failures, leave, shuffles.

use std::time::Duration;

use maquis_proto::harness::{NetConfig, Network, Observer, SimId};
use maquis_proto::membership::{MembershipConfig, MembershipEvent, Output, Protocol};
use maquis_proto::overlay::{Erased, HyParView, HyParViewConfig, HyParViewMsg};

/// Every overlay message, in the order they arrived, and the `Down` events reported (the
/// node reporting, the node reported).
#[derive(Default)]
struct Log(Vec<(u32, u32, HyParViewMsg<SimId>)>, Vec<(u32, u32)>);

impl Observer for Log {
    fn on_message(&mut self, from: u32, to: u32, protocol: Protocol, payload: &[u8]) {
        if protocol == Protocol::Overlay {
            let msg = postcard::from_bytes(payload).expect("a HyParView message");
            self.0.push((from, to, msg));
        }
    }

    fn on_output(&mut self, _now: u64, node: u32, output: &Output<SimId>) {
        if let Output::Event(MembershipEvent::Down(x)) = output {
            self.1.push((node, x.index));
        }
    }
}

fn hv(net: &Network<Log>, i: u32) -> &HyParView<SimId> {
    net.node(i).machine.overlay().expect("HyParView")
}

/// `n` nodes, node i joining through node (7i + 3) mod i, one join every 20 ms, then
/// `settle` of simulated time.
fn network(n: u32, settle: Duration) -> Network<Log> {
    let mut net = Network::new(NetConfig::default(), Log::default());
    for i in 0..n {
        let id = net.next_id();
        let cfg = HyParViewConfig {
            active_size: 3,
            passive_size: 6,
            shuffle_active: 2,
            shuffle_passive: 2,
            seed: Some(u64::from(i)),
            ..HyParViewConfig::default()
        };
        let node = net.spawn(
            Box::new(Erased(HyParView::new(id, cfg))),
            MembershipConfig::default(),
        );
        if i > 0 {
            net.join(node, (i * 7 + 3) % i);
        }
        net.run_for(Duration::from_millis(20));
    }
    net.run_for(settle);
    net
}

fn assert_symmetric(net: &Network<Log>) {
    let g = net.graph();
    assert_eq!(g.symmetry, 1.0, "{g:?}");
}

#[test]
fn joins_build_symmetric_bounded_connected_views() {
    let net = network(20, Duration::from_secs(3));
    assert_symmetric(&net);
    for i in 0..20 {
        let h = hv(&net, i);
        assert!(
            !h.neighbors().is_empty() && h.neighbors().len() <= 3,
            "node {i}"
        );
        assert!(h.passive().len() <= 6 && !h.passive().contains(h.me()));
        assert!(h.neighbors().iter().all(|a| !h.passive().contains(a)));
    }
    assert_eq!(net.graph().components, 1, "connected");
}

#[test]
fn failed_neighbour_is_replaced_from_passive() {
    let mut net = network(12, Duration::from_secs(3));
    let victim = hv(&net, 0).neighbors()[0];
    let before = hv(&net, 0).neighbors().len();
    net.observer.0.clear();
    net.crash(victim.index);
    net.run_for(Duration::from_secs(2));
    let a = hv(&net, 0);
    // Not in the active view. (It may be back in the passive view: another node that had it
    // in its own can pass it on in a shuffle, and passive identities are not checked until
    // they are dialed, as in the paper; whether that happens within the 2 s depends on the
    // order of the messages.)
    assert!(!a.neighbors().contains(&victim));
    assert_eq!(
        a.neighbors().len(),
        before,
        "replaced from the passive view"
    );
    let asked = net
        .observer
        .0
        .iter()
        .any(|(f, _, m)| *f == 0 && matches!(m, HyParViewMsg::Neighbor { .. }));
    assert!(asked);
    assert_symmetric(&net);
}

#[test]
fn leave_tells_neighbours_which_replace_it() {
    let mut net = network(12, Duration::from_secs(3));
    let leaver = 3;
    let old: Vec<u32> = hv(&net, leaver)
        .neighbors()
        .iter()
        .map(|n| n.index)
        .collect();
    let me = *hv(&net, leaver).me();
    net.leave(leaver);
    // Its goodbyes arrive within one message delay (5–15 ms).
    net.run_for(Duration::from_millis(100));
    use maquis_proto::overlay::Overlay;
    assert_eq!(hv(&net, leaver).members(), vec![me]);
    for j in old {
        let n = hv(&net, j);
        assert!(!n.neighbors().contains(&me) && !n.passive().contains(&me));
        assert!(!n.neighbors().is_empty(), "node {j} replaced the leaver");
    }
    net.crash(leaver);
    net.run_for(Duration::from_secs(1));
    assert_symmetric(&net);
}

#[test]
fn shuffle_reply_goes_to_the_originator() {
    let net = network(16, Duration::from_secs(3));
    let log = &net.observer.0;
    // The first reply node 0 got, and the shuffle walk of node 0 that it answers.
    let (at, (from, _, nodes)) = log
        .iter()
        .enumerate()
        .find(|(_, (_, to, m))| *to == 0 && matches!(m, HyParViewMsg::ShuffleReply { .. }))
        .map(|(k, (f, t, m))| (k, (*f, *t, m.clone())))
        .expect("a reply to node 0");
    let last_hop = log[..at]
        .iter()
        .rev()
        .find(|(_, _, m)| matches!(m, HyParViewMsg::Shuffle { origin, .. } if origin.index == 0))
        .map(|(_, to, _)| *to)
        .expect("node 0's shuffle");
    assert_eq!(
        from, last_hop,
        "from where the walk ended, straight to the originator"
    );
    let HyParViewMsg::ShuffleReply { nodes } = nodes else {
        unreachable!()
    };
    assert!(!nodes.is_empty());
}

/// Eight nodes with active views of 3 join through one contact at about the same time, as a
/// small cluster starts. Their views can close into two groups of four, each node a neighbour
/// of the three others in its group: every view is full, so no request of the paper's protocol
/// crosses, and each group stops hearing the other. Without more, 35 of 1,000 seeds (delays
/// and views) ended split for good; the seeds here are eight of those. A member whose
/// heartbeats are half the member timeout late is dialed and asked to be a neighbour, which
/// joins the groups again before the member timeout: every cluster is split for a while, then
/// connected, with every node listing all eight, and no node was ever reported down. (Before
/// that, the groups joined only once they had declared each other down and re-dialed.)
#[test]
fn views_closed_into_full_groups_join_again() {
    use maquis_proto::overlay::Overlay;
    for seed in [29, 31, 54, 80, 87, 208, 226, 257] {
        let cfg = NetConfig {
            seed,
            ..NetConfig::default()
        };
        let mut net = Network::new(cfg, Log::default());
        for i in 0..8u32 {
            let id = net.next_id();
            let cfg = HyParViewConfig {
                active_size: 3,
                passive_size: 6,
                shuffle_period: Duration::from_millis(400),
                seed: Some(seed * 8 + u64::from(i)),
                ..HyParViewConfig::default()
            };
            let node = net.spawn(
                Box::new(Erased(HyParView::new(id, cfg))),
                MembershipConfig::default(),
            );
            if i > 0 {
                net.join(node, 0);
            }
            net.run_for(Duration::from_millis(1));
        }
        let mut split = false;
        for _ in 0..60 {
            net.run_for(Duration::from_millis(250));
            split |= net.graph().components > 1;
        }
        assert!(split, "seed {seed} never split: the scenario changed");
        assert_eq!(net.graph().components, 1, "seed {seed}: {:?}", net.graph());
        assert_eq!(
            net.observer.1,
            vec![],
            "seed {seed}: live nodes reported down"
        );
        for i in 0..8 {
            assert_eq!(hv(&net, i).members().len(), 8, "seed {seed}, node {i}");
        }
    }
}

/// A view one-sided by a lost message (node `a` holds `b` as a neighbour, `b` does not hold
/// `a`: here a `ForwardJoinReply` handed to `a` as if `b` had accepted its walk) mends
/// itself: a walk `a` sends through `b` tells `b` the views disagree, and `b` tells `a` to
/// drop it. Without that, only a later random eviction undid it.
#[test]
fn a_one_sided_view_mends_itself() {
    let mut net = network(12, Duration::from_secs(3));
    assert_symmetric(&net);
    let a = 0;
    let b = (1..12)
        .find(|j| {
            let bj = *hv(&net, *j).me();
            !hv(&net, a).neighbors().contains(&bj)
        })
        .expect("a node that is not a neighbour of node 0");
    let b_id = *hv(&net, b).me();
    let reply = maquis_proto::encode(&HyParViewMsg::<SimId>::ForwardJoinReply).unwrap();
    net.input(a, |m, now| {
        m.handle_overlay_msg(now, &b_id, &reply).unwrap();
    });
    net.run_for(Duration::from_millis(50));
    assert!(hv(&net, a).neighbors().contains(&b_id));
    let a_id = *hv(&net, a).me();
    assert!(!hv(&net, b).neighbors().contains(&a_id));
    assert!(net.graph().symmetry < 1.0);
    // Three shuffle periods (mended after 0.6 s here; without the check it took 9 s, until a
    // random eviction happened to undo it).
    net.run_for(Duration::from_secs(3));
    assert_symmetric(&net);
    assert_eq!(net.graph().components, 1, "connected");
}
