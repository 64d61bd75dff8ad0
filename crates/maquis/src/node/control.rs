//! The control loop: the driver of this node's [`Membership`] machine. Connection events,
//! protocol messages, link heartbeats and API requests arrive on one bounded queue; the
//! machine's timers are one deadline the loop sleeps toward. After every input the loop
//! carries out the machine's outputs: it opens and closes connections, sends protocol frames,
//! hands broadcasts to subscribers, publishes the members, neighbours and routes the send path
//! reads, and reports events. Only this loop changes membership.
//!
//! It also runs the link heartbeats (each heartbeat interval, a probe to every peer this node
//! wrote nothing to since the last one, and to all of them every `RTT_EVERY_TICKS` intervals
//! to measure round trips; a peer silent for the heartbeat timeout is dropped), which are about
//! connections, not members.
//!
//! The queue holds `CONTROL_QUEUE` (4,096) requests: `Join`, `Joined`, `Leave`, `Remove`, `LaneUp`,
//! `LaneDown`, `DialFailed`, `PeerDown`, `Bye`, `OverlayMsg`, `Tick`, `Broadcast`, `BroadcastMsg`.
//! The outputs, as `execute` carries them out: `Connect` creates the peer (its dialers connect
//! every lane), `Dial` dials an address once, `Close` sends `Bye`, lets the writers drain and cuts
//! after 5 s, `Send` queues a protocol frame on the membership lane without waiting (dropped and
//! counted in `control_drops` when full, `control_no_peer` when the peer is gone), `Deliver` hands a broadcast to the local subscribers
//! (bounded, the oldest dropped), `Members`, `Neighbors` and `Route` update the snapshots the API
//! and the router read, `Event` goes to the subscribers, `Gone` fires monitors and fails calls. A
//! peer silent for `transport.heartbeat_timeout_ms` on every lane (the readers stamp its
//! `last_seen_us` on every read) is dropped at the next `Tick`; the others it wrote nothing to
//! since the last `Tick` get a `Heartbeat`.
//!
//! The data path never touches the machine: it reads the router's peers and route table.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::inner::Inner;
use crate::broadcast::Topic;
use crate::error::{ConnError, JoinError};
use crate::id::{LaneId, NodeId, MEMBERSHIP_CHANNEL};
use crate::membership::{Disconnect, Membership, MembershipEvent, Output, Protocol};
use crate::overlay::Liveness;
use crate::transport::{conn, Host};
use crate::wire::frame::Header;

/// The reason given for a peer that said goodbye.
const BYE: &str = "closed by the peer";

/// Capacity of the control queue; senders wait when it is full.
pub(crate) const CONTROL_QUEUE: usize = 4096;

/// Which failed attempts to reach a contact are tried again (with backoff).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Retry {
    /// None: the first failure is the answer.
    Never,
    /// Every failure, until the node stops (contacts from the configuration).
    Forever,
    /// Failures that may pass (refused, reset, a handshake timeout, a contact too busy to
    /// take the handshake) until the deadline; a rejection or an incompatible peer at once.
    Transient(tokio::time::Instant),
}

impl Retry {
    /// Whether to try again after `e`, waiting `delay` first.
    fn again(&self, e: &ConnError, delay: Duration) -> bool {
        match self {
            Retry::Never => false,
            Retry::Forever => true,
            Retry::Transient(until) => {
                matches!(e, ConnError::Io(_) | ConnError::Timeout)
                    && tokio::time::Instant::now() + delay < *until
            }
        }
    }
}

/// How long a peer closed on purpose keeps its connections: its queued frames are written, and
/// what it still sends is read, before they are cut.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Every this many heartbeat ticks, every connected peer gets a heartbeat whatever was written
/// to it, so that its round-trip time stays measured.
const RTT_EVERY_TICKS: u64 = 10;

/// A request to the control loop.
pub(crate) enum Control {
    Join {
        addr: SocketAddr,
        done: Option<oneshot::Sender<Result<NodeId, JoinError>>>,
        retry: Retry,
    },
    Joined {
        addr: SocketAddr,
        result: Result<NodeId, String>,
        done: Option<oneshot::Sender<Result<NodeId, JoinError>>>,
        overlay_join: bool,
    },
    Leave {
        done: oneshot::Sender<()>,
    },
    Remove {
        name: String,
    },
    LaneUp {
        peer: NodeId,
        slot: usize,
    },
    LaneDown {
        peer: NodeId,
        slot: usize,
    },
    DialFailed {
        peer: NodeId,
        slot: usize,
        error: String,
        /// Whether the failure is evidence that the peer is down (refused, unreachable).
        evidence: bool,
    },
    PeerDown {
        peer: NodeId,
        reason: String,
    },
    Bye {
        peer: NodeId,
    },
    /// An overlay message from a neighbour.
    OverlayMsg {
        from: NodeId,
        payload: Bytes,
    },
    /// Time for the link heartbeats.
    Tick,
    /// `Node::broadcast`: an encoded message for a topic.
    Broadcast {
        topic: Topic,
        payload: Bytes,
    },
    /// A Plumtree message from a neighbour.
    BroadcastMsg {
        from: NodeId,
        payload: Bytes,
    },
}

/// What the loop keeps besides the machine.
struct Driver {
    inner: Arc<Inner>,
    /// Addresses being dialed for the overlay (`Output::Dial`), so each is dialed once.
    dialing: BTreeSet<SocketAddr>,
    seq: u64,
}

impl Driver {
    /// The machine's clock: time since the node started.
    fn now(&self) -> Duration {
        self.inner.router.started().elapsed()
    }
}

pub(crate) async fn run(
    inner: Arc<Inner>,
    mut machine: Membership,
    mut rx: mpsc::Receiver<Control>,
) {
    let mut d = Driver {
        inner,
        dialing: BTreeSet::new(),
        seq: 0,
    };
    machine.handle_start(d.now());
    execute(&mut d, &mut machine);
    loop {
        let deadline = machine
            .poll_timeout()
            .map(|at| tokio::time::Instant::from_std(d.inner.router.started() + at));
        let sleep = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = d.inner.router.shutdown.cancelled() => return,
            m = rx.recv() => match m {
                Some(m) => handle(&mut d, &mut machine, m),
                None => return,
            },
            _ = sleep => machine.handle_timeout(d.now()),
        }
        execute(&mut d, &mut machine);
    }
}

fn handle(d: &mut Driver, m: &mut Membership, msg: Control) {
    let inner = d.inner.clone();
    let now = d.now();
    match msg {
        Control::Join { addr, done, retry } => {
            let known = inner
                .router
                .peers()
                .into_iter()
                .find(|p| p.id.addr == addr && p.is_up())
                .map(|p| p.id.clone());
            match known {
                Some(id) => {
                    m.handle_join(now, &id);
                    // The join's effects (the members, the first protocol messages) are out
                    // before the caller hears that it joined.
                    execute(d, m);
                    if let Some(done) = done {
                        let _ = done.send(Ok(id));
                    }
                }
                None => spawn_dial(&inner, addr, done, retry, true),
            }
        }
        Control::Joined {
            addr,
            result,
            done,
            overlay_join,
        } => {
            d.dialing.remove(&addr);
            match result {
                Ok(id) => {
                    if overlay_join {
                        m.handle_join(now, &id);
                        execute(d, m);
                    }
                    if let Some(done) = done {
                        let _ = done.send(Ok(id));
                    }
                }
                Err(reason) => {
                    tracing::warn!(%addr, %reason, "join failed");
                    if let Some(done) = done {
                        let _ = done.send(Err(JoinError::Failed { addr, reason }));
                    }
                }
            }
        }
        Control::Leave { done } => {
            let before = inner.router.peers();
            m.handle_leave(now);
            execute(d, m);
            // `leave` returns once the goodbyes are written (or a second has passed), so a
            // process may exit right after it.
            let closing: Vec<_> = before
                .into_iter()
                .filter(|p| p.close.is_cancelled())
                .collect();
            tokio::spawn(async move {
                let all = closing.iter().map(|p| p.drained(Duration::from_secs(1)));
                futures::future::join_all(all).await;
                let _ = done.send(());
            });
        }
        Control::Remove { name } => m.handle_remove(now, &name.into()),
        Control::LaneUp { peer, slot } => {
            let Some(p) = inner.router.peer_of(&peer) else {
                return;
            };
            if slot == inner.router.dispatch.membership_slot() && !p.up.swap(true, Ordering::AcqRel)
            {
                p.last_seen_us
                    .store(inner.router.now_us(), Ordering::Relaxed);
                tracing::info!(peer = %peer, "peer connected");
                m.handle_connected(now, &peer);
                inner.router.peer_up();
            }
        }
        Control::LaneDown { peer, slot } => {
            tracing::trace!(node = %inner.router.id.name, %peer, slot, "lane down");
        }
        Control::DialFailed {
            peer,
            slot,
            error,
            evidence,
        } => {
            if slot == inner.router.dispatch.membership_slot() {
                let why = if evidence {
                    inner.router.counters.dials_refused.inc();
                    Disconnect::Lost
                } else {
                    inner.router.counters.dials_inconclusive.inc();
                    Disconnect::Inconclusive
                };
                peer_down(d, m, &peer, &format!("unreachable: {error}"), why);
            }
        }
        Control::PeerDown { peer, reason } => peer_down(d, m, &peer, &reason, Disconnect::Lost),
        Control::Bye { peer } => peer_down(d, m, &peer, BYE, Disconnect::Bye),
        Control::Broadcast { topic, payload } => m.broadcast(now, topic, payload),
        Control::BroadcastMsg { from, payload } => {
            if let Err(e) = m.handle_broadcast_msg(now, &from, &payload) {
                inner.router.counters.decode_errors.inc();
                tracing::warn!(error = %e, "bad broadcast message");
            }
        }
        Control::OverlayMsg { from, payload } => {
            if let Err(e) = m.handle_overlay_msg(now, &from, &payload) {
                inner.router.counters.decode_errors.inc();
                tracing::warn!(error = %e, "bad overlay message");
            }
        }
        Control::Tick => heartbeat(d, m),
    }
}

/// Carries out the machine's outputs.
fn execute(d: &mut Driver, m: &mut Membership) {
    let inner = d.inner.clone();
    while let Some(out) = m.poll_output() {
        match out {
            Output::Connect(id) => {
                if let Err(why) = inner.peer_get_or_create(&id) {
                    tracing::debug!(%id, %why, "connect skipped");
                }
            }
            Output::Dial(addr) => {
                let known = inner.router.knows_addr(addr);
                if !known && d.dialing.insert(addr) {
                    spawn_dial(&inner, addr, None, Retry::Never, false);
                }
            }
            Output::Close(id) => close_peer(&inner, &id),
            Output::Send {
                to,
                protocol,
                payload,
            } => match inner.router.peer_of(&to) {
                Some(p) => {
                    let header = match protocol {
                        Protocol::Overlay => Header::Overlay,
                        Protocol::Broadcast => Header::Broadcast,
                    };
                    inner.router.send_control(&p, &header, payload);
                }
                None => inner.router.counters.control_no_peer.inc(),
            },
            Output::Deliver { topic, payload, .. } => {
                let dropped = inner.topics.deliver(&topic, &payload);
                for _ in 0..dropped {
                    inner.router.counters.subscription_drops.inc();
                }
            }
            Output::Members(members) => {
                inner.router.set_members(members);
            }
            Output::Neighbors(nbrs) => {
                *inner.neighbors.write().unwrap_or_else(|e| e.into_inner()) = nbrs;
            }
            Output::Route(change) => {
                inner.router.set_route(change);
            }
            Output::Event(ev) => {
                if let MembershipEvent::Down(n) = &ev {
                    if inner.router.liveness == Liveness::Membership {
                        inner.router.counters.peers_down.inc();
                        tracing::info!(node = %inner.router.id.name, member = %n, "member down");
                    }
                }
                let _ = inner.events.send(ev);
            }
            Output::Gone(id) => inner.actors.node_gone(&id),
            Output::Malformed { what, error } => {
                inner.router.counters.decode_errors.inc();
                tracing::warn!(what, %error, "malformed runtime broadcast");
            }
        }
    }
}

/// Probes every connected peer; drops the ones silent for longer than the heartbeat timeout.
/// Copies the broadcast layer's counters into the node's first.
fn heartbeat(d: &mut Driver, m: &mut Membership) {
    let inner = d.inner.clone();
    let bcast = m.plumtree().stats();
    let c = &inner.router.counters;
    c.broadcast_route_moves.raise_to(bcast.route_moves);
    c.broadcast_strangers_ignored
        .raise_to(bcast.strangers_ignored);
    c.broadcast_lazy_dropped.raise_to(bcast.lazy_dropped);
    c.broadcast_missing_dropped.raise_to(bcast.missing_dropped);
    let ms = m.stats();
    c.members_accused.raise_to(ms.accusations);
    c.members_declared_down.raise_to(ms.declared_down);
    c.accusations_refuted.raise_to(ms.refutations);
    c.members_silent_dials.raise_to(ms.silent_dials);
    let sent = m.sent();
    c.membership_sent_overlay.raise_to(sent.overlay);
    c.membership_sent_heartbeats.raise_to(sent.heartbeats);
    c.membership_sent_notices.raise_to(sent.notices);
    c.membership_sent_gossip.raise_to(sent.gossip);
    c.membership_sent_ihave.raise_to(sent.ihave);
    c.membership_sent_tree.raise_to(sent.tree);
    c.membership_sent_bytes.raise_to(sent.bytes);
    d.seq += 1;
    let now = inner.router.now_us();
    let timeout = inner.config.transport.heartbeat_timeout_ms * 1000;
    let measure_rtt = d.seq.is_multiple_of(RTT_EVERY_TICKS);
    for p in inner.router.peers() {
        // Striped frames lost with a connection, and the window's limit again.
        let tick = p.stripes_in.tick(now, timeout);
        if tick.dropped {
            inner.router.counters.stripes_dropped.inc();
        }
        if let Some(window) = tick.announce {
            let slot = inner.router.dispatch.membership_slot();
            crate::transport::stripe::announce(&p, slot, window, c);
        }
        if !p.is_up() {
            continue;
        }
        if now.saturating_sub(p.last_seen_us.load(Ordering::Relaxed)) > timeout {
            let id = p.id.clone();
            inner.router.counters.links_silent.inc();
            peer_down(d, m, &id, "heartbeat timeout", Disconnect::Lost);
            continue;
        }
        // A peer this node wrote to since the last tick has heard from it: the probe would
        // tell it nothing (traffic keeps links alive, as Erlang's ticks do), except the
        // round-trip time, measured every `RTT_EVERY_TICKS` ticks.
        let written = p.frames_written();
        if p.written_at_tick.swap(written, Ordering::Relaxed) != written && !measure_rtt {
            continue;
        }
        inner.router.counters.heartbeats_sent.inc();
        inner.router.send_control(
            &p,
            &Header::Heartbeat {
                seq: d.seq,
                sent_us: now,
            },
            Bytes::new(),
        );
    }
}

/// Drops a peer's connection (if it is still that incarnation) and tells the machine. With
/// `Connection` liveness the node is down: the machine reports it gone.
fn peer_down(d: &mut Driver, m: &mut Membership, peer: &NodeId, reason: &str, why: Disconnect) {
    let inner = &d.inner;
    let bye = why == Disconnect::Bye;
    let removed = inner.router.remove_peer(peer);
    if inner.router.liveness == Liveness::Connection {
        if let Some(p) = &removed {
            p.abort.cancel();
            inner.router.counters.peers_down.inc();
            tracing::info!(%peer, %reason, "peer down");
        }
    } else if let Some(p) = &removed {
        tracing::debug!(node = %inner.router.id.name, %peer, %reason, "connection closed");
        if bye {
            // The peer closed it because its views changed: what is queued for it (replies,
            // forwarded messages) is still written, its end reads until it cuts the connection.
            p.close_then_cut(CLOSE_GRACE);
        } else {
            p.abort.cancel();
        }
    }
    m.handle_disconnected(d.now(), peer, why);
}

/// Closes a peer's connections gracefully: a goodbye, the queued frames written, then closed
/// (cut after 5 s).
fn close_peer(inner: &Inner, id: &NodeId) {
    let removed = inner.router.remove_peer(id);
    if let Some(p) = removed {
        inner.router.send_control(&p, &Header::Bye, Bytes::new());
        p.close_then_cut(CLOSE_GRACE);
    }
}

fn spawn_dial(
    inner: &Arc<Inner>,
    addr: SocketAddr,
    done: Option<oneshot::Sender<Result<NodeId, JoinError>>>,
    retry: Retry,
    overlay_join: bool,
) {
    let inner = inner.clone();
    tokio::spawn(async move {
        let lane = LaneId::new(MEMBERSHIP_CHANNEL, 0);
        let min = Duration::from_millis(inner.config.transport.reconnect_min_ms);
        let max = Duration::from_millis(inner.config.transport.reconnect_max_ms);
        let mut delay = min;
        let result = loop {
            let attempt = tokio::select! {
                _ = inner.router.shutdown.cancelled() => return,
                r = conn::dial(&*inner, addr, &lane, None) => r,
            };
            match attempt {
                Ok(dialed) if dialed.node.name != inner.router.id.name => {
                    let id = dialed.node;
                    let slot = inner.router.dispatch.membership_slot();
                    match inner.peer_with_connection(&id, slot) {
                        Ok((peer, arriving)) => {
                            let (stream, limit) = (dialed.stream, dialed.max_frame);
                            conn::install(&inner, &peer, slot, stream, true, limit).await;
                            drop(arriving);
                            break Ok(id);
                        }
                        Err(e) => break Err(e.to_string()),
                    }
                }
                Ok(dialed) => break Err(format!("{} is this node's own name", dialed.node)),
                Err(ConnError::Superseded(id)) => {
                    // The contact is dialing us at the same time; its connection serves.
                    let peer = match inner.peer_get_or_create(&id) {
                        Ok(p) => p,
                        Err(e) => break Err(e.to_string()),
                    };
                    let limit = Duration::from_millis(inner.config.transport.handshake_timeout_ms);
                    if peer
                        .wait_connected(inner.router.dispatch.membership_slot(), limit)
                        .await
                    {
                        break Ok(id);
                    }
                    break Err(format!("{id} did not connect back"));
                }
                Err(e) if retry.again(&e, delay) => {
                    if e.is_refusal() {
                        // A wrong cookie or configuration will not pass by itself: say so
                        // loudly (once a minute per contact), and go on trying, as the other
                        // node may be reconfigured.
                        if let Some(refusals) =
                            inner.on_refused(addr, e.refused_here(), &e.to_string())
                        {
                            tracing::warn!(%addr, reason = %e, refusals, "join refused; retrying");
                        }
                    } else {
                        tracing::debug!(%addr, error = %e, "join attempt failed; retrying");
                    }
                    tokio::select! {
                        _ = inner.router.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(max);
                }
                Err(e) => {
                    if e.is_refusal() {
                        // The caller hears of it (and the control loop logs a failed join).
                        let _ = inner.on_refused(addr, e.refused_here(), &e.to_string());
                    }
                    break Err(e.to_string());
                }
            }
        };
        let _ = inner
            .control
            .send(Control::Joined {
                addr,
                result,
                done,
                overlay_join,
            })
            .await;
    });
}
