//! Refs to local actors that carry their actor's mailbox (from `spawn`, `myself`, `whereis`):
//! a stopped actor is still `NoProc` (waiting or not, acknowledged or not), another type still `TypeMismatch`; and local calls whose
//! reply handle leaves the node, or is dropped, still end as a call must.

mod common;

use std::time::Duration;

use common::*;
use maquis::{ActorRef, CallError, Node, ReplyTo, SendError, SendOpts};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize)]
enum Life {
    Ping,
    Stop,
}

fn mortal(node: &Node) -> ActorRef<Life> {
    node.spawn_fn(|mut inbox| async move {
        while let Some(m) = inbox.recv().await {
            if let Life::Stop = m {
                break;
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_actor_is_no_proc_through_every_kind_of_local_ref() {
    let node = &start_with(config("lrstop1")).await;
    let spawned = mortal(node);
    node.register("mortal", &spawned).unwrap();
    let found: ActorRef<Life> = node.whereis("mortal").unwrap();
    let decoded: ActorRef<Life> = node.decode(&maquis::encode(&spawned).unwrap()).unwrap();
    for r in [&spawned, &found, &decoded] {
        r.send(Life::Ping).await.unwrap();
        r.try_send(Life::Ping).unwrap();
    }
    let down = node.monitor(&spawned);
    spawned.send(Life::Stop).await.unwrap();
    tokio::time::timeout(LIMIT, down).await.unwrap();
    let acked = SendOpts::default().acked();
    for r in [&spawned, &found, &decoded] {
        assert_eq!(r.send(Life::Ping).await, Err(SendError::NoProc));
        assert_eq!(r.try_send(Life::Ping), Err(SendError::NoProc));
        // Acknowledged delivery to a local actor is a plain local send: the same answer.
        assert_eq!(
            r.send_with(Life::Ping, &acked).await,
            Err(SendError::NoProc)
        );
        assert_eq!(r.try_send_with(Life::Ping, &acked), Err(SendError::NoProc));
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_name_looked_up_with_another_type_is_a_type_mismatch() {
    let node = &start_with(config("lrtype1")).await;
    node.register("mortal", &mortal(node)).unwrap();
    let wrong: ActorRef<u64> = node.whereis("mortal").unwrap();
    assert_eq!(wrong.send(7).await, Err(SendError::TypeMismatch));
    node.shutdown().await;
}

/// A request whose reply handle is sent on to an actor elsewhere.
#[derive(Debug, Serialize, Deserialize)]
struct Ask(u64, ReplyTo<u64>);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_call_is_answered_from_another_node_its_request_was_sent_on_to() {
    let nodes = cluster("lrfwd", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    // On b: answers with twice the number; or, for 0, drops the handle unanswered.
    let doubler = b.spawn_fn(|mut inbox: maquis::Inbox<Ask>| async move {
        while let Some(Ask(x, reply)) = inbox.recv().await {
            if x > 0 {
                let _ = reply.send(2 * x).await;
            }
        }
    });
    b.register("doubler", &doubler).unwrap();
    let far: ActorRef<Ask> = a.remote("lrfwd2", "doubler").unwrap();
    // On a: passes every request on to b's doubler.
    let relay = a.spawn_fn(move |mut inbox: maquis::Inbox<Ask>| async move {
        while let Some(ask) = inbox.recv().await {
            let _ = far.send(ask).await;
        }
    });
    assert_eq!(relay.call(|r| Ask(21, r), LIMIT).await, Ok(42));
    // Dropped over there: the call fails at once, not at its timeout.
    let started = std::time::Instant::now();
    let dropped = relay.call(|r| Ask(0, r), Duration::from_secs(30)).await;
    assert!(matches!(dropped, Err(CallError::NoReply(_))), "{dropped:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_call_whose_handle_is_dropped_fails_at_once() {
    let node = &start_with(config("lrdrop1")).await;
    let silent = node.spawn_fn(|mut inbox: maquis::Inbox<Ask>| async move {
        while let Some(Ask(_, reply)) = inbox.recv().await {
            drop(reply);
        }
    });
    let started = std::time::Instant::now();
    let r = silent.call(|r| Ask(1, r), Duration::from_secs(30)).await;
    assert!(matches!(r, Err(CallError::NoReply(_))), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // And a late answer after a timeout is dropped without harm.
    let slow = node.spawn_fn(|mut inbox: maquis::Inbox<Ask>| async move {
        while let Some(Ask(x, reply)) = inbox.recv().await {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = reply.send(x).await;
        }
    });
    let r = slow.call(|r| Ask(1, r), Duration::from_millis(50)).await;
    assert_eq!(r, Err(CallError::Timeout));
    assert_eq!(slow.call(|r| Ask(2, r), LIMIT).await, Ok(2));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_loop_sees_the_end_of_its_inbox_when_the_node_shuts_down() {
    let node = start("inbox-end").await;
    let (ended_tx, ended) = tokio::sync::oneshot::channel();
    // A ref kept alive: the mailbox has a sender left, and still its loop ends.
    let kept = node.spawn_fn(|mut inbox: maquis::Inbox<Life>| async move {
        while inbox.recv().await.is_some() {}
        let _ = ended_tx.send(());
    });
    kept.send(Life::Ping).await.unwrap();
    node.shutdown().await;
    tokio::time::timeout(LIMIT, ended)
        .await
        .expect("the loop ran to its end")
        .expect("the actor's future finished rather than being dropped");
    drop(kept);
}
