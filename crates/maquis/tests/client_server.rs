//! The client-server overlay in running nodes: one server and eleven clients as in PARTISAN's
//! `high_client_test` (membership, connections, broadcast, calls relayed by the server, a
//! killed client), clients re-homing when their server dies, and the cluster services between
//! clients.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use maquis::config::ClientServerOptions;
use maquis::echo::echo_once;
use maquis::overlay::Role;
use maquis::{Config, DownReason, MembershipEvent, Node, SendOpts};

fn cs(name: &str, role: Role) -> Config {
    config(name).overlay(ClientServerOptions {
        role,
        servers_per_client: 1,
        sync_interval_ms: 50,
        gossip_interval_ms: 250,
    })
}

/// Every node calls the `echo` service of every other node; a failed call is tried again until
/// `limit`. Returns (answered at the first try, answered in the end, calls).
async fn call_everyone(nodes: &[&Node], limit: Duration) -> (usize, usize, usize) {
    let (mut first, mut ok, mut total) = (0, 0, 0);
    let mut failures = Vec::new();
    for a in nodes {
        for b in nodes {
            if a.id() == b.id() {
                continue;
            }
            total += 1;
            let deadline = Instant::now() + limit;
            let mut attempt = 0;
            loop {
                let r = echo_once(
                    a,
                    &b.id().name,
                    Bytes::from_static(b"ping"),
                    Duration::from_secs(2),
                    &SendOpts::default(),
                )
                .await;
                match r {
                    Ok(_) => {
                        ok += 1;
                        first += usize::from(attempt == 0);
                        break;
                    }
                    Err(e) => failures.push(format!("{} -> {}: {e}", a.id().name, b.id().name)),
                }
                attempt += 1;
                if Instant::now() > deadline {
                    break;
                }
                // The routes are rebuilt with the next membership change or tick.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    if !failures.is_empty() {
        println!("failed tries: {failures:?}");
    }
    (first, ok, total)
}

/// Checks that a client's only connection is to `server`: it is its only neighbour, it has
/// lanes to it, and it has no lanes to any other client.
fn only_connected_to(client: &Node, server: &Node, clients: &[Node]) {
    let name = &client.id().name;
    assert_eq!(
        client.neighbors(),
        vec![server.id().clone()],
        "{name}'s neighbours"
    );
    let lanes = client.lanes_connected(&server.id().name);
    assert!(
        lanes
            .iter()
            .any(|(ch, up, _)| ch == "membership" && *up == 1),
        "{name} to the server: {lanes:?}"
    );
    for other in clients.iter().filter(|c| c.id() != client.id()) {
        assert!(
            client.lanes_connected(&other.id().name).is_empty(),
            "{name} has no connection to {}",
            other.id().name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_eleven_clients() {
    const CLIENTS: usize = 11;
    let t0 = Instant::now();
    let server = start_with(cs("s00", Role::Server)).await;
    let mut clients = Vec::new();
    for i in 1..=CLIENTS {
        clients.push(start_with(cs(&format!("c{i:02}"), Role::Client)).await);
    }
    for c in &clients {
        c.join_wait(server.addr(), Duration::from_secs(5))
            .await
            .expect("join");
    }
    let all: Vec<&Node> = std::iter::once(&server).chain(clients.iter()).collect();
    let everyone: BTreeSet<String> = all.iter().map(|n| n.id().name.to_string()).collect();
    all_members(
        &all,
        &everyone,
        "every node knows all 12",
        Duration::from_secs(10),
    )
    .await;
    let converged = t0.elapsed();
    println!("{} nodes converged in {converged:?}", all.len());

    // Connections: a client only to the server; the server to every client.
    until(
        "every client's only neighbour is the server",
        Duration::from_secs(5),
        || {
            let ok = clients
                .iter()
                .all(|c| c.neighbors() == vec![server.id().clone()]);
            async move { ok }
        },
    )
    .await;
    for c in &clients {
        only_connected_to(c, &server, &clients);
    }
    let client_names: BTreeSet<String> = clients.iter().map(|c| c.id().name.to_string()).collect();
    assert_eq!(names(&server.neighbors()), client_names);

    // Broadcast from a client: the server relays it to every other client.
    let mut subs: Vec<_> = all
        .iter()
        .map(|n| n.subscribe_topic::<String>("news"))
        .collect();
    let sent = Instant::now();
    clients[2]
        .broadcast("news", &"hello from c03".to_string())
        .await
        .unwrap();
    for s in &mut subs {
        let got = tokio::time::timeout(Duration::from_secs(5), s.recv())
            .await
            .expect("broadcast arrives in time")
            .expect("node running");
        assert_eq!(got, "hello from c03");
    }
    println!("broadcast reached all 12 in {:?}", sent.elapsed());

    // Calls from every node to every other: client to client goes through the server.
    let before = server.counters().routed_forwarded.get();
    let (first, ok, total) = call_everyone(&all, Duration::from_secs(3)).await;
    let relayed = CLIENTS * (CLIENTS - 1);
    // The server counts a frame once it is queued, and a queued frame may be written (and the
    // call answered) before that.
    let forwarded = || server.counters().routed_forwarded.get() - before;
    until("the forwards counted", Duration::from_secs(1), || {
        let ok = forwarded() >= 2 * relayed as u64;
        async move { ok }
    })
    .await;
    let forwarded = forwarded();
    println!(
        "calls: {first}/{total} answered at the first try ({:.1} %), {ok}/{total} in the end \
         ({:.1} %); the server forwarded {forwarded} frames",
        100.0 * first as f64 / total as f64,
        100.0 * ok as f64 / total as f64,
    );
    assert_eq!(ok, total);
    // Each client-to-client call is a routed request and a routed reply.
    assert!(
        forwarded >= 2 * relayed as u64,
        "{forwarded} forwarded for {relayed} relayed calls"
    );
    let drops: u64 = all
        .iter()
        .map(|n| {
            let c = n.counters();
            c.routed_no_route.get()
                + c.routed_hop_limit.get()
                + c.routed_queue_full.get()
                + c.routed_invalid.get()
        })
        .sum();
    assert_eq!(drops, 0, "no routed message dropped");
    let flaps: u64 = all.iter().map(|n| n.counters().peers_down.get()).sum();
    assert_eq!(flaps, 0, "no live node was declared down");
    // Still one connection per client after all that traffic.
    for c in &clients {
        only_connected_to(c, &server, &clients);
    }

    // A killed client disappears from every survivor's members; monitors fire.
    let victim = clients.pop().expect("a client");
    let victim_id = victim.id().clone();
    let watcher = &clients[0];
    let mut events = watcher.subscribe();
    let watch = watcher.monitor_node(&victim_id);
    let killed = Instant::now();
    victim.shutdown().await;
    let survivors: Vec<&Node> = std::iter::once(&server).chain(clients.iter()).collect();
    let mut rest = everyone.clone();
    rest.remove(&*victim_id.name);
    all_members(
        &survivors,
        &rest,
        "the killed client leaves every member list",
        Duration::from_secs(10),
    )
    .await;
    println!(
        "killed client dropped by all {} survivors in {:?}",
        survivors.len(),
        killed.elapsed()
    );
    next_event(&mut events, Duration::from_secs(1), |e| {
        *e == MembershipEvent::Down(victim_id.clone())
    })
    .await;
    let reason = tokio::time::timeout(Duration::from_secs(1), watch)
        .await
        .expect("the monitor fires with the membership change");
    assert_eq!(reason, DownReason::NodeDown);
    // Only the victim was declared down, by the server (the others learnt it from the server).
    // A node's member list changes just before it counts the Down.
    let flaps = || -> u64 {
        survivors
            .iter()
            .map(|n| n.counters().peers_down.get())
            .sum()
    };
    until(
        "every survivor counted a Down",
        Duration::from_secs(1),
        || {
            let ok = flaps() >= survivors.len() as u64;
            async move { ok }
        },
    )
    .await;
    assert_eq!(flaps(), survivors.len() as u64, "one Down per survivor");
    println!("test took {:?}", t0.elapsed());
    for n in survivors {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_rehome_when_their_server_dies() {
    const CLIENTS: usize = 6;
    let s1 = start_with(cs("s1", Role::Server)).await;
    let s2 = start_with(cs("s2", Role::Server)).await;
    s2.join_wait(s1.addr(), Duration::from_secs(5))
        .await
        .expect("join");
    let mut clients = Vec::new();
    for i in 1..=CLIENTS {
        let c = start_with(cs(&format!("k{i}"), Role::Client)).await;
        // Half join through each server, so both serve clients.
        let contact = if i % 2 == 0 { &s2 } else { &s1 };
        c.join_wait(contact.addr(), Duration::from_secs(5))
            .await
            .expect("join");
        clients.push(c);
    }
    let all: Vec<&Node> = [&s1, &s2].into_iter().chain(clients.iter()).collect();
    let everyone: BTreeSet<String> = all.iter().map(|n| n.id().name.to_string()).collect();
    all_members(
        &all,
        &everyone,
        "every node knows all 8",
        Duration::from_secs(10),
    )
    .await;
    until("servers mesh", Duration::from_secs(5), || {
        let ok = s1.neighbors().contains(s2.id()) && s2.neighbors().contains(s1.id());
        async move { ok }
    })
    .await;
    // A client may know every member (a server's state reaches it) a moment before its
    // attach is answered.
    until(
        "every client has one server",
        Duration::from_secs(5),
        || {
            let ok = clients.iter().all(|c| c.neighbors().len() == 1);
            async move { ok }
        },
    )
    .await;
    let orphans: Vec<&Node> = clients
        .iter()
        .filter(|c| c.neighbors() == vec![s1.id().clone()])
        .collect();
    assert!(!orphans.is_empty(), "s1 serves some clients");

    let dead = s1.id().clone();
    let killed = Instant::now();
    s1.shutdown().await;
    let survivors: Vec<&Node> = std::iter::once(&s2).chain(clients.iter()).collect();
    let mut rest = everyone.clone();
    rest.remove(&*dead.name);
    until(
        "every client is served by s2",
        Duration::from_secs(10),
        || {
            let ok = clients
                .iter()
                .all(|c| c.neighbors() == vec![s2.id().clone()]);
            async move { ok }
        },
    )
    .await;
    let rehomed = killed.elapsed();
    all_members(
        &survivors,
        &rest,
        "the dead server leaves every member list",
        Duration::from_secs(10),
    )
    .await;
    println!(
        "{} clients re-homed in {rehomed:?}; the dead server dropped everywhere in {:?}",
        orphans.len(),
        killed.elapsed()
    );
    for c in &clients {
        only_connected_to(c, &s2, &clients);
    }
    // The re-homed clients reach everyone again through s2.
    let (first, ok, total) = call_everyone(&survivors, Duration::from_secs(3)).await;
    println!("calls after re-homing: {first}/{total} at the first try, {ok}/{total} in the end");
    assert_eq!(ok, total);
    for n in survivors {
        n.shutdown().await;
    }
}

/// Resident memory of this process, in KiB (Linux; 0 elsewhere).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One server and many clients in this process (`MAQUIS_CS_CLIENTS`, default 256): how long
/// they take to converge and what each client costs in resident memory (its own node and the
/// server's share together: an upper bound of the server's cost per client). Run by hand:
/// `cargo test --release -p maquis --test client_server -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, run by hand"]
async fn many_clients_memory() {
    let n: usize = std::env::var("MAQUIS_CS_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let slow = |mut c: Config| {
        c.transport.heartbeat_interval_ms = 1000;
        c.transport.heartbeat_timeout_ms = 10_000;
        if let Some(o) = c.overlay.client_server_mut() {
            o.sync_interval_ms = 100;
            o.gossip_interval_ms = 1000;
        }
        c
    };
    let server = start_with(slow(cs("s00", Role::Server))).await;
    let before = rss_kib();
    let t0 = Instant::now();
    let mut clients = Vec::new();
    for i in 0..n {
        let c = start_with(slow(cs(&format!("c{i:04}"), Role::Client))).await;
        let asked = Instant::now();
        c.join_wait(server.addr(), Duration::from_secs(10))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "client {i} of {n}: join failed after {:?}: {e}; {:?} since the start, \
                     RSS {} KiB",
                    asked.elapsed(),
                    t0.elapsed(),
                    rss_kib()
                )
            });
        clients.push(c);
        if (i + 1) % 128 == 0 {
            println!(
                "{} clients joined after {:?}, RSS {} KiB, last join {:?}",
                i + 1,
                t0.elapsed(),
                rss_kib(),
                asked.elapsed()
            );
        }
    }
    let joined = t0.elapsed();
    let all: Vec<&Node> = std::iter::once(&server).chain(clients.iter()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let behind: Vec<(String, usize)> = all
            .iter()
            .filter(|x| x.members().len() != n + 1)
            .map(|x| (x.id().name.to_string(), x.members().len()))
            .collect();
        if behind.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            let s = &server;
            let missing: Vec<String> = all
                .iter()
                .filter(|x| !s.members().contains(x.id()))
                .map(|x| x.id().name.to_string())
                .collect();
            panic!(
                "not converged: {} nodes behind, first {:?}; the server misses {missing:?}; \
                 server counters {:?}",
                behind.len(),
                &behind[..behind.len().min(10)],
                s.counters().snapshot()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let converged = t0.elapsed();
    until("every client is served", Duration::from_secs(30), || {
        let ok = server.neighbors().len() == n;
        async move { ok }
    })
    .await;
    let after = rss_kib();
    println!(
        "{n} clients: joined in {joined:?}, converged in {converged:?}; RSS {before} KiB -> \
         {after} KiB, {:.1} KiB per client (its node and the server's share); server counters \
         {:?}",
        (after.saturating_sub(before)) as f64 / n as f64,
        server.counters().snapshot()
    );
    for x in all {
        x.shutdown().await;
    }
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
enum Ask {
    /// Answer with the node's name.
    Who(maquis::ReplyTo<String>),
    /// Report (node, n) on the actor's channel.
    Note(u64),
}

/// An actor that answers `Who` with its node's name and reports every `Note` on `seen`.
fn asker(
    node: &Node,
    seen: tokio::sync::mpsc::UnboundedSender<(String, u64)>,
) -> maquis::ActorRef<Ask> {
    let me = node.id().name.to_string();
    node.spawn_fn(move |mut inbox| async move {
        while let Some(m) = inbox.recv().await {
            match m {
                Ask::Who(reply) => {
                    let _ = reply.send(me.clone()).await;
                }
                Ask::Note(n) => {
                    let _ = seen.send((me.clone(), n));
                }
            }
        }
    })
}

/// The cluster services between clients, which are never connected to each other (a server
/// relays everything): a global name registered on one client and called from the others,
/// a group of members on four clients published to and called, remote spawn and RPC from
/// client to client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_services_work_between_clients() {
    const T: Duration = Duration::from_secs(5);
    let s1 = start_with(cs("svc-s1", Role::Server)).await;
    let s2 = start_with(cs("svc-s2", Role::Server)).await;
    s2.join_wait(s1.addr(), T).await.unwrap();
    let mut clients = Vec::new();
    for i in 1..=4 {
        let c = start_with(cs(&format!("svc-c{i}"), Role::Client)).await;
        let server = if i % 2 == 0 { &s1 } else { &s2 };
        c.join_wait(server.addr(), T).await.unwrap();
        clients.push(c);
    }
    let all: Vec<&Node> = [&s1, &s2].into_iter().chain(clients.iter()).collect();
    let want: BTreeSet<String> = all.iter().map(|n| n.id().name.to_string()).collect();
    all_members(
        &all,
        &want,
        "six members everywhere",
        Duration::from_secs(15),
    )
    .await;
    for c in &clients {
        assert!(
            c.neighbors().iter().all(|n| n.name.starts_with("svc-s")),
            "a client is connected to servers only"
        );
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();

    // A global name on c1, looked up and called from the other clients.
    let named = asker(&clients[0], tx.clone());
    clients[0].register_global("svc", &named).await.unwrap();
    for c in &clients[1..] {
        let found = c
            .whereis_global::<Ask>("svc")
            .await
            .unwrap()
            .expect("registered");
        assert_eq!(found.call(Ask::Who, T).await.unwrap(), "svc-c1");
    }

    // A group with a member on every client: publish reaches each once, call_any one of them.
    for c in &clients {
        let m = asker(c, tx.clone());
        c.join_group("g", &m).await.unwrap();
    }
    for n in &all {
        until("four members of g", Duration::from_secs(10), || async {
            n.group_members::<Ask>("g").await.unwrap().len() == 4
        })
        .await;
    }
    assert_eq!(clients[0].publish("g", &Ask::Note(5)).await.unwrap(), 4);
    let mut got = Vec::new();
    for _ in 0..4 {
        let note = tokio::time::timeout(T, rx.recv()).await.expect("delivered");
        got.push(note.unwrap());
    }
    got.sort();
    let expected: Vec<(String, u64)> = (1..=4).map(|i| (format!("svc-c{i}"), 5)).collect();
    assert_eq!(got, expected);
    let who = clients[3].call_any("g", Ask::Who, T).await.unwrap();
    assert!(who.starts_with("svc-c"), "{who}");

    // Remote spawn and RPC from client to client.
    for c in &clients {
        c.register_fn("double", |x: u64| async move { x * 2 });
        let seen = tx.clone();
        c.register_kind("asker", move |node: &Node, _: ()| asker(node, seen.clone()));
    }
    let doubled: u64 = clients[0].rpc("svc-c4", "double", &21u64, T).await.unwrap();
    assert_eq!(doubled, 42);
    let child: maquis::ActorRef<Ask> = clients[1]
        .spawn_remote("svc-c3", "asker", &(), T)
        .await
        .unwrap();
    assert_eq!(&*child.node().name, "svc-c3");
    assert_eq!(child.call(Ask::Who, T).await.unwrap(), "svc-c3");
    for n in all {
        n.shutdown().await;
    }
}
