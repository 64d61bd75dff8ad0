//! The node's shared state and its data path: sending frames to peers and handling the frames
//! that arrive.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::control::Control;
use super::topics::Topics;
use super::MembershipEvent;
use crate::actor::registry::{RemoteMsg, Watcher};
use crate::actor::{CallOutcome, Monitors, PendingCalls};
use crate::broadcast::{DropReason, ForwardDecision};
use crate::config::Config;
use crate::counters::Counters;
use crate::dispatch::{Dispatcher, SendOpts};
use crate::error::SendError;
use crate::id::{LaneId, NodeId};
use crate::membership::{forward, next_hop, Direct, NextHop, NoHop};
use crate::overlay::Liveness;
use crate::transport::lane::{run_writer, Lane};
use crate::transport::{connector, Peer, QueueBudget};
use crate::wire::frame::{encode_head, Dest, DownReason, Frame, Header, ReplyStatus, Routed};

/// How long a forwarding node waits for room in the next hop's lane before it drops a routed
/// message (counted in `routed_queue_full`). The wait holds up the lane the message came on, as
/// a full mailbox does; the limit keeps two nodes forwarding to each other from waiting forever.
const FORWARD_WAIT: Duration = Duration::from_secs(2);

/// Where a frame for a node goes first.
enum Hop {
    /// To the node itself.
    Direct(Arc<Peer>),
    /// To a neighbour that forwards it.
    Via(Arc<Peer>),
}

/// The shared state of a running node.
pub(crate) struct Inner {
    pub(crate) id: NodeId,
    pub(crate) config: Config,
    pub(crate) cookie: Vec<u8>,
    pub(crate) dispatch: Dispatcher,
    pub(crate) registry: crate::actor::registry::Registry,
    pub(crate) calls: PendingCalls,
    pub(crate) monitors: Monitors,
    pub(crate) peers: RwLock<HashMap<String, Arc<Peer>>>,
    pub(crate) overlay_name: &'static str,
    /// How nodes are declared down (from the overlay).
    pub(crate) liveness: Liveness,
    /// The members, sorted (by name first), shared with the control loop that sets them.
    pub(crate) members: RwLock<Arc<Vec<NodeId>>>,
    /// The nodes broadcast runs over (the overlay's neighbours), as the control loop last set.
    pub(crate) neighbors: RwLock<Vec<NodeId>>,
    /// Routes to non-neighbours, by name: (destination, neighbour to go through). Set by the
    /// control loop from `Overlay::route`, read by every send (no overlay lock on the way).
    pub(crate) routes: RwLock<HashMap<String, (NodeId, NodeId)>>,
    /// Local broadcast subscribers.
    pub(crate) topics: Topics,
    pub(crate) events: broadcast::Sender<MembershipEvent>,
    pub(crate) control: mpsc::Sender<Control>,
    pub(crate) counters: Counters,
    pub(crate) next_actor: AtomicU64,
    pub(crate) next_conn: AtomicU64,
    pub(crate) shutdown: CancellationToken,
    pub(crate) handshakes: Arc<Semaphore>,
    /// The bytes all lanes together may hold queued (`node_queue_bytes`).
    pub(crate) queue_budget: QueueBudget,
    pub(crate) started: Instant,
    pub(crate) admin_addr: Option<std::net::SocketAddr>,
    pub(crate) listener_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Inner {
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
                node: node.name.clone(),
                ref_incarnation: node.incarnation,
                current: self.id.incarnation,
            })
        }
    }

    /// The members as the control loop last published them (sorted).
    pub(crate) fn members_now(&self) -> Arc<Vec<NodeId>> {
        self.members
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn peer(&self, name: &str) -> Option<Arc<Peer>> {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// The peer whose lanes carry traffic for `dst`: the node itself when it is a peer, else
    /// (on overlays with multi-hop routes) the neighbour a route names
    /// ([`next_hop`](crate::membership::next_hop) decides).
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
                via_peer = self.peer(&via.name).filter(|p| p.id == *via);
                via_peer.is_some()
            },
        );
        match hop {
            Ok(NextHop::Direct) => direct.map(Hop::Direct),
            Ok(NextHop::Via(_)) => via_peer.map(Hop::Via),
            Err(NoHop::Stale { current }) => {
                return Err(SendError::StaleIncarnation {
                    node: dst.name.clone(),
                    ref_incarnation: dst.incarnation,
                    current,
                })
            }
            Err(NoHop::Unreachable) => None,
        }
        .ok_or_else(|| SendError::Unreachable(dst.name.clone()))
    }

    /// The lane and the head of a frame for `dst`, wrapped for forwarding when `dst` is not a
    /// neighbour.
    fn route_frame(
        &self,
        dst: &NodeId,
        opts: &SendOpts,
        sender: u64,
        receiver: u64,
        header: &Header,
        payload_len: usize,
    ) -> Result<(Arc<Lane>, Bytes), SendError> {
        let slot = self.dispatch.pick(opts, sender, receiver);
        match self.next_hop(dst)? {
            Hop::Direct(peer) => Ok((peer.lanes[slot].clone(), self.head(header, payload_len)?)),
            Hop::Via(peer) => {
                let kind = Routed::from_header(header)
                    .ok_or_else(|| SendError::Unreachable(dst.name.clone()))?;
                let routed = Header::Routed {
                    to: dst.clone(),
                    from: self.id.clone(),
                    hops: 1,
                    lane: slot as u16,
                    kind,
                };
                Ok((peer.lanes[slot].clone(), self.head(&routed, payload_len)?))
            }
        }
    }

    fn head(&self, header: &Header, payload_len: usize) -> Result<Bytes, SendError> {
        let mut buf = BytesMut::with_capacity(64);
        encode_head(header, payload_len, self.config.max_frame_bytes, &mut buf).map_err(|_| {
            SendError::TooLarge {
                len: payload_len,
                max: self.config.max_frame_bytes,
            }
        })?;
        Ok(buf.freeze())
    }

    /// Queues a frame for `dst`, waiting for room in the lane's queue.
    pub(crate) async fn send_frame(
        &self,
        dst: &NodeId,
        opts: &SendOpts,
        sender: u64,
        receiver: u64,
        header: &Header,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let (lane, head) = self.route_frame(dst, opts, sender, receiver, header, payload.len())?;
        lane.enqueue(head, payload).await
    }

    /// Queues a frame for `dst` or fails with `Backpressure` at once.
    pub(crate) fn try_send_frame(
        &self,
        dst: &NodeId,
        opts: &SendOpts,
        sender: u64,
        receiver: u64,
        header: &Header,
        payload: Bytes,
    ) -> Result<(), SendError> {
        let (lane, head) = self.route_frame(dst, opts, sender, receiver, header, payload.len())?;
        lane.try_enqueue(head, payload)
    }

    /// Queues a protocol frame on a peer's membership lane; never waits (drops and counts).
    pub(crate) fn send_control(&self, peer: &Peer, header: &Header, payload: Bytes) {
        let ok = self.head(header, payload.len()).and_then(|head| {
            peer.lanes[self.dispatch.membership_slot()].try_enqueue(head, payload)
        });
        if let Err(e) = ok {
            self.counters.control_drops.inc();
            tracing::debug!(peer = %peer.id, error = %e, "protocol frame dropped");
        }
    }

    /// A protocol frame for a node: on its membership lane if it is a peer, else routed (on
    /// overlays with multi-hop routes); dropped and counted otherwise.
    fn send_control_to(&self, node: &NodeId, header: &Header) {
        match self.peer(&node.name).filter(|p| p.id == *node) {
            Some(p) => self.send_control(&p, header, Bytes::new()),
            None if self.liveness == Liveness::Membership => {
                let opts = SendOpts::default();
                if self
                    .try_send_frame(node, &opts, 0, 0, header, Bytes::new())
                    .is_err()
                {
                    self.counters.control_drops.inc();
                }
            }
            None => self.counters.control_drops.inc(),
        }
    }

    /// Answers a call with a status (no payload) without waiting.
    pub(crate) fn reply_status(&self, to: &NodeId, call: u64, status: ReplyStatus) {
        let header = Header::Reply { call, status };
        if let Err(e) =
            self.try_send_frame(to, &SendOpts::default(), 0, call, &header, Bytes::new())
        {
            tracing::debug!(%to, error = %e, "status reply dropped");
        }
    }

    /// Tells a remote watcher that an actor stopped.
    pub(crate) fn send_down(&self, to: &NodeId, watch: u64, target: u64, reason: DownReason) {
        self.send_control_to(
            to,
            &Header::Down {
                watch,
                target,
                reason,
            },
        );
    }

    /// Sends a watch request on the lane the current actor's messages to `target` take, so a
    /// monitor set up before a send is in place when that message arrives.
    pub(crate) fn send_monitor(&self, to: &NodeId, watch: u64, target: u64) {
        self.send_watch(to, target, &Header::Monitor { watch, target });
    }

    fn send_watch(&self, to: &NodeId, target: u64, header: &Header) {
        let receiver = crate::dispatch::hash_of(&Dest::Id(target));
        let sender = crate::actor::current_actor();
        let opts = SendOpts::default();
        if self
            .try_send_frame(to, &opts, sender, receiver, header, Bytes::new())
            .is_err()
        {
            // The data lane is full: the membership lane still gets it there, unordered.
            self.send_control_to(to, header);
        }
    }

    /// Cancels a watch.
    pub(crate) fn demonitor(&self, watch: u64, target: &crate::actor::WatchTarget) {
        use crate::actor::WatchTarget;
        match target {
            WatchTarget::Local(id) => self.registry.unwatch(*id, watch),
            WatchTarget::Actor(node, id) => {
                if self.monitors.remove(watch).is_some() {
                    self.send_watch(node, *id, &Header::Demonitor { watch, target: *id });
                }
            }
            WatchTarget::Node(_) => {
                self.monitors.remove(watch);
            }
        }
    }

    /// Finds or creates the peer for `id`. A newer incarnation replaces an older one (which is
    /// reported down); an older one than we know is refused.
    pub(crate) fn peer_get_or_create(self: &Arc<Self>, id: &NodeId) -> Result<Arc<Peer>, String> {
        if self.shutdown.is_cancelled() {
            return Err("the node is shutting down".into());
        }
        let mut peers = self.peers.write().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = peers.get(&id.name) {
            if p.id == *id {
                return Ok(p.clone());
            }
            if p.id.incarnation > id.incarnation {
                return Err(format!("stale incarnation of {}", id.name));
            }
            let old = p.id.clone();
            if let Some(old_peer) = peers.remove(&id.name) {
                old_peer.abort.cancel();
            }
            let _ = self.control.try_send(Control::PeerDown {
                peer: old,
                reason: "restarted".into(),
            });
        }
        let peer = self.new_peer(id);
        peers.insert(id.name.clone(), peer.clone());
        Ok(peer)
    }

    fn new_peer(self: &Arc<Self>, id: &NodeId) -> Arc<Peer> {
        let abort = self.shutdown.child_token();
        let close = CancellationToken::new();
        let mut lanes = Vec::with_capacity(self.dispatch.total_lanes());
        let mut tasks = Vec::new();
        for spec in self.dispatch.specs() {
            for index in 0..spec.parallelism {
                let slot = spec.offset + index as usize;
                let (lane, task) = Lane::with_budget(
                    LaneId::new(spec.name.clone(), index),
                    slot,
                    self.config.lane_queue_bytes,
                    self.queue_budget.clone(),
                );
                tasks.push((lane.clone(), task));
                lanes.push(lane);
            }
        }
        let peer = Arc::new(Peer {
            id: id.clone(),
            lanes,
            up: Default::default(),
            last_seen_us: AtomicU64::new(self.now_us()),
            rtt_us: Default::default(),
            abort: abort.clone(),
            close: close.clone(),
            changed: Default::default(),
            writers: Default::default(),
        });
        let mut writers = Vec::with_capacity(tasks.len());
        for (lane, task) in tasks {
            let slot = lane.slot;
            writers.push(tokio::spawn(run_writer(
                lane,
                task,
                abort.clone(),
                close.clone(),
            )));
            tokio::spawn(connector::run(self.clone(), peer.clone(), slot));
        }
        *peer.writers.lock().unwrap_or_else(|e| e.into_inner()) = writers;
        peer
    }

    /// Hands an arriving frame on: to a mailbox, a waiting call, the overlay, broadcast, a
    /// monitor, or (routed frames for other nodes) to the next hop.
    pub(crate) async fn handle_frame(&self, peer: &Arc<Peer>, frame: Frame) {
        let Frame { header, payload } = frame;
        match header {
            Header::Overlay | Header::Broadcast => {
                let from = peer.id.clone();
                let msg = if matches!(header, Header::Overlay) {
                    Control::OverlayMsg { from, payload }
                } else {
                    Control::BroadcastMsg { from, payload }
                };
                let _ = self.control.send(msg).await;
            }
            Header::Heartbeat { seq, sent_us } => {
                self.send_control(peer, &Header::HeartbeatAck { seq, sent_us }, Bytes::new());
            }
            Header::HeartbeatAck { sent_us, .. } => {
                let rtt = self.now_us().saturating_sub(sent_us).max(1);
                peer.rtt_us.store(rtt, Ordering::Relaxed);
            }
            Header::Bye => {
                let _ = self
                    .control
                    .send(Control::Bye {
                        peer: peer.id.clone(),
                    })
                    .await;
            }
            Header::Routed {
                to,
                from,
                hops,
                lane,
                kind,
            } => {
                if to.name == self.id.name {
                    if to.incarnation != self.id.incarnation {
                        self.counters.stale_target.inc();
                        if let Routed::Send { call: Some(c), .. } = kind {
                            self.reply_status(&from, c, ReplyStatus::NoProc);
                        }
                        return;
                    }
                    return self.handle_app(&from, kind.into_header(), payload).await;
                }
                self.forward(&peer.id, to, from, hops, lane, kind, payload)
                    .await;
            }
            other => self.handle_app(&peer.id, other, payload).await,
        }
    }

    /// Passes a routed message on to the next hop, on the lane slot its sender picked. A next
    /// hop that is the neighbour it came from (routes that disagree for a moment) counts as no
    /// route: the message is dropped at once rather than bounced to the hop limit.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        came_from: &NodeId,
        to: NodeId,
        from: NodeId,
        hops: u16,
        lane: u16,
        kind: Routed,
        payload: Bytes,
    ) {
        let slot = usize::from(lane);
        if slot >= self.dispatch.total_lanes() {
            self.counters.routed_invalid.inc();
            return self.routed_failed(&from, &kind, "invalid lane");
        }
        let limit = self.config.hop_limit;
        let next = forward(&self.id, came_from, &to, hops, limit, |d| {
            match self.next_hop(d) {
                Ok(Hop::Direct(p)) | Ok(Hop::Via(p)) => Some(p.id.clone()),
                Err(_) => None,
            }
        });
        let peer = match next {
            ForwardDecision::ForwardTo(id) => self.peer(&id.name).filter(|p| p.id == id),
            ForwardDecision::Drop(DropReason::HopLimit) => {
                self.counters.routed_hop_limit.inc();
                tracing::debug!(%to, %from, hops, "routed message dropped: hop limit");
                return self.routed_failed(&from, &kind, "hop limit reached");
            }
            ForwardDecision::Drop(DropReason::NoRoute) | ForwardDecision::Deliver => None,
        };
        let Some(peer) = peer else {
            self.counters.routed_no_route.inc();
            tracing::debug!(%to, %from, hops, "routed message dropped: no route");
            return self.routed_failed(&from, &kind, "no route");
        };
        let header = Header::Routed {
            to,
            from: from.clone(),
            hops: hops.saturating_add(1),
            lane,
            kind: kind.clone(),
        };
        let head = match self.head(&header, payload.len()) {
            Ok(h) => h,
            Err(_) => {
                self.counters.routed_invalid.inc();
                return self.routed_failed(&from, &kind, "frame too large");
            }
        };
        let queued =
            tokio::time::timeout(FORWARD_WAIT, peer.lanes[slot].enqueue(head, payload)).await;
        match queued {
            Ok(Ok(())) => self.counters.routed_forwarded.inc(),
            _ => {
                self.counters.routed_queue_full.inc();
                self.routed_failed(&from, &kind, "next hop congested");
            }
        }
    }

    /// A routed call that cannot go on fails at once at its caller instead of timing out.
    fn routed_failed(&self, from: &NodeId, kind: &Routed, why: &str) {
        if let Routed::Send { call: Some(c), .. } = kind {
            if *from != self.id {
                let status = ReplyStatus::Failed(format!("unreachable: {why}"));
                self.reply_status(from, *c, status);
            }
        }
    }

    /// Application frames (sends, replies, monitors) from node `from`, direct or routed.
    async fn handle_app(&self, from: &NodeId, header: Header, payload: Bytes) {
        match header {
            Header::Send {
                to,
                incarnation,
                call,
            } => {
                if incarnation != 0 && incarnation != self.id.incarnation {
                    self.counters.stale_target.inc();
                    if let Some(call) = call {
                        self.reply_status(from, call, ReplyStatus::NoProc);
                    }
                    return;
                }
                let mailbox = match &to {
                    Dest::Id(id) => self.registry.by_id(*id),
                    Dest::Name(n) => self
                        .registry
                        .resolve(n)
                        .and_then(|id| self.registry.by_id(id)),
                };
                let delivered = match mailbox {
                    Some(mb) => mb
                        .push_remote(RemoteMsg {
                            payload,
                            from_node: from.clone(),
                            call,
                        })
                        .await
                        .is_ok(),
                    None => false,
                };
                if !delivered {
                    self.counters.unknown_actor.inc();
                    if let Some(call) = call {
                        self.reply_status(from, call, ReplyStatus::NoProc);
                    }
                }
            }
            Header::Reply { call, status } => {
                let outcome = match status {
                    ReplyStatus::Ok => CallOutcome::Remote(payload),
                    ReplyStatus::NoProc => CallOutcome::NoProc,
                    ReplyStatus::Failed(why) => CallOutcome::Failed(why),
                };
                if !self.calls.complete(call, outcome) {
                    self.counters.late_replies.inc();
                }
            }
            Header::Monitor { watch, target } => {
                let w = Watcher::Remote {
                    node: from.clone(),
                    watch,
                };
                if self.registry.watch(target, w).is_err() {
                    self.send_down(from, watch, target, DownReason::NoProc);
                }
            }
            Header::Demonitor { watch, target } => self.registry.unwatch(target, watch),
            Header::Down { watch, reason, .. } => self.monitors.fire(watch, reason),
            // Protocol headers are handled in `handle_frame`.
            other => {
                self.counters.routed_invalid.inc();
                tracing::debug!(%from, header = ?other, "unexpected header dropped");
            }
        }
    }
}
