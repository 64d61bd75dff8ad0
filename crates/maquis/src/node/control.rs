//! The control loop: the only place that drives the overlay. Connection events, overlay
//! messages, timers, heartbeats and API requests arrive on one bounded queue; the overlay's
//! effects are carried out here, and membership events are derived by diffing `members()`.
//! Broadcast (Plumtree, in `bcast.rs`) runs here too, over the overlay's neighbours.
//!
//! What "down" means depends on the overlay's [`Liveness`]: with `Connection`, a node whose
//! connection is lost is down (monitors fire, calls fail); with `Membership` a lost connection
//! only tells the overlay, and a node is down when it leaves `members()`.

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::bcast::Bcast;
use super::inner::Inner;
use super::MembershipEvent;
use crate::broadcast::{PlumtreeTimer, Topic};
use crate::error::{ConnError, JoinError};
use crate::id::{LaneId, NodeId, MEMBERSHIP_CHANNEL};
use crate::overlay::{Effect, Liveness, RawEffect, Route, TimerId};
use crate::transport::conn;
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
    },
    PeerDown {
        peer: NodeId,
        reason: String,
    },
    Bye {
        peer: NodeId,
    },
    OverlayMsg {
        from: NodeId,
        payload: Bytes,
    },
    Timer(TimerId),
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
    BroadcastTimer(PlumtreeTimer),
    /// A peer the overlay disconnected before its connection was up: close it now if the
    /// overlay has not asked for it again meanwhile.
    Linger {
        peer: NodeId,
    },
}

struct State {
    /// The members last published, sorted (the same vector as `Inner::members`).
    members: Arc<Vec<NodeId>>,
    /// The overlay's epoch at the last `settle` (`Overlay::epoch`).
    epoch: Option<u64>,
    left_hint: HashSet<NodeId>,
    dialing: BTreeSet<SocketAddr>,
    seq: u64,
    bcast: Bcast,
    /// Peers the overlay disconnected while their connection was still coming up (`Membership`
    /// liveness): closed once it is up, so the frames queued for them go out first.
    unneeded: HashSet<NodeId>,
    /// The runtime broadcasts member heartbeats and leave notices, and hands the overlay the
    /// routes they reveal (`Overlay::member_heartbeats`).
    heartbeats: bool,
}

pub(crate) async fn run(inner: Arc<Inner>, mut rx: mpsc::Receiver<Control>) {
    let mut st = State {
        members: Arc::new(vec![inner.id.clone()]),
        epoch: None,
        left_hint: HashSet::new(),
        dialing: BTreeSet::new(),
        seq: 0,
        bcast: Bcast::new(&inner),
        unneeded: HashSet::new(),
        heartbeats: false,
    };
    st.heartbeats =
        inner.liveness == Liveness::Membership && overlay(&inner, |o| o.member_heartbeats());
    if st.heartbeats {
        st.bcast.start_heartbeats(&inner);
    }
    let fx = inner
        .overlay
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .on_start();
    apply(&inner, &mut st, fx);
    loop {
        let msg = tokio::select! {
            _ = inner.shutdown.cancelled() => return,
            m = rx.recv() => match m { Some(m) => m, None => return },
        };
        handle(&inner, &mut st, msg);
    }
}

fn overlay<R>(inner: &Inner, f: impl FnOnce(&mut dyn crate::overlay::DynOverlay) -> R) -> R {
    let mut o = inner.overlay.lock().unwrap_or_else(|e| e.into_inner());
    f(o.as_mut())
}

fn handle(inner: &Arc<Inner>, st: &mut State, msg: Control) {
    match msg {
        Control::Join { addr, done, retry } => {
            if st.heartbeats {
                st.bcast.start_heartbeats(inner);
            }
            let known = inner
                .peers
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .find(|p| p.id.addr == addr && p.is_up())
                .map(|p| p.id.clone());
            match known {
                Some(id) => {
                    let fx = overlay(inner, |o| o.on_join(&id));
                    apply(inner, st, fx);
                    if let Some(done) = done {
                        let _ = done.send(Ok(id));
                    }
                }
                None => spawn_dial(inner, addr, done, retry, true),
            }
        }
        Control::Joined {
            addr,
            result,
            done,
            overlay_join,
        } => {
            st.dialing.remove(&addr);
            match result {
                Ok(id) => {
                    if overlay_join {
                        let fx = overlay(inner, |o| o.on_join(&id));
                        apply(inner, st, fx);
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
            let before: Vec<_> = inner
                .peers
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect();
            if st.heartbeats {
                st.bcast.leave(inner);
            }
            let fx = overlay(inner, |o| o.on_leave());
            apply(inner, st, fx);
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
        Control::Remove { name } => {
            let fx = overlay(inner, |o| o.on_remove(&name));
            apply(inner, st, fx);
        }
        Control::LaneUp { peer, slot } => {
            let Some(p) = inner.peer(&peer.name).filter(|p| p.id == peer) else {
                return;
            };
            if slot == inner.dispatch.membership_slot() && !p.up.swap(true, Ordering::AcqRel) {
                p.last_seen_us.store(inner.now_us(), Ordering::Relaxed);
                tracing::info!(peer = %peer, "peer connected");
                let fx = overlay(inner, |o| o.on_connection(&peer, true));
                apply(inner, st, fx);
            }
        }
        Control::LaneDown { peer, slot } => {
            tracing::debug!(%peer, slot, "lane down; redialing");
        }
        Control::DialFailed { peer, slot, error } => {
            if slot == inner.dispatch.membership_slot() {
                peer_down(inner, st, &peer, &format!("unreachable: {error}"));
            }
        }
        Control::PeerDown { peer, reason } => peer_down(inner, st, &peer, &reason),
        Control::Bye { peer } => {
            // With `Membership` liveness a goodbye only closes a connection (the overlay
            // changed its views); the overlay's own messages tell whether the node left.
            if inner.liveness == Liveness::Connection {
                st.left_hint.insert(peer.clone());
            }
            peer_down(inner, st, &peer, BYE);
        }
        Control::Broadcast { topic, payload } => {
            st.bcast.broadcast(inner, topic, payload);
        }
        Control::BroadcastMsg { from, payload } => {
            if let Err(e) = st.bcast.on_message(inner, &from, &payload) {
                inner.counters.decode_errors.inc();
                tracing::warn!(%from, error = %e, "bad broadcast message");
            }
            let left = st.bcast.take_left();
            if !left.is_empty() {
                st.left_hint.extend(left);
                settle(inner, st, true);
            }
        }
        Control::BroadcastTimer(t) => st.bcast.on_timer(inner, t),
        Control::Linger { peer } => {
            if st.unneeded.remove(&peer) {
                close_peer(inner, &peer);
                settle(inner, st, false);
            }
        }
        Control::OverlayMsg { from, payload } => {
            match overlay(inner, |o| o.on_message(&from, &payload)) {
                Ok(fx) => apply(inner, st, fx),
                Err(e) => {
                    inner.counters.decode_errors.inc();
                    tracing::warn!(%from, error = %e, "bad overlay message");
                }
            }
        }
        Control::Timer(t) => {
            let fx = overlay(inner, |o| o.on_timer(t));
            apply(inner, st, fx);
        }
        Control::Tick => {
            heartbeat(inner, st);
            settle(inner, st, true);
        }
    }
}

fn heartbeat(inner: &Arc<Inner>, st: &mut State) {
    st.seq += 1;
    let now = inner.now_us();
    let timeout = inner.config.heartbeat_timeout_ms * 1000;
    let peers: Vec<_> = inner
        .peers
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .values()
        .cloned()
        .collect();
    for p in peers {
        if !p.is_up() {
            continue;
        }
        if now.saturating_sub(p.last_seen_us.load(Ordering::Relaxed)) > timeout {
            let id = p.id.clone();
            peer_down(inner, st, &id, "heartbeat timeout");
            continue;
        }
        inner.send_control(
            &p,
            &Header::Heartbeat {
                seq: st.seq,
                sent_us: now,
            },
            Bytes::new(),
        );
    }
}

/// Drops a peer's connection (if it is still that incarnation) and tells the overlay. With
/// `Connection` liveness the node is down: monitors fire and calls fail.
fn peer_down(inner: &Arc<Inner>, st: &mut State, peer: &NodeId, reason: &str) {
    let bye = reason == BYE;
    let removed = {
        let mut peers = inner.peers.write().unwrap_or_else(|e| e.into_inner());
        match peers.get(&peer.name) {
            Some(p) if p.id == *peer => peers.remove(&peer.name),
            _ => None,
        }
    };
    st.unneeded.remove(peer);
    if inner.liveness == Liveness::Connection {
        if let Some(p) = &removed {
            p.abort.cancel();
            inner.counters.peers_down.inc();
            tracing::info!(%peer, %reason, "peer down");
        }
        node_gone(inner, peer);
    } else if let Some(p) = &removed {
        tracing::debug!(%peer, %reason, "connection closed");
        if bye {
            // The peer closed it because its views changed: what is queued for it (replies,
            // forwarded messages) is still written, its end reads until it cuts the connection.
            p.close.cancel();
            let abort = p.abort.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                abort.cancel();
            });
        } else {
            p.abort.cancel();
        }
    }
    let fx = overlay(inner, |o| o.on_connection(peer, false));
    apply(inner, st, fx);
}

/// A node is down or gone: its monitors fire, its watchers are forgotten, calls to it fail.
fn node_gone(inner: &Inner, node: &NodeId) {
    inner.monitors.node_down(node);
    inner.registry.forget_node(node);
    inner.calls.fail_node(node);
}

/// Closes a peer's connections gracefully: a goodbye, the queued frames written, then closed
/// (cut after 5 s).
fn close_peer(inner: &Inner, id: &NodeId) {
    let removed = {
        let mut peers = inner.peers.write().unwrap_or_else(|e| e.into_inner());
        match peers.get(&id.name) {
            Some(p) if p.id == *id => peers.remove(&id.name),
            _ => None,
        }
    };
    if let Some(p) = removed {
        inner.send_control(&p, &Header::Bye, Bytes::new());
        p.close.cancel();
        // Give the writers time to drain, then cut whatever is left.
        let abort = p.abort.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            abort.cancel();
        });
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
        let min = Duration::from_millis(inner.config.reconnect_min_ms);
        let max = Duration::from_millis(inner.config.reconnect_max_ms);
        let mut delay = min;
        let result = loop {
            let attempt = tokio::select! {
                _ = inner.shutdown.cancelled() => return,
                r = conn::dial(&inner, addr, &lane, None) => r,
            };
            match attempt {
                Ok((id, stream)) if id.name != inner.id.name => {
                    match inner.peer_get_or_create(&id) {
                        Ok(peer) => {
                            let slot = inner.dispatch.membership_slot();
                            conn::install(&inner, &peer, slot, stream, true).await;
                            break Ok(id);
                        }
                        Err(e) => break Err(e),
                    }
                }
                Ok((id, _)) => break Err(format!("{id} is this node's own name")),
                Err(ConnError::Superseded(id)) => {
                    // The contact is dialing us at the same time; its connection serves.
                    let peer = match inner.peer_get_or_create(&id) {
                        Ok(p) => p,
                        Err(e) => break Err(e),
                    };
                    let limit = Duration::from_millis(inner.config.handshake_timeout_ms);
                    if peer
                        .wait_connected(inner.dispatch.membership_slot(), limit)
                        .await
                    {
                        break Ok(id);
                    }
                    break Err(format!("{id} did not connect back"));
                }
                Err(e) if retry.again(&e, delay) => {
                    tracing::debug!(%addr, error = %e, "join attempt failed; retrying");
                    tokio::select! {
                        _ = inner.shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(max);
                }
                Err(e) => break Err(e.to_string()),
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

/// Carries out an overlay's effects, then publishes membership changes.
fn apply(inner: &Arc<Inner>, st: &mut State, effects: Vec<RawEffect>) {
    for e in effects {
        match e {
            Effect::Connect(id) => {
                st.unneeded.remove(&id);
                if id.name != inner.id.name {
                    if let Err(why) = inner.peer_get_or_create(&id) {
                        tracing::debug!(%id, %why, "connect skipped");
                    }
                }
            }
            Effect::Dial(addr) => {
                let known = inner
                    .peers
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .any(|p| p.id.addr == addr);
                if !known && addr != inner.id.addr && st.dialing.insert(addr) {
                    spawn_dial(inner, addr, None, Retry::Never, false);
                }
            }
            Effect::Disconnect(id) if inner.liveness == Liveness::Membership => {
                disconnect_soon(inner, st, id);
            }
            Effect::Disconnect(id) => {
                close_peer(inner, &id);
                node_gone(inner, &id);
            }
            Effect::Send(to, bytes) => match inner.peer(&to.name).filter(|p| p.id == to) {
                Some(p) => inner.send_control(&p, &Header::Overlay, bytes),
                None => inner.counters.control_drops.inc(),
            },
            Effect::SetTimer(t, after) => {
                let inner = inner.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = inner.shutdown.cancelled() => {}
                        _ = tokio::time::sleep(after) => {
                            let _ = inner.control.send(Control::Timer(t)).await;
                        }
                    }
                });
            }
            Effect::Left(id) => {
                if inner.liveness == Liveness::Membership {
                    st.bcast.departed(&id);
                }
                st.left_hint.insert(id);
            }
        }
    }
    settle(inner, st, false);
}

/// `Membership` liveness: the overlay no longer needs a connection. A peer whose membership lane
/// is up is closed at once (its queued frames are written first); one still connecting is
/// closed once it connects (or after the handshake timeout), so that a message queued for it
/// just before (a shuffle reply, say) still goes out, unless the overlay connects it again.
fn disconnect_soon(inner: &Arc<Inner>, st: &mut State, id: NodeId) {
    let Some(p) = inner.peer(&id.name).filter(|p| p.id == id) else {
        return;
    };
    let slot = inner.dispatch.membership_slot();
    if p.lanes[slot].is_connected() {
        st.unneeded.remove(&id);
        close_peer(inner, &id);
        return;
    }
    if st.unneeded.insert(id.clone()) {
        let inner = inner.clone();
        tokio::spawn(async move {
            let limit = Duration::from_millis(inner.config.handshake_timeout_ms);
            p.wait_connected(slot, limit).await;
            let _ = inner.control.send(Control::Linger { peer: id }).await;
        });
    }
}

/// After anything that may change the overlay: updates broadcast's neighbours, (with
/// `Membership` liveness, when `refresh` or the neighbours changed) hands the overlay the
/// routes heartbeats revealed, publishes membership changes, and rebuilds the route table.
fn settle(inner: &Arc<Inner>, st: &mut State, refresh: bool) {
    // An overlay that counts its changes saves the work below when nothing changed, unless
    // heartbeat routes are due (they come from the runtime, not the overlay).
    let epoch = overlay(inner, |o| o.epoch());
    if epoch.is_some() && epoch == st.epoch && !(refresh && st.heartbeats) {
        return;
    }
    st.epoch = epoch;
    let want = overlay(inner, |o| o.neighbors()).unwrap_or_else(|| connected_members(inner));
    let changed = st.bcast.sync_neighbors(inner, want);
    let membership = inner.liveness == Liveness::Membership;
    if st.heartbeats && (changed || refresh) {
        let max_age = Duration::from_millis(inner.config.member_timeout_ms);
        let routes = st.bcast.routes(inner, max_age);
        overlay(inner, |o| o.set_routes(routes));
    }
    let moved = publish(inner, st);
    if membership && (changed || refresh || moved) {
        update_routes(inner, st);
    }
}

/// Members (other than this node) whose membership lane is up.
fn connected_members(inner: &Inner) -> Vec<NodeId> {
    let members = overlay(inner, |o| o.members());
    let peers = inner.peers.read().unwrap_or_else(|e| e.into_inner());
    members
        .into_iter()
        .filter(|m| peers.get(&m.name).is_some_and(|p| p.id == *m && p.is_up()))
        .collect()
}

/// Brings the route table the send path reads up to date: every member the overlay reaches
/// through a neighbour. Only the entries that differ are written, so a change of one member
/// costs lookups, not a new table.
fn update_routes(inner: &Inner, st: &State) {
    let wanted: Vec<(&NodeId, NodeId)> = overlay(inner, |o| {
        st.members
            .iter()
            .filter(|m| **m != inner.id)
            .filter_map(|m| match o.route(m) {
                Route::Via(via) => Some((m, via)),
                Route::Direct | Route::Unreachable => None,
            })
            .collect()
    });
    let stale = {
        let table = inner.routes.read().unwrap_or_else(|e| e.into_inner());
        table.len() != wanted.len()
            || wanted
                .iter()
                .any(|(m, via)| !table.get(&m.name).is_some_and(|(d, v)| d == *m && v == via))
    };
    if !stale {
        return;
    }
    let mut table = inner.routes.write().unwrap_or_else(|e| e.into_inner());
    let keep: HashSet<&str> = wanted.iter().map(|(m, _)| m.name.as_str()).collect();
    table.retain(|name, _| keep.contains(name.as_str()));
    for (m, via) in wanted {
        match table.get_mut(&m.name) {
            Some(e) if e.0 == *m && e.1 == via => {}
            Some(e) => *e = (m.clone(), via),
            None => {
                table.insert(m.name.clone(), (m.clone(), via));
            }
        }
    }
}

/// The overlay's members, sorted; with `Membership` liveness only the newest incarnation of a
/// name.
fn current_members(inner: &Inner) -> Vec<NodeId> {
    let mut all = overlay(inner, |o| o.members());
    // Usually sorted already (overlays keep their members in ordered sets): then this is one
    // pass.
    all.sort_unstable();
    all.dedup();
    if inner.liveness == Liveness::Membership {
        // The incarnations of a name are adjacent; keep the largest.
        all.dedup_by(|later, kept| {
            if later.name != kept.name {
                return false;
            }
            if later.incarnation > kept.incarnation {
                std::mem::swap(later, kept);
            }
            true
        });
    }
    all
}

/// Publishes the changes of `members()` as events; returns whether there were any.
fn publish(inner: &Inner, st: &mut State) -> bool {
    let now = current_members(inner);
    if now == *st.members {
        return false;
    }
    let now = Arc::new(now);
    // Readers woken by an event must already see the new membership.
    *inner.members.write().unwrap_or_else(|e| e.into_inner()) = now.clone();
    // Both lists are sorted: one merge pass finds who came and who went.
    let (mut came, mut went) = (Vec::new(), Vec::new());
    let (mut a, mut b) = (st.members.iter().peekable(), now.iter().peekable());
    loop {
        match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x == y => {
                a.next();
                b.next();
            }
            (Some(x), Some(y)) if x < y => went.extend(a.next()),
            (Some(_), Some(_)) | (None, Some(_)) => came.extend(b.next()),
            (Some(_), None) => went.extend(a.next()),
            (None, None) => break,
        }
    }
    for n in came {
        tracing::debug!(node = %inner.id.name, member = %n, "member up");
        let _ = inner.events.send(MembershipEvent::Up(n.clone()));
    }
    for n in went {
        tracing::debug!(node = %inner.id.name, member = %n, "member gone");
        let ev = if st.left_hint.remove(n) {
            MembershipEvent::Left(n.clone())
        } else {
            MembershipEvent::Down(n.clone())
        };
        if inner.liveness == Liveness::Membership {
            if matches!(ev, MembershipEvent::Down(_)) {
                inner.counters.peers_down.inc();
                tracing::info!(node = %inner.id.name, member = %n, "member down");
            }
            node_gone(inner, n);
        }
        let _ = inner.events.send(ev);
    }
    st.left_hint.retain(|n| now.binary_search(n).is_ok());
    st.members = now;
    true
}
