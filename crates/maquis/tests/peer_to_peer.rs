//! The peer-to-peer overlay (HyParView + Plumtree) in running nodes: convergence to a connected,
//! symmetric overlay, broadcast, routed sends to non-neighbours, failures, leave and rejoin (calls
//! while the overlay reshapes itself: `overlay_churn.rs`).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use common::probe::{spawn_probe, Probe};
use common::*;
use maquis::{ActorRef, CallError, MembershipEvent, Node, Subscription};

const N: usize = 12;

/// Neighbour sets by name of the nodes that are running.
fn views(nodes: &[&Node]) -> HashMap<String, BTreeSet<String>> {
    nodes
        .iter()
        .map(|n| (n.id().name.to_string(), names(&n.neighbors())))
        .collect()
}

/// Every neighbour relation goes both ways, nobody is alone, and the graph is connected.
fn symmetric_and_connected(v: &HashMap<String, BTreeSet<String>>) -> bool {
    for (a, nbrs) in v {
        if nbrs.is_empty() {
            return false;
        }
        for b in nbrs {
            match v.get(b) {
                Some(back) if back.contains(a) => {}
                _ => return false,
            }
        }
    }
    let Some(start) = v.keys().next() else {
        return true;
    };
    let mut seen = BTreeSet::from([start.clone()]);
    let mut todo = vec![start.clone()];
    while let Some(a) = todo.pop() {
        for b in &v[&a] {
            if seen.insert(b.clone()) {
                todo.push(b.clone());
            }
        }
    }
    seen.len() == v.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_nodes_converge_broadcast_route_fail_leave_and_rejoin() {
    let t0 = Instant::now();
    let mut nodes = Vec::new();
    for i in 0..N {
        nodes.push(start_with(p2p(&format!("p{i:02}"))).await);
    }
    // Each node joins through an earlier one, so the contacts differ.
    for i in 1..N {
        let contact = nodes[(i * 7) % i].addr();
        nodes[i]
            .join_wait(contact, Duration::from_secs(5))
            .await
            .expect("join");
    }
    let everyone: BTreeSet<String> = nodes.iter().map(|n| n.id().name.to_string()).collect();
    let all: Vec<&Node> = nodes.iter().collect();
    until(
        "a connected, symmetric overlay",
        Duration::from_secs(20),
        || {
            let ok = symmetric_and_connected(&views(&all));
            async move { ok }
        },
    )
    .await;
    all_members(
        &all,
        &everyone,
        "every node knows all 12",
        Duration::from_secs(20),
    )
    .await;
    let converged = t0.elapsed();
    // The broadcast layer's counters reach the node's (`/metrics`): every node has first
    // routes by now, each one counted as a route move.
    until("route moves counted", Duration::from_secs(5), || {
        let ok = all
            .iter()
            .all(|n| n.counters().broadcast_route_moves.get() > 0);
        async move { ok }
    })
    .await;
    // The views keep changing (shuffles, neighbours replaced): a node may be without
    // neighbours for a moment while it asks another. The sizes are those of a settled overlay.
    let settled = Instant::now();
    let v = loop {
        let v = views(&all);
        if symmetric_and_connected(&v) {
            break v;
        }
        assert!(
            settled.elapsed() < Duration::from_secs(10),
            "the overlay settles again: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let degrees: Vec<usize> = v.values().map(|s| s.len()).collect();
    assert!(degrees.iter().all(|d| (1..=3).contains(d)), "{degrees:?}");
    println!("converged in {converged:?}; active view sizes {degrees:?}");

    // Broadcast: every subscriber, the sender's included, gets it once.
    let mut subs: Vec<Subscription<String>> =
        nodes.iter().map(|n| n.subscribe_topic("news")).collect();
    let sent = Instant::now();
    nodes[5]
        .broadcast("news", &"hello from p05".to_string())
        .await
        .unwrap();
    for s in &mut subs {
        assert_eq!(next(s).await, "hello from p05");
    }
    println!(
        "broadcast reached all {N} subscribers in {:?}",
        sent.elapsed()
    );
    for s in &subs {
        assert!(s.is_empty(), "delivered once");
    }

    // Routed sends: every node calls every other node's probe, neighbours or not. Delivery is
    // at most once: a message caught in a view change, or sent while the routes disagree, can
    // be lost; a call that fails is tried again (for up to 5 s), and both the fraction answered
    // at the first try and the fraction answered in the end are reported.
    for n in &nodes {
        spawn_probe(n);
    }
    let (mut first, mut ok, mut total) = (0, 0, 0);
    let mut failures = Vec::new();
    for a in &nodes {
        for b in &nodes {
            if a.id() == b.id() {
                continue;
            }
            total += 1;
            let to: ActorRef<Probe> = a.remote(&b.id().name, "probe").expect("member");
            let from = a.id().name.to_string();
            let want = format!("{} got {from}", b.id().name);
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut attempt = 0;
            loop {
                let r = to
                    .call(
                        |reply| Probe::Ping {
                            from: from.clone(),
                            reply,
                        },
                        Duration::from_secs(2),
                    )
                    .await;
                match r {
                    Ok(s) if s == want => {
                        ok += 1;
                        first += usize::from(attempt == 0);
                        break;
                    }
                    other => failures.push(format!("{from} -> {}: {other:?}", b.id().name)),
                }
                attempt += 1;
                if Instant::now() > deadline {
                    break;
                }
                // Routes refresh with the next heartbeats.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let forwarded: u64 = nodes
        .iter()
        .map(|n| n.counters().routed_forwarded.get())
        .sum();
    println!(
        "routed calls: {first}/{total} answered at the first try ({:.1} %), {ok}/{total} \
         in the end ({:.1} %); {forwarded} frames forwarded; failed tries: {failures:?}",
        100.0 * first as f64 / total as f64,
        100.0 * ok as f64 / total as f64,
    );
    if ok != total {
        for n in &nodes {
            println!("{}: {:?}", n.id().name, n.counters().snapshot());
        }
    }
    assert_eq!(ok, total, "failures: {failures:?}");
    assert!(
        first * 10 >= total * 9,
        "most calls arrive at the first try"
    );
    assert!(forwarded > 0, "some calls went through intermediate nodes");
    let flaps: u64 = nodes.iter().map(|n| n.counters().peers_down.get()).sum();
    if flaps != 0 {
        for n in &nodes {
            println!("{}: {:?}", n.id().name, n.counters().snapshot());
        }
    }
    assert_eq!(flaps, 0, "no live node was declared down");

    // A node killed: it leaves every survivor's neighbours and members, and calls to it fail
    // (an error, not a hang).
    let victim = nodes.remove(7);
    let victim_id = victim.id().clone();
    let probe: ActorRef<Probe> = nodes[0].remote(&victim_id.name, "probe").unwrap();
    let mut events = nodes[0].subscribe();
    let watch = nodes[0].monitor_node(&victim_id);
    let killed = Instant::now();
    victim.shutdown().await;
    let survivors: Vec<&Node> = nodes.iter().collect();
    let mut rest = everyone.clone();
    rest.remove(&*victim_id.name);
    until(
        "the dead node leaves every view",
        Duration::from_secs(15),
        || {
            let ok = survivors
                .iter()
                .all(|n| !n.neighbors().contains(&victim_id));
            async move { ok }
        },
    )
    .await;
    all_members(
        &survivors,
        &rest,
        "the dead node leaves every member list",
        Duration::from_secs(15),
    )
    .await;
    println!("killed node dropped everywhere in {:?}", killed.elapsed());
    next_event(&mut events, Duration::from_secs(1), |e| {
        *e == MembershipEvent::Down(victim_id.clone())
    })
    .await;
    let reason = tokio::time::timeout(Duration::from_secs(1), watch)
        .await
        .expect("the monitor fires with the membership change");
    assert_eq!(reason, maquis::DownReason::NodeDown);
    let r = probe
        .call(
            |reply| Probe::Ping {
                from: "p00".into(),
                reply,
            },
            Duration::from_secs(5),
        )
        .await;
    assert!(
        matches!(r, Err(CallError::Send(_)) | Err(CallError::NoReply(_))),
        "{r:?}"
    );
    until("the overlay heals", Duration::from_secs(15), || {
        let ok = symmetric_and_connected(&views(&survivors));
        async move { ok }
    })
    .await;

    // Leave and rejoin.
    let leaver = nodes[3].clone();
    let leaver_id = leaver.id().clone();
    let mut events = nodes[0].subscribe();
    leaver.leave().await;
    let others: Vec<&Node> = nodes.iter().filter(|n| n.id() != &leaver_id).collect();
    let mut without = rest.clone();
    without.remove(&*leaver_id.name);
    all_members(
        &others,
        &without,
        "the leaver leaves every member list",
        Duration::from_secs(15),
    )
    .await;
    next_event(&mut events, Duration::from_secs(1), |e| {
        *e == MembershipEvent::Left(leaver_id.clone())
    })
    .await;
    assert_eq!(
        names(&leaver.members()),
        BTreeSet::from([leaver_id.name.to_string()])
    );
    assert!(leaver.neighbors().is_empty());
    leaver
        .join_wait(nodes[0].addr(), Duration::from_secs(5))
        .await
        .expect("rejoin");
    let survivors: Vec<&Node> = nodes.iter().collect();
    all_members(
        &survivors,
        &rest,
        "the node is back in every member list",
        Duration::from_secs(15),
    )
    .await;
    until(
        "a connected, symmetric overlay again",
        Duration::from_secs(15),
        || {
            let ok = symmetric_and_connected(&views(&survivors));
            async move { ok }
        },
    )
    .await;
    let mut sub: Subscription<u32> = leaver.subscribe_topic("after");
    nodes[10].broadcast("after", &42u32).await.unwrap();
    assert_eq!(next(&mut sub).await, 42);
    println!("whole scenario took {:?}", t0.elapsed());
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_to_a_node_nobody_knows_fails_at_once() {
    let a = start_with(p2p("lone-a")).await;
    let b = start_with(p2p("lone-b")).await;
    spawn_probe(&b);
    let stranger = b.id().clone();
    // A ref to a node that is not a member: no direct connection, no route.
    let probe: ActorRef<Probe> = a
        .decode(&maquis::encode(&b.whereis::<Probe>("probe").unwrap()).unwrap())
        .unwrap();
    assert_eq!(probe.node(), &stranger);
    let started = Instant::now();
    let r = probe
        .call(
            |reply| Probe::Ping {
                from: "a".into(),
                reply,
            },
            Duration::from_secs(5),
        )
        .await;
    assert!(
        matches!(r, Err(CallError::Send(maquis::SendError::Unreachable(_)))),
        "{r:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    a.shutdown().await;
    b.shutdown().await;
}
