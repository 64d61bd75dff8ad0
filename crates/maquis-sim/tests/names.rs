//! Global names on the peer-to-peer overlay at 40 nodes, on the deterministic network of
//! `maquis_proto::harness`: each node runs the membership machine and the directory a real
//! node runs; directory messages to nodes that are not neighbours take the routed hops the
//! runtime's router takes.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::p2p_cluster;
use maquis_proto::harness::{Micros, Network, Observer, SimId};
use maquis_proto::names::{DirOutput, DirectoryConfig, Entry, ReqId, Whereis};

const N: u32 = 40;

type Answer = Result<Option<Entry<SimId>>, String>;

/// What the directories answered, by (node, request).
#[derive(Default)]
struct Answers {
    registered: HashMap<(u32, ReqId), Result<(), String>>,
    found: HashMap<(u32, ReqId), Answer>,
    lost: Vec<(u32, String, Entry<SimId>)>,
}

impl Observer for Answers {
    fn on_names(&mut self, _now: Micros, node: u32, output: &DirOutput<SimId>) {
        match output {
            DirOutput::Registered { req, result } => {
                let r = result.clone().map_err(|e| e.to_string());
                self.registered.insert((node, *req), r);
            }
            DirOutput::Found { req, result } => {
                let r = result.clone().map_err(|e| e.to_string());
                self.found.insert((node, *req), r);
            }
            DirOutput::Lost { name, winner } => {
                self.lost.push((node, name.clone(), winner.clone()))
            }
            DirOutput::Send { .. } => {}
        }
    }
}

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The 40-node cluster, each node running the directory.
fn cluster() -> Network<Answers> {
    p2p_cluster(N, Answers::default(), |net, node| {
        net.start_names(node, DirectoryConfig::default())
    })
}

/// Registers `name` on `node` (stamped with the simulated time) and lets the answer come.
fn register(net: &mut Network<Answers>, node: u32, name: &str) -> Result<(), String> {
    let stamp = net.now();
    let req = net.names(node, |d, now| {
        d.register(now, name, Bytes::from(name.to_string()), stamp)
    });
    loop {
        net.run_for(Duration::from_millis(100));
        if let Some(answer) = net.observer.registered.remove(&(node, req)) {
            break answer;
        }
    }
}

/// Who node `node` says holds `name` (asking the home and waiting when it must).
fn whereis(net: &mut Network<Answers>, node: u32, name: &str) -> Option<SimId> {
    match net.names(node, |d, now| d.whereis(now, name)) {
        Whereis::Now(e) => e.map(|e| e.owner),
        Whereis::Failed(e) => panic!("lookup failed: {e}"),
        Whereis::Asked(req) => loop {
            // The answer comes within the request timeout (5 s), retries included.
            net.run_for(Duration::from_millis(100));
            if let Some(answer) = net.observer.found.remove(&(node, req)) {
                break answer.expect("a lookup answered").map(|e| e.owner);
            }
        },
    }
}

fn live(net: &Network<Answers>) -> Vec<u32> {
    (0..N).filter(|&i| net.node(i).alive).collect()
}

#[test]
fn names_resolve_everywhere_and_vanish_with_their_node() {
    let mut net = cluster();
    for k in 0..60u32 {
        let owner = (k * 13) % N;
        register(&mut net, owner, &format!("svc-{k}")).expect("registered");
    }
    // A registration costs the same few messages whatever the cluster: at most the claim, its
    // answer and two copies.
    let sent = net.counters().names_sent;
    register(&mut net, 5, "one-more").expect("registered");
    assert!(net.counters().names_sent - sent <= 4);
    // Every node finds every name, through routed lookups where the home is not a neighbour.
    for node in 0..N {
        for k in (0..60u32).step_by(7) {
            let owner = net.node((k * 13) % N).id;
            assert_eq!(
                whereis(&mut net, node, &format!("svc-{k}")),
                Some(owner),
                "node {node}, svc-{k}"
            );
        }
    }
    assert_eq!(net.counters().names_dropped, 0);
    // A second claim of a held name is refused.
    let err = register(&mut net, 1, "svc-0").expect_err("taken");
    assert!(err.contains("registered by another node"), "{err}");

    // Node 13 crashes: once the others see it gone (member timeout), none of them finds its
    // names, from cache or home.
    net.crash(13);
    net.run_for(s(12));
    for node in live(&net) {
        assert_eq!(net.node(node).machine.members().len(), N as usize - 1);
        for k in 0..60u32 {
            if (k * 13) % N == 13 {
                assert_eq!(whereis(&mut net, node, &format!("svc-{k}")), None);
            }
        }
    }
    // The names of the others survive their homes' and replicas' loss of node 13.
    for k in 0..60u32 {
        let owner = (k * 13) % N;
        if owner != 13 {
            let want = net.node(owner).id;
            assert_eq!(whereis(&mut net, 21, &format!("svc-{k}")), Some(want));
        }
    }
}

#[test]
fn of_two_registrations_across_a_partition_one_wins_when_it_heals() {
    let mut net = cluster();
    let side: Vec<bool> = (0..N).map(|i| i % 2 == 1).collect();
    net.partition(side);
    // Each side forgets the other.
    net.run_for(s(15));
    for i in 0..N {
        assert_eq!(
            net.node(i).machine.members().len(),
            N as usize / 2,
            "node {i} sees only its side"
        );
    }
    // The even side registers first (smaller stamp): it is the one that must win.
    register(&mut net, 2, "leader").expect("even side");
    net.run_for(Duration::from_millis(10));
    register(&mut net, 3, "leader").expect("odd side");
    assert_eq!(whereis(&mut net, 4, "leader"), Some(net.node(2).id));
    assert_eq!(whereis(&mut net, 5, "leader"), Some(net.node(3).id));

    net.heal();
    // The overlay heals through the passive views; a few contacts across speed it up, as an
    // operator (or the configured contacts) would.
    for i in (1..N).step_by(8) {
        net.join(i, 0);
    }
    net.run_for(s(30));
    for i in 0..N {
        assert_eq!(net.node(i).machine.members().len(), N as usize, "node {i}");
    }
    let winner = net.node(2).id;
    for node in 0..N {
        assert_eq!(
            whereis(&mut net, node, "leader"),
            Some(winner),
            "node {node}"
        );
    }
    let told: Vec<_> = net
        .observer
        .lost
        .iter()
        .filter(|l| l.1 == "leader")
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0].0, 3, "the loser's node is told");
    assert_eq!(told[0].2.owner, winner);
}
