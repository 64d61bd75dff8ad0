//! The dialer of one lane: whenever the lane has no connection, dial with exponential backoff.
//! On overlays where most connections are short-lived (see [`Host::dials_on_demand`]), a data
//! lane is dialed only when it has a frame to carry; the membership lane always at once.
//!
//! Both nodes may dial the same lane; the tie winner (see `NodeId::wins_tie_against`) dials at
//! once, the other waits `transport.reconnect_min_ms` first, so that usually only one dial happens
//! and the handshake's tie-break rule settles the rest.
//!
//! A peer's data lanes dial at most half of `transport.max_pending_handshakes_per_source` at
//! once ([`Peer::dials`]): a channel of 16 lanes and another of 16 are more connections than
//! a listener with the default settings takes at once from one address, and the rest would be
//! refused, warned about and dialed again.

use std::sync::Arc;
use std::time::Duration;

use super::conn;
use super::peer::Peer;
use super::{Host, LaneEvent};
use crate::error::ConnError;
use crate::throttle::Throttle;

pub(crate) async fn run<H: Host>(inner: Arc<H>, peer: Arc<Peer>, slot: usize) {
    let lane = peer.lanes[slot].clone();
    let min = Duration::from_millis(inner.config().transport.reconnect_min_ms);
    let max = Duration::from_millis(inner.config().transport.reconnect_max_ms);
    let winner = inner.id().wins_tie_against(&peer.id);
    let membership = inner.dispatch().membership_slot();
    let on_demand = inner.dials_on_demand() && slot != membership;
    let mut delay = if winner { Duration::ZERO } else { min };
    loop {
        // Wait while the lane is connected.
        loop {
            let changed = peer.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !lane.is_served() {
                break;
            }
            tokio::select! {
                _ = peer.abort.cancelled() => return,
                _ = peer.close.cancelled() => return,
                _ = &mut changed => {}
            }
        }
        if peer.said_bye.load(std::sync::atomic::Ordering::Acquire) {
            // The peer closed its connections on purpose: not dialed again (the control loop
            // drops the peer; a new one is dialed if the overlay wants it back).
            tokio::select! {
                _ = peer.abort.cancelled() => return,
                _ = peer.close.cancelled() => return,
            }
        }
        if on_demand {
            tokio::select! {
                _ = peer.abort.cancelled() => return,
                _ = peer.close.cancelled() => return,
                _ = lane.wanted() => {}
            }
            if lane.is_served() {
                continue;
            }
        }
        if !delay.is_zero() {
            tokio::select! {
                _ = peer.abort.cancelled() => return,
                _ = peer.close.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
        }
        if lane.is_served() {
            delay = if winner { Duration::ZERO } else { min };
            continue;
        }
        // A data lane waits for one of the peer's dials (the membership lane, one connection
        // that liveness rests on, never does).
        let turn = if slot == membership {
            None
        } else {
            let turn = tokio::select! {
                _ = peer.abort.cancelled() => return,
                _ = peer.close.cancelled() => return,
                t = peer.dials.acquire() => t,
            };
            // The semaphore is never closed.
            let Ok(turn) = turn else { return };
            if lane.is_served() {
                delay = if winner { Duration::ZERO } else { min };
                continue;
            }
            Some(turn)
        };
        set_dialing(&peer, slot, true);
        // A graceful close lets a dial in flight finish (the other end may already have taken
        // the connection and written to it): the connection is installed, and closed as the
        // peer's others are, after what the other end sent has been read.
        let result = tokio::select! {
            _ = peer.abort.cancelled() => return,
            r = conn::dial(&*inner, peer.id.addr, &lane.id, Some(&peer.id)) => r,
        };
        set_dialing(&peer, slot, false);
        drop(turn);
        match result {
            Ok(dialed) => {
                conn::install(&inner, &peer, slot, dialed.stream, true, dialed.max_frame).await;
                delay = if winner { Duration::ZERO } else { min };
            }
            Err(ConnError::Superseded(_)) => {
                delay = (delay * 2).clamp(min, max);
            }
            Err(ConnError::Rejected(reason)) => {
                // The peer kept a connection of its own for this lane (tie-break), or refused.
                tracing::debug!(peer = %peer.id, lane = %lane.id, %reason, "dial rejected");
                delay = (delay * 2).clamp(min, max);
            }
            Err(e) => {
                if e.is_refusal() {
                    static WARN: Throttle = Throttle::new(Duration::from_secs(1));
                    let here = e.refused_here();
                    if let Some(refusals) = inner.on_refused(peer.id.addr, here, &e.to_string()) {
                        if let Some(held) = WARN.allow() {
                            if here {
                                tracing::warn!(peer = %peer.id, reason = %e, refusals, other_lines_held = held, "connection to the peer refused");
                            } else {
                                tracing::warn!(peer = %peer.id, reason = %e, refusals, other_lines_held = held, "peer refused the connection");
                            }
                        }
                    }
                } else {
                    tracing::debug!(peer = %peer.id, lane = %lane.id, error = %e, "dial failed");
                }
                inner
                    .on_lane(LaneEvent::DialFailed {
                        peer: peer.id.clone(),
                        slot,
                        error: e.to_string(),
                        evidence: e.is_evidence_of_down(),
                    })
                    .await;
                delay = (delay * 2).clamp(min, max);
            }
        }
    }
}

fn set_dialing(peer: &Peer, slot: usize, on: bool) {
    let mut st = peer.lanes[slot]
        .state
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    st.dialing = on;
}
