//! The control loop: the only place that drives the overlay. Connection events, overlay
//! messages, timers, heartbeats and API requests arrive on one bounded queue; the overlay's
//! effects are carried out here, and membership events are derived by diffing `members()`.

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::inner::Inner;
use super::MembershipEvent;
use crate::error::{ConnError, JoinError};
use crate::id::{LaneId, NodeId, MEMBERSHIP_CHANNEL};
use crate::overlay::{Effect, RawEffect, TimerId};
use crate::transport::conn;
use crate::wire::frame::Header;

/// Capacity of the control queue; senders wait when it is full.
pub(crate) const CONTROL_QUEUE: usize = 4096;

/// A request to the control loop.
pub(crate) enum Control {
    Join {
        addr: SocketAddr,
        done: Option<oneshot::Sender<Result<NodeId, JoinError>>>,
        retry: bool,
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
}

struct State {
    members: Vec<NodeId>,
    left_hint: HashSet<NodeId>,
    dialing: BTreeSet<SocketAddr>,
    seq: u64,
}

pub(crate) async fn run(inner: Arc<Inner>, mut rx: mpsc::Receiver<Control>) {
    let mut st = State {
        members: vec![inner.id.clone()],
        left_hint: HashSet::new(),
        dialing: BTreeSet::new(),
        seq: 0,
    };
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
            st.left_hint.insert(peer.clone());
            peer_down(inner, st, &peer, "left");
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
        Control::Tick => heartbeat(inner, st),
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

/// Drops a peer (if it is still that incarnation), fires monitors, and tells the overlay.
fn peer_down(inner: &Arc<Inner>, st: &mut State, peer: &NodeId, reason: &str) {
    let removed = {
        let mut peers = inner.peers.write().unwrap_or_else(|e| e.into_inner());
        match peers.get(&peer.name) {
            Some(p) if p.id == *peer => peers.remove(&peer.name),
            _ => None,
        }
    };
    if let Some(p) = &removed {
        p.abort.cancel();
        inner.counters.peers_down.inc();
        tracing::info!(%peer, %reason, "peer down");
    }
    inner.monitors.node_down(peer);
    inner.registry.forget_node(peer);
    inner.calls.fail_node(peer);
    let fx = overlay(inner, |o| o.on_connection(peer, false));
    apply(inner, st, fx);
}

fn spawn_dial(
    inner: &Arc<Inner>,
    addr: SocketAddr,
    done: Option<oneshot::Sender<Result<NodeId, JoinError>>>,
    retry: bool,
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
                Err(e) if retry => {
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
                    spawn_dial(inner, addr, None, false, false);
                }
            }
            Effect::Disconnect(id) => {
                let removed = {
                    let mut peers = inner.peers.write().unwrap_or_else(|e| e.into_inner());
                    match peers.get(&id.name) {
                        Some(p) if p.id == id => peers.remove(&id.name),
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
                inner.monitors.node_down(&id);
                inner.registry.forget_node(&id);
                inner.calls.fail_node(&id);
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
                st.left_hint.insert(id);
            }
        }
    }
    publish(inner, st);
}

fn publish(inner: &Inner, st: &mut State) {
    let now = overlay(inner, |o| o.members());
    if now == st.members {
        return;
    }
    // Readers woken by an event must already see the new membership.
    *inner.members.write().unwrap_or_else(|e| e.into_inner()) = now.clone();
    for n in now.iter().filter(|n| !st.members.contains(n)) {
        tracing::debug!(node = %inner.id.name, member = %n, "member up");
        let _ = inner.events.send(MembershipEvent::Up(n.clone()));
    }
    for n in st.members.iter().filter(|n| !now.contains(n)) {
        tracing::debug!(node = %inner.id.name, member = %n, "member gone");
        let ev = if st.left_hint.remove(n) {
            MembershipEvent::Left(n.clone())
        } else {
            MembershipEvent::Down(n.clone())
        };
        let _ = inner.events.send(ev);
    }
    st.left_hint.retain(|n| now.contains(n));
    st.members = now;
}
