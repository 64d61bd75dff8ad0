//! The router: the node's peers and their lanes, the route table, and the data path of frames
//! to other nodes — direct to a peer, or wrapped and forwarded hop by hop on overlays with
//! multi-hop routes.
//!
//! The router knows nothing of actors (what a frame's header means at its destination is the
//! actor layer's business) and nothing of membership (the control loop sets its route table
//! and removes its peers). It decides one thing per frame: which lane of which peer carries
//! it, by the protocol crate's pure rules ([`next_hop`], [`forward`], which the simulator runs
//! too), and it never waits on anything but the room in that lane's queue.
//!
//! # A frame's way out
//!
//! 1. [`Router::send_frame`] (or `try_send_frame`, which fails instead of waiting) gets an
//!    [`ActorHeader`] and an encoded payload from the actor layer. `Dispatcher::pick` gives
//!    the lane slot (channel, then partition key, affinity hash or round robin).
//! 2. `next_hop` finds the [`Peer`] of the destination's name and checks its incarnation.
//!    With [`Liveness::Connection`] (static, full mesh) the frame goes to that peer or the
//!    send fails with `Unreachable`. With `Liveness::Membership` (peer-to-peer,
//!    client-server) a peer whose membership lane is up is used directly; otherwise the route
//!    table (name → destination, neighbour; set by the control loop, read under an `RwLock`
//!    only when no direct connection is up) names a neighbour, and the header is wrapped in
//!    `Header::Routed { to, from, hops: 1, lane: slot, actor }`; a peer still connecting is
//!    used when there is no route (its lanes queue the frame).
//! 3. `head` writes the frame prefix and header (`encode_head`), never the payload, which the
//!    lane's writer hands to vectored I/O as it is. A frame over `transport.max_frame_bytes` or
//!    over the limit the peer announced in its handshake fails with `TooLarge` here, before
//!    anything is queued. (A routed frame is checked against the first hop's limit; each hop
//!    checks the next one's, and a frame too large on the way is dropped, counted in
//!    `routed_invalid`, and a call fails at once.)
//! 4. `Lane::enqueue` takes permits for the frame's size from the lane's byte budget and from
//!    the node's (`transport.node_queue_bytes`, shared by every lane of every peer): `send`
//!    waits, `try_send` fails with `Backpressure`. The permits come back once the frame is
//!    written.
//!
//! # Forwarding
//!
//! A routed frame for another node ([`Router::forward`]) goes on with `hops + 1` on the same
//! lane slot its sender picked, so channels and affinity hold along the way, waiting up to
//! 2 s for room. A next hop equal to the neighbour it came from counts as no route. Drops are
//! counted (`routed_hop_limit`, `routed_no_route`, `routed_queue_full`, `routed_invalid`;
//! forwarded ones in `routed_forwarded`), and a dropped call is answered
//! `Reply { status: Failed("unreachable: …") }` back along the routes, so its caller does not
//! wait for its timeout.
//!
//! Frames that must not wait (replies with a status only, down notices, protocol frames) go
//! through `try_send_frame` and `send_control*`, which drop and count instead.
//!
//! # Overlays whose connections change
//!
//! On overlays with multi-hop routes (membership liveness), neighbours come and go as the
//! overlay reshapes itself, and for a moment after a neighbour leaves, the routes through it are
//! gone before the next member heartbeat brings new ones. Two rules keep traffic for live
//! members from being lost in that moment:
//!
//! - A send toward a current member that has no route yet waits for one (the control loop
//!   signals every change of routes, members and peers), up to `ROUTE_WAIT` (2 s); only then
//!   does it fail with `Unreachable`. A forward in that case does not hold up the lane it came
//!   on: the frame waits in [`waiting`] (bounded), tried again at every change, for the same
//!   2 s; then it is dropped (`routed_no_route`) and its call failed. A node that is not a
//!   member fails at once.
//! - The frames a dropped peer's lanes never wrote come back to the router and wait there too,
//!   sent again by the routes of the moment; what finds no way is counted in `unsent_dropped`,
//!   and a call among it fails at once. Frames already written to a connection that was then
//!   cut are not sent again (the peer may have read them).
//!
//! A frame sent again may arrive after frames its sender sent later by the new route: order
//! between two actors holds except across the moment a route changes under a frame.

mod waiting;

pub(crate) use waiting::Parked;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::broadcast::{DropReason, ForwardDecision};
use crate::counters::Counters;
use crate::dispatch::{Dispatcher, Pick, SendOpts};
use crate::error::SendError;
use crate::id::{LaneId, NodeId};
use crate::membership::{forward, next_hop, Direct, NextHop, NoHop, RouteChange};
use crate::overlay::Liveness;
use crate::transport::lane::{run_writer, Lane, LaneMetrics, Unsent, UnsentSink};
use crate::transport::stripe::{self, Role, StripesIn, StripesOut};
use crate::transport::widen::{Driver, Full, Place, Widen};
use crate::transport::{Peer, PeerRefused, QueueBudget};
use crate::wire::frame::{encode_head, ActorHeader, DownReason, Header, ReplyStatus};
use crate::wire::Body;

/// How long a forwarding node waits for room in the next hop's lane before it drops a routed
/// message (counted in `routed_queue_full`). The wait holds up the lane the message came on, as
/// a full mailbox does; the limit keeps two nodes forwarding to each other from waiting forever.
const FORWARD_WAIT: Duration = Duration::from_secs(2);

/// How long a send or a forward toward a member waits for a route to appear, and how long
/// frames a dropped peer left unwritten may take to find another way.
const ROUTE_WAIT: Duration = Duration::from_secs(2);

/// Batches of unwritten frames (one per lane of a dropped peer) waiting to be taken by the task
/// that sends them again; when full, a lane's frames are dropped and counted in its `dropped`.
/// The frames hold their queue permits meanwhile, so the bytes stay within
/// `transport.node_queue_bytes`.
const UNSENT_BATCHES: usize = 1024;

/// A round trip (µs, the kernel's for a lane's connection when it connected) from which frames
/// of one part are striped even while their lane keeps up. One connection carries at most its send
/// buffer (4 MiB by Linux's default `tcp_wmem`) per round trip: from half a millisecond that is
/// under 8 GB/s, and 16 messages of 512 KiB in flight already fill it at a millisecond. On one
/// host the round trip is tens of µs.
const LONG_ROUND_TRIP_US: u64 = 500;

/// Whether a frame of one part is striped rather than sent whole on `first`, its channel's
/// first lane: when that lane's socket lags, or its connection's round trip is long.
fn one_part_striped(first: &LaneMetrics) -> bool {
    first.behind.load(Ordering::Relaxed)
        || first.round_trip_us.load(Ordering::Relaxed) >= LONG_ROUND_TRIP_US
}

/// The receiving ends of the queues of frames waiting for a way, for [`Router::run_waiting`].
pub(crate) struct WaitingQueues {
    /// Frames dropped peers left unwritten.
    pub(crate) unsent: mpsc::Receiver<Unsent>,
    /// Forwarded frames that found no way on yet.
    pub(crate) parked: mpsc::Receiver<Parked>,
}

/// How many times a send chooses its way when the peer it chose turns out dropped meanwhile
/// (its lanes closed): the peer table changes under the choice only in that moment.
const CHOICES: usize = 3;

/// Where a routed frame goes next from this node ([`Router::next_leg`]).
enum Leg {
    /// On to this peer.
    Go(Arc<Peer>),
    /// No way on for now (no route, or only back where it came from).
    NoWay,
    /// Dropped here (counted, its call failed).
    Dropped,
}

/// Where a frame for a node goes first.
enum Hop {
    /// To the node itself.
    Direct(Arc<Peer>),
    /// To a neighbour that forwards it.
    Via(Arc<Peer>),
}

impl Hop {
    /// The peer the frame is queued for.
    fn peer(&self) -> &Arc<Peer> {
        match self {
            Hop::Direct(p) | Hop::Via(p) => p,
        }
    }
}

/// The limits the router works with (from the node's configuration).
pub(crate) struct RouterLimits {
    /// Largest frame sent.
    pub(crate) max_frame_bytes: usize,
    /// Bytes one lane's queue holds.
    pub(crate) lane_queue_bytes: usize,
    /// Bytes all lanes together hold.
    pub(crate) node_queue_bytes: usize,
    /// Frames larger than this go in parts of this size.
    pub(crate) part_bytes: usize,
    /// Frames of at least this size are striped over their channel's lanes (0: never).
    pub(crate) stripe_bytes: usize,
    /// Bytes of a peer's striped frames this node holds at most (its window).
    pub(crate) stripe_window_bytes: usize,
    /// Hops after which a routed frame is dropped.
    pub(crate) hop_limit: u16,
    /// Dials of one peer's data lanes in progress at once.
    pub(crate) dials_per_peer: usize,
}

#[cfg(test)]
impl RouterLimits {
    /// Small limits for unit tests: 1 MiB frames and lane queues, no striping.
    pub(crate) fn for_tests() -> Self {
        RouterLimits {
            max_frame_bytes: 1 << 20,
            lane_queue_bytes: 1 << 20,
            node_queue_bytes: 1 << 24,
            part_bytes: crate::wire::PART_BYTES,
            stripe_bytes: 0,
            stripe_window_bytes: 2 << 20,
            hop_limit: 16,
            dials_per_peer: 16,
        }
    }
}

/// A frame to stripe: its peer, the lane slots its parts go on, and its hold key.
struct Striped {
    peer: Arc<Peer>,
    lanes: std::ops::Range<usize>,
    hold: Option<u64>,
}

/// What [`Router::peer_entry`] found.
pub(crate) enum PeerEntry {
    /// The peer was known (this incarnation).
    Known(Arc<Peer>),
    /// It is new: its lanes' writers run, its dialers are the caller's to start. `replaced` is
    /// the older incarnation it took the place of.
    New {
        /// The new peer.
        peer: Arc<Peer>,
        /// The incarnation it replaced, if any.
        replaced: Option<NodeId>,
    },
}

/// The node's peers, routes and frame path.
pub(crate) struct Router {
    /// This node.
    pub(crate) id: NodeId,
    /// The channel table and the lane picker.
    pub(crate) dispatch: Dispatcher,
    /// The node's counters.
    pub(crate) counters: Counters,
    /// How nodes are declared down (from the overlay).
    pub(crate) liveness: Liveness,
    /// Cancelled when the node stops.
    pub(crate) shutdown: CancellationToken,
    /// The bytes all lanes together may hold queued.
    pub(crate) queue_budget: QueueBudget,
    limits: RouterLimits,
    started: Instant,
    peers: RwLock<HashMap<Arc<str>, Arc<Peer>>>,
    /// Routes to non-neighbours, by name: (destination, neighbour to go through). Set by the
    /// control loop from the membership machine, read by sends only when no direct connection
    /// is up (no overlay lock on the way).
    routes: RwLock<HashMap<Arc<str>, (NodeId, NodeId)>>,
    /// The members, as the control loop last published them.
    members: RwLock<Members>,
    /// Signalled whenever a route, a peer or the members change: sends waiting for a route
    /// look again.
    routes_changed: Notify,
    /// Where lanes of dropped peers hand their unwritten frames (membership liveness only).
    unsent: Option<mpsc::Sender<Unsent>>,
    /// Where forwarded frames with no way on yet wait (membership liveness only).
    parked: Option<mpsc::Sender<Parked>>,
    /// The node's stages, when it sizes them (lane writers run in the send stage).
    pub(crate) stages: Option<Arc<crate::stages::Stages>>,
    /// What the lanes of peers that are gone carried.
    pub(crate) retired: Arc<crate::transport::lane::Retired>,
}

/// The members as published, and by name (a lookup per remote call: a binary search over
/// names spread in memory cost a cache miss per step).
struct Members {
    list: Arc<Vec<NodeId>>,
    by_name: HashMap<Arc<str>, NodeId>,
}

impl Members {
    fn new(list: Arc<Vec<NodeId>>) -> Self {
        let mut by_name: HashMap<Arc<str>, NodeId> = HashMap::with_capacity(list.len());
        for m in list.iter() {
            match by_name.get(&m.name) {
                Some(known) if known.incarnation >= m.incarnation => {}
                _ => {
                    by_name.insert(m.name.clone(), m.clone());
                }
            }
        }
        Members { list, by_name }
    }
}

impl Router {
    /// A router for node `id` with no peers; with membership liveness also the queues of frames
    /// waiting for a way, for [`Router::run_waiting`].
    pub(crate) fn new(
        id: NodeId,
        dispatch: Dispatcher,
        liveness: Liveness,
        limits: RouterLimits,
    ) -> (Self, Option<WaitingQueues>) {
        let (unsent, parked, queues) = if liveness == Liveness::Membership {
            let (unsent, unsent_rx) = mpsc::channel(UNSENT_BATCHES);
            let (parked, parked_rx) = mpsc::channel(waiting::PARKED_QUEUE);
            let queues = WaitingQueues {
                unsent: unsent_rx,
                parked: parked_rx,
            };
            (Some(unsent), Some(parked), Some(queues))
        } else {
            (None, None, None)
        };
        let members = RwLock::new(Members::new(Arc::new(vec![id.clone()])));
        let router = Router {
            id,
            dispatch,
            counters: Counters::default(),
            liveness,
            shutdown: CancellationToken::new(),
            queue_budget: QueueBudget::new(limits.node_queue_bytes),
            limits,
            started: Instant::now(),
            peers: RwLock::new(HashMap::new()),
            routes: RwLock::new(HashMap::new()),
            members,
            routes_changed: Notify::new(),
            unsent,
            parked,
            stages: None,
            retired: Default::default(),
        };
        (router, queues)
    }

    /// The members as the control loop last published them (sorted).
    pub(crate) fn members(&self) -> Arc<Vec<NodeId>> {
        self.members
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .list
            .clone()
    }

    /// The member named `name` (its newest incarnation, if several are listed).
    pub(crate) fn member(&self, name: &str) -> Option<NodeId> {
        self.members
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_name
            .get(name)
            .cloned()
    }

    /// Sets the members (sorted, this node included).
    pub(crate) fn set_members(&self, members: Arc<Vec<NodeId>>) {
        let members = Members::new(members);
        *self.members.write().unwrap_or_else(|e| e.into_inner()) = members;
        self.routes_changed.notify_waiters();
    }

    /// A peer's membership lane came up: sends waiting for a way to it look again.
    pub(crate) fn peer_up(&self) {
        self.routes_changed.notify_waiters();
    }

    /// When the node started.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// Microseconds since the node started.
    pub(crate) fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Whether `node` is this node; a ref to an older life of this node is an error.
    pub(crate) fn is_local(&self, node: &NodeId) -> Result<bool, SendError> {
        if node.name != self.id.name {
            return Ok(false);
        }
        if node.incarnation == self.id.incarnation {
            Ok(true)
        } else {
            Err(SendError::StaleIncarnation {
                node: node.name.to_string(),
                ref_incarnation: node.incarnation,
                current: self.id.incarnation,
            })
        }
    }

    /// The peer of that name (any incarnation).
    pub(crate) fn peer(&self, name: &str) -> Option<Arc<Peer>> {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// The peer of exactly that incarnation.
    pub(crate) fn peer_of(&self, id: &NodeId) -> Option<Arc<Peer>> {
        self.peer(&id.name).filter(|p| p.id == *id)
    }

    /// Every peer now.
    pub(crate) fn peers(&self) -> Vec<Arc<Peer>> {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Whether a peer listens on `addr`.
    pub(crate) fn knows_addr(&self, addr: std::net::SocketAddr) -> bool {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .any(|p| p.id.addr == addr)
    }

    /// Removes the peer if it is that incarnation; returns it.
    pub(crate) fn remove_peer(&self, id: &NodeId) -> Option<Arc<Peer>> {
        let mut peers = self.peers.write().unwrap_or_else(|e| e.into_inner());
        match peers.get(&id.name) {
            Some(p) if p.id == *id => peers.remove(&id.name),
            _ => None,
        }
    }

    /// Removes every peer (the node stops); returns them.
    pub(crate) fn drain_peers(&self) -> Vec<Arc<Peer>> {
        self.peers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, p)| p)
            .collect()
    }

    /// Applies a change of the route table.
    pub(crate) fn set_route(&self, change: RouteChange<NodeId>) {
        let mut table = self.routes.write().unwrap_or_else(|e| e.into_inner());
        match change {
            RouteChange::Set { dst, via } => {
                table.insert(dst.name.clone(), (dst, via));
            }
            RouteChange::Remove(name) => {
                table.remove(&name);
            }
        }
        drop(table);
        self.routes_changed.notify_waiters();
    }

    /// Finds or creates the peer for `id`. A newer incarnation replaces an older one (whose
    /// lanes are aborted): a restart. Refused: an older incarnation than the one known, any
    /// while stopping, and a node with the name of a peer whose membership connection is open
    /// at another address — two live nodes may not share a name, and a restart either keeps
    /// its address or comes after the old process's connections have closed.
    pub(crate) fn peer_entry(&self, id: &NodeId) -> Result<PeerEntry, PeerRefused> {
        if self.shutdown.is_cancelled() {
            return Err(PeerRefused::ShuttingDown);
        }
        let mut peers = self.peers.write().unwrap_or_else(|e| e.into_inner());
        let mut replaced = None;
        if let Some(p) = peers.get(&id.name) {
            if p.id == *id {
                return Ok(PeerEntry::Known(p.clone()));
            }
            if p.id.incarnation > id.incarnation {
                return Err(PeerRefused::Stale(id.name.to_string()));
            }
            let connected = p.is_up() && p.lanes[self.dispatch.membership_slot()].is_connected();
            if connected && p.id.addr != id.addr {
                return Err(PeerRefused::Duplicate {
                    name: id.name.to_string(),
                    addr: p.id.addr,
                });
            }
            replaced = Some(p.id.clone());
            if let Some(old_peer) = peers.remove(&id.name) {
                old_peer.abort.cancel();
            }
        }
        let peer = self.new_peer(id);
        peers.insert(id.name.clone(), peer.clone());
        self.routes_changed.notify_waiters();
        Ok(PeerEntry::New { peer, replaced })
    }

    /// A peer with its lanes, their writers running.
    fn new_peer(&self, id: &NodeId) -> Arc<Peer> {
        let abort = self.shutdown.child_token();
        let close = CancellationToken::new();
        let mut lanes = Vec::with_capacity(self.dispatch.total_lanes());
        let mut tasks = Vec::new();
        let mut widths = Vec::with_capacity(self.dispatch.total_lanes());
        let rtt_us = Arc::new(AtomicU64::new(0));
        for spec in self.dispatch.specs() {
            for index in 0..spec.parallelism {
                let (lane, task) = Lane::with_budget(
                    LaneId::new(spec.name.clone(), index),
                    self.limits.lane_queue_bytes,
                    self.queue_budget.clone(),
                    self.retired.clone(),
                );
                tasks.push((lane.clone(), task, None));
                lanes.push(lane);
                widths.push(None);
            }
            // With striping, a channel's small frames start on its first lane and take more
            // when the network, not the CPU, holds them up.
            if self.limits.stripe_bytes > 0 && spec.parallelism > 1 {
                let widen = Arc::new(Widen::new(spec.parallelism as usize));
                let channel = lanes[spec.offset..spec.offset + spec.parallelism as usize].to_vec();
                tasks[spec.offset].2 = Some(Driver::new(widen.clone(), channel, rtt_us.clone()));
                widths[spec.offset] = Some(widen);
            }
        }
        let peer = Arc::new(Peer {
            id: id.clone(),
            lanes,
            up: Default::default(),
            said_bye: Default::default(),
            last_seen_us: AtomicU64::new(self.now_us()),
            rtt_us,
            written_at_tick: Default::default(),
            max_frame: AtomicU64::new(u64::MAX),
            stripes_out: StripesOut::new(abort.clone()),
            stripes_in: StripesIn::new(
                self.limits.max_frame_bytes,
                self.limits.stripe_window_bytes,
            ),
            widths,
            barriers_in: Default::default(),
            abort: abort.clone(),
            close: close.clone(),
            changed: Default::default(),
            dials: tokio::sync::Semaphore::new(self.limits.dials_per_peer.max(1)),
            writers: Default::default(),
        });
        let writers = tasks
            .into_iter()
            .enumerate()
            .map(|(slot, (lane, task, widen))| {
                let sink = self.unsent.clone().map(|tx| UnsentSink {
                    peer: id.clone(),
                    slot,
                    tx,
                });
                crate::stages::spawn(
                    self.stages.as_ref(),
                    crate::stages::Stage::Send,
                    run_writer(
                        lane,
                        task,
                        abort.clone(),
                        close.clone(),
                        sink,
                        self.limits.part_bytes,
                        widen,
                    ),
                )
            })
            .collect();
        *peer.writers.lock().unwrap_or_else(|e| e.into_inner()) = writers;
        peer
    }

    /// The peer whose lanes carry traffic for `dst`: the node itself when it is a peer, else
    /// (on overlays with multi-hop routes) the neighbour a route names
    /// ([`next_hop`] decides).
    fn next_hop(&self, dst: &NodeId) -> Result<Hop, SendError> {
        let direct = self.peer(&dst.name);
        let route = || {
            self.routes
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(&dst.name)
                .cloned()
        };
        let mut via_peer = None;
        let hop = next_hop(
            self.liveness,
            dst,
            direct.as_ref().map(|p| Direct {
                id: &p.id,
                up: p.is_up(),
            }),
            route,
            |via| {
                via_peer = self.peer_of(via);
                via_peer.is_some()
            },
        );
        match hop {
            Ok(NextHop::Direct) => direct.map(Hop::Direct),
            Ok(NextHop::Via(_)) => via_peer.map(Hop::Via),
            Err(NoHop::Stale { current }) => {
                return Err(SendError::StaleIncarnation {
                    node: dst.name.to_string(),
                    ref_incarnation: dst.incarnation,
                    current,
                })
            }
            Err(NoHop::Unreachable) => None,
        }
        .ok_or_else(|| SendError::Unreachable(dst.name.to_string()))
    }

    /// Whether a send toward `dst` that finds no way may wait for one: `dst` is a member (this
    /// incarnation) on an overlay whose routes change.
    fn may_wait_for_route(&self, dst: &NodeId) -> bool {
        self.liveness == Liveness::Membership
            && self
                .members
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .list
                .binary_search(dst)
                .is_ok()
    }

    /// [`Router::next_hop`], waiting until `deadline` while `dst` is a member with no way to it
    /// (its route being rebuilt after a neighbour left).
    async fn next_hop_by(
        &self,
        dst: &NodeId,
        deadline: tokio::time::Instant,
    ) -> Result<Hop, SendError> {
        loop {
            let changed = self.routes_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.next_hop(dst) {
                Err(SendError::Unreachable(_))
                    if tokio::time::Instant::now() < deadline && self.may_wait_for_route(dst) =>
                {
                    tokio::select! {
                        _ = &mut changed => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                        _ = self.shutdown.cancelled() => return Err(SendError::Unreachable(dst.name.to_string())),
                    }
                }
                other => return other,
            }
        }
    }

    /// The peer and the head of a frame for `dst` on lane `slot`, sent to `hop`: wrapped for
    /// forwarding when `hop` is a neighbour on the way; and whether it goes to `dst` itself.
    fn frame_to(
        &self,
        hop: Hop,
        dst: &NodeId,
        slot: usize,
        header: ActorHeader,
        payload_len: usize,
    ) -> Result<(Arc<Peer>, Bytes, bool), SendError> {
        let direct = matches!(hop, Hop::Direct(_));
        let (peer, header) = match hop {
            Hop::Direct(peer) => (peer, Header::Actor(header)),
            Hop::Via(peer) => {
                let routed = Header::Routed {
                    to: dst.clone(),
                    from: self.id.clone(),
                    hops: 1,
                    lane: slot as u16,
                    actor: header,
                };
                (peer, routed)
            }
        };
        let head = self.head(&peer, &header, payload_len)?;
        Ok((peer, head, direct))
    }

    /// [`Router::next_hop`], chosen again (up to `CHOICES` times) while the peer chosen turns
    /// out dropped meanwhile: its lane `slot` takes no more frames.
    fn open_hop(&self, dst: &NodeId, slot: usize) -> Result<Hop, SendError> {
        let mut hop = self.next_hop(dst);
        for _ in 1..CHOICES {
            match &hop {
                Ok(h) if h.peer().lanes[slot].is_closed() => hop = self.next_hop(dst),
                _ => break,
            }
        }
        hop
    }

    /// The frame prefix and header of a frame for `peer`: at most this node's frame limit and
    /// the peer's (from its handshake), so a message too large for its receiver fails here,
    /// before any byte is queued.
    fn head(&self, peer: &Peer, header: &Header, payload_len: usize) -> Result<Bytes, SendError> {
        let max = self.limits.max_frame_bytes.min(peer.max_frame());
        crate::slab::cut(64, |buf| encode_head(header, payload_len, max, buf)).map_err(|_| {
            SendError::TooLarge {
                len: payload_len,
                max,
            }
        })
    }

    /// Queues a frame for `dst`, waiting for room in the lane's queue (and, for a member with
    /// no way to it yet, up to `ROUTE_WAIT` for a route). `sender` and `receiver` are the
    /// hashes the lane picker uses for affinity.
    pub(crate) async fn send_frame(
        &self,
        dst: &NodeId,
        opts: &SendOpts,
        sender: u64,
        receiver: u64,
        header: ActorHeader,
        payload: Body,
    ) -> Result<(), SendError> {
        match self.send_frame_now(dst, opts, sender, receiver, header, payload) {
            Now::Done(r) => r,
            Now::Later(later) => self.send_later(dst, later).await,
        }
    }

    /// The part of [`Router::send_frame`] that takes no waiting: the frame is queued when its
    /// way is known, it goes whole and its lane has room (most sends); otherwise what is left
    /// to do comes back, for [`Router::send_later`]. A sender that awaits only in the rare
    /// case keeps a small future (and allocates none) in the common one.
    pub(crate) fn send_frame_now(
        &self,
        dst: &NodeId,
        opts: &SendOpts,
        sender: u64,
        receiver: u64,
        header: ActorHeader,
        payload: Body,
    ) -> Now {
        let pick = self.dispatch.pick(opts, sender, receiver);
        match self.open_hop(dst, pick.slot) {
            Err(SendError::Unreachable(_)) if self.may_wait_for_route(dst) => {
                Now::Later(Later(Step::Route {
                    pick,
                    header,
                    payload,
                }))
            }
            Err(e) => Now::Done(Err(e)),
            Ok(hop) => self.frame_now(hop, dst, pick, header, payload),
        }
    }

    /// Frames a message for `hop` and queues it if its lane has room now; or what is left.
    fn frame_now(
        &self,
        hop: Hop,
        dst: &NodeId,
        pick: Pick,
        header: ActorHeader,
        payload: Body,
    ) -> Now {
        let Pick {
            slot,
            order,
            stripe,
        } = pick;
        let striped = self.stripe_peer(&hop, stripe, slot, &header, payload.len());
        let (peer, head, direct) = match self.frame_to(hop, dst, slot, header, payload.len()) {
            Ok(framed) => framed,
            Err(e) => return Now::Done(Err(e)),
        };
        if let Some(striped) = striped {
            let frame = Framed {
                peer,
                slot,
                direct,
                head,
                payload,
                order,
            };
            return Now::Later(Later(Step::Striped(striped, frame)));
        }
        match place(&peer, slot, direct).try_enqueue((head, payload), order, Role::Whole) {
            Ok(queued) => Now::Done(queued.map(drop)),
            Err(Full {
                frame: (head, payload),
                why,
            }) => {
                let frame = Framed {
                    peer,
                    slot,
                    direct,
                    head,
                    payload,
                    order,
                };
                Now::Later(Later(Step::Room(frame, why)))
            }
        }
    }

    /// Finishes a send [`Router::send_frame_now`] could not: waits for a route, for room, or
    /// stripes the frame.
    pub(crate) async fn send_later(&self, dst: &NodeId, later: Later) -> Result<(), SendError> {
        match later.0 {
            Step::Route {
                pick,
                header,
                payload,
            } => {
                let deadline = tokio::time::Instant::now() + ROUTE_WAIT;
                let hop = self.next_hop_by(dst, deadline).await?;
                match self.frame_now(hop, dst, pick, header, payload) {
                    Now::Done(r) => r,
                    // Room or striping: no route to wait for again.
                    Now::Later(later) => Box::pin(self.send_later(dst, later)).await,
                }
            }
            Step::Striped(striped, f) => {
                let place = place(&f.peer, f.slot, f.direct);
                let send = self.send_striped(&striped, place, f.head, f.payload, f.order, true);
                Box::pin(send).await
            }
            Step::Room(f, _) => place(&f.peer, f.slot, f.direct)
                .enqueue((f.head, f.payload), f.order, Role::Whole, true)
                .await
                .map(drop),
        }
    }

    /// Finishes a send [`Router::send_frame_now`] could not without waiting: a striped frame
    /// goes if it can at once; otherwise `Backpressure`.
    fn later_without_waiting(&self, later: Later) -> Result<(), SendError> {
        match later.0 {
            Step::Striped(striped, f) => {
                let place = place(&f.peer, f.slot, f.direct);
                self.send_striped(&striped, place, f.head, f.payload, f.order, false)
                    .now_or_never()
                    .unwrap_or(Err(SendError::Backpressure("striped frames")))
            }
            Step::Room(_, why) => Err(why),
            Step::Route { .. } => Err(SendError::Backpressure("no route yet")),
        }
    }

    /// Queues a frame for `dst` or fails with `Backpressure` at once.
    pub(crate) fn try_send_frame(
        &self,
        dst: &NodeId,
        opts: &SendOpts,
        sender: u64,
        receiver: u64,
        header: ActorHeader,
        payload: Body,
    ) -> Result<(), SendError> {
        let pick = self.dispatch.pick(opts, sender, receiver);
        let hop = self.open_hop(dst, pick.slot)?;
        match self.frame_now(hop, dst, pick, header, payload) {
            Now::Done(r) => r,
            Now::Later(later) => self.later_without_waiting(later),
        }
    }

    /// Where to stripe a frame with `len` bytes of payload, whose channel's first lane (where
    /// it goes whole) is `first`, when it is to be striped: large
    /// enough, on a channel that stripes, to a peer directly that has announced a window it
    /// fits in (a frame forwarded through other nodes goes whole, and so does one sent before
    /// the peer's window arrives, a moment after its first lane connects). A frame of one part
    /// (up to `part_bytes`) goes whole on its channel's first lane when that lane's connection
    /// has a round trip under [`LONG_ROUND_TRIP_US`] and its socket takes its writes at once:
    /// striping it then buys no bandwidth, and its bytes spread over more sockets' buffers
    /// cost more CPU (on loopback a 512 KiB echo cost about 430 µs of CPU striped and 300 µs
    /// whole). Over a longer round trip one connection carries at most a window per round
    /// trip, and a few large messages in flight fill it whether or not the last write waited.
    fn stripe_peer(
        &self,
        hop: &Hop,
        lanes: Option<std::ops::Range<usize>>,
        first: usize,
        header: &ActorHeader,
        len: usize,
    ) -> Option<Striped> {
        let lanes = lanes?;
        match hop {
            Hop::Direct(peer)
                if self.limits.stripe_bytes > 0
                    && len >= self.limits.stripe_bytes
                    && peer.stripes_out.fits(len)
                    && (len > self.limits.part_bytes
                        || one_part_striped(&peer.lanes[first].metrics)) =>
            {
                Some(Striped {
                    peer: peer.clone(),
                    lanes,
                    hold: crate::wire::actor_hold_key(header),
                })
            }
            _ => None,
        }
    }

    /// Sends a frame striped (see `transport::stripe::send`), its commit at `ordering`.
    fn send_striped<'a>(
        &'a self,
        s: &'a Striped,
        ordering: Place<'a>,
        head: Bytes,
        payload: Body,
        order: u64,
        wait: bool,
    ) -> impl std::future::Future<Output = Result<(), SendError>> + 'a {
        stripe::send(
            &s.peer.stripes_out,
            ordering,
            &s.peer.lanes[s.lanes.clone()],
            (head, payload),
            (order, s.hold),
            self.limits.part_bytes,
            wait,
        )
    }

    /// Queues a protocol frame on a peer's membership lane; never waits (drops and counts:
    /// `control_drops` when the lane or the node has no room, `control_no_peer` when the lane
    /// is closed).
    pub(crate) fn send_control(&self, peer: &Peer, header: &Header, payload: Bytes) {
        let ok = self.head(peer, header, payload.len()).and_then(|head| {
            peer.lanes[self.dispatch.membership_slot()].try_enqueue(head, payload, None)
        });
        if let Err(e) = ok {
            match e {
                SendError::Backpressure(_) => self.counters.control_drops.inc(),
                _ => self.counters.control_no_peer.inc(),
            }
            tracing::debug!(peer = %peer.id, error = %e, "protocol frame dropped");
        }
    }

    /// Actor traffic without a payload that must not wait (a down notice, a watch whose data
    /// lane is full): on the node's membership lane if it is a peer, else routed (on overlays
    /// with multi-hop routes); dropped and counted otherwise.
    pub(crate) fn send_control_to(&self, node: &NodeId, header: ActorHeader) {
        match self.peer_of(node) {
            Some(p) => self.send_control(&p, &Header::Actor(header), Bytes::new()),
            None if self.liveness == Liveness::Membership => {
                let opts = SendOpts::default();
                if self
                    .try_send_frame(node, &opts, 0, 0, header, Body::default())
                    .is_err()
                {
                    self.counters.control_drops.inc();
                }
            }
            None => self.counters.control_no_peer.inc(),
        }
    }

    /// Answers a call with a status (no payload) without waiting.
    pub(crate) fn reply_status(&self, to: &NodeId, call: u64, status: ReplyStatus) {
        let header = ActorHeader::Reply {
            call,
            status,
            ty: 0,
        };
        if let Err(e) =
            self.try_send_frame(to, &SendOpts::default(), 0, call, header, Body::default())
        {
            tracing::debug!(%to, error = %e, "status reply dropped");
        }
    }

    /// Tells a remote watcher that an actor stopped.
    pub(crate) fn send_down(&self, to: &NodeId, watch: u64, target: u64, reason: DownReason) {
        self.send_control_to(
            to,
            ActorHeader::Down {
                watch,
                target,
                reason,
            },
        );
    }

    /// Sends a frame without a payload on the lane `sender`'s messages to `receiver` take, so
    /// that it stays in order with them; when that lane is full, on the membership lane
    /// (unordered) instead.
    pub(crate) fn send_ordered(
        &self,
        to: &NodeId,
        sender: u64,
        receiver: u64,
        header: ActorHeader,
    ) {
        let opts = SendOpts::default();
        // Watch headers are a few integers: the copy for the fallback costs nothing.
        if self
            .try_send_frame(to, &opts, sender, receiver, header.clone(), Body::default())
            .is_err()
        {
            self.send_control_to(to, header);
        }
    }

    /// Passes a routed frame that arrived from `came_from` on to the next hop, on the lane slot
    /// its sender picked. A next hop that is the neighbour it came from (routes that disagree
    /// for a moment) counts as no route: the frame is dropped at once rather than bounced to
    /// the hop limit.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn forward(
        &self,
        came_from: &NodeId,
        to: NodeId,
        from: NodeId,
        hops: u16,
        lane: u16,
        actor: ActorHeader,
        payload: Bytes,
    ) {
        let slot = usize::from(lane);
        let peer = match self.next_leg(came_from, &to, &from, hops, slot, &actor) {
            Leg::Go(peer) => Some(peer),
            Leg::NoWay => None,
            Leg::Dropped => return,
        };
        let Some(peer) = peer else {
            // No way on (or only back where it came from, while routes disagree) toward a
            // member: it waits for the routes to change, without holding up this lane.
            let (to, from, actor) = match &self.parked {
                Some(tx) if self.may_wait_for_route(&to) => {
                    let p = Parked::forward(
                        came_from.clone(),
                        to,
                        from,
                        hops,
                        lane,
                        actor,
                        payload.into(),
                    );
                    match tx.try_send(p) {
                        Ok(()) => return,
                        Err(e) => {
                            let p = e.into_inner();
                            (p.to, p.from, p.actor)
                        }
                    }
                }
                _ => (to, from, actor),
            };
            self.counters.routed_no_route.inc();
            tracing::debug!(%to, %from, hops, me = %self.id, %came_from, "routed message dropped: no route");
            return self.routed_failed(&from, &actor, "no route");
        };
        let order = routed_order(&from, &to, lane);
        let header = Header::Routed {
            to,
            from: from.clone(),
            hops: hops.saturating_add(1),
            lane,
            actor: actor.clone(),
        };
        let head = match self.head(&peer, &header, payload.len()) {
            Ok(h) => h,
            Err(_) => {
                self.counters.routed_invalid.inc();
                return self.routed_failed(&from, &actor, "frame too large");
            }
        };
        let queued =
            tokio::time::timeout(FORWARD_WAIT, peer.lanes[slot].enqueue(head, payload, order))
                .await;
        match queued {
            Ok(Ok(())) => self.counters.routed_forwarded.inc(),
            _ => {
                self.counters.routed_queue_full.inc();
                self.routed_failed(&from, &actor, "next hop congested");
            }
        }
    }

    /// Where a routed frame goes next from here, by the pure forwarding rule over the routes of
    /// the moment. A frame on a lane slot this node does not have, or at the hop limit, is
    /// dropped here (counted, its call failed).
    fn next_leg(
        &self,
        came_from: &NodeId,
        to: &NodeId,
        from: &NodeId,
        hops: u16,
        slot: usize,
        actor: &ActorHeader,
    ) -> Leg {
        if slot >= self.dispatch.total_lanes() {
            self.counters.routed_invalid.inc();
            self.routed_failed(from, actor, "invalid lane");
            return Leg::Dropped;
        }
        let limit = self.limits.hop_limit;
        let next = forward(&self.id, came_from, to, hops, limit, |d| {
            match self.next_hop(d) {
                Ok(Hop::Direct(p)) | Ok(Hop::Via(p)) => Some(p.id.clone()),
                Err(_) => None,
            }
        });
        match next {
            ForwardDecision::ForwardTo(id) => self.peer_of(&id).map_or(Leg::NoWay, Leg::Go),
            ForwardDecision::Drop(DropReason::HopLimit) => {
                self.counters.routed_hop_limit.inc();
                tracing::debug!(%to, %from, hops, "routed message dropped: hop limit");
                self.routed_failed(from, actor, "hop limit reached");
                Leg::Dropped
            }
            ForwardDecision::Drop(DropReason::NoRoute) | ForwardDecision::Deliver => Leg::NoWay,
        }
    }

    /// A routed call that cannot go on fails at once at its caller instead of timing out.
    fn routed_failed(&self, from: &NodeId, actor: &ActorHeader, why: &str) {
        if let ActorHeader::Send { call: Some(c), .. } = actor {
            if *from != self.id {
                let status = ReplyStatus::Failed(format!("unreachable: {why}"));
                self.reply_status(from, *c, status);
            }
        }
    }
}

/// Where a frame for `peer` picked for lane `slot` goes: on a channel whose small frames may
/// take several lanes, to the peer itself, the lane its key takes now; else lane `slot`.
/// What [`Router::send_frame_now`] did.
pub(crate) enum Now {
    /// Queued, or failed.
    Done(Result<(), SendError>),
    /// Not yet: [`Router::send_later`] finishes it.
    Later(Later),
}

/// A send that has to wait (for a route, for room) or go striped.
pub(crate) struct Later(Step);

enum Step {
    /// No way to the destination yet, which is a member: wait for a route.
    Route {
        pick: Pick,
        header: ActorHeader,
        payload: Body,
    },
    /// To go striped.
    Striped(Striped, Framed),
    /// Its lane (or the node) had no room: `Backpressure` saying which.
    Room(Framed, SendError),
}

/// A frame made for a peer's lane.
struct Framed {
    peer: Arc<Peer>,
    slot: usize,
    direct: bool,
    head: Bytes,
    payload: Body,
    order: u64,
}

fn place(peer: &Peer, slot: usize, direct: bool) -> Place<'_> {
    match &peer.widths[slot] {
        Some(widen) if direct => Place::Widened {
            widen,
            lanes: &peer.lanes[slot..slot + widen.lanes()],
        },
        _ => Place::Lane(&peer.lanes[slot]),
    }
}

/// The order key of a frame passing through on its way from `from` to `to` on lane `lane`:
/// such frames keep the order they arrived in, the sender's own order by pair being unknown
/// here (see `transport::schedule`).
pub(crate) fn routed_order(from: &NodeId, to: &NodeId, lane: u16) -> Option<u64> {
    Some(crate::dispatch::hash_of(&(from, to, lane)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, incarnation: u64) -> NodeId {
        NodeId::new(name, "127.0.0.1:1".parse().unwrap(), incarnation)
    }

    #[test]
    fn a_member_by_name_is_its_newest_incarnation() {
        let mut list = vec![id("b", 7), id("a", 1), id("b", 9), id("b", 8)];
        list.sort();
        let m = Members::new(Arc::new(list));
        assert_eq!(m.by_name.get("b"), Some(&id("b", 9)));
        assert_eq!(m.by_name.get("a"), Some(&id("a", 1)));
        assert_eq!(m.by_name.get("c"), None);
        assert_eq!(m.list.len(), 4);
    }

    /// A frame of one part goes whole on a lane of a short round trip that keeps up, and is
    /// striped when the lane lags or its round trip is long (or not whole when unknown: 0).
    #[test]
    fn one_part_frames_are_striped_over_long_round_trips_or_a_lagging_lane() {
        let m = LaneMetrics::default();
        assert!(!one_part_striped(&m), "round trip unknown, keeping up");
        m.round_trip_us.store(40, Ordering::Relaxed);
        assert!(!one_part_striped(&m), "one host");
        m.behind.store(true, Ordering::Relaxed);
        assert!(one_part_striped(&m), "lagging");
        m.behind.store(false, Ordering::Relaxed);
        m.round_trip_us.store(LONG_ROUND_TRIP_US, Ordering::Relaxed);
        assert!(one_part_striped(&m), "a long round trip");
        m.round_trip_us.store(20_000, Ordering::Relaxed);
        assert!(one_part_striped(&m), "20 ms");
    }
}
