//! Failure detection by heartbeats alone: a peer that keeps its connection open but falls
//! silent (as behind a partition that sends no reset) is declared down after the timeout.

mod common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::*;
use maquis::wire::handshake::{self, HandshakeDecoder, HandshakeMsg};
use maquis::{LaneId, MembershipEvent, NodeId, OverlayKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Decoder;

async fn read_msg(s: &mut TcpStream) -> HandshakeMsg {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let n = u32::from_be_bytes(len) as usize;
    let mut buf = BytesMut::from(&len[..]);
    buf.resize(4 + n, 0);
    s.read_exact(&mut buf[4..]).await.unwrap();
    HandshakeDecoder.decode(&mut buf).unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_is_declared_down_by_heartbeat_timeout() {
    let a = start_with(config("hb1").overlay(OverlayKind::Static)).await;
    let mut events = a.subscribe();
    // The ghost's advertised address accepts connections and never answers, so the other lanes
    // never connect and nothing but the heartbeat timeout can notice the ghost is gone.
    let sink = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ghost = NodeId::new("ghost", sink.local_addr().unwrap(), 1);
    let _sink_task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = sink.accept().await {
            held.push(s);
        }
    });

    // The ghost dials a's membership lane and passes the handshake (it knows the cookie).
    let mut s = TcpStream::connect(a.addr()).await.unwrap();
    let lane = LaneId::new("membership", 0);
    let nonce = handshake::new_nonce();
    let hello = HandshakeMsg::Hello {
        magic: handshake::MAGIC,
        version: handshake::VERSION,
        node: ghost.clone(),
        lane: lane.clone(),
        nonce,
        channels: vec![("membership".into(), 1), ("default".into(), 1)],
    };
    s.write_all(&handshake::encode_handshake(&hello).unwrap())
        .await
        .unwrap();
    let HandshakeMsg::Challenge {
        node: acceptor,
        nonce: theirs,
        proof,
    } = read_msg(&mut s).await
    else {
        panic!("expected a challenge")
    };
    let cookie = b"test-cookie";
    assert!(handshake::verify_acceptor(
        cookie, &ghost, &acceptor, &lane, &nonce, &theirs, &proof
    ));
    let proof = handshake::dialer_proof(cookie, &ghost, &acceptor, &lane, &nonce, &theirs);
    s.write_all(&handshake::encode_handshake(&HandshakeMsg::Response { proof }).unwrap())
        .await
        .unwrap();
    assert_eq!(read_msg(&mut s).await, HandshakeMsg::Accepted);

    next_event(
        &mut events,
        Duration::from_secs(5),
        |e| matches!(e, MembershipEvent::Up(n) if n.name == "ghost"),
    )
    .await;
    // Now silence: the socket stays open, nothing is read or written.
    let silent_since = Instant::now();
    next_event(
        &mut events,
        Duration::from_secs(10),
        |e| matches!(e, MembershipEvent::Down(n) if n.name == "ghost"),
    )
    .await;
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
