//! The durable backend in one process: every write is acknowledged, whatever arrives while
//! a batch is being committed.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::future::join_all;
use maquis_ring::StorageConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_are_all_acknowledged_and_stored() {
    let dirs = tempfile::tempdir().unwrap();
    let mut nodes = Vec::new();
    for i in 1..=3 {
        let cfg = ring_config().storage(StorageConfig::Durable(dirs.path().join(format!("d{i}"))));
        nodes.push(start(&format!("d{i}"), cfg).await);
    }
    let contact = nodes[0].node().addr();
    for n in &nodes[1..] {
        n.join(contact, Duration::from_secs(5)).await.unwrap();
    }
    converge(&nodes).await;
    // Many writes at once: each vnode gets writes while its previous batch is committing,
    // and after the last one nothing else arrives to wake it.
    for round in 0..5 {
        let puts = (0..200).map(|i| {
            let n = &nodes[i % 3];
            async move {
                let key = format!("k{round}-{i}");
                tokio::time::timeout(Duration::from_secs(10), n.put(key, Bytes::from("v"))).await
            }
        });
        for (i, r) in join_all(puts).await.into_iter().enumerate() {
            let r = r.unwrap_or_else(|_| panic!("put {round}-{i} never acknowledged"));
            r.unwrap_or_else(|e| panic!("put {round}-{i}: {e}"));
        }
    }
    // With three nodes every node holds every key; the replicas beyond W = 2 are written in
    // the background.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let st = loop {
        let (backend, st) = nodes[0].storage_stats();
        assert_eq!(backend, "redb");
        if st.objects >= 1000 {
            break st;
        }
        assert!(std::time::Instant::now() < deadline, "{st:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(st.commits < st.objects, "group commit: {st:?}");
    for i in (0..200).step_by(17) {
        let got = nodes[1].get(format!("k4-{i}")).await.unwrap();
        assert_eq!(got, Some(Bytes::from("v")));
    }
    stop(&nodes).await;
}

/// A durable node restarted to join its cluster (`peers` configured) holds its partitions'
/// data before it knows the cluster's ring: it must neither hand that data off nor run
/// anti-entropy by the one-node ring it starts with (that spread stray copies to the others).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_to_join_moves_nothing_before_it_knows_the_ring() {
    let dirs = tempfile::tempdir().unwrap();
    let cfg =
        |i: usize| ring_config().storage(StorageConfig::Durable(dirs.path().join(format!("j{i}"))));
    let mut nodes = Vec::new();
    for i in 1..=3 {
        nodes.push(start(&format!("j{i}"), cfg(i)).await);
    }
    let contact = nodes[0].node().addr();
    for n in &nodes[1..] {
        n.join(contact, Duration::from_secs(5)).await.unwrap();
    }
    converge(&nodes).await;
    for i in 0..300 {
        nodes[i % 3]
            .put(format!("k{i}"), Bytes::from("v"))
            .await
            .unwrap();
    }
    // Every node holds every key (N = 3 on three nodes) once the background replicas landed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while join_all(nodes.iter().map(|n| n.status()))
        .await
        .iter()
        .any(|s| s.as_ref().map_or(true, |s| s.keys != 300))
    {
        assert!(std::time::Instant::now() < deadline, "replicas not written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = nodes.pop().unwrap();
    old.shutdown().await;
    drop(old);
    // The stopped node's vnodes let go of its database as their tasks end.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let restarted = loop {
        match maquis_ring::Ring::start(node_config("j3").peer(contact), cfg(3)).await {
            Ok(n) => break n,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("restart: {e}"),
        }
    };
    nodes.push(restarted);
    converge(&nodes).await;
    // The restarted node's vnodes load their stored objects as they start.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while nodes[2].status().await.unwrap().loading > 0 {
        assert!(std::time::Instant::now() < deadline, "j3 still loading");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for n in &nodes {
        let st = n.status().await.unwrap();
        assert_eq!(st.keys, 300, "{}: stray or missing copies", st.name);
    }
    // The others' exchanges with j3 while it was down may have failed; its own may not.
    assert_eq!(nodes[2].stats().aae_errors.get(), 0, "j3");
    for i in (0..300).step_by(7) {
        assert_eq!(
            nodes[2].get(format!("k{i}")).await.unwrap(),
            Some(Bytes::from("v"))
        );
    }
    stop(&nodes).await;
}
