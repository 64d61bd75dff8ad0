//! Multi-node behaviour of the ring: convergence, preference lists, quorums with a node down,
//! handoff on join and on leave.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use maquis_ring::{vnode_name, vnode_opts, Object, RingConfig, RingNode, Version, VnodeMsg};

fn key(i: usize) -> String {
    format!("key:{i}")
}

fn value(i: usize, round: usize) -> Bytes {
    Bytes::from(format!("value-{i}-{round}"))
}

async fn write_keys(node: &RingNode, range: std::ops::Range<usize>, round: usize) {
    for i in range {
        node.put(key(i), value(i, round))
            .await
            .unwrap_or_else(|e| panic!("put {}: {e}", key(i)));
    }
}

async fn check_keys(node: &RingNode, range: std::ops::Range<usize>, round: usize) {
    for i in range {
        let got = node
            .get(key(i))
            .await
            .unwrap_or_else(|e| panic!("get {} on {}: {e}", key(i), node.name()));
        if got != Some(value(i, round)) {
            let k = key(i);
            let mut replicas = Vec::new();
            for (p, owner) in node.preflist(k.as_bytes()) {
                let vnode: Option<maquis::ActorRef<VnodeMsg>> =
                    node.node().remote(&owner, &vnode_name(p));
                let r = match vnode {
                    Some(v) => format!(
                        "{:?}",
                        v.call_with(
                            |reply| VnodeMsg::Get {
                                key: Bytes::from(k.clone()),
                                hops: 0,
                                reply
                            },
                            Duration::from_secs(1),
                            &vnode_opts(p)
                        )
                        .await
                    ),
                    None => "not a member".into(),
                };
                replicas.push(format!("{owner}/{p}: {r}"));
            }
            panic!(
                "{k} on {}: got {got:?}; targets {:?}; replicas {replicas:#?}",
                node.name(),
                node.targets(k.as_bytes())
            );
        }
    }
}

fn assert_same_preflists(nodes: &[RingNode], keys: usize) {
    for i in 0..keys {
        let k = key(i);
        let first = nodes[0].preflist(k.as_bytes());
        assert_eq!(first.len(), 3);
        let owners: BTreeSet<_> = first.iter().map(|(_, o)| o.clone()).collect();
        assert_eq!(owners.len(), 3.min(nodes.len()), "{k}: {first:?}");
        for n in &nodes[1..] {
            assert_eq!(n.preflist(k.as_bytes()), first, "{k} on {}", n.name());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_and_five_nodes_converge_with_identical_preflists() {
    let nodes = cluster("conv", 3, ring_config()).await;
    let ring = nodes[0].ring();
    for n in &nodes {
        assert_eq!(*n.ring(), *ring);
        let owned = ring.owned_by(n.name()).len();
        assert!((21..=22).contains(&owned), "{} owns {owned}", n.name());
    }
    assert_same_preflists(&nodes, 1000);
    stop(&nodes).await;

    let nodes = cluster("five", 5, ring_config().partitions(128)).await;
    let ring = nodes[0].ring();
    for n in &nodes {
        assert_eq!(*n.ring(), *ring);
        let owned = ring.owned_by(n.name()).len();
        assert!((25..=26).contains(&owned), "{} owns {owned}", n.name());
    }
    // Vnodes that handed their partition off forward for a grace period, then stop: in the
    // end each node runs one vnode per partition it owns.
    for n in &nodes {
        let owned = ring.owned_by(n.name()).len();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let st = n.status().await.unwrap();
            if st.vnodes == owned {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{}: {st:?}", n.name());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_same_preflists(&nodes, 1000);
    stop(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_and_kv_from_every_node() {
    let nodes = cluster("kv", 3, ring_config()).await;
    for n in &nodes {
        let payload = Bytes::from(format!("hello from {}", n.name()));
        assert_eq!(n.echo(payload.clone()).await.unwrap(), payload);
    }
    write_keys(&nodes[0], 0..50, 0).await;
    for n in &nodes {
        check_keys(n, 0..50, 0).await;
    }
    nodes[1].put("k", Bytes::from("v1")).await.unwrap();
    nodes[2].put("k", Bytes::from("v2")).await.unwrap();
    assert_eq!(nodes[0].get("k").await.unwrap(), Some(Bytes::from("v2")));
    assert!(nodes[0].delete("k").await.unwrap());
    assert_eq!(nodes[1].get("k").await.unwrap(), None);
    assert!(!nodes[2].delete("k").await.unwrap());
    assert_eq!(nodes[2].get("never-written").await.unwrap(), None);

    // A client node follows the ring and coordinates requests, but owns nothing.
    let client = start("kv0-client", ring_config().claim(false)).await;
    client
        .join(nodes[0].node().addr(), Duration::from_secs(5))
        .await
        .unwrap();
    client
        .wait_converged(Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(client.ring().nodes, vec!["kv1", "kv2", "kv3"]);
    assert_eq!(*client.ring(), *nodes[0].ring());
    check_keys(&client, 0..50, 0).await;
    client.put("from-client", Bytes::from("c")).await.unwrap();
    assert_eq!(
        nodes[2].get("from-client").await.unwrap(),
        Some(Bytes::from("c"))
    );
    assert_eq!(
        client.echo(Bytes::from("e")).await.unwrap(),
        Bytes::from("e")
    );
    assert_eq!(client.status().await.unwrap().keys, 0);
    client.shutdown().await;
    stop(&nodes).await;
}

/// A write wins over the value it overwrites even when that value was stamped by a node whose
/// clock runs ahead, as long as the writer's clock has not seen it: the replicas that keep the
/// newer version say so, and the write goes again with a later stamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_wins_over_a_value_stamped_by_a_clock_running_ahead() {
    let nodes = cluster("lw", 3, ring_config()).await;
    // "first", stamped 10 s ahead (by a node whose clock runs ahead), is on the replicas of
    // nodes 0 and 1; node 2 has not seen it.
    let ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 10_000;
    let first = Object {
        value: Some(Bytes::from_static(b"first")),
        version: Version {
            ts: ahead << 16,
            origin: 0,
        },
    };
    for n in &nodes[..2] {
        let (p, owner) = n
            .preflist(b"k")
            .into_iter()
            .find(|(_, owner)| owner == n.name())
            .expect("every node holds a replica (3 nodes, 3 replicas)");
        let vnode: maquis::ActorRef<VnodeMsg> =
            n.node().remote(&owner, &vnode_name(p)).expect("the vnode");
        let repair = VnodeMsg::Repair {
            key: Bytes::from_static(b"k"),
            object: first.clone(),
            hops: 0,
        };
        vnode.send_with(repair, &vnode_opts(p)).await.unwrap();
        // The vnode has merged it once it answers a read.
        let get = |reply| VnodeMsg::Get {
            key: Bytes::from_static(b"k"),
            hops: 0,
            reply,
        };
        vnode
            .call_with(get, Duration::from_secs(5), &vnode_opts(p))
            .await
            .unwrap();
    }
    // (No read before the write: its read repair would show node 2 the stamp.)
    nodes[2].put("k", Bytes::from("second")).await.unwrap();
    assert_eq!(
        nodes[0].get("k").await.unwrap(),
        Some(Bytes::from("second"))
    );
    assert!(nodes[2].stats().write_retries.get() >= 1);
    stop(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_reads_and_writes_with_one_node_killed() {
    let nodes = cluster("q", 3, ring_config()).await;
    write_keys(&nodes[0], 0..100, 0).await;
    let dead = nodes[2].clone();
    dead.shutdown().await;
    // Before the failure is detected: the dead replica never answers, the two others do.
    check_keys(&nodes[0], 0..100, 0).await;
    write_keys(&nodes[1], 0..30, 1).await;
    check_keys(&nodes[0], 0..30, 1).await;
    // After it is detected: requests go to the live primaries (and fallbacks if any).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while nodes[0].node().member(dead.name()).is_some() {
        assert!(std::time::Instant::now() < deadline, "failure not detected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check_keys(&nodes[1], 0..30, 1).await;
    check_keys(&nodes[1], 30..100, 0).await;
    write_keys(&nodes[0], 100..150, 0).await;
    check_keys(&nodes[1], 100..150, 0).await;
    assert!(nodes[0].delete(key(5)).await.unwrap());
    assert_eq!(nodes[1].get(key(5)).await.unwrap(), None);
    // A down node keeps its partitions (no data moves to nodes that never had it).
    assert!(nodes[0].ring().has_node(dead.name()));
    stop(&nodes[..2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_a_join_and_a_leave_while_serving() {
    // Small chunks: every partition moves in several chunks.
    let cfg = ring_config().handoff_chunk(4, 64 * 1024);
    let mut nodes = cluster("ho", 3, cfg.clone()).await;
    write_keys(&nodes[0], 0..300, 0).await;

    // Traffic during the changes: writes and reads of keys 300.., checked as they go.
    let stop_flag = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let traffic = {
        let n = nodes[1].clone();
        let (stop_flag, errors, done) = (stop_flag.clone(), errors.clone(), done.clone());
        tokio::spawn(async move {
            let mut i = 300;
            while stop_flag.load(Ordering::Relaxed) == 0 {
                let k = key(i);
                match n.put(&k, value(i, 0)).await {
                    Ok(()) => match n.get(&k).await {
                        Ok(Some(v)) if v == value(i, 0) => {}
                        other => {
                            eprintln!("read-your-write failed for {k}: {other:?}");
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                    Err(e) => {
                        eprintln!("put {k} failed: {e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let old = i % 300;
                match n.get(key(old)).await {
                    Ok(Some(v)) if v == value(old, 0) => {}
                    other => {
                        eprintln!("read of {} failed: {other:?}", key(old));
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
                done.store(i, Ordering::Relaxed);
            }
        })
    };

    // A fourth node joins: about a quarter of the partitions move to it by handoff.
    let newcomer = start("ho4", cfg.clone()).await;
    newcomer
        .join(nodes[0].node().addr(), Duration::from_secs(5))
        .await
        .unwrap();
    nodes.push(newcomer.clone());
    converge(&nodes).await;
    let owned = nodes[0].ring().owned_by("ho4").len();
    assert_eq!(owned, 16, "the newcomer owns a quarter of the ring");
    let st = newcomer.status().await.unwrap();
    assert!(
        st.keys > 100,
        "handoff brought data to the newcomer: {st:?}"
    );
    for n in &nodes {
        check_keys(n, 0..300, 0).await;
    }

    // Node 1 (the claimant) leaves: its partitions are handed off before it goes, and the
    // next lowest-named node takes over as claimant.
    let leaver = nodes.remove(0);
    // Keep the traffic on a node that stays.
    stop_flag.store(1, Ordering::Relaxed);
    traffic.await.unwrap();
    let written = done.load(Ordering::Relaxed);
    let traffic = {
        let n = nodes[0].clone();
        let (errors, done) = (errors.clone(), done.clone());
        let stop_flag = Arc::new(AtomicUsize::new(0));
        let s2 = stop_flag.clone();
        (
            tokio::spawn(async move {
                let mut i = written;
                while s2.load(Ordering::Relaxed) == 0 {
                    let k = key(i);
                    match n.put(&k, value(i, 0)).await {
                        Ok(()) => {}
                        Err(e) => {
                            eprintln!("put {k} failed: {e}");
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    match n.get(&k).await {
                        Ok(Some(v)) if v == value(i, 0) => {}
                        other => {
                            eprintln!("read-your-write failed for {k}: {other:?}");
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    i += 1;
                    done.store(i, Ordering::Relaxed);
                }
            }),
            stop_flag,
        )
    };
    leaver.leave(Duration::from_secs(20)).await.unwrap();
    converge(&nodes).await;
    traffic.1.store(1, Ordering::Relaxed);
    traffic.0.await.unwrap();
    let total = done.load(Ordering::Relaxed);
    assert!(total > 300, "traffic ran during the changes");
    assert_eq!(
        errors.load(Ordering::Relaxed),
        0,
        "requests failed during handoff"
    );
    assert!(!nodes[0].ring().has_node("ho1"));
    // The next lowest-named node is the claimant now (it publishes the ring that forgets ho1).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while nodes[0].ring().claimant != "ho2" {
        assert!(
            std::time::Instant::now() < deadline,
            "ho2 did not take over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in &nodes {
        check_keys(n, 0..total, 0).await;
    }
    stop(&nodes).await;
}

async fn wait_gone(observer: &RingNode, name: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while observer.node().member(name).is_some() {
        assert!(std::time::Instant::now() < deadline, "{name} not seen down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_data_is_handed_back_to_a_restarted_primary() {
    let cfg = ring_config();
    let mut nodes = cluster("hh", 4, cfg.clone()).await;
    let down = nodes.pop().unwrap();
    down.shutdown().await;
    wait_gone(&nodes[0], "hh4").await;
    // Writes whose preference list holds hh4 go to a fallback (sloppy quorum).
    write_keys(&nodes[0], 0..200, 0).await;
    let fallback_keys: usize = {
        let mut n = 0;
        for node in &nodes {
            n += node.status().await.unwrap().stray_keys;
        }
        n
    };
    assert!(fallback_keys > 0, "fallbacks hold hh4's replicas");
    let expected = (0..200)
        .filter(|i| {
            nodes[0]
                .preflist(key(*i).as_bytes())
                .iter()
                .any(|(_, o)| o == "hh4")
        })
        .count();
    // hh4 comes back (a new incarnation, empty): the fallbacks hand its replicas back.
    let back = start("hh4", cfg).await;
    back.join(nodes[0].node().addr(), Duration::from_secs(5))
        .await
        .unwrap();
    nodes.push(back.clone());
    converge(&nodes).await;
    let st = back.status().await.unwrap();
    assert_eq!(
        st.keys, expected,
        "every fallback replica came back: {st:?}"
    );
    // Now lose another node: hh4's replicas are needed for the quorums.
    let gone = nodes.remove(0);
    gone.shutdown().await;
    check_keys(&nodes[0], 0..200, 0).await;
    stop(&nodes).await;
}

/// Three nodes `{prefix}1..3` with keys 0..100 written, the third then restarted empty (same
/// name, new incarnation: it keeps its partitions, without data) and converged again; returns
/// all three and the restarted one.
async fn with_last_restarted_empty(prefix: &str, cfg: RingConfig) -> (Vec<RingNode>, RingNode) {
    let mut nodes = cluster(prefix, 3, cfg.clone()).await;
    write_keys(&nodes[0], 0..100, 0).await;
    let old = nodes.pop().unwrap();
    old.shutdown().await;
    let name = format!("{prefix}3");
    wait_gone(&nodes[0], &name).await;
    let fresh = start(&name, cfg).await;
    fresh
        .join(nodes[0].node().addr(), Duration::from_secs(5))
        .await
        .unwrap();
    nodes.push(fresh.clone());
    converge(&nodes).await;
    (nodes, fresh)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anti_entropy_refills_a_restarted_replica_without_reads() {
    let (mut nodes, fresh) = with_last_restarted_empty("ae", ring_config()).await;
    // No read: anti-entropy refills it, and then trusts its vnodes again.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let st = fresh.status().await.unwrap();
        if st.keys >= 100 && st.recovering == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "anti-entropy did not refill ae3: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let copied: u64 = nodes.iter().map(|n| n.stats().aae_objects.get()).sum();
    assert!(copied >= 100, "anti-entropy copied {copied} objects");
    // The progress is in the node's /metrics too.
    let metrics = maquis::admin::render_metrics(&fresh.node().status());
    assert!(
        metrics.contains("maquis_ring_aae_exchanges_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("maquis_ring_recovering_vnodes 0"),
        "{metrics}"
    );
    assert!(nodes.iter().all(|n| n.stats().read_repairs.get() == 0));
    // With ae1 gone, the refilled replicas make the quorums.
    let gone = nodes.remove(0);
    gone.shutdown().await;
    check_keys(&nodes[0], 0..100, 0).await;
    stop(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_repair_refills_an_emptied_replica() {
    // Without anti-entropy, only reads repair.
    let mut cfg = ring_config();
    cfg.aae_interval = None;
    let (mut nodes, fresh) = with_last_restarted_empty("rr", cfg).await;
    assert_eq!(fresh.status().await.unwrap().keys, 0);
    // Reads still see every value (two replicas have it) and repair the third.
    check_keys(&nodes[0], 0..100, 0).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fresh.status().await.unwrap().keys < 100 {
        assert!(
            std::time::Instant::now() < deadline,
            "read repair did not refill rr3"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(nodes[0].stats().read_repairs.get() >= 100);
    // With rr1 gone, the repaired replicas make the quorums.
    let gone = nodes.remove(0);
    gone.shutdown().await;
    check_keys(&nodes[0], 0..100, 0).await;
    stop(&nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_answers_nothing_until_it_knows_the_ring() {
    // Its configured peer does not answer: it cannot know the cluster's ring.
    let cfg = node_config("nr1").peer("127.0.0.1:9".parse().unwrap());
    let lone = maquis_ring::Ring::start(cfg, ring_config()).await.unwrap();
    assert!(matches!(
        lone.put("k", bytes::Bytes::from("v")).await,
        Err(maquis_ring::RingError::NotReady)
    ));
    assert!(matches!(
        lone.get("k").await,
        Err(maquis_ring::RingError::NotReady)
    ));
    // Once it is in a cluster and has the ring, it serves.
    let other = start("nr2", ring_config()).await;
    lone.join(other.node().addr(), Duration::from_secs(5))
        .await
        .unwrap();
    let nodes = vec![lone, other];
    converge(&nodes).await;
    nodes[0].put("k", bytes::Bytes::from("v")).await.unwrap();
    assert_eq!(
        nodes[1].get("k").await.unwrap(),
        Some(bytes::Bytes::from("v"))
    );
    stop(&nodes).await;
}
