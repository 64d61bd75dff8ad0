//! Failure detection by heartbeats alone: a peer that keeps its connection open but falls
//! silent (as behind a partition that sends no reset) is declared down after the timeout.

mod common;

use std::time::{Duration, Instant};

use common::*;
use maquis::{MembershipEvent, NodeId, OverlayKind};
use maquis_proto::wire::handshake::HandshakeMsg;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// A node "ghost" that passes the handshake on a's membership lane and then does only what the
/// test makes it do. Its advertised address accepts connections and never answers, so its
/// other lanes never connect and nothing but the heartbeat timeout can notice it is gone.
async fn ghost(a: &maquis::Node, events: &mut Events) -> (TcpStream, tokio::task::JoinHandle<()>) {
    let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ghost = NodeId::new("ghost", sink.local_addr().unwrap(), 1);
    let sink_task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = sink.accept().await {
            held.push(s);
        }
    });
    let (mut s, transcript) = raw::hello(a.addr(), ghost, "membership").await;
    let cookie = b"test-cookie";
    let proof = transcript.dialer_proof(cookie);
    raw::write_msg(&mut s, &HandshakeMsg::Response { proof }).await;
    let HandshakeMsg::Accepted { proof } = raw::read_msg(&mut s).await else {
        panic!("expected the lane to be accepted")
    };
    assert!(transcript.verify_acceptor(cookie, &proof));
    next_event(
        events,
        Duration::from_secs(5),
        |e| matches!(e, MembershipEvent::Up(n) if &*n.name == "ghost"),
    )
    .await;
    (s, sink_task)
}

type Events = tokio::sync::broadcast::Receiver<MembershipEvent>;

fn ghost_down(e: &MembershipEvent) -> bool {
    matches!(e, MembershipEvent::Down(n) if &*n.name == "ghost")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_is_declared_down_by_heartbeat_timeout() {
    let a = start_with(config("hb1").overlay(OverlayKind::Static)).await;
    let mut events = a.subscribe();
    let (s, _sink) = ghost(&a, &mut events).await;
    // Now silence: the socket stays open, nothing is read or written.
    let silent_since = Instant::now();
    next_event(&mut events, Duration::from_secs(10), ghost_down).await;
    let took = silent_since.elapsed();
    // The test config uses a 1.5 s timeout checked every 200 ms.
    assert!(
        took >= Duration::from_millis(1300),
        "declared down too early: {took:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "declared down too late: {took:?}"
    );
    assert_eq!(member_names(&a), vec!["hb1"]);
    drop(s);
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_in_the_middle_of_a_large_frame_is_not_silent() {
    let a = start_with(config("hb2").overlay(OverlayKind::Static)).await;
    let mut events = a.subscribe();
    let (mut s, _sink) = ghost(&a, &mut events).await;
    // The start of a 1 MiB frame (length prefix, header length), then a byte every 100 ms
    // for twice the 1.5 s timeout: no complete frame arrives, but the peer is not silent.
    let mut start = (1u32 << 20).to_be_bytes().to_vec();
    start.extend_from_slice(&16u16.to_be_bytes());
    s.write_all(&start).await.unwrap();
    let trickle_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < trickle_until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.write_all(&[0]).await.unwrap();
        while let Ok(e) = events.try_recv() {
            assert!(
                !ghost_down(&e),
                "declared down while its frame was arriving"
            );
        }
    }
    assert_eq!(member_names(&a), vec!["ghost", "hb2"]);
    // Silence again: now the timeout applies.
    next_event(&mut events, Duration::from_secs(10), ghost_down).await;
    drop(s);
    a.shutdown().await;
}

/// Heartbeats sent by `n` while `during` runs.
async fn heartbeats_during(n: &maquis::Node, during: impl std::future::Future<Output = ()>) -> u64 {
    let before = n.counters().heartbeats_sent.get();
    during.await;
    n.counters().heartbeats_sent.get() - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_to_a_peer_stands_in_for_its_heartbeats() {
    let nodes = cluster("hbt", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let sink =
        b.spawn_fn(
            |mut inbox: maquis::Inbox<u64>| async move { while inbox.recv().await.is_some() {} },
        );
    b.register("sink", &sink).unwrap();
    let to_b = a.remote::<u64>("hbt2", "sink").unwrap();
    // The test config ticks every 200 ms: 10 ticks in each 2 s window.
    let window = Duration::from_secs(2);
    let idle = heartbeats_during(a, tokio::time::sleep(window)).await;
    let busy = heartbeats_during(a, async {
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < window {
            to_b.send(i).await.unwrap();
            i += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // Idle, a heartbeat goes at least every other tick (the one before counts as written);
    // busy, only the round-trip probe of every tenth tick.
    assert!(idle >= 3, "{idle} heartbeats to an idle peer in 2 s");
    assert!(
        busy <= 4,
        "{busy} heartbeats to a peer sent a message every 20 ms for 2 s"
    );
    for n in nodes {
        n.shutdown().await;
    }
}
