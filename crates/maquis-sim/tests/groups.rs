//! Process groups on the peer-to-peer overlay at 40 nodes, on the deterministic network of
//! `maquis_proto::harness`: each node runs the membership machine and the groups machine a real
//! node runs; group messages to nodes that are not neighbours take the routed hops the
//! runtime's router takes.

mod common;

use std::time::Duration;

use common::p2p_cluster;
use maquis_proto::groups::{Actor, GroupsConfig};
use maquis_proto::harness::{Network, NoObserver, SimId};

const N: u32 = 40;

fn s(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The 40-node cluster, each node running the groups with a digest every 2 s.
fn cluster() -> Network<NoObserver> {
    p2p_cluster(N, NoObserver, |net, node| {
        let groups = GroupsConfig {
            digest_every: s(2),
            ..GroupsConfig::default()
        };
        net.start_groups(node, groups)
    })
}

/// Node `i`'s actor `k`.
fn actor(i: u32, k: u64) -> Actor {
    Actor {
        id: u64::from(i) * 100 + k,
        ty: 1,
    }
}

/// The members of `group` as node `i` sees them, sorted.
fn members(net: &mut Network<NoObserver>, i: u32, group: &str) -> Vec<(SimId, Actor)> {
    let mut m = net.groups(i, |g, _| g.members(group));
    m.sort();
    m
}

/// Every live node in `nodes` sees the same members of `group`, `n` of them.
fn everyone_sees(net: &mut Network<NoObserver>, nodes: &[u32], group: &str, n: usize) {
    let reference = members(net, nodes[0], group);
    assert_eq!(reference.len(), n, "node {} sees {reference:?}", nodes[0]);
    for &i in nodes {
        assert_eq!(members(net, i, group), reference, "node {i}");
    }
}

/// Every node joins an actor to `all`, every fourth one a second actor to `some`.
fn join_everywhere(net: &mut Network<NoObserver>) {
    for i in 0..N {
        net.groups(i, |g, now| g.join(now, "all", actor(i, 1)))
            .unwrap();
        if i % 4 == 0 {
            net.groups(i, |g, now| g.join(now, "some", actor(i, 2)))
                .unwrap();
        }
    }
}

#[test]
fn groups_converge_and_lose_a_crashed_nodes_members() {
    let mut net = cluster();
    join_everywhere(&mut net);
    net.run_for(s(1));
    let everyone: Vec<u32> = (0..N).collect();
    everyone_sees(&mut net, &everyone, "all", N as usize);
    everyone_sees(&mut net, &everyone, "some", N as usize / 4);
    assert!(net.counters().groups_sent > 0);

    // A leave and a stopped actor reach every node.
    assert!(net.groups(5, |g, now| g.leave(now, "all", actor(5, 1))));
    net.groups(8, |g, now| g.remove_actor(now, actor(8, 2).id));
    net.run_for(s(1));
    everyone_sees(&mut net, &everyone, "all", N as usize - 1);
    everyone_sees(&mut net, &everyone, "some", N as usize / 4 - 1);

    // Node 12 crashes: once the others see it gone (member timeout), its members are gone
    // everywhere.
    net.crash(12);
    net.run_for(s(12));
    let live: Vec<u32> = (0..N).filter(|&i| i != 12).collect();
    everyone_sees(&mut net, &live, "all", N as usize - 2);
    everyone_sees(&mut net, &live, "some", N as usize / 4 - 2);
}

#[test]
fn groups_merge_when_a_partition_heals() {
    let mut net = cluster();
    let side: Vec<bool> = (0..N).map(|i| i % 2 == 1).collect();
    net.partition(side);
    net.run_for(s(15));
    // Each side joins while apart, and sees only its own side's members.
    join_everywhere(&mut net);
    net.run_for(s(3));
    let even: Vec<u32> = (0..N).step_by(2).collect();
    let odd: Vec<u32> = (1..N).step_by(2).collect();
    everyone_sees(&mut net, &even, "all", N as usize / 2);
    everyone_sees(&mut net, &odd, "all", N as usize / 2);

    net.heal();
    // The overlay heals through the passive views; a few contacts across speed it up.
    for i in (1..N).step_by(8) {
        net.join(i, 0);
    }
    net.run_for(s(30));
    let everyone: Vec<u32> = (0..N).collect();
    everyone_sees(&mut net, &everyone, "all", N as usize);
    everyone_sees(&mut net, &everyone, "some", N as usize / 4);
}
