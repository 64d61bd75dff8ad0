//! What the handshake settles between two nodes: who proves the cookie first, and the largest
//! frame each end takes.

mod common;

use std::time::Duration;

use common::*;
use maquis::{NodeId, SendError};
use maquis_proto::wire::handshake::{HandshakeMsg, RejectCode};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_gets_nothing_to_test_cookie_guesses_against() {
    let a = start("hs1").await;
    let stranger = NodeId::new("stranger", "127.0.0.1:9".parse().unwrap(), 1);
    // The challenge carries the node's identity, a nonce and its frame limit: nothing computed
    // from the cookie (the message has no field for it).
    let (mut s, transcript) = raw::hello(a.addr(), stranger, "membership").await;
    assert_eq!(transcript.acceptor, *a.id());
    assert_eq!(
        transcript.acceptor_max_frame,
        a.config().transport.max_frame_bytes as u64
    );
    // A guess of the cookie is refused, and the refusal carries no proof either.
    let proof = transcript.dialer_proof(b"maquis");
    raw::write_msg(&mut s, &HandshakeMsg::Response { proof }).await;
    assert_eq!(
        raw::read_msg(&mut s).await,
        HandshakeMsg::Rejected {
            code: RejectCode::Auth,
            detail: "the proof of the cookie does not check".into(),
            proof: None,
        }
    );
    until("the failure is counted", Duration::from_secs(5), || {
        let n = a.counters().handshake_failures.get();
        async move { n >= 1 }
    })
    .await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_larger_than_the_receiver_takes_fails_at_the_sender() {
    let a = start("big1").await;
    let mut small = config("big2");
    small.transport.max_frame_bytes = 64 * 1024;
    let b = start_with(small).await;
    b.join_wait(a.addr(), Duration::from_secs(5)).await.unwrap();
    until("a and b see each other", Duration::from_secs(5), || {
        let ok = a.member("big2").is_some() && b.member("big1").is_some();
        async move { ok }
    })
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = b.spawn_fn(move |mut inbox: maquis::Inbox<Vec<u8>>| async move {
        while let Some(m) = inbox.recv().await {
            let _ = tx.send(m.len());
        }
    });
    b.register("sink", &sink).unwrap();
    let to_b = a.remote::<Vec<u8>>("big2", "sink").expect("b is a member");

    // Too large for b, though a would send it: refused at a, nothing written.
    let err = to_b.send(vec![7; 100_000]).await.unwrap_err();
    assert!(
        matches!(err, SendError::TooLarge { max: 65536, .. }),
        "{err:?}"
    );
    let err = to_b.try_send(vec![7; 100_000]).unwrap_err();
    assert!(matches!(err, SendError::TooLarge { .. }), "{err:?}");
    // The lanes stay up and a message that fits arrives.
    to_b.send(vec![1; 60_000]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("the message that fits arrives");
    assert_eq!(got, Some(60_000));
    assert_eq!(
        b.counters().bad_frames.get(),
        0,
        "b never saw a frame too large"
    );
    // The other way, b's own limit applies.
    let back = b.remote::<Vec<u8>>("big1", "echo").expect("a is a member");
    let err = back.send(vec![0; 100_000]).await.unwrap_err();
    assert!(
        matches!(err, SendError::TooLarge { max: 65536, .. }),
        "{err:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_cookie_shows_in_the_status_of_both_nodes() {
    let a = start("ck-a").await;
    // b keeps trying its configured contact, as `maquis node --join` does.
    let mut cfg = config("ck-b").cookie("not-the-cookie");
    cfg.node.peers = vec![a.addr()];
    let b = start_with(cfg).await;
    until(
        "both nodes list the refusal",
        Duration::from_secs(10),
        || {
            let (sa, sb) = (a.status(), b.status());
            let ok = sa
                .refusals
                .iter()
                .any(|r| r.by_us && r.reason.contains("cookie"))
                && sb.refusals.iter().any(|r| {
                    !r.by_us
                        && r.addr == a.addr().to_string()
                        && r.reason.contains("authentication")
                });
            async move { ok }
        },
    )
    .await;
    assert_eq!(b.members().len(), 1, "b never joined");
    let table = b.status().render_table();
    assert!(table.contains("refused handshakes:"), "{table}");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_of_a_name_in_use_is_refused() {
    let a = start("dup-a").await;
    let b = start("dup-b").await;
    b.join_wait(a.addr(), Duration::from_secs(5)).await.unwrap();
    until("a sees b", Duration::from_secs(5), || {
        let ok = a.member("dup-b").is_some();
        async move { ok }
    })
    .await;
    let original = b.id().clone();
    // Another process started with the same name (on another port).
    let impostor = start("dup-b").await;
    let err = impostor
        .join_wait(a.addr(), Duration::from_secs(5))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("already"), "{text}");
    assert!(text.contains(&original.addr.to_string()), "{text}");
    // The original keeps its identity in the cluster.
    assert_eq!(a.member("dup-b"), Some(original.clone()));
    assert_eq!(impostor.members().len(), 1);
    // A restart of the original still joins, once a has seen its old process go.
    let mut events = a.subscribe();
    b.shutdown().await;
    next_event(
        &mut events,
        Duration::from_secs(5),
        |e| matches!(e, maquis::MembershipEvent::Down(n) if *n == original),
    )
    .await;
    let restarted = start("dup-b").await;
    restarted
        .join_wait(a.addr(), Duration::from_secs(5))
        .await
        .unwrap();
    until("a sees the restarted b", Duration::from_secs(5), || {
        let ok = a.member("dup-b").as_ref() == Some(restarted.id());
        async move { ok }
    })
    .await;
    a.shutdown().await;
    impostor.shutdown().await;
    restarted.shutdown().await;
}

/// Opens a connection from `source` that never says anything.
async fn silent_from(source: &str, to: std::net::SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{source}:0").parse().unwrap()).unwrap();
    sock.connect(to).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_cannot_hold_every_handshake_slot() {
    let mut cfg = config("slots-a");
    cfg.transport.max_pending_handshakes = 8;
    cfg.transport.max_pending_handshakes_per_source = 4;
    // Long enough that, without the share, the silent connections would hold every slot for
    // longer than b's join may take.
    cfg.transport.unauthenticated_timeout_ms = 3000;
    let a = start_with(cfg).await;
    // Another address of the loopback range plays the misbehaving source: it opens twice
    // its share of connections and never speaks.
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(silent_from("127.0.0.2", a.addr()).await);
    }
    until(
        "the connections beyond the share are closed",
        Duration::from_secs(5),
        || {
            let n = a.counters().handshakes_refused.get();
            async move { n >= 4 }
        },
    )
    .await;
    // A node from another address still joins, at once.
    let b = start("slots-b").await;
    b.join_wait(a.addr(), Duration::from_secs(2)).await.unwrap();
    // The silent ones are closed once the unauthenticated stage runs out: each reads the end
    // of the stream.
    for mut s in silent {
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("closed before the test's limit")
            .unwrap_or(0);
        assert_eq!(n, 0, "the node sent nothing to a silent connection");
    }
    // Each is counted as its handshake task ends, just after the socket closes.
    until(
        "the silent connections are counted as failed handshakes",
        Duration::from_secs(5),
        || {
            let n = a.counters().handshake_failures.get();
            async move { n >= 4 }
        },
    )
    .await;
    a.shutdown().await;
    b.shutdown().await;
}

/// Two nodes with more lanes to each other (1 + 16 + 16 + 16) than a listener takes handshakes
/// at once from one address (`max_pending_handshakes_per_source`, 32): every lane connects and
/// neither refuses a single connection, as each dials at most half that many at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_lanes_connect_without_a_refused_handshake() {
    let wide = |name: &str| {
        config(name)
            .parallelism(16)
            .channel("vnode", Some(16))
            .channel("bulk", Some(16))
    };
    let a = start_with(wide("wide-a")).await;
    let b = start_with(wide("wide-b")).await;
    b.join_wait(a.addr(), Duration::from_secs(5)).await.unwrap();
    for (x, y) in [(&a, &b), (&b, &a)] {
        let peer = y.id().name.to_string();
        until("every lane connected", Duration::from_secs(10), || {
            let lanes = x.lanes_connected(&peer);
            async move { lanes.len() == 4 && lanes.iter().all(|(_, up, want)| up == want) }
        })
        .await;
    }
    assert_eq!(a.counters().handshakes_refused.get(), 0);
    assert_eq!(b.counters().handshakes_refused.get(), 0);
    a.shutdown().await;
    b.shutdown().await;
}
