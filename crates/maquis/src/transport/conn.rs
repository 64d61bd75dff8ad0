//! One connection's life: TLS when it is on, the handshake (both roles), installing it on its
//! lane, and the reader that hands frames on until the connection dies.
//!
//! # TLS
//!
//! With `transport.tls` on, both roles wrap the TCP connection in TLS ([`crate::tls`]) before the
//! handshake, and everything below runs inside it ([`Stream`]). The acceptor's TLS handshake
//! counts in its unauthenticated stage (below), so a source that opens TCP and never finishes
//! TLS holds its handshake slot no longer than one that never proves the cookie. The TLS layer
//! checks the other end's certificate chain; the name it must carry is checked here, as soon as
//! the handshake tells it: the acceptor checks the dialer's certificate against the node of its
//! `Hello` (and refuses with `Refused`), the dialer the acceptor's against the node of its
//! `Challenge` (before it sends its proof). A TLS failure is a `ConnError::Tls`, a refusal like a
//! wrong cookie: counted, listed and logged. Without TLS, bytes that look like a TLS record where
//! a handshake message's length should be are refused as `Incompatible` ("the other node speaks
//! TLS").
//!
//! # Handshake
//!
//! The messages, proofs and reject codes are in `maquis_proto::wire::handshake`, the two sides as
//! state machines without I/O in `maquis_proto::wire::auth` (`Dialer`, `Acceptor`: a message out of
//! order ends the handshake, a refusal carries a code). This module drives them over the socket
//! under `transport.handshake_timeout_ms`, and decides what needs the node's state between the
//! acceptor's `Authenticated` and its accept or reject. Every message is `[u32 BE
//! length][postcard]`, at most 16 KiB.
//!
//! 1. Dialer → `Hello { magic "MAQS", version, node, lane, nonce, channels, max_frame }`.
//! 2. The acceptor checks magic and version (else `Rejected { code: Version }`), then →
//!    `Challenge { node, nonce, max_frame }`: nothing computed from the cookie, so a stranger
//!    learns nothing it could test guesses of the cookie against.
//! 3. The dialer checks, when redialing a known peer, that the acceptor is the same
//!    incarnation; → `Response { proof }`, `proof = HMAC-SHA256(cookie, "maquis-dialer-v3" ‖
//!    postcard(transcript))` over both identities, the lane, both nonces and both limits.
//! 4. The acceptor verifies it (else `Rejected { code: Auth }`, counted in
//!    `handshake_failures`), refuses another channel table (`Incompatible`) or a dialer with
//!    its own name (`SameName`); then this module refuses an unknown lane (`UnknownLane`) or an
//!    incarnation older than the one it knows (`Refused`; a newer one replaces the old peer,
//!    which is reported down), and asks the lane (`offer_incoming`, see the tie-break in
//!    [`crate::transport`]) → `Accepted { proof }` with its own proof (label
//!    `maquis-acceptor-v3`), or `Rejected { code: Superseded, proof }`.
//! 5. The dialer verifies the acceptor's proof before it uses the connection.
//!
//! Each side keeps the other's `max_frame`: the router sends a peer no frame larger than it
//! takes (`TooLarge` at the sender), and a lane's writer drops, and counts, a frame queued
//! before the limit was known that turns out too large.
//!
//! A join (`Node::join`, `join_wait`) dials the membership lane of an address whose identity
//! it does not know yet ([`dial`] with no expected peer), installs it, and reports to the
//! control loop, which tells the overlay. If the contact is dialing at the same moment and
//! wins the tie, the join waits for the contact's connection instead.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use futures::StreamExt;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, FramedRead};

use crate::wire::StreamDecoder;

use super::lane::{ConnInfo, Offer};
use super::peer::{Peer, PeerRefused};
use super::stream::{ReadHalf, Stream};
use super::stripe::{PeerRooms, Tried};
use super::widen::LanePlace;
use super::{Host, LaneEvent};
use crate::error::ConnError;
use crate::id::{LaneId, NodeId};
use crate::throttle::Throttle;
use crate::wire::frame::{Frame, FrameDecoder, Header};
use crate::wire::handshake::{self, HandshakeDecoder, HandshakeMsg, MAX_HANDSHAKE_FRAME};
use crate::wire::WireError;
use crate::wire::{Acceptor, AcceptorStep, Dialer, DialerStep, HandshakeError, RejectCode};
use crate::wire::{Held, OrderingQueue, PiecesOn, Window};

/// Why a reader ended when the other end closed its side cleanly.
const END_OF_STREAM: &str = "end of stream";

// A lane's read buffer (grows for large frames, up to the frame limit), and the smallest buffer
// a frame that has not fully arrived moves into: reads of small frames stay this large rather
// than shrinking to the decoder's 8 KiB (eight times the reads).
use crate::payload::READ_BUFFER;

/// Sets a lane's TCP options: no Nagle delay, and `TCP_NOTSENT_LOWAT` (Linux) of `unsent`
/// bytes (`transport.unsent_bytes`; 0 leaves the kernel's default). What the kernel has queued
/// but not sent is a queue the lane's writer cannot reorder, so a small frame written between
/// two parts of a large one ([`super::schedule`]) waits behind at most this much; bytes in
/// flight (sent, not acknowledged) are not limited by it.
fn tune(tcp: &TcpStream, unsent: usize) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    #[cfg(target_os = "linux")]
    if unsent > 0 {
        use std::os::fd::AsRawFd;
        let value = libc::c_int::try_from(unsent).unwrap_or(libc::c_int::MAX);
        // SAFETY: the descriptor is an open TCP socket for the duration of the call, and the
        // option value is a `c_int` passed with its size.
        let r = unsafe {
            libc::setsockopt(
                tcp.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

async fn write_msg(s: &mut Stream, msg: &HandshakeMsg) -> Result<(), ConnError> {
    let buf = handshake::encode_handshake(msg)?;
    s.write_all(&buf).await?;
    s.flush().await?;
    Ok(())
}

/// A wire decoder driven by `FramedRead`.
struct Codec<D>(D);

impl<D: StreamDecoder> Decoder for Codec<D> {
    type Item = D::Item;
    type Error = crate::wire::WireError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<D::Item>, Self::Error> {
        self.0.decode(src)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<D::Item>, Self::Error> {
        match self.0.decode(src)? {
            Some(item) => Ok(Some(item)),
            None if src.is_empty() => Ok(None),
            // The other end stopped writing inside a frame: it exited or was killed with the
            // frame half written. A lost connection, like a reset, not bad data.
            None => Err(WireError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection ended inside a frame",
            ))),
        }
    }
}

/// Whether the first bytes read are those of a TLS record (a handshake or an alert, of TLS
/// 1.0 to 1.3) rather than a handshake message's length, which is at most 16 KiB and so
/// starts with a zero byte.
fn looks_like_tls(first: &[u8; 4]) -> bool {
    matches!(first[0], 0x15 | 0x16) && first[1] == 0x03 && first[2] <= 0x04
}

/// Reads exactly one handshake message (never more bytes than it spans, so nothing that
/// follows the handshake is lost).
async fn read_msg(s: &mut Stream) -> Result<HandshakeMsg, ConnError> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await?;
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_HANDSHAKE_FRAME {
        if looks_like_tls(&len) {
            return Err(ConnError::Incompatible(
                "the other node speaks TLS, and transport.tls is off on this node".into(),
            ));
        }
        return Err(ConnError::Protocol(format!(
            "handshake message of {n} bytes"
        )));
    }
    let mut buf = BytesMut::with_capacity(4 + n);
    buf.extend_from_slice(&len);
    buf.resize(4 + n, 0);
    s.read_exact(&mut buf[4..]).await?;
    HandshakeDecoder
        .decode(&mut buf)?
        .ok_or_else(|| ConnError::Protocol("truncated handshake message".into()))
}

/// Serves an incoming connection: TLS (when on), handshake, lane decision, then reading.
pub(crate) async fn accept<H: Host>(inner: Arc<H>, tcp: TcpStream, remote: SocketAddr) {
    if let Err(e) = tune(&tcp, inner.config().transport.unsent_bytes) {
        tracing::debug!(%remote, error = %e, "lane socket options not set");
    }
    let transport = &inner.config().transport;
    let limit = Duration::from_millis(transport.handshake_timeout_ms);
    // Until the dialer has proved the cookie (and, with TLS, shown its certificate first), it
    // gets only a short time.
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(transport.unauthenticated_timeout_ms);
    let result = match tokio::time::timeout(limit, accept_handshake(&inner, tcp, deadline)).await {
        Ok(r) => r,
        Err(_) => Err(ConnError::Timeout),
    };
    match result {
        Ok(Some((peer, slot, max_frame, stream, arriving))) => {
            install(&inner, &peer, slot, stream, false, max_frame).await;
            drop(arriving);
        }
        Ok(None) => {}
        Err(ConnError::Io(e)) => {
            // A peer that goes away mid-handshake (shutting down, or a cancelled dial).
            inner.counters().handshake_failures.inc();
            tracing::debug!(%remote, error = %e, "incoming connection closed during the handshake");
        }
        Err(e) if inner.shutdown().is_cancelled() => {
            // Refused because this node is stopping: expected, nothing to warn about.
            tracing::debug!(%remote, reason = %e, "incoming connection refused while stopping");
        }
        Err(e) => {
            // One line per source a minute at most (the host counts), and one a second for all
            // sources together.
            static WARN: Throttle = Throttle::new(Duration::from_secs(1));
            inner.counters().handshake_failures.inc();
            // On an incoming connection this node does the refusing, except when the other
            // one refused this node's certificate (a TLS alert received).
            let by_us = !matches!(e, ConnError::Tls { by_us: false, .. });
            if let Some(refusals) = inner.on_refused(remote, by_us, &e.to_string()) {
                if let Some(held) = WARN.allow() {
                    tracing::warn!(%remote, reason = %e, refusals, other_lines_held = held, "incoming connection refused");
                }
            }
        }
    }
}

/// An accepted connection, the peer and lane slot it serves, the largest frame the peer
/// takes, and the lane's mark that it is in hand.
type Accepted = (Arc<Peer>, usize, u64, Stream, super::peer::Arriving);

async fn accept_handshake<H: Host>(
    inner: &Arc<H>,
    tcp: TcpStream,
    deadline: tokio::time::Instant,
) -> Result<Option<Accepted>, ConnError> {
    let mut stream = match inner.tls() {
        None => Stream::Plain(tcp),
        Some(tls) => {
            let handshake = tokio_rustls::TlsAcceptor::from(tls.server.clone()).accept(tcp);
            let tls = tokio::time::timeout_at(deadline, handshake)
                .await
                .map_err(|_| ConnError::Protocol("no TLS handshake in time".into()))??;
            Stream::Tls(Box::new(tls.into()))
        }
    };
    let s = &mut stream;
    let me = inner.id();
    let mut acc = Acceptor::new(
        me.clone(),
        inner.cookie(),
        inner.dispatch().table(),
        inner.config().transport.max_frame_bytes as u64,
        handshake::new_nonce(),
    );
    let (dialer, lane, max_frame) = loop {
        let msg = tokio::time::timeout_at(deadline, read_msg(s))
            .await
            .map_err(|_| ConnError::Protocol("no proof of the cookie in time".into()))??;
        if let HandshakeMsg::Hello { node, .. } = &msg {
            // With TLS, the dialer's certificate must name the node it says it is.
            if let Err(why) = s.check_peer_name(&node.name) {
                let (reply, _) = acc.reject(RejectCode::Refused, why.clone());
                let _ = write_msg(s, &reply).await;
                return Err(ConnError::Tls {
                    reason: format!("{node}: {why}"),
                    by_us: true,
                });
            }
        }
        match acc.handle(msg) {
            AcceptorStep::Send(msg) => {
                if inner.shutdown().is_cancelled() {
                    let (reply, e) = acc.reject(RejectCode::Refused, "shutting down".into());
                    let _ = write_msg(s, &reply).await;
                    return Err(conn_error(e, None));
                }
                write_msg(s, &msg).await?;
            }
            AcceptorStep::Authenticated {
                dialer,
                lane,
                max_frame,
            } => break (dialer, lane, max_frame),
            AcceptorStep::Refuse { reply, error } => {
                if let Some(reply) = reply {
                    let _ = write_msg(s, &reply).await;
                }
                return Err(conn_error(error, None));
            }
        }
    };
    // What only this node's state can decide: is the lane known, is the dialer older than an
    // incarnation we know, which of two crossing connections stays.
    let refuse = |acc: &mut Acceptor, code, detail: String| {
        let (reply, e) = acc.reject(code, detail);
        (reply, conn_error(e, None))
    };
    let Some(slot) = inner.dispatch().slot_of(&lane.channel, lane.index) else {
        let (reply, e) = refuse(
            &mut acc,
            RejectCode::UnknownLane,
            format!("unknown lane {lane}"),
        );
        write_msg(s, &reply).await?;
        return Err(e);
    };
    let (peer, arriving) = match inner.peer_for(&dialer, slot) {
        Ok(p) => p,
        Err(why) => {
            let code = match why {
                PeerRefused::Duplicate { .. } => RejectCode::DuplicateName,
                PeerRefused::Stale(_) | PeerRefused::ShuttingDown => RejectCode::Refused,
            };
            let (reply, e) = refuse(&mut acc, code, why.to_string());
            write_msg(s, &reply).await?;
            return Err(e);
        }
    };
    match peer.lanes[slot].offer_incoming(dialer.wins_tie_against(me)) {
        Offer::Accept => {
            let accepted = acc
                .accept()
                .ok_or_else(|| ConnError::Protocol("accepted an unauthenticated dialer".into()))?;
            write_msg(s, &accepted).await?;
            Ok(Some((peer, slot, max_frame, stream, arriving)))
        }
        Offer::Reject(why) => {
            let (reply, _) = acc.reject(RejectCode::Superseded, why.to_string());
            write_msg(s, &reply).await?;
            Ok(None)
        }
    }
}

/// The runtime's error for a failed handshake; `acceptor` is the node a dialer reached.
fn conn_error(e: HandshakeError, acceptor: Option<&NodeId>) -> ConnError {
    match e {
        HandshakeError::Auth(who) => ConnError::Auth(format!("{who} does not know the cookie")),
        HandshakeError::Rejected {
            code: RejectCode::Superseded,
            detail,
        } => match acceptor {
            Some(a) => ConnError::Superseded(a.clone()),
            None => ConnError::Rejected(detail),
        },
        HandshakeError::Rejected {
            code: RejectCode::Incompatible | RejectCode::Version,
            detail,
        }
        | HandshakeError::Refused {
            code: RejectCode::Incompatible | RejectCode::Version,
            detail,
        } => ConnError::Incompatible(detail),
        HandshakeError::Rejected { code, detail } => {
            ConnError::Rejected(format!("{code}: {detail}"))
        }
        other => ConnError::Protocol(other.to_string()),
    }
}

/// A connection whose dialer's handshake succeeded.
pub(crate) struct Dialed {
    /// The node reached.
    pub(crate) node: NodeId,
    /// The largest frame it accepts.
    pub(crate) max_frame: u64,
    /// The connection.
    pub(crate) stream: Stream,
}

/// Dials `addr` for `lane` and runs the dialer's side of the handshake. With `expect`, the
/// acceptor must be exactly that node (a restarted node has a new incarnation and fails here).
pub(crate) async fn dial<H: Host>(
    inner: &H,
    addr: SocketAddr,
    lane: &LaneId,
    expect: Option<&NodeId>,
) -> Result<Dialed, ConnError> {
    let limit = std::time::Duration::from_millis(inner.config().transport.handshake_timeout_ms);
    match tokio::time::timeout(limit, dial_inner(inner, addr, lane, expect)).await {
        Ok(r) => r,
        Err(_) => Err(ConnError::Timeout),
    }
}

async fn dial_inner<H: Host>(
    inner: &H,
    addr: SocketAddr,
    lane: &LaneId,
    expect: Option<&NodeId>,
) -> Result<Dialed, ConnError> {
    let tcp = TcpStream::connect(addr).await?;
    tune(&tcp, inner.config().transport.unsent_bytes)?;
    let mut s = match inner.tls() {
        None => Stream::Plain(tcp),
        Some(tls) => {
            // The chain is verified here, the name once the acceptor says who it is.
            let name = ServerName::IpAddress(addr.ip().into());
            let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
            Stream::Tls(Box::new(connector.connect(name, tcp).await?.into()))
        }
    };
    let (mut d, hello) = Dialer::new(
        inner.id().clone(),
        lane.clone(),
        inner.dispatch().table(),
        inner.config().transport.max_frame_bytes as u64,
        inner.cookie(),
        handshake::new_nonce(),
        expect.cloned(),
    );
    write_msg(&mut s, &hello).await?;
    loop {
        let msg = read_msg(&mut s).await?;
        if let HandshakeMsg::Challenge { node, .. } = &msg {
            // With TLS, the acceptor's certificate must name the node it says it is.
            s.check_peer_name(&node.name)
                .map_err(|why| ConnError::Tls {
                    reason: format!("{node}: {why}"),
                    by_us: true,
                })?;
        }
        match d.handle(msg) {
            Ok(DialerStep::Send(msg)) => write_msg(&mut s, &msg).await?,
            Ok(DialerStep::Established {
                acceptor,
                max_frame,
            }) => {
                return Ok(Dialed {
                    node: acceptor,
                    max_frame,
                    stream: s,
                })
            }
            Err(e) => return Err(conn_error(e, d.acceptor())),
        }
    }
}

/// Makes an authenticated connection the lane's connection, starts its reader, and tells the
/// control loop. `max_frame` is the largest frame the peer said it accepts.
pub(crate) async fn install<H: Host>(
    inner: &Arc<H>,
    peer: &Arc<Peer>,
    slot: usize,
    stream: Stream,
    dialed_by_me: bool,
    max_frame: u64,
) {
    if inner.shutdown().is_cancelled() || peer.abort.is_cancelled() {
        return;
    }
    let round_trip = stream.round_trip();
    let (read, write) = stream.into_split();
    let info = ConnInfo::new(inner.next_conn_id(), dialed_by_me, peer.abort.child_token());
    peer.max_frame.store(max_frame, Ordering::Relaxed);
    let lane = &peer.lanes[slot];
    let us = round_trip.map_or(0, |rtt| u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX));
    lane.metrics.round_trip_us.store(us, Ordering::Relaxed);
    let limit = usize::try_from(max_frame).unwrap_or(usize::MAX);
    let peer_wins_tie = peer.id.wins_tie_against(inner.id());
    let replaced = match lane.install(info.clone(), write, limit, peer_wins_tie) {
        Ok(replaced) => replaced,
        Err(mut write) => {
            // Both dialed; the peer's connection serves on both ends, and the peer closes
            // this one as this end does.
            tracing::debug!(node = %inner.id().name, peer = %peer.id, lane = %lane.id, "own dial closed: the peer's connection serves");
            drop(read);
            tokio::spawn(async move {
                let _ = write.shutdown().await;
            });
            return;
        }
    };
    tracing::debug!(node = %inner.id().name, peer = %peer.id, lane = %lane.id, dialed_by_me, ?replaced, ?round_trip, "lane connected");
    crate::stages::spawn(
        inner.stages(),
        crate::stages::Stage::Receive,
        read_loop(inner.clone(), peer.clone(), slot, read, info),
    );
    peer.changed.notify_waiters();
    inner
        .on_lane(LaneEvent::Up {
            peer: peer.id.clone(),
            slot,
        })
        .await;
}

async fn read_loop<H: Host>(
    inner: Arc<H>,
    peer: Arc<Peer>,
    slot: usize,
    read: ReadHalf,
    info: ConnInfo,
) {
    let lane = peer.lanes[slot].clone();
    // Pieces of striped frames are read straight into their frames' memory.
    let rooms = Arc::new(PeerRooms::new(peer.clone()));
    let decoder = FrameDecoder::new(inner.config().transport.max_frame_bytes)
        .read_buffer(READ_BUFFER)
        .pieces_into(rooms.clone());
    let counted = Counted {
        inner: read,
        lane: lane.clone(),
        node: inner.clone(),
        peer: peer.clone(),
    };
    let mut frames = FramedRead::with_capacity(counted, Codec(decoder), READ_BUFFER);
    // How long a striped frame's commit waits for its pieces before it is dropped.
    let patience = Duration::from_millis(inner.config().transport.heartbeat_timeout_ms);
    // One wait for the whole loop: made anew for every frame, it registered with the token
    // and left it again each time.
    let cancelled = info.cancel.cancelled();
    tokio::pin!(cancelled);
    // Frames behind striped frames still missing pieces (commits come on ordering lanes).
    let mut ordering = OrderingQueue::new(HELD_FRAMES, HELD_BYTES);
    let mut front = Front::default();
    // A barrier across the channel's lanes this reader stopped at, and the first frame read
    // behind it (pieces of striped frames before that are still taken in). No commit ahead of
    // a barrier waits for a piece behind one: the sender queues a commit after its pieces.
    let place = lane_place(inner.dispatch(), slot);
    let mut barrier: Option<AtBarrier> = None;
    // The peer learns of this node's window for its striped frames (and of a new table, after
    // this node dropped it) as soon as it can send them.
    // And the peer announces its own on this connection, perhaps of a new table.
    let mut conn_number = None;
    if slot == inner.dispatch().membership_slot() {
        conn_number = Some(peer.stripes_out.connected());
        let window = peer.stripes_in.window();
        super::stripe::announce(&peer, slot, window, inner.counters());
    }
    let mut kept: Option<Frame> = None;
    let reason = loop {
        // Most of the time nothing waits: no per-frame work then.
        if !ordering.is_empty() {
            if let Err(e) =
                hand_on_front(&*inner, &peer, place, &mut ordering, &mut front, patience).await
            {
                break bad_frame(&*inner, &peer, &lane, e);
            }
        }
        let mut next = None;
        if let Some(b) = &mut barrier {
            match b.step(&peer, place, ordering.is_empty(), patience) {
                Ok(true) => {
                    barrier = None;
                    next = kept.take().map(Ok);
                }
                Ok(false) => {}
                Err(e) => break bad_frame(&*inner, &peer, &lane, e),
            }
        }
        if next.is_none() {
            let waiting = front.deadline.is_some();
            let arrived = barrier.as_ref().and_then(|b| b.deadline);
            next = tokio::select! {
                _ = &mut cancelled => break "closed".to_string(),
                f = frames.next(), if !ordering.is_full() && kept.is_none() => {
                    if let Some(Ok(_)) = &f {
                        lane.metrics.msgs_in.fetch_add(1, Ordering::Relaxed);
                    }
                    f
                }
                _ = peer.stripes_in.changed_since(front.seen), if waiting => continue,
                _ = sleep_until(front.deadline), if waiting => {
                    give_up_front(&*inner, &peer, &mut ordering, &mut front);
                    continue;
                }
                _ = released(&peer, place, barrier.as_ref()), if arrived.is_some() => continue,
                _ = sleep_until(arrived), if arrived.is_some() => {
                    if barrier.as_mut().is_some_and(|b| b.still_coming(&peer, place, patience)) {
                        continue;
                    }
                    if let Some(b) = barrier.take() {
                        peer.barriers_in.give_up(place.channel, b.epoch);
                        inner.counters().barriers_given_up.inc();
                    }
                    match kept.take() {
                        Some(f) => Some(Ok(f)),
                        None => continue,
                    }
                }
            };
        }
        match next {
            Some(Ok(frame)) => {
                // Pieces and windows are the transport's own, and pass barriers.
                if let Header::Stripe {
                    session,
                    id,
                    offset,
                    total,
                } = frame.header
                {
                    match peer
                        .stripes_in
                        .part(session, id, offset, total, frame.payload)
                    {
                        Ok(()) => continue,
                        Err(e) => break bad_frame(&*inner, &peer, &lane, e),
                    }
                }
                if let Header::StripeWindow {
                    session,
                    low,
                    limit,
                    bytes,
                } = frame.header
                {
                    let window = Window {
                        session,
                        low,
                        limit,
                        bytes,
                    };
                    peer.stripes_out.grant(window, conn_number);
                    continue;
                }
                if barrier.is_some() {
                    kept = Some(frame);
                    continue;
                }
                if let Header::Barrier { epoch, lanes } = frame.header {
                    barrier = Some(AtBarrier {
                        epoch,
                        lanes,
                        deadline: None,
                        behind: Vec::new(),
                    });
                    continue;
                }
                if let Some(now) = ordering.admit(frame) {
                    inner.on_frame(&peer, now).await;
                }
            }
            Some(Err(WireError::Io(e))) if !is_tls_error(&e) => {
                // The connection ended without a clean close (reset, or TLS cut short): lost,
                // not bad data.
                break e.to_string();
            }
            Some(Err(e)) => break bad_frame(&*inner, &peer, &lane, e),
            None => break END_OF_STREAM.to_string(),
        }
    };
    // What was read and waits is handed on: after a clean end, the striped frames still
    // missing pieces get their patience (their pieces come on other connections); otherwise
    // they are given up.
    while !ordering.is_empty() {
        if hand_on_front(&*inner, &peer, place, &mut ordering, &mut front, patience)
            .await
            .is_err()
        {
            break;
        }
        if front.deadline.is_some() {
            if reason == END_OF_STREAM {
                tokio::select! {
                    _ = peer.stripes_in.changed_since(front.seen) => continue,
                    _ = sleep_until(front.deadline) => {}
                }
            }
            give_up_front(&*inner, &peer, &mut ordering, &mut front);
        }
    }
    if reason != END_OF_STREAM {
        // Pieces of striped frames may have been lost with it.
        peer.stripes_in.lane_lost(rooms.reading(), place);
        announce_window(&*inner, &peer);
    }
    if let Some(conn) = conn_number {
        // The peer may drop this node before it connects again: large frames go whole until
        // it says which table it has.
        peer.stripes_out.lost(conn);
    }
    if reason == END_OF_STREAM {
        // The other end closed its side on purpose: the write in progress here still goes out
        // (it reads until it cuts the connection), then the writer lets the connection go.
        info.ended.cancel();
    } else {
        info.cancel.cancel();
    }
    lane.metrics.readers_ended.fetch_add(1, Ordering::Relaxed);
    if lane.clear(info.id) {
        tracing::debug!(node = %inner.id().name, peer = %peer.id, lane = %lane.id, %reason, "lane disconnected");
        peer.changed.notify_waiters();
        inner
            .on_lane(LaneEvent::Down {
                peer: peer.id.clone(),
                slot,
            })
            .await;
    }
}

/// A barrier a reader stopped at ([`super::widen`]).
///
/// Once this lane has arrived it waits for the others up to `patience` (the heartbeat
/// timeout) at a time: a lane yet to arrive that has read more bytes on the same connection
/// since the last look is behind, not lost (the barrier comes after those bytes on it), so the
/// wait goes on; so is one stopped at an earlier barrier still waited for (it reads nothing
/// until that one is released or given up, which that barrier's own waiters decide by the
/// same rule); one whose connection changed, or one of whose connections' readers ended, or
/// that read nothing otherwise, may have lost the barrier with a connection, and the barrier
/// is given up. So a lane held up behind a long queue (a slow link, a busy machine) never lets
/// a key that moved overtake its frames.
struct AtBarrier {
    epoch: u64,
    lanes: u16,
    /// Set when this lane has arrived: until when it waits for the others.
    deadline: Option<tokio::time::Instant>,
    /// The lanes yet to arrive at the last look: their slots, connections and bytes read.
    behind: Vec<Behind>,
}

/// A lane yet to arrive at a barrier, as a waiting reader last saw it.
struct Behind {
    slot: usize,
    conn: Option<u64>,
    readers_ended: u64,
    bytes_in: u64,
    /// Stopped at an earlier barrier still waited for.
    held: bool,
}

impl AtBarrier {
    /// Arrives once everything read before the barrier is handed on (`drained`); whether the
    /// reader may go on.
    fn step(
        &mut self,
        peer: &Peer,
        place: LanePlace,
        drained: bool,
        patience: Duration,
    ) -> Result<bool, WireError> {
        if self.deadline.is_none() {
            if !drained {
                return Ok(false);
            }
            if peer.barriers_in.arrive(place, self.epoch, self.lanes)? {
                return Ok(true);
            }
            self.deadline = Some(tokio::time::Instant::now() + patience);
            self.behind = self.lanes_behind(peer, place);
            return Ok(false);
        }
        Ok(peer.barriers_in.is_released(place.channel, self.epoch))
    }

    /// At the deadline: whether to wait on, as the barrier was released meanwhile (not given
    /// up, then) or every lane yet to arrive read more bytes on the connection it had at the
    /// last look (then the deadline moves `patience` on).
    fn still_coming(&mut self, peer: &Peer, place: LanePlace, patience: Duration) -> bool {
        if peer.barriers_in.is_released(place.channel, self.epoch) {
            return true;
        }
        let now = self.lanes_behind(peer, place);
        let moved = !now.is_empty()
            && now.iter().all(|n| {
                self.behind.iter().any(|b| {
                    b.slot == n.slot
                        && b.conn == n.conn
                        && b.readers_ended == n.readers_ended
                        && (b.bytes_in < n.bytes_in || n.held)
                })
            });
        if moved {
            self.deadline = Some(tokio::time::Instant::now() + patience);
            self.behind = now;
        }
        moved
    }

    fn lanes_behind(&self, peer: &Peer, place: LanePlace) -> Vec<Behind> {
        let missing = peer.barriers_in.missing(place.channel, self.epoch);
        let held = peer.barriers_in.held_before(place.channel, self.epoch);
        (0..128usize)
            .filter(|i| missing >> i & 1 == 1)
            .filter_map(|i| {
                let slot = usize::from(place.channel) + i;
                let lane = peer.lanes.get(slot)?;
                Some(Behind {
                    slot,
                    conn: lane.conn_id(),
                    readers_ended: lane.metrics.readers_ended.load(Ordering::Relaxed),
                    bytes_in: lane.metrics.bytes_in.load(Ordering::Relaxed),
                    held: held >> i & 1 == 1,
                })
            })
            .collect()
    }
}

/// Returns once the barrier `at` is released (never without one).
async fn released(peer: &Peer, place: LanePlace, at: Option<&AtBarrier>) {
    match at {
        Some(b) => peer.barriers_in.released(place.channel, b.epoch).await,
        None => std::future::pending().await,
    }
}

/// Where lane `slot` is in its channel.
fn lane_place(dispatch: &crate::dispatch::Dispatcher, slot: usize) -> LanePlace {
    let spec = dispatch
        .specs()
        .iter()
        .find(|s| slot >= s.offset && slot < s.offset + s.parallelism as usize);
    match spec {
        Some(s) => LanePlace {
            channel: s.offset as u16,
            index: (slot - s.offset) as u16,
            parallelism: s.parallelism,
        },
        // Every slot is in a channel; a place no barrier fits otherwise.
        None => LanePlace {
            channel: slot as u16,
            index: 0,
            parallelism: 0,
        },
    }
}

/// Frames and their payload bytes an ordering lane's reader keeps behind striped frames that
/// miss pieces before it stops reading.
const HELD_FRAMES: usize = 4096;
const HELD_BYTES: usize = 4 << 20;

/// The state of the commit at the front of an ordering lane's queue.
#[derive(Default)]
struct Front {
    /// The table's generation when it was last tried.
    seen: u64,
    /// When it is given up on, while it waits for pieces.
    deadline: Option<tokio::time::Instant>,
}

/// Waits until `deadline` (never when there is none).
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Hands on what is ready at the front of `ordering`: frames let go, and striped frames whose
/// pieces are in; stops at a commit still missing pieces (its deadline set).
async fn hand_on_front<H: Host>(
    inner: &H,
    peer: &Arc<Peer>,
    place: LanePlace,
    ordering: &mut OrderingQueue,
    front: &mut Front,
    patience: Duration,
) -> Result<(), WireError> {
    loop {
        let (session, id, ok, lanes) = match ordering.front() {
            None => {
                front.deadline = None;
                return Ok(());
            }
            Some(Held::Frame(_)) => {
                if let Some(Held::Frame(f)) = ordering.pop() {
                    inner.on_frame(peer, f).await;
                }
                continue;
            }
            Some(&Held::Commit {
                session,
                id,
                ok,
                lanes,
                ..
            }) => (session, id, ok, lanes),
        };
        front.seen = peer.stripes_in.generation();
        let on = PiecesOn {
            channel: place.channel,
            lanes,
        };
        let tried = peer.stripes_in.try_commit(session, id, ok, on)?;
        if !matches!(tried, Tried::Pending) {
            announce_window(inner, peer);
        }
        match tried {
            Tried::Pending => {
                front
                    .deadline
                    .get_or_insert_with(|| tokio::time::Instant::now() + patience);
                return Ok(());
            }
            Tried::Dropped => {
                ordering.pop();
                front.deadline = None;
                inner.counters().stripes_dropped.inc();
            }
            Tried::Ready(a) => {
                ordering.pop();
                front.deadline = None;
                let f = a.into_frame()?;
                inner.on_frame(peer, f).await;
            }
        }
    }
}

/// The commit at the front waited its patience out: its frame is dropped (and counted).
fn give_up_front<H: Host>(inner: &H, peer: &Peer, ordering: &mut OrderingQueue, front: &mut Front) {
    if let Some(Held::Commit { id, .. }) = ordering.pop() {
        peer.stripes_in.give_up(id);
        inner.counters().stripes_dropped.inc();
        announce_window(inner, peer);
    }
    front.deadline = None;
}

/// Tells the peer how far its striped frames may go now, when that has moved enough.
fn announce_window<H: Host>(inner: &H, peer: &Peer) {
    if let Some(window) = peer.stripes_in.take_window() {
        super::stripe::announce(
            peer,
            inner.dispatch().membership_slot(),
            window,
            inner.counters(),
        );
    }
}

/// Counts and logs a frame that closes its connection; the reason.
fn bad_frame<H: Host>(inner: &H, peer: &Peer, lane: &super::lane::Lane, e: WireError) -> String {
    inner.counters().bad_frames.inc();
    tracing::warn!(peer = %peer.id, lane = %lane.id, error = %e, "bad frame; closing the connection");
    e.to_string()
}

/// Whether a read failed on bad TLS data (a record that does not decrypt, say) rather than
/// the connection ending.
fn is_tls_error(e: &std::io::Error) -> bool {
    e.get_ref()
        .is_some_and(|i| i.downcast_ref::<rustls::Error>().is_some())
}

/// The read half, counting bytes per lane; every byte that arrives also shows the peer alive
/// (a large frame takes a while to arrive, and a peer that sends one is not silent).
struct Counted<H> {
    inner: ReadHalf,
    lane: Arc<super::lane::Lane>,
    node: Arc<H>,
    peer: Arc<Peer>,
}

impl<H: Host> tokio::io::AsyncRead for Counted<H> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &r {
            let n = (buf.filled().len() - before) as u64;
            self.lane.metrics.bytes_in.fetch_add(n, Ordering::Relaxed);
            if n > 0 {
                self.peer
                    .last_seen_us
                    .store(self.node.now_us(), Ordering::Relaxed);
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader at a barrier waits on, a patience at a time, while every lane yet to arrive
    /// keeps reading on the same connection; it gives up once one reads nothing for a
    /// patience, or once one of its connections' readers ended.
    #[tokio::test]
    async fn a_barrier_is_waited_for_while_the_lanes_behind_keep_reading() {
        use crate::router::{PeerEntry, Router, RouterLimits};
        let id = |name: &str| NodeId::new(name, ([127, 0, 0, 1], 9).into(), 1);
        let transport = crate::config::TransportConfig {
            parallelism: 4,
            ..Default::default()
        };
        let dispatch = crate::dispatch::Dispatcher::new(transport.channel_specs(), true, true);
        let first = dispatch.slot_of("default", 0).unwrap();
        let (router, _queues) = Router::new(
            id("a"),
            dispatch,
            crate::overlay::Liveness::Membership,
            RouterLimits::for_tests(),
        );
        let Ok(PeerEntry::New { peer, .. }) = router.peer_entry(&id("b")) else {
            panic!("a new peer");
        };
        let place = LanePlace {
            channel: first as u16,
            index: 0,
            parallelism: 4,
        };
        let patience = Duration::from_secs(5);
        let read = |index: usize, n: u64| {
            let m = &peer.lanes[first + index].metrics;
            m.bytes_in.fetch_add(n, Ordering::Relaxed);
        };
        let mut b = AtBarrier {
            epoch: 1,
            lanes: 3,
            deadline: None,
            behind: Vec::new(),
        };
        // Lane 0 arrives; lanes 1 and 2 have yet to.
        assert!(!b.step(&peer, place, true, patience).unwrap());
        // Both read on: the wait goes on.
        read(1, 100);
        read(2, 100);
        assert!(b.still_coming(&peer, place, patience));
        // Lane 1 arrives, lane 2 reads on: still.
        let one = LanePlace { index: 1, ..place };
        assert!(!peer.barriers_in.arrive(one, 1, 3).unwrap());
        read(2, 100);
        assert!(b.still_coming(&peer, place, patience));
        // Lane 2 read nothing since: given up.
        assert!(!b.still_coming(&peer, place, patience));
        // Reading on, but a reader of lane 2 ended meanwhile: given up too.
        read(2, 100);
        assert!(b.still_coming(&peer, place, patience));
        read(2, 100);
        peer.lanes[first + 2]
            .metrics
            .readers_ended
            .fetch_add(1, Ordering::Relaxed);
        assert!(!b.still_coming(&peer, place, patience));
        // Released at the deadline (the last lane arrived): waited on, not given up.
        let two = LanePlace { index: 2, ..place };
        assert!(peer.barriers_in.arrive(two, 1, 3).unwrap());
        assert!(b.still_coming(&peer, place, patience));

        // Barrier 2 over lanes 0-1 and then barrier 3 over all four: lane 0 stops at 2 and
        // waits for lane 1, behind a long queue; lanes 2 and 3 (not in barrier 2) arrive at 3.
        let at = |index: u16| LanePlace { index, ..place };
        assert!(!peer.barriers_in.arrive(at(0), 2, 2).unwrap());
        let mut later = AtBarrier {
            epoch: 3,
            lanes: 4,
            deadline: None,
            behind: Vec::new(),
        };
        assert!(!peer.barriers_in.arrive(at(3), 3, 4).unwrap());
        assert!(!later.step(&peer, at(2), true, patience).unwrap());
        // Lane 1 reads on; lane 0 reads nothing, stopped at barrier 2: barrier 3 waits on.
        read(1, 100);
        assert!(later.still_coming(&peer, at(2), patience));
        read(1, 100);
        assert!(later.still_coming(&peer, at(2), patience));
        // Lane 1 arrives at 2, which is released; lanes 0 and 1 then read on to 3.
        assert!(peer.barriers_in.arrive(at(1), 2, 2).unwrap());
        read(0, 100);
        read(1, 100);
        assert!(later.still_coming(&peer, at(2), patience));
        // Now lane 0 reads nothing and no earlier barrier holds it: given up.
        read(1, 100);
        assert!(!later.still_coming(&peer, at(2), patience));
        router.shutdown.cancel();
    }

    #[test]
    fn a_stream_that_ends_inside_a_frame_is_a_lost_connection_not_bad_data() {
        let frame = crate::wire::encode_frame(&Header::Broadcast, &[7u8; 100], 1 << 20).unwrap();
        let mut codec = Codec(FrameDecoder::new(1 << 20));
        // The whole frame, then the end: the frame, then a clean end.
        let mut src = frame.clone();
        let got = codec.decode_eof(&mut src).unwrap().expect("the frame");
        assert_eq!(got.header, Header::Broadcast);
        assert!(codec.decode_eof(&mut src).unwrap().is_none());
        // Half a frame, then the end: an i/o error (the reader's lost connection).
        let mut src = BytesMut::from(&frame[..frame.len() / 2]);
        match codec.decode_eof(&mut src) {
            Err(WireError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof),
            other => panic!("expected an i/o error, got {other:?}"),
        }
    }
}
