//! Broadcast on the full mesh, and the bounded subscriptions.

mod common;

use std::time::Duration;

use common::*;
use maquis::{BroadcastError, Subscription};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broadcast_reaches_every_subscriber_on_the_full_mesh() {
    let nodes = cluster("bc", 4, |c| c).await;
    until(
        "everyone has three neighbours",
        Duration::from_secs(10),
        || {
            let ok = nodes.iter().all(|n| n.neighbors().len() == 3);
            async move { ok }
        },
    )
    .await;
    let mut subs: Vec<Subscription<(String, u32)>> =
        nodes.iter().map(|n| n.subscribe_topic("t")).collect();
    let mut other: Subscription<(String, u32)> = nodes[0].subscribe_topic("other");
    for n in &nodes {
        n.broadcast("t", &(n.id().name.to_string(), 7u32))
            .await
            .unwrap();
    }
    for s in &mut subs {
        let mut got = Vec::new();
        for _ in 0..nodes.len() {
            got.push(next(s).await.0);
        }
        got.sort();
        assert_eq!(got, vec!["bc1", "bc2", "bc3", "bc4"]);
    }
    assert!(other.try_recv().is_none(), "another topic gets nothing");
    assert!(matches!(
        nodes[0].broadcast("$maquis/left", &1u8).await,
        Err(BroadcastError::ReservedTopic(_))
    ));
    // A node that goes away leaves the others' neighbours; broadcast goes on without it.
    nodes[3].shutdown().await;
    until(
        "the dead node is no neighbour",
        Duration::from_secs(10),
        || {
            let ok = nodes[..3].iter().all(|n| n.neighbors().len() == 2);
            async move { ok }
        },
    )
    .await;
    nodes[1]
        .broadcast("t", &("again".to_string(), 8u32))
        .await
        .unwrap();
    for s in &mut subs[..3] {
        assert_eq!(next(s).await, ("again".to_string(), 8));
    }
    for n in &nodes[..3] {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_subscription_drops_the_oldest_and_counts() {
    let mut cfg = config("sub-a");
    cfg.broadcast.subscription_capacity = 2;
    let a = start_with(cfg).await;
    let mut slow: Subscription<u32> = a.subscribe_topic("n");
    let mut dropped = a.subscribe_topic::<u32>("n");
    for i in 0..5u32 {
        a.broadcast("n", &i).await.unwrap();
    }
    until("five deliveries", Duration::from_secs(5), || {
        let d = slow.dropped();
        async move { d == 3 }
    })
    .await;
    assert_eq!(slow.len(), 2);
    assert_eq!(next(&mut slow).await, 3, "the oldest went first");
    assert_eq!(next(&mut slow).await, 4);
    assert!(slow.try_recv().is_none());
    assert_eq!(
        a.counters().subscription_drops.get(),
        6,
        "both subscriptions"
    );
    let _ = dropped.try_recv();
    drop(dropped);
    a.broadcast("n", &9u32).await.unwrap();
    assert_eq!(next(&mut slow).await, 9);
    a.shutdown().await;
    assert_eq!(slow.recv().await, None, "ends when the node stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_refuses_broadcasts_of_another_type() {
    let nodes = cluster("bty", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    // Same shape on the wire as (String, u32), other names: postcard alone would decode it.
    #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Tagged {
        who: String,
        n: u32,
    }
    let mut pairs: Subscription<(String, u32)> = b.subscribe_topic("t");
    let mut tagged: Subscription<Tagged> = b.subscribe_topic("t");
    a.broadcast("t", &("a".to_string(), 1u32)).await.unwrap();
    a.broadcast(
        "t",
        &Tagged {
            who: "a".into(),
            n: 2,
        },
    )
    .await
    .unwrap();
    assert_eq!(next(&mut pairs).await, ("a".to_string(), 1));
    assert_eq!(
        next(&mut tagged).await,
        Tagged {
            who: "a".into(),
            n: 2
        }
    );
    // Each refused the other's message, before decoding it.
    assert!(pairs.try_recv().is_none());
    assert!(tagged.try_recv().is_none());
    assert_eq!(b.counters().type_mismatch.get(), 2);
    for n in &nodes {
        n.shutdown().await;
    }
}
