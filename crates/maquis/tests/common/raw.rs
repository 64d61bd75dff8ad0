//! The handshake spoken by hand over a socket, as a stranger (or a node a test plays) would.

use std::net::SocketAddr;

use bytes::BytesMut;
use maquis::{LaneId, NodeId};
use maquis_proto::wire::handshake::{self, HandshakeDecoder, HandshakeMsg, Transcript};
use maquis_proto::wire::StreamDecoder;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The frame limit the hand-made dialer announces.
pub const MAX_FRAME: u64 = 1 << 20;

/// Reads one handshake message.
pub async fn read_msg<S: AsyncRead + Unpin>(s: &mut S) -> HandshakeMsg {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.unwrap();
    let n = u32::from_be_bytes(len) as usize;
    let mut buf = BytesMut::from(&len[..]);
    buf.resize(4 + n, 0);
    s.read_exact(&mut buf[4..]).await.unwrap();
    HandshakeDecoder.decode(&mut buf).unwrap().unwrap()
}

/// Writes one handshake message.
pub async fn write_msg<S: AsyncWrite + Unpin>(s: &mut S, msg: &HandshakeMsg) {
    s.write_all(&handshake::encode_handshake(msg).unwrap())
        .await
        .unwrap();
}

/// Connects to `to` as node `me` for `lane` (index 0), sends the `Hello` and reads the
/// `Challenge`; returns the connection and the transcript both proofs are over.
pub async fn hello(to: SocketAddr, me: NodeId, lane: &str) -> (TcpStream, Transcript) {
    let s = TcpStream::connect(to).await.unwrap();
    hello_on(s, me, lane).await
}

/// [`hello`] over a connection already open (e.g. TLS).
pub async fn hello_on<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    me: NodeId,
    lane: &str,
) -> (S, Transcript) {
    let lane = LaneId::new(lane, 0);
    let nonce = handshake::new_nonce();
    let msg = HandshakeMsg::Hello {
        magic: handshake::MAGIC,
        version: handshake::VERSION,
        node: me.clone(),
        lane: lane.clone(),
        nonce,
        channels: vec![("membership".into(), 1), ("default".into(), 1)],
        max_frame: MAX_FRAME,
    };
    write_msg(&mut s, &msg).await;
    let HandshakeMsg::Challenge {
        node,
        nonce: theirs,
        max_frame,
    } = read_msg(&mut s).await
    else {
        panic!("expected a challenge")
    };
    let transcript = Transcript {
        dialer: me,
        acceptor: node,
        lane,
        dialer_nonce: nonce,
        acceptor_nonce: theirs,
        dialer_max_frame: MAX_FRAME,
        acceptor_max_frame: max_frame,
    };
    (s, transcript)
}
