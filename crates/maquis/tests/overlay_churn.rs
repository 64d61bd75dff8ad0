//! Calls between the nodes of a peer-to-peer overlay that keeps reshaping itself: connections
//! open and close all the time (shuffles every 100 ms), and no call is lost. A binary of its own,
//! so that its load does not share the cores with the other overlay tests.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::probe::{spawn_probe, Probe};
use common::*;
use maquis::{ActorRef, Node};

/// Calls between every pair of nodes while the overlay keeps reshaping itself (shuffles every
/// 100 ms open and close connections, views change): none is lost or fails. Frames queued for
/// a connection that closes go another way, and a forward that meets a route being rebuilt
/// waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_survive_the_overlay_reshaping() {
    let mut nodes = Vec::new();
    for i in 0..8 {
        let mut c = p2p(&format!("sh{i}"));
        if let maquis::config::OverlayConfig::PeerToPeer(o) = &mut c.overlay {
            o.shuffle_period_ms = 100;
        }
        nodes.push(start_with(c).await);
    }
    for n in &nodes[1..] {
        n.join_wait(nodes[0].addr(), Duration::from_secs(5))
            .await
            .unwrap();
    }
    let all: BTreeSet<String> = nodes.iter().map(|n| n.id().name.to_string()).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    all_members(&refs, &all, "8 members", Duration::from_secs(20)).await;
    for n in &nodes {
        spawn_probe(n);
    }
    let encoded: Vec<Vec<u8>> = nodes
        .iter()
        .map(|n| maquis::encode(&n.whereis::<Probe>("probe").unwrap()).unwrap())
        .collect();
    let until = Instant::now() + Duration::from_secs(3);
    let mut callers = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for k in 0..4 {
            let n = n.clone();
            let targets: Vec<ActorRef<Probe>> = encoded
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, e)| n.decode(e).unwrap())
                .collect();
            callers.push(tokio::spawn(async move {
                let (mut ok, mut failed) = (0u32, Vec::new());
                let mut t = k;
                while Instant::now() < until {
                    t = (t + 1) % targets.len();
                    let from = n.id().name.to_string();
                    let r = targets[t]
                        .call(|reply| Probe::Ping { from, reply }, Duration::from_secs(10))
                        .await;
                    match r {
                        Ok(_) => ok += 1,
                        Err(e) => failed.push(format!(
                            "{} -> {}: {e:?}",
                            n.id().name,
                            targets[t].node().name
                        )),
                    }
                }
                (ok, failed)
            }));
        }
    }
    let (mut ok, mut failed) = (0, Vec::new());
    for c in callers {
        let (o, f) = c.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    let mut sum = std::collections::BTreeMap::new();
    for n in &nodes {
        for (k, v) in n.counters().snapshot() {
            *sum.entry(k).or_insert(0u64) += v;
        }
    }
    sum.retain(|_, v| *v > 0);
    eprintln!("counters: {sum:?}");
    let resent: u64 = nodes.iter().map(|n| n.counters().unsent_resent.get()).sum();
    let connections: usize = nodes.iter().map(|n| n.status().peers.len()).sum();
    if !failed.is_empty() {
        // Where frames wait: lanes with bytes queued, by node and peer.
        for n in &nodes {
            for p in n.status().peers {
                for l in p
                    .lanes
                    .iter()
                    .filter(|l| l.queued_bytes > 0 || l.dropped > 0)
                {
                    eprintln!(
                        "{} -> {} (up {}): lane {}/{} connected {} queued {} dropped {}",
                        n.id().name,
                        p.name,
                        p.up,
                        l.channel,
                        l.index,
                        l.connected,
                        l.queued_bytes,
                        l.dropped
                    );
                }
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} calls failed: {:?}",
        failed.len(),
        ok as usize + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 100, "only {ok} calls in 3 s");
    eprintln!("{ok} calls, {resent} unwritten frames sent again, {connections} peers at the end");
    for n in nodes {
        n.shutdown().await;
    }
}
