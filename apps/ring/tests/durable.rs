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
