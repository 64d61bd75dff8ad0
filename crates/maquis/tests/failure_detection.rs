//! How fast a crashed node is reported down on the overlays whose members are not simply the
//! nodes a connection reaches (peer-to-peer, client-server), and that nobody else is.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use maquis::config::{ClientServerOptions, PeerToPeerOptions};
use maquis::overlay::Role;
use maquis::{Config, MembershipEvent, Node};

/// Starts `nodes` (already configured), joins each through the first, waits until every one
/// counts all as members.
async fn build(configs: Vec<Config>) -> Vec<Node> {
    let mut nodes = Vec::new();
    for c in configs {
        nodes.push(start_with(c).await);
    }
    for n in &nodes[1..] {
        n.join_wait(nodes[0].addr(), Duration::from_secs(5))
            .await
            .expect("join");
    }
    for n in &nodes {
        until("every node counts all", Duration::from_secs(20), || async {
            n.members().len() == nodes.len()
        })
        .await;
    }
    nodes
}

/// Shuts `victim` down (its connections close as in a crash) and returns, per other node,
/// how long until it reported the victim down, sorted; fails on any other `Down` or `Left`.
/// Each node's events are awaited in a task of its own, so that every time is when that node
/// reported, not when the test got to it; the times are printed per node.
async fn crash_and_time(nodes: &[Node], victim: usize, limit: Duration) -> Vec<Duration> {
    let name = nodes[victim].id().name.to_string();
    let t = Instant::now();
    let waits: Vec<_> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, n)| {
            let mut rx = n.subscribe();
            let who = n.id().name.to_string();
            tokio::spawn(async move {
                let ev = next_event(&mut rx, limit, |e| {
                    matches!(e, MembershipEvent::Down(_) | MembershipEvent::Left(_))
                })
                .await;
                (who, ev, t.elapsed())
            })
        })
        .collect();
    nodes[victim].shutdown().await;
    let mut times = Vec::new();
    for w in waits {
        let (who, ev, at) = w.await.expect("waiter");
        match ev {
            MembershipEvent::Down(n) if *n.name == *name => {
                println!("{who} reported {name} down after {at:?}");
                times.push(at);
            }
            other => panic!("only {name} goes down, not {other:?} (at {who})"),
        }
    }
    times.sort();
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_to_peer_reports_a_crash_within_the_suspicion_not_the_member_timeout() {
    let configs = (0..8)
        .map(|i| {
            let mut c = config(&format!("fd{i}")).overlay(PeerToPeerOptions {
                active_size: 3,
                passive_size: 6,
                shuffle_period_ms: 400,
                ..PeerToPeerOptions::default()
            });
            // The runtime's defaults: a heartbeat a second, a member timeout of 5 s, a
            // suspicion of 1 s.
            c.broadcast = Default::default();
            c
        })
        .collect();
    let nodes = build(configs).await;
    let times = crash_and_time(&nodes, 5, Duration::from_secs(10)).await;
    println!("peer-to-peer: crash reported by all 7 after {times:?}");
    let slowest = *times.last().unwrap();
    assert!(
        slowest < Duration::from_secs(3),
        "reported after {slowest:?}, the member timeout is 5 s"
    );
    // The others stay members of one another: nobody else was declared down meanwhile.
    let mut counts: HashMap<usize, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate().filter(|(i, _)| *i != 5) {
        counts.insert(i, n.members().len());
    }
    assert!(counts.values().all(|&c| c == 7), "{counts:?}");
    for (i, n) in nodes.iter().enumerate() {
        if i != 5 {
            n.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_server_reports_a_crashed_client_at_once() {
    let opts = |role| ClientServerOptions {
        role,
        servers_per_client: 1,
        sync_interval_ms: 50,
        gossip_interval_ms: 250,
    };
    let mut configs = vec![
        config("cfs0").overlay(opts(Role::Server)),
        config("cfs1").overlay(opts(Role::Server)),
    ];
    for i in 0..4 {
        configs.push(config(&format!("cfc{i}")).overlay(opts(Role::Client)));
    }
    let nodes = build(configs).await;
    let times = crash_and_time(&nodes, 3, Duration::from_secs(10)).await;
    println!("client-server: crashed client reported by all 5 after {times:?}");
    assert!(*times.last().unwrap() < Duration::from_secs(3), "{times:?}");
    for (i, n) in nodes.iter().enumerate() {
        if i != 3 {
            n.shutdown().await;
        }
    }
}
