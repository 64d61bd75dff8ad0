//! Multi-node behaviour of the runtime: membership, messaging, lanes, failures.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use maquis::{ActorRef, CallError, DownReason, MembershipEvent, ReplyTo, SendOpts};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum Probe {
    Hello { from: String },
    Count(ReplyTo<Vec<String>>),
}

fn spawn_probe(node: &maquis::Node) -> ActorRef<Probe> {
    node.spawn_fn(|mut inbox| async move {
        let mut seen = Vec::new();
        while let Some(msg) = inbox.recv().await {
            match msg {
                Probe::Hello { from } => seen.push(from),
                Probe::Count(reply) => {
                    let _ = reply.send(seen.clone()).await;
                }
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_nodes_converge_through_one_contact() {
    let nodes = cluster("conv", 6, |c| c).await;
    for n in &nodes {
        assert_eq!(member_names(n).len(), 6);
    }
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_reaches_every_other_by_name_and_by_ref() {
    let nodes = cluster("msg", 4, |c| c).await;
    let mut refs = Vec::new();
    for n in &nodes {
        let p = spawn_probe(n);
        n.register("probe", &p).unwrap();
        refs.push(p);
    }
    for a in &nodes {
        for (j, b) in nodes.iter().enumerate() {
            if a.id() == b.id() {
                continue;
            }
            let by_name: ActorRef<Probe> = a.remote(&b.id().name, "probe").expect("member");
            by_name
                .send(Probe::Hello {
                    from: format!("{}-name", a.id().name),
                })
                .await
                .unwrap();
            // A ref made on b, used from a (as if it had been received in a message).
            let by_ref: ActorRef<Probe> = rebind(a, &refs[j]);
            by_ref
                .send(Probe::Hello {
                    from: format!("{}-ref", a.id().name),
                })
                .await
                .unwrap();
        }
    }
    for (j, b) in nodes.iter().enumerate() {
        let want = 2 * (nodes.len() - 1);
        let r = refs[j].clone();
        until("all hellos arrive", Duration::from_secs(10), || {
            let r = r.clone();
            async move {
                r.call(Probe::Count, Duration::from_secs(5))
                    .await
                    .unwrap()
                    .len()
                    >= want
            }
        })
        .await;
        let seen = refs[j]
            .call(Probe::Count, Duration::from_secs(5))
            .await
            .unwrap();
        for a in &nodes {
            if a.id() == b.id() {
                continue;
            }
            for how in ["name", "ref"] {
                let want = format!("{}-{how}", a.id().name);
                assert!(
                    seen.contains(&want),
                    "{} did not get {want}: {seen:?}",
                    b.id().name
                );
            }
        }
        assert_eq!(seen.len(), 2 * (nodes.len() - 1));
    }
    for n in &nodes {
        n.shutdown().await;
    }
}

/// Moves a ref to another node the way the network does: serialize there, decode here.
fn rebind<M: maquis::Message>(node: &maquis::Node, r: &ActorRef<M>) -> ActorRef<M> {
    // A ref travels inside a message; simulate by round-tripping through an actor call.
    let bytes = maquis::encode(r).expect("encodes");
    node.decode::<ActorRef<M>>(&bytes).expect("decodes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_match_parallelism_on_both_sides() {
    let nodes = cluster("lanes", 3, |c| c.parallelism(4).channel("vnode", Some(16))).await;
    for a in &nodes {
        for b in &nodes {
            if a.id() == b.id() {
                continue;
            }
            let peer = b.id().name.to_string();
            until("all lanes connected", Duration::from_secs(10), || {
                let lanes = a.lanes_connected(&peer);
                async move { lanes.iter().all(|(_, up, want)| up == want) && !lanes.is_empty() }
            })
            .await;
            let lanes = a.lanes_connected(&peer);
            assert_eq!(
                lanes,
                vec![
                    ("membership".to_string(), 1, 1),
                    ("default".to_string(), 4, 4),
                    ("vnode".to_string(), 16, 16)
                ]
            );
        }
    }
    // Both sides agree and no socket is doubled: every connection has its accepting end on a
    // listen port, so the established sockets on those ports are exactly pairs × lanes.
    let ports: Vec<u16> = nodes.iter().map(|n| n.addr().port()).collect();
    until(
        "exactly one connection per lane",
        Duration::from_secs(10),
        || {
            let n = established_on(&ports);
            async move { n == 3 * 21 }
        },
    )
    .await;
    let st = nodes[0].status();
    for p in &st.peers {
        assert_eq!(p.lanes.iter().filter(|l| l.connected).count(), 21);
    }
    for n in &nodes {
        n.shutdown().await;
    }
}

/// Established TCP sockets (IPv4) whose local port is one of `ports`.
fn established_on(ports: &[u16]) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let local_port = cols
                .get(1)
                .and_then(|a| a.split(':').nth(1))
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            cols.get(3) == Some(&"01") && local_port.is_some_and(|p| ports.contains(&p))
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leave_remove_and_rejoin() {
    let nodes = cluster("lv", 4, |c| c).await;
    let mut events = nodes[0].subscribe();
    // Self-leave: lv4 leaves and sees only itself; the others see it as Left.
    nodes[3].leave().await;
    assert_eq!(member_names(&nodes[3]), vec!["lv4"]);
    let ev = next_event(
        &mut events,
        Duration::from_secs(5),
        |e| matches!(e, MembershipEvent::Left(n) if &*n.name == "lv4"),
    )
    .await;
    assert!(matches!(ev, MembershipEvent::Left(_)));
    for n in &nodes[..3] {
        until("lv4 gone", Duration::from_secs(5), || {
            let m = member_names(n);
            async move { m == ["lv1", "lv2", "lv3"] }
        })
        .await;
    }
    // Removal of another node: lv1 removes lv3; lv3 ends up alone.
    nodes[0].remove("lv3").await;
    until("lv3 alone", Duration::from_secs(5), || {
        let m = member_names(&nodes[2]);
        async move { m == ["lv3"] }
    })
    .await;
    for n in &nodes[..2] {
        until("lv3 removed", Duration::from_secs(5), || {
            let m = member_names(n);
            async move { m == ["lv1", "lv2"] }
        })
        .await;
    }
    // Both rejoin, through different contacts.
    nodes[3]
        .join_wait(nodes[1].addr(), Duration::from_secs(5))
        .await
        .unwrap();
    nodes[2]
        .join_wait(nodes[0].addr(), Duration::from_secs(5))
        .await
        .unwrap();
    for n in &nodes {
        until("rejoined", Duration::from_secs(10), || {
            let m = member_names(n);
            async move { m == ["lv1", "lv2", "lv3", "lv4"] }
        })
        .await;
    }
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_is_reported_down_by_every_survivor() {
    let nodes = cluster("kill", 4, |c| c).await;
    let mut subs: Vec<_> = nodes[..3].iter().map(|n| n.subscribe()).collect();
    let victim = nodes[3].id().clone();
    let monitor = nodes[0].monitor_node(&victim);
    let started = std::time::Instant::now();
    nodes[3].shutdown().await;
    for rx in &mut subs {
        next_event(
            rx,
            Duration::from_secs(5),
            |e| matches!(e, MembershipEvent::Down(n) if *n == victim),
        )
        .await;
    }
    assert_eq!(monitor.await, DownReason::NodeDown);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "detection took {took:?}");
    for n in &nodes[..3] {
        assert!(
            !member_names(n).contains(&"kill4".to_string()),
            "{:?} {:?}",
            n.id(),
            n.status()
        );
        n.shutdown().await;
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum PidTest {
    /// Carries a ref of the sender's reply actor; the receiver answers through it.
    Ping { reply_to: ActorRef<Pong> },
}

#[derive(Debug, Serialize, Deserialize)]
struct Pong {
    from: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_ref_round_trip() {
    let nodes = cluster("pid", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let server = b.spawn_fn(|mut inbox: maquis::Inbox<PidTest>| async move {
        let me = inbox
            .node()
            .map(|n| n.id().name.to_string())
            .unwrap_or_default();
        while let Some(PidTest::Ping { reply_to }) = inbox.recv().await {
            reply_to.send(Pong { from: me.clone() }).await.unwrap();
        }
    });
    b.register("server", &server).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let mut tx = Some(tx);
    let client = a.spawn_fn(move |mut inbox: maquis::Inbox<Pong>| async move {
        if let Some(p) = inbox.recv().await {
            let _ = tx.take().map(|t| t.send(p.from));
        }
    });
    let server_ref: ActorRef<PidTest> = a.remote("pid2", "server").unwrap();
    server_ref
        .send(PidTest::Ping { reply_to: client })
        .await
        .unwrap();
    let from = tokio::time::timeout(Duration::from_secs(5), rx)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(from, "pid2");
    for n in &nodes {
        n.shutdown().await;
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Slow {
    Wait {
        ms: u64,
        tag: u32,
        reply: ReplyTo<u32>,
    },
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_timeout_and_late_reply() {
    let nodes = cluster("call", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let slow = b.spawn_fn(|mut inbox: maquis::Inbox<Slow>| async move {
        while let Some(Slow::Wait { ms, tag, reply }) = inbox.recv().await {
            tokio::time::sleep(Duration::from_millis(ms)).await; // the work being timed out
            let _ = reply.send(tag).await;
        }
    });
    b.register("slow", &slow).unwrap();
    let r: ActorRef<Slow> = a.remote("call2", "slow").unwrap();
    let late = r
        .call(
            |reply| Slow::Wait {
                ms: 300,
                tag: 1,
                reply,
            },
            Duration::from_millis(50),
        )
        .await;
    assert_eq!(late, Err(CallError::Timeout));
    // The next call is queued behind the first; its reply must be its own (2), never the late 1.
    let next = r
        .call(
            |reply| Slow::Wait {
                ms: 0,
                tag: 2,
                reply,
            },
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(next, Ok(2));
    until("late reply counted", Duration::from_secs(5), || {
        let late = a.counters().late_replies.get();
        async move { late >= 1 }
    })
    .await;
    // A call to a name nobody holds fails fast with NoProc.
    let ghost: ActorRef<Slow> = a.remote("call2", "ghost").unwrap();
    let err = ghost
        .call(
            |reply| Slow::Wait {
                ms: 0,
                tag: 3,
                reply,
            },
            Duration::from_secs(5),
        )
        .await;
    assert_eq!(err, Err(CallError::NoProc));
    for n in &nodes {
        n.shutdown().await;
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Seq {
    Item { sender: u32, n: u32 },
    Check(ReplyTo<Result<u32, String>>),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_pair_fifo_with_parallelism_16_and_affinity() {
    // PARTISAN's way: every frame on the lane its key picks.
    let used = per_pair_fifo("fifo", 0).await;
    assert!(used >= 4, "only {used} default lanes carried traffic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_pair_fifo_with_parallelism_16_and_striping() {
    // Small frames all on the channel's ordering lane.
    let used = per_pair_fifo("fifos", 256 * 1024).await;
    assert_eq!(used, 1, "small frames on the ordering lane only");
}

/// Eight senders on one node each send 1,250 numbered messages to one sink on another, over
/// 16 lanes per channel with affinity and `transport.stripe_bytes` = `stripe`; the sink checks
/// each sender's order. Returns how many default lanes carried traffic.
async fn per_pair_fifo(prefix: &str, stripe: usize) -> usize {
    let nodes = cluster(prefix, 2, |mut c| {
        c.transport.stripe_bytes = stripe;
        c.parallelism(16).affinity(true)
    })
    .await;
    let (a, b) = (&nodes[0], &nodes[1]);
    const SENDERS: u32 = 8;
    const PER_SENDER: u32 = 10_000 / SENDERS;
    let sink = b.spawn_fn(|mut inbox: maquis::Inbox<Seq>| async move {
        let mut next = vec![0u32; SENDERS as usize];
        let mut error: Option<String> = None;
        let mut total = 0;
        while let Some(m) = inbox.recv().await {
            match m {
                Seq::Item { sender, n } => {
                    total += 1;
                    if next[sender as usize] != n && error.is_none() {
                        error = Some(format!(
                            "sender {sender}: got {n}, expected {}",
                            next[sender as usize]
                        ));
                    }
                    next[sender as usize] = n + 1;
                }
                Seq::Check(reply) => {
                    let _ = reply.send(error.clone().map_or(Ok(total), Err)).await;
                }
            }
        }
    });
    b.register("sink", &sink).unwrap();
    let mut tasks = Vec::new();
    for s in 0..SENDERS {
        let a = a.clone();
        let sink_node = format!("{prefix}2");
        tasks.push(tokio::spawn(async move {
            let target: ActorRef<Seq> = a.remote(&sink_node, "sink").unwrap();
            a.spawn_fn(move |_inbox: maquis::Inbox<()>| async move {
                for n in 0..PER_SENDER {
                    target.send(Seq::Item { sender: s, n }).await.unwrap();
                }
            });
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let r: ActorRef<Seq> = a.remote(&format!("{prefix}2"), "sink").unwrap();
    until("all delivered", Duration::from_secs(20), || {
        let r = r.clone();
        async move {
            matches!(r.call(Seq::Check, Duration::from_secs(5)).await, Ok(Ok(n)) if n == SENDERS * PER_SENDER)
                || matches!(r.call(Seq::Check, Duration::from_secs(5)).await, Ok(Err(_)))
        }
    })
    .await;
    let result = r.call(Seq::Check, Duration::from_secs(5)).await.unwrap();
    assert_eq!(result, Ok(SENDERS * PER_SENDER));
    let st = a.status();
    let used = st.peers[0]
        .lanes
        .iter()
        .filter(|l| l.channel == "default" && l.msgs_out > 0)
        .count();
    for n in &nodes {
        n.shutdown().await;
    }
    used
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_cookie_is_rejected() {
    let a = start("ck1").await;
    let b = start_with(config("ck2").cookie("another-secret")).await;
    let r = b.join_wait(a.addr(), Duration::from_secs(5)).await;
    assert!(r.is_err(), "join with a wrong cookie must fail: {r:?}");
    assert_eq!(member_names(&a), vec!["ck1"]);
    assert_eq!(member_names(&b), vec!["ck2"]);
    until("failure counted", Duration::from_secs(5), || {
        let f = a.counters().handshake_failures.get();
        async move { f >= 1 }
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A port that can be bound now, below the kernel's ephemeral port range.
fn port_outside_the_ephemeral_range() -> std::net::SocketAddr {
    let first = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low = 10_000.min(first / 2);
    (0..1000)
        .map(|_| rand::Rng::gen_range(&mut rand::thread_rng(), low..first))
        .find_map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
        .and_then(|l| l.local_addr().ok())
        .expect("a free port below the ephemeral range")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_wait_keeps_trying_a_contact_that_is_not_up_yet() {
    // A free port, nobody listening on it yet: the first attempts are refused. Below the
    // ephemeral range, so that no other test's node (listening on port 0) nor any outgoing
    // connection (b's own attempts among them) takes it in the meantime.
    let port = port_outside_the_ephemeral_range();
    let b = start("late2").await;
    let started = std::time::Instant::now();
    let joining = {
        let b = b.clone();
        tokio::spawn(async move { b.join_wait(port, Duration::from_secs(10)).await })
    };
    // The contact comes up while b is still trying.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = start_with(config("late1").listen(port)).await;
    let joined = joining.await.unwrap();
    assert_eq!(
        joined.map(|id| id.name.to_string()),
        Ok("late1".to_string())
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    until("both see both", Duration::from_secs(5), || {
        let ok = member_names(&a) == ["late1", "late2"] && member_names(&b) == ["late1", "late2"];
        async move { ok }
    })
    .await;
    // Nobody ever listens: the answer comes at the deadline, not before and not much later.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let t = std::time::Instant::now();
    let r = b.join_wait(nowhere, Duration::from_millis(800)).await;
    assert!(r.is_err(), "{r:?}");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_listen_port_leaves_the_node_serving() {
    use tokio::io::AsyncWriteExt;
    let nodes = cluster("gb", 2, |c| c).await;
    let target = nodes[0].addr();
    for junk in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        vec![0xff; 10_000],
        vec![0, 0, 0, 5, 1, 2, 3],
        vec![0x7f, 0xff, 0xff, 0xff],
    ] {
        let mut s = tokio::net::TcpStream::connect(target).await.unwrap();
        let _ = s.write_all(&junk).await;
        drop(s);
    }
    until("failures counted", Duration::from_secs(10), || {
        let f = nodes[0].counters().handshake_failures.get();
        async move { f >= 3 }
    })
    .await;
    // Still serving: a new node joins and the echo service answers.
    let c = start("gb3").await;
    c.join_wait(target, Duration::from_secs(5)).await.unwrap();
    let rtt = maquis::echo::echo_once(
        &c,
        "gb1",
        Bytes::from_static(b"hi"),
        Duration::from_secs(5),
        &SendOpts::default(),
    )
    .await;
    assert!(rtt.is_ok(), "{rtt:?}");
    for n in nodes.iter().chain([&c]) {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_channel_tables_are_refused_with_a_reason() {
    let a = start_with(config("ct1").parallelism(1)).await;
    let b = start_with(config("ct2").parallelism(4)).await;
    let err = b
        .join_wait(a.addr(), Duration::from_secs(5))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("channel tables differ"), "{text}");
    assert!(
        text.contains("default:1") && text.contains("default:4"),
        "{text}"
    );
    assert_eq!(member_names(&a), vec!["ct1"]);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_fails_at_once_when_the_target_node_goes_down() {
    let nodes = cluster("cd", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let (got_tx, got_rx) = tokio::sync::oneshot::channel();
    let mut got_tx = Some(got_tx);
    let sink = b.spawn_fn(move |mut inbox: maquis::Inbox<Slow>| async move {
        // Holds the request without answering.
        let held = inbox.recv().await;
        let _ = got_tx.take().map(|t| t.send(()));
        let _keep = held;
        let _ = inbox.recv().await;
    });
    b.register("sink", &sink).unwrap();
    let r: ActorRef<Slow> = a.remote("cd2", "sink").unwrap();
    let call = tokio::spawn(async move {
        let t = std::time::Instant::now();
        let res = r
            .call(
                |reply| Slow::Wait {
                    ms: 0,
                    tag: 9,
                    reply,
                },
                Duration::from_secs(30),
            )
            .await;
        (res, t.elapsed())
    });
    got_rx.await.unwrap();
    b.shutdown().await;
    let (res, took) = call.await.unwrap();
    assert!(matches!(res, Err(CallError::NoReply(_))), "{res:?}");
    assert!(took < Duration::from_secs(10), "the call waited {took:?}");
    a.shutdown().await;
}
