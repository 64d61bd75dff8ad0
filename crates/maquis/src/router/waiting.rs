//! Frames waiting for a way: the routed frames this node forwards that found no route yet, and
//! the frames a dropped peer's lanes never wrote.
//!
//! A lane's reader never waits for a route: [`Router::forward`] tries once, and a frame for a
//! member with no way on yet is parked here. When a peer is dropped (closed because the overlay
//! no longer wants it, or lost), each of its lanes' writers hands what it still had queued
//! here too: a frame for that peer itself (`Header::Actor`, or this node's own routed frame)
//! goes to it again, routed through a neighbour if the connection is gone; a frame this node
//! was forwarding goes on toward its destination; protocol frames are dropped (their protocols
//! repair themselves) and counted in `control_no_peer`.
//!
//! One task ([`Router::run_waiting`]) holds them and tries them again whenever the routes, the
//! members or the peers change (and every 50 ms, for a next hop's lane that was full), each
//! until `ROUTE_WAIT` after it arrived. A forwarded frame whose only way on is back where it
//! came from goes back there after `SEND_BACK_AFTER` (200 ms): by then the neighbour that
//! sent it has usually followed the heartbeat that moved its route. Bounded: at most
//! `WAITING_FRAMES` frames and `WAITING_BYTES` bytes of payload wait (beyond, the newcomer is
//! dropped); the queues into the task are bounded too. A frame dropped here is counted
//! (`routed_no_route` for forwarded frames, `unsent_dropped` for a dropped peer's), and a call
//! among them fails at once: at its caller (a status reply) or, for this node's own call,
//! here.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{Leg, Router, ROUTE_WAIT};
use crate::id::NodeId;
use crate::transport::lane::{OutFrame, Unsent};
use crate::wire::frame::{decode_head, ActorHeader, Header};
use crate::wire::Body;

/// Most frames waiting at once.
pub(crate) const WAITING_FRAMES: usize = 4096;
/// Most payload bytes waiting at once.
pub(crate) const WAITING_BYTES: usize = 64 << 20;
/// Forwarded frames handed to the task and not yet taken; beyond, a frame is dropped at once.
pub(crate) const PARKED_QUEUE: usize = 1024;
/// How often waiting frames are tried again besides every change (a next hop's full lane
/// makes room without a change of routes).
const RETRY_EVERY: std::time::Duration = std::time::Duration::from_millis(50);
/// How long a forwarded frame whose only way on is back to the neighbour it came from waits
/// before it goes back there. Routes through each other mean that one of the two nodes
/// had not yet followed a heartbeat that moved the route; when the one that sent it has
/// caught up by now (a heartbeat crosses the cluster in a few milliseconds), the frame goes
/// on from there. Each return costs a hop, so two routes that stayed crossed end at the hop
/// limit.
const SEND_BACK_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// Where a waiting frame came from (for its counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// A routed frame that arrived for another node.
    Forward,
    /// A frame a dropped peer's lane never wrote.
    Unsent,
}

/// A routed frame waiting for a way on.
pub(crate) struct Parked {
    /// The neighbour it arrived from (not sent back there); this node for its own frames.
    pub(crate) came_from: NodeId,
    /// Its destination.
    pub(crate) to: NodeId,
    /// Its sender.
    pub(crate) from: NodeId,
    /// Hops so far.
    pub(crate) hops: u16,
    /// The lane slot its sender picked.
    pub(crate) lane: u16,
    /// What it carries.
    pub(crate) actor: ActorHeader,
    /// Its payload.
    pub(crate) payload: Body,
    /// When it is given up.
    pub(crate) deadline: Instant,
    /// From when it may go back to `came_from` (see `SEND_BACK_AFTER`).
    back_at: Instant,
    origin: Origin,
}

impl Parked {
    /// A forwarded frame that found no way on, waiting until `ROUTE_WAIT` from now.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        came_from: NodeId,
        to: NodeId,
        from: NodeId,
        hops: u16,
        lane: u16,
        actor: ActorHeader,
        payload: Body,
    ) -> Self {
        let now = Instant::now();
        Parked {
            came_from,
            to,
            from,
            hops,
            lane,
            actor,
            payload,
            deadline: now + ROUTE_WAIT,
            back_at: now + SEND_BACK_AFTER,
            origin: Origin::Forward,
        }
    }
}

/// What became of a frame that was tried.
enum Tried {
    /// Queued on the next hop's lane.
    Sent,
    /// No way yet: it waits on.
    Wait(Box<Parked>),
    /// Given up (counted, its call failed).
    Dropped,
}

impl Router {
    /// Holds the frames waiting for a way and tries them again as things change, until the
    /// node stops. `fail_call` fails a call of this node whose request found no way (so that
    /// it does not wait for its timeout).
    pub(crate) async fn run_waiting(
        self: Arc<Self>,
        mut unsent: mpsc::Receiver<Unsent>,
        mut parked: mpsc::Receiver<Parked>,
        fail_call: impl Fn(u64, String) + Send + 'static,
    ) {
        let mut waiting: VecDeque<Parked> = VecDeque::new();
        let mut bytes = 0usize;
        loop {
            let changed = self.routes_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // Every change of routes, members or peers may open a way: try them all.
            let now = Instant::now();
            for p in std::mem::take(&mut waiting) {
                bytes -= p.payload.len();
                if let Some(p) = self.try_place(p, now, &fail_call) {
                    bytes += p.payload.len();
                    waiting.push_back(p);
                }
            }
            let next = waiting
                .iter()
                .map(|p| p.deadline)
                .min()
                .map(|d| d.min(Instant::now() + RETRY_EVERY));
            let arrived = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = &mut changed => None,
                _ = sleep_until(next) => None,
                b = unsent.recv() => match b {
                    Some(b) => Some(self.unsent_frames(b)),
                    None => return,
                },
                p = parked.recv() => match p {
                    Some(p) => Some(vec![p]),
                    None => return,
                },
            };
            for p in arrived.into_iter().flatten() {
                let Some(p) = self.try_place(p, Instant::now(), &fail_call) else {
                    continue;
                };
                if waiting.len() >= WAITING_FRAMES || bytes + p.payload.len() > WAITING_BYTES {
                    self.give_up(p, "too many frames waiting for a way", &fail_call);
                } else {
                    bytes += p.payload.len();
                    waiting.push_back(p);
                }
            }
        }
    }

    /// A dropped peer's unwritten frames as frames waiting for a way (the protocol frames among
    /// them are dropped and counted).
    fn unsent_frames(&self, batch: Unsent) -> Vec<Parked> {
        let deadline = Instant::now() + ROUTE_WAIT;
        let me = &self.id;
        let mut out = Vec::with_capacity(batch.frames.len());
        for frame in batch.frames {
            // The frame's queue permits go back here; sending it again takes new ones.
            let OutFrame { head, payload, .. } = frame;
            let (to, from, hops, actor) = match decode_head(&head) {
                Ok(Header::Actor(actor)) => (batch.peer.clone(), me.clone(), 0, actor),
                Ok(Header::Routed {
                    to,
                    from,
                    hops,
                    actor,
                    ..
                }) => (to, from, hops, actor),
                Ok(_) => {
                    self.counters.control_no_peer.inc();
                    continue;
                }
                Err(e) => {
                    // The router wrote every head itself: this cannot happen short of a bug.
                    tracing::error!(error = %e, "an unwritten frame's head does not decode");
                    self.counters.unsent_dropped.inc();
                    continue;
                }
            };
            out.push(Parked {
                // Not sent back to the dropped peer only if it was on the way; it may be the
                // destination, reachable again.
                came_from: me.clone(),
                to,
                from,
                hops,
                lane: batch.slot as u16,
                actor,
                payload,
                deadline,
                back_at: deadline,
                origin: Origin::Unsent,
            });
        }
        out
    }

    /// Tries to queue a waiting frame on its next hop without waiting; returns it if it is to
    /// wait on.
    fn try_place(
        &self,
        mut p: Parked,
        now: Instant,
        fail_call: &impl Fn(u64, String),
    ) -> Option<Parked> {
        if now >= p.back_at {
            // Any neighbour will do now, the one it came from included.
            p.came_from = self.id.clone();
        }
        match self.try_once(p) {
            Tried::Sent | Tried::Dropped => None,
            Tried::Wait(p) if now < p.deadline && self.may_wait_for_route(&p.to) => Some(*p),
            Tried::Wait(p) => {
                self.give_up(*p, "no route", fail_call);
                None
            }
        }
    }

    /// One attempt: the pure forwarding rule over the routes of the moment, then the next hop's
    /// lane if it has room.
    fn try_once(&self, p: Parked) -> Tried {
        let slot = usize::from(p.lane);
        let peer = match self.next_leg(&p.came_from, &p.to, &p.from, p.hops, slot, &p.actor) {
            Leg::Go(peer) => peer,
            Leg::NoWay => return Tried::Wait(Box::new(p)),
            Leg::Dropped => return Tried::Dropped,
        };
        let header = Header::Routed {
            to: p.to.clone(),
            from: p.from.clone(),
            hops: p.hops.saturating_add(1),
            lane: p.lane,
            actor: p.actor.clone(),
        };
        let Ok(head) = self.head(&peer, &header, p.payload.len()) else {
            self.counters.routed_invalid.inc();
            self.routed_failed(&p.from, &p.actor, "frame too large");
            return Tried::Dropped;
        };
        let order = super::routed_order(&p.from, &p.to, p.lane);
        match peer.lanes[slot].try_enqueue(head, p.payload.clone(), order) {
            Ok(()) => {
                match p.origin {
                    Origin::Forward => self.counters.routed_forwarded.inc(),
                    Origin::Unsent => self.counters.unsent_resent.inc(),
                }
                Tried::Sent
            }
            // A full lane, or a peer dropped meanwhile: it waits on.
            Err(_) => Tried::Wait(Box::new(p)),
        }
    }

    /// Drops a waiting frame: counted, and its call failed.
    fn give_up(&self, p: Parked, why: &str, fail_call: &impl Fn(u64, String)) {
        match p.origin {
            Origin::Forward => self.counters.routed_no_route.inc(),
            Origin::Unsent => self.counters.unsent_dropped.inc(),
        }
        tracing::debug!(to = %p.to, from = %p.from, hops = p.hops, why, me = %self.id.name, came_from = %p.came_from.name, "waiting frame dropped");
        if p.from == self.id {
            if let ActorHeader::Send { call: Some(c), .. } = &p.actor {
                fail_call(*c, format!("unreachable: {why}"));
            }
        } else {
            self.routed_failed(&p.from, &p.actor, why);
        }
    }
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::dispatch::Dispatcher;
    use crate::membership::RouteChange;
    use crate::overlay::Liveness;
    use crate::router::{PeerEntry, RouterLimits, WaitingQueues};
    use crate::wire::frame::Dest;

    fn id(name: &str) -> NodeId {
        NodeId::new(name, ([127, 0, 0, 1], 9).into(), 1)
    }

    /// Node `a`'s router, its members `a`, `b`, `c`, with the task that holds waiting frames
    /// running; returns how many of its own calls the task failed.
    fn router() -> (Arc<Router>, Arc<AtomicUsize>) {
        let specs = crate::config::TransportConfig::default().channel_specs();
        let limits = RouterLimits::for_tests();
        let dispatch = Dispatcher::new(specs, true, false);
        let (router, queues) = Router::new(id("a"), dispatch, Liveness::Membership, limits);
        let router = Arc::new(router);
        router.set_members(Arc::new(vec![id("a"), id("b"), id("c")]));
        let failed = Arc::new(AtomicUsize::new(0));
        let f = failed.clone();
        let WaitingQueues { unsent, parked } = queues.expect("membership liveness");
        let fail = move |_, _| {
            f.fetch_add(1, Ordering::Relaxed);
        };
        tokio::spawn(router.clone().run_waiting(unsent, parked, fail));
        (router, failed)
    }

    /// A call from `z` to `b` that arrived from `x`, for node `a` to forward.
    fn parked(to: &str) -> Parked {
        let actor = ActorHeader::Send {
            to: Dest::Id(1),
            incarnation: 0,
            call: Some(7),
            ty: 0,
        };
        Parked::forward(id("x"), id(to), id("z"), 1, 1, actor, Body::default())
    }

    async fn park(router: &Router, p: Parked) {
        let tx = router.parked.as_ref().expect("membership liveness");
        tx.send(p).await.unwrap();
    }

    /// Lets the task take what it was sent.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_waits_for_a_route_and_goes_when_one_appears() {
        let (router, _) = router();
        park(&router, parked("b")).await;
        settle().await;
        assert_eq!(router.counters.routed_forwarded.get(), 0);
        assert_eq!(router.counters.routed_no_route.get(), 0);
        // A neighbour `c` and a route to `b` through it, a second later.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let PeerEntry::New { peer: c, .. } = router.peer_entry(&id("c")).unwrap() else {
            panic!("a new peer");
        };
        router.set_route(RouteChange::Set {
            dst: id("b"),
            via: id("c"),
        });
        settle().await;
        assert_eq!(router.counters.routed_forwarded.get(), 1);
        assert!(
            c.lanes[1].queued_bytes() > 0,
            "queued on the lane it came on"
        );
        assert_eq!(router.counters.routed_no_route.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_whose_way_on_is_back_goes_back_after_a_moment() {
        let (router, _) = router();
        // The route to `b` goes through `x`, the neighbour the frame came from.
        router.set_members(Arc::new(vec![id("a"), id("b"), id("c"), id("x")]));
        let PeerEntry::New { peer: x, .. } = router.peer_entry(&id("x")).unwrap() else {
            panic!("a new peer");
        };
        router.set_route(RouteChange::Set {
            dst: id("b"),
            via: id("x"),
        });
        park(&router, parked("b")).await;
        tokio::time::sleep(SEND_BACK_AFTER / 2).await;
        assert_eq!(router.counters.routed_forwarded.get(), 0, "not at once");
        tokio::time::sleep(SEND_BACK_AFTER).await;
        assert_eq!(router.counters.routed_forwarded.get(), 1);
        assert!(x.lanes[1].queued_bytes() > 0, "back to `x`");
        assert_eq!(router.counters.routed_no_route.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_is_bounded_and_ends_after_the_route_wait() {
        let (router, failed) = router();
        let extra = 5;
        for _ in 0..WAITING_FRAMES + extra {
            park(&router, parked("b")).await;
        }
        settle().await;
        // Beyond the bound: dropped at once, counted.
        assert_eq!(router.counters.routed_no_route.get(), extra as u64);
        tokio::time::sleep(ROUTE_WAIT + Duration::from_millis(100)).await;
        assert_eq!(
            router.counters.routed_no_route.get(),
            (WAITING_FRAMES + extra) as u64
        );
        // Calls of another node: failed at their caller, not here.
        assert_eq!(failed.load(Ordering::Relaxed), 0);
        // A node that is not a member does not wait.
        park(&router, parked("stranger")).await;
        settle().await;
        assert_eq!(
            router.counters.routed_no_route.get(),
            (WAITING_FRAMES + extra + 1) as u64
        );
    }
}
