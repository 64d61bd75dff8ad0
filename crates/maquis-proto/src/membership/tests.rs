//! The machine's bookkeeping, driven by hand through an overlay that does what its messages
//! say.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::*;
use crate::overlay::{Effects, Erased, Overlay};

#[derive(Serialize, Deserialize)]
enum Cmd {
    Connect(NodeId),
    Disconnect(NodeId),
    Timer(u64, u64),
    Leave(NodeId),
}

/// Members: this node and every peer whose connection is up. Messages are commands.
struct Scripted {
    me: NodeId,
    liveness: Liveness,
    members: BTreeSet<NodeId>,
    fired: Arc<Mutex<Vec<u64>>>,
}

impl Overlay for Scripted {
    type Msg = Cmd;
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn on_join(&mut self, _contact: &NodeId, _fx: &mut Effects<Cmd>) {}
    fn on_leave(&mut self, _fx: &mut Effects<Cmd>) {}
    fn on_message(&mut self, _from: &NodeId, msg: Cmd, fx: &mut Effects<Cmd>) {
        match msg {
            Cmd::Connect(n) => fx.connect(n),
            Cmd::Disconnect(n) => fx.disconnect(n),
            Cmd::Timer(id, ms) => fx.timer(TimerId(id), Duration::from_millis(ms)),
            Cmd::Leave(n) => {
                self.members.remove(&n);
                fx.left(n);
            }
        }
    }
    fn on_connection(&mut self, peer: &NodeId, up: bool, _fx: &mut Effects<Cmd>) {
        if up {
            self.members.insert(peer.clone());
        } else {
            self.members.remove(peer);
        }
    }
    fn on_timer(&mut self, timer: TimerId, _fx: &mut Effects<Cmd>) {
        self.fired.lock().unwrap().push(timer.0);
    }
    fn members(&self) -> Vec<NodeId> {
        let mut all: Vec<NodeId> = self.members.iter().cloned().collect();
        all.push(self.me.clone());
        all
    }
    fn route(&self, _dst: &NodeId) -> Route {
        Route::Direct
    }
    fn liveness(&self) -> Liveness {
        self.liveness
    }
    fn member_heartbeats(&self) -> bool {
        false
    }
}

fn id(name: &str) -> NodeId {
    NodeId::new(name, ([127, 0, 0, 1], 7000).into(), 1)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn machine(liveness: Liveness) -> (Membership, Arc<Mutex<Vec<u64>>>) {
    let fired = Arc::new(Mutex::new(Vec::new()));
    let overlay = Scripted {
        me: id("a"),
        liveness,
        members: BTreeSet::new(),
        fired: fired.clone(),
    };
    let cfg = MembershipConfig {
        linger: ms(500),
        refresh_every: ms(1000),
        ..MembershipConfig::default()
    };
    let mut m = Membership::new(id("a"), Box::new(Erased(overlay)), cfg);
    m.handle_start(Duration::ZERO);
    (m, fired)
}

fn outputs(m: &mut Membership) -> Vec<Output> {
    std::iter::from_fn(|| m.poll_output()).collect()
}

fn cmd(m: &mut Membership, now: Duration, c: Cmd) {
    let bytes = crate::encode(&c).unwrap();
    m.handle_overlay_msg(now, &id("x"), &bytes).unwrap();
}

#[test]
fn a_lost_connection_is_a_gone_node_and_a_goodbye_is_a_departure() {
    let (mut m, _) = machine(Liveness::Connection);
    outputs(&mut m);
    m.handle_connected(ms(1), &id("b"));
    m.handle_connected(ms(1), &id("c"));
    let out = outputs(&mut m);
    let members = out.iter().position(|o| matches!(o, Output::Members(_)));
    let up = out
        .iter()
        .position(|o| *o == Output::Event(MembershipEvent::Up(id("b"))));
    assert!(members.is_some() && up.is_some() && members < up, "{out:?}");
    assert_eq!(**m.members(), vec![id("a"), id("b"), id("c")]);
    assert_eq!(m.neighbors(), &[id("b"), id("c")]);

    m.handle_disconnected(ms(2), &id("b"), Disconnect::Bye);
    let out = outputs(&mut m);
    assert_eq!(out[0], Output::Gone(id("b")));
    assert!(out.contains(&Output::Event(MembershipEvent::Left(id("b")))));
    m.handle_disconnected(ms(3), &id("c"), Disconnect::Lost);
    let out = outputs(&mut m);
    assert!(out.contains(&Output::Event(MembershipEvent::Down(id("c")))));
    assert_eq!(**m.members(), vec![id("a")]);
}

#[test]
fn a_connection_dropped_while_coming_up_closes_once_up_or_after_the_linger() {
    let (mut m, _) = machine(Liveness::Membership);
    outputs(&mut m);
    // Up: closed at once.
    m.handle_connected(ms(1), &id("b"));
    outputs(&mut m);
    cmd(&mut m, ms(2), Cmd::Disconnect(id("b")));
    assert!(outputs(&mut m).contains(&Output::Close(id("b"))));
    // Still coming up: closed when it connects.
    cmd(&mut m, ms(3), Cmd::Disconnect(id("c")));
    assert!(!outputs(&mut m).contains(&Output::Close(id("c"))));
    m.handle_connected(ms(10), &id("c"));
    assert!(outputs(&mut m).contains(&Output::Close(id("c"))));
    // Never connects: closed after the linger.
    cmd(&mut m, ms(20), Cmd::Disconnect(id("d")));
    assert_eq!(m.poll_timeout(), Some(ms(520)));
    m.handle_timeout(ms(519));
    assert!(!outputs(&mut m).contains(&Output::Close(id("d"))));
    m.handle_timeout(ms(520));
    assert!(outputs(&mut m).contains(&Output::Close(id("d"))));
    // Wanted again before the linger: kept.
    cmd(&mut m, ms(600), Cmd::Disconnect(id("e")));
    cmd(&mut m, ms(601), Cmd::Connect(id("e")));
    assert!(outputs(&mut m).contains(&Output::Connect(id("e"))));
    m.handle_timeout(ms(2000));
    assert!(!outputs(&mut m).contains(&Output::Close(id("e"))));
}

#[test]
fn an_overlay_timer_set_again_is_replaced_not_doubled() {
    let (mut m, fired) = machine(Liveness::Connection);
    cmd(&mut m, ms(0), Cmd::Timer(7, 100));
    cmd(&mut m, ms(50), Cmd::Timer(7, 100));
    m.handle_timeout(ms(120));
    assert!(fired.lock().unwrap().is_empty(), "moved to 150 ms");
    m.handle_timeout(ms(150));
    m.handle_timeout(ms(5000));
    assert_eq!(*fired.lock().unwrap(), vec![7]);
}

#[test]
fn a_node_the_overlay_says_left_is_reported_left() {
    let (mut m, _) = machine(Liveness::Membership);
    m.handle_connected(ms(1), &id("b"));
    outputs(&mut m);
    cmd(&mut m, ms(2), Cmd::Leave(id("b")));
    let out = outputs(&mut m);
    assert!(out.contains(&Output::Gone(id("b"))), "{out:?}");
    assert!(out.contains(&Output::Event(MembershipEvent::Left(id("b")))));
}

#[test]
fn a_closed_connection_is_no_longer_a_neighbour() {
    let (mut m, _) = machine(Liveness::Connection);
    m.handle_connected(ms(1), &id("b"));
    m.handle_connected(ms(1), &id("c"));
    outputs(&mut m);
    assert_eq!(m.neighbors(), &[id("b"), id("c")]);
    // The overlay drops b (it still lists it as a member): its connection closes here and
    // the driver reports nothing back, so the machine must stop counting it as up.
    cmd(&mut m, ms(2), Cmd::Disconnect(id("b")));
    let out = outputs(&mut m);
    assert!(out.contains(&Output::Close(id("b"))), "{out:?}");
    assert!(!m.is_up(&id("b")));
    assert_eq!(m.neighbors(), &[id("c")]);
}

/// Accusations on the peer-to-peer overlay, in a simulated network.
mod accusations {
    use crate::broadcast::PlumtreeMsg;
    use crate::harness::{Micros, NetConfig, Network, Observer, SimId};
    use crate::membership::{MembershipConfig, MembershipEvent, Output, Protocol};
    use crate::overlay::{Erased, HyParView, HyParViewConfig};
    use std::time::Duration;

    /// Every `Down` event: (when, by whom, about whom), and the ids of the down notices seen
    /// on the wire.
    #[derive(Default)]
    struct Downs(Vec<(Micros, u32, u32)>, std::collections::BTreeSet<String>);

    impl Observer for Downs {
        fn on_output(&mut self, now: Micros, node: u32, output: &Output<SimId>) {
            if let Output::Event(MembershipEvent::Down(x)) = output {
                self.0.push((now, node, x.index));
            }
        }

        fn on_message(&mut self, _from: u32, _to: u32, protocol: Protocol, payload: &[u8]) {
            if protocol != Protocol::Broadcast {
                return;
            }
            if let Ok(PlumtreeMsg::<SimId>::Gossip { id, topic, .. }) =
                postcard::from_bytes(payload)
            {
                if topic.as_str() == super::super::bcast::DOWN_TOPIC {
                    self.1.insert(format!("{id:?}"));
                }
            }
        }
    }

    const N: u32 = 30;

    /// `N` nodes, a heartbeat every 4 s (as a large cluster's nodes send them: rarely), a
    /// member timeout of 20 s, settled.
    fn network(suspicion: Duration) -> Network<Downs> {
        network_refreshed(suspicion, MembershipConfig::default().refresh_every)
    }

    /// [`network`], with its nodes refreshing their routes every `refresh_every`.
    fn network_refreshed(suspicion: Duration, refresh_every: Duration) -> Network<Downs> {
        let mut net = Network::new(NetConfig::default(), Downs::default());
        let mut cfg = MembershipConfig {
            suspicion,
            member_timeout: Duration::from_secs(20),
            refresh_every,
            ..MembershipConfig::default()
        };
        cfg.plumtree.heartbeat_every = Duration::from_secs(4);
        cfg.plumtree.route_ttl = cfg.member_timeout;
        for i in 0..N {
            let id = net.next_id();
            let overlay = Erased(HyParView::new(id, HyParViewConfig::default()));
            let node = net.spawn(Box::new(overlay), cfg.clone());
            if i > 0 {
                net.join(node, i / 2);
            }
            net.run_for(Duration::from_millis(50));
        }
        net.run_for(Duration::from_secs(20));
        for i in 0..N {
            assert_eq!(net.node(i).machine.members().len(), N as usize, "settled");
        }
        net
    }

    fn downs_of(net: &Network<Downs>, who: u32, since: Micros) -> Vec<(Micros, u32)> {
        net.observer
            .0
            .iter()
            .filter(|(at, _, x)| *x == who && *at >= since)
            .map(|(at, by, _)| (*at - since, *by))
            .collect()
    }

    #[test]
    fn a_crash_is_reported_everywhere_within_the_suspicion_not_the_member_timeout() {
        let mut net = network(Duration::from_secs(1));
        let neighbours = (0..N).filter(|&i| i != 7 && net.connected(i, 7)).count();
        let t = net.now();
        net.crash(7);
        net.run_for(Duration::from_secs(3));
        let downs = downs_of(&net, 7, t);
        let reporters: std::collections::BTreeSet<u32> = downs.iter().map(|(_, by)| *by).collect();
        assert_eq!(
            reporters.len(),
            N as usize - 1,
            "every live node: {downs:?}"
        );
        let slowest = downs.iter().map(|(at, _)| *at).max().unwrap();
        // Each neighbour of the crashed node lost its connection; the first notice silenced
        // the others.
        // Each of its neighbours lost its connection; the first notice silenced the others.
        let notices = net.observer.1.len();
        assert!(neighbours >= 3, "{neighbours} neighbours");
        assert!(
            (1..=2).contains(&notices),
            "{notices} notices from {neighbours} neighbours"
        );
        // Noticed after 200 ms, suspected for 1 s: well under 2 s, against 20 s.
        assert!(slowest < 2_000_000, "slowest report after {slowest} µs");
    }

    #[test]
    fn suspicions_ending_close_together_are_judged_together() {
        // Refreshes (which judge suspects too) rare enough that the suspicion timer alone
        // judges here.
        let mut net = network_refreshed(Duration::from_secs(1), Duration::from_secs(30));
        let t = net.now();
        net.crash(7);
        net.run_for(Duration::from_millis(100));
        net.crash(9);
        net.run_for(Duration::from_secs(3));
        let (a, b) = (downs_of(&net, 7, t), downs_of(&net, 9, t));
        for i in (0..N).filter(|&i| i != 7 && i != 9) {
            let at = |d: &[(Micros, u32)]| d.iter().find(|(_, by)| *by == i).map(|(at, _)| *at);
            let (Some(x), Some(y)) = (at(&a), at(&b)) else {
                panic!("node {i} reported both: {a:?} {b:?}");
            };
            // One judgement, or two at least a quarter of the suspicion apart.
            let gap = x.abs_diff(y);
            assert!(gap == 0 || gap >= 250_000, "node {i}: {x} and {y} µs");
            // Still within the suspicion and a quarter of it after the notices.
            assert!(x.max(y) < 2_250_000, "node {i}: {x} and {y} µs");
        }
    }

    #[test]
    fn a_failed_dial_to_a_node_long_gone_accuses_nobody() {
        let mut net = network(Duration::from_secs(1));
        let dead = net.node(7).id;
        let t = net.now();
        net.crash(7);
        net.run_for(Duration::from_secs(3));
        let notices = net.observer.1.len();
        assert!((1..=2).contains(&notices), "{notices} notices");
        assert_eq!(downs_of(&net, 7, t).len(), N as usize - 1);
        // Long after (its routes expired everywhere), every node tries it (its id still in a
        // passive view, say) and fails.
        net.run_for(Duration::from_secs(30));
        for i in (0..N).filter(|&i| i != 7) {
            net.input(i, |m, now| {
                m.handle_disconnected(now, &dead, crate::membership::Disconnect::Lost)
            });
        }
        net.run_for(Duration::from_secs(3));
        assert_eq!(
            net.observer.1.len(),
            notices,
            "no notice about a non-member"
        );
    }

    #[test]
    fn an_inconclusive_dial_accuses_nobody_and_a_refused_one_is_refuted() {
        use crate::membership::Disconnect;
        let mut net = network(Duration::from_secs(1));
        let live = net.node(7).id;
        let dialer = (0..N).find(|&i| i != 7 && !net.connected(i, 7)).unwrap();
        let t = net.now();
        // A dial that timed out (a busy node, or a busy dialer) says nothing of the peer.
        net.input(dialer, |m, now| {
            m.handle_disconnected(now, &live, Disconnect::Inconclusive)
        });
        net.run_for(Duration::from_secs(3));
        assert_eq!(net.observer.1.len(), 0, "no notice");
        assert_eq!(net.node(dialer).machine.stats().accusations, 0);
        // A refused one accuses; the live node refutes it before anyone declares it down.
        net.input(dialer, |m, now| {
            m.handle_disconnected(now, &live, Disconnect::Lost)
        });
        net.run_for(Duration::from_secs(3));
        assert_eq!(net.observer.1.len(), 1, "one notice");
        assert_eq!(net.node(dialer).machine.stats().accusations, 1);
        assert_eq!(net.node(7).machine.stats().refutations, 1);
        assert_eq!(downs_of(&net, 7, t), vec![], "nobody declared it down");
        let declared: u64 = (0..N)
            .map(|i| net.node(i).machine.stats().declared_down)
            .sum();
        assert_eq!(declared, 0);
    }

    #[test]
    fn without_suspicion_a_crash_waits_for_the_member_timeout() {
        let mut net = network(Duration::ZERO);
        let t = net.now();
        net.crash(7);
        net.run_for(Duration::from_secs(3));
        let early: Vec<_> = downs_of(&net, 7, t)
            .into_iter()
            .filter(|(_, by)| {
                // Its neighbours lost their connections: the overlay's own view may drop it.
                !net.node(*by).machine.neighbors().is_empty()
            })
            .collect();
        assert!(
            early.len() < N as usize - 1,
            "not everyone knew within 3 s: {early:?}"
        );
        net.run_for(Duration::from_secs(20));
        assert_eq!(
            downs_of(&net, 7, t).len(),
            N as usize - 1,
            "everyone after the timeout"
        );
    }

    #[test]
    fn a_node_that_lost_one_connection_refutes_and_stays_a_member() {
        let mut net = network(Duration::from_secs(1));
        let (a, b) = (0..N)
            .flat_map(|a| (0..N).map(move |b| (a, b)))
            .find(|&(a, b)| a != b && net.connected(a, b))
            .expect("a link");
        let t = net.now();
        net.break_link(a, b);
        net.run_for(Duration::from_secs(5));
        let wrong: Vec<_> = net
            .observer
            .0
            .iter()
            .filter(|(at, _, _)| *at >= t)
            .collect();
        assert!(wrong.is_empty(), "nobody is declared down: {wrong:?}");
        for i in 0..N {
            assert_eq!(net.node(i).machine.members().len(), N as usize);
        }
    }

    #[test]
    fn the_messages_sent_are_counted_by_kind() {
        let mut net = network(Duration::from_secs(1));
        let sent = |net: &Network<Downs>| -> Vec<super::SentStats> {
            (0..N).map(|i| net.node(i).machine.sent()).collect()
        };
        let total = |s: &[super::SentStats]| s.iter().map(|s| s.messages()).sum::<u64>();
        // Every message a machine asked to send is counted once, in one kind.
        assert_eq!(total(&sent(&net)), net.counters().protocol);
        let before = sent(&net);
        let (sent_before, asked_before) = (total(&before), net.counters().protocol);
        // At rest for 40 s, a heartbeat every 4 s: ten of each node's own, at least.
        net.run_for(Duration::from_secs(40));
        let after = sent(&net);
        assert_eq!(
            total(&after) - sent_before,
            net.counters().protocol - asked_before
        );
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            assert!(a.heartbeats - b.heartbeats >= 9, "node {i}: {b:?} -> {a:?}");
            assert_eq!(a.gossip, b.gossip, "node {i}: no application topic");
            assert_eq!(a.notices, b.notices, "node {i}: nobody accused at rest");
            assert!(a.bytes > b.bytes);
        }
    }
}

#[test]
fn a_heartbeat_that_moves_a_route_moves_the_route_table_at_once() {
    use crate::broadcast::PlumtreeMsg;
    use crate::overlay::{HyParView, HyParViewConfig, HyParViewMsg};
    let overlay = HyParView::new(id("a"), HyParViewConfig::default());
    let mut m = Membership::new(
        id("a"),
        Box::new(Erased(overlay)),
        MembershipConfig::default(),
    );
    let t = ms(10);
    m.handle_start(Duration::ZERO);
    // `b` and `c` become neighbours.
    for n in ["b", "c"] {
        let join = crate::encode(&HyParViewMsg::<NodeId>::Join).unwrap();
        m.handle_overlay_msg(t, &id(n), &join).unwrap();
        m.handle_connected(t, &id(n));
    }
    outputs(&mut m);
    let beat = |seq, way| {
        let msg = PlumtreeMsg::Heartbeat {
            origin: id("d"),
            seq,
            round: way,
            way,
        };
        crate::encode(&msg).unwrap()
    };
    let routes = |m: &mut Membership| -> Vec<RouteChange<NodeId>> {
        outputs(m)
            .into_iter()
            .filter_map(|o| match o {
                Output::Route(r) => Some(r),
                _ => None,
            })
            .collect()
    };
    // No refresh is due: the table follows each heartbeat that moves the route.
    m.handle_broadcast_msg(t, &id("b"), &beat(1, 2)).unwrap();
    let set = |via: &str| RouteChange::Set {
        dst: id("d"),
        via: id(via),
    };
    assert_eq!(routes(&mut m), vec![set("b")]);
    // A shorter way through `c`.
    m.handle_broadcast_msg(t, &id("c"), &beat(2, 1)).unwrap();
    assert_eq!(routes(&mut m), vec![set("c")]);
    m.handle_broadcast_msg(t, &id("c"), &beat(3, 1)).unwrap();
    assert_eq!(routes(&mut m), vec![], "the same way: nothing to write");
    assert_eq!(m.route(&"d".into()), Some(&(id("d"), id("c"))));
}

/// A client-server record that changes only a client's servers (its members and this node's
/// neighbours stay the same) moves the route to that client at once, not at some later
/// change.
#[test]
fn a_record_naming_a_new_server_moves_the_route_at_once() {
    use crate::overlay::{
        ClientServer, ClientServerConfig, ClientServerMsg, Member, MemberState, Role,
    };
    let me = id("s2");
    let overlay = ClientServer::new(me.clone(), ClientServerConfig::default());
    let mut m = Membership::new(me, Box::new(Erased(overlay)), MembershipConfig::default());
    let t = ms(10);
    m.handle_start(Duration::ZERO);
    let record = |name: &str, role, version, servers: &[&str]| Member {
        id: id(name),
        role,
        version,
        state: MemberState::Alive,
        servers: servers.iter().map(|s| (*s).into()).collect(),
    };
    let server = |name| record(name, Role::Server, 0, &[]);
    m.handle_connected(t, &id("s1"));
    let state = ClientServerMsg::State(vec![server("s1"), record("c", Role::Client, 0, &[])]);
    m.handle_overlay_msg(t, &id("s1"), &crate::encode(&state).unwrap())
        .unwrap();
    outputs(&mut m);
    assert!(m.route(&"c".into()).is_none(), "no server of c yet");
    // c attached to s1: its record says so, nothing else changes.
    let delta = ClientServerMsg::Delta(vec![record("c", Role::Client, 1, &["s1"])]);
    m.handle_overlay_msg(t, &id("s1"), &crate::encode(&delta).unwrap())
        .unwrap();
    let routes: Vec<_> = outputs(&mut m)
        .into_iter()
        .filter_map(|o| match o {
            Output::Route(r) => Some(r),
            _ => None,
        })
        .collect();
    let via_s1 = RouteChange::Set {
        dst: id("c"),
        via: id("s1"),
    };
    assert_eq!(routes, vec![via_s1]);
}
