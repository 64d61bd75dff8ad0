//! Remote spawn and RPC in running nodes: success, unknown kinds and functions, other types,
//! a node that is killed, timeouts, linked and monitored children, calls that do not wait for
//! each other, the bound on running calls.

mod common;

use std::time::{Duration, Instant};

use common::*;
use maquis::remote::{RpcError, SpawnError};
use maquis::{ActorRef, DownReason, Node, ReplyTo};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize)]
enum Counter {
    Add(u64),
    Get(ReplyTo<u64>),
    Crash,
}

/// Offers the `counter` kind (starting at its argument) and a few functions.
fn offer(node: &Node) {
    node.register_kind("counter", |node: &Node, start: u64| {
        node.spawn_fn(move |mut inbox| async move {
            let mut total = start;
            while let Some(msg) = inbox.recv().await {
                match msg {
                    Counter::Add(n) => total += n,
                    Counter::Get(reply) => {
                        let _ = reply.send(total).await;
                    }
                    Counter::Crash => panic!("asked to crash"),
                }
            }
        })
    });
    node.register_fn("add", |(x, y): (u64, u64)| async move { x + y });
    node.register_fn("echo", |data: Vec<u8>| async move { data });
    node.register_fn("sleep_ms", |ms: u64| async move {
        tokio::time::sleep(Duration::from_millis(ms)).await;
        ms
    });
    node.register_fn("panics", |_: ()| async move {
        if true {
            panic!("on purpose");
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spawn_and_rpc_succeed_or_fail_clearly() {
    let nodes = cluster("s", 3, |c| c).await;
    for n in &nodes {
        offer(n);
    }
    // Spawn on another node, use the child.
    let c: ActorRef<Counter> = nodes[0]
        .spawn_remote("s2", "counter", &40u64, T)
        .await
        .expect("spawned");
    assert_eq!(&*c.node().name, "s2");
    c.send(Counter::Add(2)).await.unwrap();
    assert_eq!(c.call(Counter::Get, T).await.unwrap(), 42);
    // On this node too.
    let local: ActorRef<Counter> = nodes[0]
        .spawn_remote("s1", "counter", &1u64, T)
        .await
        .unwrap();
    assert_eq!(local.call(Counter::Get, T).await.unwrap(), 1);

    let sum: u64 = nodes[0].rpc("s3", "add", &(2u64, 3u64), T).await.unwrap();
    assert_eq!(sum, 5);
    let big = vec![7u8; 10_000];
    let back: Vec<u8> = nodes[2].rpc("s1", "echo", &big, T).await.unwrap();
    assert_eq!(back, big);

    // Unknown names.
    let r: Result<ActorRef<Counter>, _> = nodes[0].spawn_remote("s2", "nope", &1u64, T).await;
    assert_eq!(r.unwrap_err(), SpawnError::UnknownKind("nope".into()));
    let r: Result<u64, _> = nodes[0].rpc("s2", "nope", &1u64, T).await;
    assert_eq!(r.unwrap_err(), RpcError::UnknownFunction("nope".into()));
    // Other types: refused before anything runs, naming what the node has.
    let r: Result<ActorRef<Counter>, _> = nodes[0]
        .spawn_remote("s2", "counter", &"x".to_string(), T)
        .await;
    match r.unwrap_err() {
        SpawnError::TypeMismatch { registered, .. } => assert!(registered.contains("u64")),
        e => panic!("{e:?}"),
    }
    let r: Result<String, _> = nodes[0].rpc("s2", "add", &(2u64, 3u64), T).await;
    assert!(matches!(r, Err(RpcError::TypeMismatch { .. })), "{r:?}");
    // Nodes that are not members.
    let r: Result<u64, _> = nodes[0].rpc("nobody", "add", &(1u64, 1u64), T).await;
    assert_eq!(r.unwrap_err(), RpcError::NodeDown("nobody".into()));
    let r: Result<ActorRef<Counter>, _> =
        nodes[0].spawn_remote("nobody", "counter", &1u64, T).await;
    assert_eq!(r.unwrap_err(), SpawnError::NodeDown("nobody".into()));
    // A function that panics fails its call; the service goes on.
    let r: Result<(), _> = nodes[0].rpc("s2", "panics", &(), T).await;
    assert!(
        matches!(&r, Err(RpcError::Failed(m)) if m.contains("on purpose")),
        "{r:?}"
    );
    let sum: u64 = nodes[0].rpc("s2", "add", &(1u64, 1u64), T).await.unwrap();
    assert_eq!(sum, 2);
    // Timeout.
    let r: Result<u64, _> = nodes[0]
        .rpc("s2", "sleep_ms", &2_000u64, Duration::from_millis(200))
        .await;
    assert_eq!(r.unwrap_err(), RpcError::Timeout);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_run_side_by_side_and_their_number_is_bounded() {
    let nodes = cluster("p", 2, |mut c| {
        c.services.max_rpc_tasks = 4;
        c
    })
    .await;
    offer(&nodes[1]);
    // A slow call does not hold up a fast one (no single server runs them in turn).
    let slow = {
        let n = nodes[0].clone();
        tokio::spawn(async move { n.rpc::<u64, u64>("p2", "sleep_ms", &1_500, T).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let sum: u64 = nodes[0].rpc("p2", "add", &(1u64, 2u64), T).await.unwrap();
    assert_eq!(sum, 3);
    assert!(
        start.elapsed() < Duration::from_millis(1_000),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(slow.await.unwrap().unwrap(), 1_500);
    // At most four at once: of eight slow calls, four are refused at once.
    let calls = (0..8).map(|_| nodes[0].rpc::<u64, u64>("p2", "sleep_ms", &500, T));
    let results = futures::future::join_all(calls).await;
    let busy = results
        .iter()
        .filter(|r| **r == Err(RpcError::Busy))
        .count();
    let done = results.iter().filter(|r| **r == Ok(500)).count();
    assert_eq!((done, busy), (4, 4), "{results:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_spawner_learns_of_its_childs_death() {
    let nodes = cluster("l", 2, |c| c).await;
    offer(&nodes[1]);
    // Monitored: the monitor resolves with the reason.
    let (child, monitor) = nodes[0]
        .spawn_remote_monitor::<u64, Counter>("l2", "counter", &0, T)
        .await
        .unwrap();
    child.send(Counter::Crash).await.unwrap();
    let reason = tokio::time::timeout(T, monitor)
        .await
        .expect("told in time");
    assert!(
        matches!(reason, DownReason::Panicked(ref m) if m.contains("asked to crash")),
        "{reason:?}"
    );

    // Linked: the child's crash stops the parent.
    let parent = nodes[0].spawn_fn(|mut inbox: maquis::Inbox<()>| async move {
        while inbox.recv().await.is_some() {}
    });
    let parent_down = nodes[0].monitor(&parent);
    let child: ActorRef<Counter> = nodes[0]
        .spawn_remote_link(&parent, "l2", "counter", &0u64, T)
        .await
        .unwrap();
    child.send(Counter::Crash).await.unwrap();
    let reason = tokio::time::timeout(T, parent_down)
        .await
        .expect("parent stopped");
    assert!(matches!(reason, DownReason::Linked(_)), "{reason:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_target_node_fails_waiting_calls_as_node_down() {
    let nodes = cluster("d", 3, |c| c).await;
    offer(&nodes[2]);
    let waiting = {
        let n = nodes[0].clone();
        tokio::spawn(async move {
            n.rpc::<u64, u64>("d3", "sleep_ms", &10_000, Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    nodes[2].shutdown().await;
    let r = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("fails before its timeout")
        .unwrap();
    assert_eq!(r, Err(RpcError::NodeDown("d3".into())));
    until("d3 gone", Duration::from_secs(10), || async {
        nodes[0].member("d3").is_none()
    })
    .await;
    let r: Result<ActorRef<Counter>, _> = nodes[0].spawn_remote("d3", "counter", &1u64, T).await;
    assert_eq!(r.unwrap_err(), SpawnError::NodeDown("d3".into()));
}
