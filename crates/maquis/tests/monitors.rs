//! Monitors of local actors, remote actors and nodes; stale refs after a restart.

mod common;

use std::time::Duration;

use common::*;
use maquis::{ActorRef, DownReason, SendError};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum Life {
    Stop,
    Noop,
}

fn spawn_mortal(node: &maquis::Node) -> ActorRef<Life> {
    node.spawn_fn(|mut inbox| async move {
        while let Some(m) = inbox.recv().await {
            if let Life::Stop = m {
                break;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitors_fire_for_stop_noproc_and_node_down() {
    let nodes = cluster("mon", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let limit = Duration::from_secs(5);

    // Local actor stops.
    let local = spawn_mortal(a);
    let m = a.monitor(&local);
    local.send(Life::Stop).await.unwrap();
    assert_eq!(
        tokio::time::timeout(limit, m).await.unwrap(),
        DownReason::Stopped
    );

    // Remote actor stops.
    let remote = spawn_mortal(b);
    b.register("mortal", &remote).unwrap();
    let from_a: ActorRef<Life> = a.decode(&maquis::encode(&remote).unwrap()).unwrap();
    let m = a.monitor(&from_a);
    // The Monitor frame travels on the membership lane, the Stop on a data lane: make sure the
    // watch is in place before stopping.
    wait_watch(b).await;
    from_a.send(Life::Stop).await.unwrap();
    assert_eq!(
        tokio::time::timeout(limit, m).await.unwrap(),
        DownReason::Stopped
    );

    // Monitoring something that is gone resolves with NoProc.
    let m = a.monitor(&from_a);
    assert_eq!(
        tokio::time::timeout(limit, m).await.unwrap(),
        DownReason::NoProc
    );

    // The node goes down: monitors of its actors fire with NodeDown.
    let victim = spawn_mortal(b);
    let victim_from_a: ActorRef<Life> = a.decode(&maquis::encode(&victim).unwrap()).unwrap();
    let m = a.monitor(&victim_from_a);
    wait_watch(b).await;
    b.shutdown().await;
    assert_eq!(
        tokio::time::timeout(limit, m).await.unwrap(),
        DownReason::NodeDown
    );
    a.shutdown().await;
}

/// Waits until `node` holds a remote watcher (a monitor from another node reached it).
async fn wait_watch(node: &maquis::Node) {
    until("remote watch arrives", Duration::from_secs(5), || {
        let n = node
            .status()
            .gauges
            .get("remote_watchers")
            .copied()
            .unwrap_or(0);
        async move { n > 0 }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refs_to_a_restarted_node_fail_fast() {
    let a = start("inc1").await;
    let b = start("inc2").await;
    let b_addr = b.addr();
    a.join_wait(b_addr, Duration::from_secs(5)).await.unwrap();
    let old = spawn_mortal(&b);
    let old_from_a: ActorRef<Life> = a.decode(&maquis::encode(&old).unwrap()).unwrap();
    old_from_a.send(Life::Noop).await.unwrap();
    b.shutdown().await;
    let b2 = start_with(config("inc2").listen(b_addr)).await;
    b2.join_wait(a.addr(), Duration::from_secs(5))
        .await
        .unwrap();
    until("a sees the new incarnation", Duration::from_secs(5), || {
        let m = a.member("inc2");
        let want = b2.id().clone();
        async move { m == Some(want) }
    })
    .await;
    let err = old_from_a.send(Life::Noop).await.unwrap_err();
    assert!(matches!(err, SendError::StaleIncarnation { .. }), "{err:?}");
    a.shutdown().await;
    b2.shutdown().await;
}
