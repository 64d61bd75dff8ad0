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

#[derive(Debug, Serialize, Deserialize)]
enum Fragile {
    /// Panics while it holds the request's `ReplyTo`.
    Crash(maquis::ReplyTo<u32>),
    /// Lets the request go without answering.
    Ignore(maquis::ReplyTo<u32>),
    Ping(maquis::ReplyTo<u32>),
}

fn spawn_fragile(node: &maquis::Node) -> ActorRef<Fragile> {
    node.spawn_fn(|mut inbox| async move {
        while let Some(m) = inbox.recv().await {
            match m {
                Fragile::Crash(_reply) => panic!("boom: a bad request"),
                Fragile::Ignore(reply) => drop(reply),
                Fragile::Ping(reply) => {
                    let _ = reply.send(7).await;
                }
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_stops_the_actor_with_its_reason_and_fails_its_call_at_once() {
    let nodes = cluster("pan", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    // Generous: the point is that nothing waits for it.
    let long = Duration::from_secs(30);
    for (caller, host) in [(a, a), (a, b)] {
        let actor = spawn_fragile(host);
        host.register("fragile", &actor).unwrap();
        let target = caller
            .remote::<Fragile>(&host.id().name, "fragile")
            .unwrap();
        let watch = caller.monitor(&actor);
        // A request let go unanswered fails its call at once.
        let started = std::time::Instant::now();
        let err = target.call(Fragile::Ignore, long).await.unwrap_err();
        assert!(
            matches!(&err, maquis::CallError::NoReply(why) if why.contains("dropped")),
            "{err:?}"
        );
        assert_eq!(target.call(Fragile::Ping, long).await.unwrap(), 7);
        // A panic: the call fails at once, the monitor says why, the node lives on.
        let err = target.call(Fragile::Crash, long).await.unwrap_err();
        assert!(matches!(err, maquis::CallError::NoReply(_)), "{err:?}");
        assert!(
            started.elapsed() < long / 2,
            "no call waited for its timeout"
        );
        let reason = tokio::time::timeout(Duration::from_secs(5), watch)
            .await
            .expect("the monitor fires");
        assert_eq!(reason, DownReason::Panicked("boom: a bad request".into()));
        assert!(!host.is_stopped());
        host.unregister("fragile");
    }
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refs_are_keys() {
    let nodes = cluster("keys", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let x = spawn_mortal(a);
    let y = spawn_mortal(b);
    let x_again = x.clone();
    let mut set = std::collections::HashSet::new();
    assert!(set.insert(x.clone()));
    assert!(!set.insert(x_again), "equal refs hash alike");
    assert!(set.insert(y.clone()));
    let ordered: std::collections::BTreeSet<_> = [y.clone(), x.clone()].into_iter().collect();
    let first = ordered.iter().next().unwrap();
    assert_eq!(&*first.node().name, "keys1", "ordered by node name first");
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_actor_can_be_watched_by_name() {
    let nodes = cluster("byname", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let limit = Duration::from_secs(5);
    let actor = spawn_mortal(b);
    b.register("mortal", &actor).unwrap();
    let by_name = a.remote::<Life>("byname2", "mortal").unwrap();
    let watch = a.monitor(&by_name);
    // The watch is set up on the lane the ref's messages take, so it is in place first.
    by_name.send(Life::Noop).await.unwrap();
    by_name.send(Life::Stop).await.unwrap();
    assert_eq!(
        tokio::time::timeout(limit, watch).await.unwrap(),
        DownReason::Stopped
    );
    // A name nobody has.
    let nobody = a.remote::<Life>("byname2", "nobody").unwrap();
    assert_eq!(
        tokio::time::timeout(limit, a.monitor(&nobody))
            .await
            .unwrap(),
        DownReason::NoProc
    );
    for n in &nodes {
        n.shutdown().await;
    }
}
