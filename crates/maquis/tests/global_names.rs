//! Global names in running nodes: register, whereis and unregister across the cluster, typed
//! lookups, names that vanish with their actor or their node, concurrent registrations, two
//! clusters that merge with a conflict, and routed lookups on the peer-to-peer overlay.

mod common;

use std::time::Duration;

use common::*;
use maquis::names::GlobalNameError;
use maquis::{ActorRef, Node, RegisterError, ReplyTo};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum Ping {
    Ping(ReplyTo<String>),
}

/// An actor that answers with its node's name.
fn pinger(node: &Node) -> ActorRef<Ping> {
    let me = node.id().name.to_string();
    node.spawn_fn(move |mut inbox| async move {
        while let Some(Ping::Ping(reply)) = inbox.recv().await {
            let _ = reply.send(me.clone()).await;
        }
    })
}

async fn ping(r: &ActorRef<Ping>) -> String {
    r.call(Ping::Ping, Duration::from_secs(5))
        .await
        .expect("the registered actor answers")
}

/// Waits until every node's lookup of `name` says `holder` (a node name, or none).
async fn everyone_sees(nodes: &[&Node], name: &str, holder: Option<&str>) {
    for n in nodes {
        until(
            &format!("{} sees {name} held by {holder:?}", n.id().name),
            Duration::from_secs(15),
            || async {
                n.invalidate_global(name).await;
                let got = n.whereis_global::<Ping>(name).await.expect("lookup");
                got.map(|r| r.node().name.clone()).as_deref() == holder
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn register_whereis_unregister_across_five_nodes() {
    let nodes = cluster("g", 5, |c| c).await;
    let actor = pinger(&nodes[2]);
    nodes[2]
        .register_global("svc", &actor)
        .await
        .expect("registered");
    for n in &nodes {
        let found: ActorRef<Ping> = n
            .whereis_global("svc")
            .await
            .expect("lookup")
            .expect("found");
        assert_eq!(ping(&found).await, "g3", "through {}", n.id().name);
    }
    // Held: another node's registration is refused, naming the holder.
    let other = pinger(&nodes[0]);
    match nodes[0].register_global("svc", &other).await {
        Err(GlobalNameError::Taken { holder, .. }) => assert!(holder.contains("g3"), "{holder}"),
        r => panic!("{r:?}"),
    }
    // Typed: a lookup with another message type is an error, not a bad message later.
    match nodes[4].whereis_global::<u64>("svc").await {
        Err(GlobalNameError::TypeMismatch { registered, .. }) => {
            assert!(registered.contains("Ping"), "{registered}")
        }
        r => panic!("{r:?}"),
    }
    // Bad input is refused clearly.
    assert_eq!(
        nodes[1].register_global("", &pinger(&nodes[1])).await,
        Err(GlobalNameError::BadName)
    );
    assert_eq!(
        nodes[1].register_global("remote", &actor).await,
        Err(GlobalNameError::NotLocal)
    );
    assert!(matches!(
        nodes[1].register("$maquis/names", &pinger(&nodes[1])),
        Err(RegisterError::Reserved(_))
    ));

    assert!(nodes[2].unregister_global("svc").await);
    assert!(!nodes[2].unregister_global("svc").await);
    everyone_sees(&nodes.iter().collect::<Vec<_>>(), "svc", None).await;
    nodes[0]
        .register_global("svc", &other)
        .await
        .expect("free again");

    // An actor that stops loses its names.
    let short = pinger(&nodes[3]);
    nodes[3].register_global("short", &short).await.unwrap();
    nodes[3].register_global("short-2", &short).await.unwrap();
    nodes[3].stop_actor(&short).unwrap();
    let all: Vec<&Node> = nodes.iter().collect();
    everyone_sees(&all, "short", None).await;
    everyone_sees(&all, "short-2", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_nodes_names_vanish_on_every_survivor() {
    let nodes = cluster("k", 5, |c| c).await;
    let actor = pinger(&nodes[4]);
    for k in 0..20 {
        nodes[4]
            .register_global(&format!("k5-{k}"), &actor)
            .await
            .unwrap();
    }
    let keep = pinger(&nodes[1]);
    for k in 0..20 {
        nodes[1]
            .register_global(&format!("k2-{k}"), &keep)
            .await
            .unwrap();
    }
    // Warm the caches.
    for n in &nodes[..4] {
        for k in 0..20 {
            assert!(n
                .whereis_global::<Ping>(&format!("k5-{k}"))
                .await
                .unwrap()
                .is_some());
        }
    }
    nodes[4].shutdown().await;
    let survivors: Vec<&Node> = nodes[..4].iter().collect();
    for n in &survivors {
        until("k5 is gone", Duration::from_secs(10), || async {
            !member_names(n).contains(&"k5".to_string())
        })
        .await;
    }
    for n in &survivors {
        for k in 0..20 {
            // Cache lines included: the dead node's names are dropped with it.
            assert_eq!(
                n.whereis_global::<Ping>(&format!("k5-{k}")).await.unwrap(),
                None
            );
            let kept = n
                .whereis_global::<Ping>(&format!("k2-{k}"))
                .await
                .unwrap()
                .expect("the other names stay");
            assert_eq!(&*kept.node().name, "k2");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_concurrent_registrations_of_one_name_exactly_one_wins() {
    let nodes = cluster("c", 5, |c| c).await;
    let tries = nodes.iter().map(|n| {
        let a = pinger(n);
        async move { n.register_global("leader", &a).await }
    });
    let results = futures::future::join_all(tries).await;
    let winners: Vec<usize> = (0..5).filter(|&i| results[i].is_ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    for r in &results {
        assert!(
            matches!(r, Ok(()) | Err(GlobalNameError::Taken { .. })),
            "{r:?}"
        );
    }
    let winner = format!("c{}", winners[0] + 1);
    everyone_sees(&nodes.iter().collect::<Vec<_>>(), "leader", Some(&winner)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sides_that_meet_keep_the_older_registration_and_tell_the_loser() {
    // Two clusters, as the two sides of a partition: each registers the name, then they meet.
    let a = cluster("pa", 3, |c| c).await;
    let b = cluster("pb", 2, |c| c).await;
    let older = pinger(&a[1]);
    a[1].register_global("leader", &older).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await; // a later wall-clock stamp
    let newer = pinger(&b[0]);
    b[0].register_global("leader", &newer).await.unwrap();
    let mut lost = b[0].subscribe_names();

    b[0].join_wait(a[0].addr(), Duration::from_secs(5))
        .await
        .unwrap();
    let all: Vec<&Node> = a.iter().chain(b.iter()).collect();
    for n in &all {
        until("one cluster", Duration::from_secs(10), || async {
            n.members().len() == 5
        })
        .await;
    }
    everyone_sees(&all, "leader", Some("pa2")).await;
    let notice = tokio::time::timeout(Duration::from_secs(10), lost.recv())
        .await
        .expect("the loser is told")
        .unwrap();
    assert_eq!(&*notice.name, "leader");
    assert_eq!(&*notice.winner.name, "pa2");
    // The loser no longer holds it.
    assert!(!b[0].unregister_global("leader").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lookups_are_routed_on_the_peer_to_peer_overlay() {
    let mut nodes = Vec::new();
    for i in 1..=8 {
        nodes.push(start_with(p2p(&format!("r{i}"))).await);
    }
    for n in &nodes[1..] {
        n.join_wait(nodes[0].addr(), Duration::from_secs(5))
            .await
            .unwrap();
    }
    for n in &nodes {
        until("8 members", Duration::from_secs(20), || async {
            n.members().len() == 8
        })
        .await;
    }
    // Names registered on every node, looked up from every node: with active views of 3, most
    // homes and holders are not neighbours.
    for (i, n) in nodes.iter().enumerate() {
        let a = pinger(n);
        n.register_global(&format!("svc-{i}"), &a).await.unwrap();
    }
    for n in &nodes {
        for i in 0..8 {
            let found = n
                .whereis_global::<Ping>(&format!("svc-{i}"))
                .await
                .unwrap()
                .expect("found");
            assert_eq!(ping(&found).await, format!("r{}", i + 1));
        }
    }
    assert!(nodes.iter().any(|n| n.neighbors().len() < 7));
}
