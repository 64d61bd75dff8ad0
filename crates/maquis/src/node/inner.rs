//! The node's shared state and its data path: sending frames to peers and handling the frames
//! that arrive.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use super::control::Control;
use super::MembershipEvent;
use crate::actor::registry::{RemoteMsg, Watcher};
use crate::actor::{CallOutcome, Monitors, PendingCalls};
use crate::config::Config;
use crate::dispatch::{Dispatcher, SendOpts};
use crate::error::SendError;
use crate::id::{LaneId, NodeId};
use crate::overlay::{DynOverlay, Route};
use crate::transport::lane::{run_writer, Lane};
use crate::transport::{connector, Peer};
use crate::wire::frame::{encode_head, Dest, DownReason, Frame, Header, ReplyStatus};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// The value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// Node-wide event counters, exported at `/metrics` as `maquis_<name>_total`.
        #[derive(Debug, Default)]
        pub struct Counters { $(#[doc = $doc] pub $name: Counter,)* }
        impl Counters {
            /// Name → value.
            pub fn snapshot(&self) -> BTreeMap<String, u64> {
                BTreeMap::from([$((stringify!($name).to_string(), self.$name.get()),)*])
            }
        }
    };
}

counters! {
    decode_errors: "messages dropped because they did not decode as the actor's type",
    unknown_actor: "messages for an actor that does not exist here",
    stale_target: "messages addressed to an older incarnation of this node",
    late_replies: "replies that arrived after their call gave up",
    handshake_failures: "incoming connections that failed the handshake",
    handshakes_refused: "connections closed because too many handshakes were in progress",
    bad_frames: "connections closed for a malformed or oversized frame",
    control_drops: "protocol frames dropped because the membership lane was full or gone",
    peers_down: "peers declared down",
}

/// The shared state of a running node.
pub struct Inner {
    pub(crate) id: NodeId,
    pub(crate) config: Config,
    pub(crate) cookie: Vec<u8>,
    pub(crate) dispatch: Dispatcher,
    pub(crate) registry: crate::actor::registry::Registry,
    pub(crate) calls: PendingCalls,
    pub(crate) monitors: Monitors,
    pub(crate) peers: RwLock<HashMap<String, Arc<Peer>>>,
    pub(crate) overlay: Mutex<Box<dyn DynOverlay>>,
    pub(crate) overlay_name: &'static str,
    pub(crate) members: RwLock<Vec<NodeId>>,
    pub(crate) events: broadcast::Sender<MembershipEvent>,
    pub(crate) control: mpsc::Sender<Control>,
    pub(crate) counters: Counters,
    pub(crate) next_actor: AtomicU64,
    pub(crate) next_conn: AtomicU64,
    pub(crate) shutdown: CancellationToken,
    pub(crate) handshakes: Arc<Semaphore>,
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

    pub(crate) fn peer(&self, name: &str) -> Option<Arc<Peer>> {
        self.peers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    fn overlay_route(&self, dst: &NodeId) -> Route {
        self.overlay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .route(dst)
    }

    /// The peer whose lanes carry traffic for `dst`.
    fn next_hop(&self, dst: &NodeId) -> Result<Arc<Peer>, SendError> {
        if let Some(p) = self.peer(&dst.name) {
            if p.id.incarnation != dst.incarnation {
                return Err(SendError::StaleIncarnation {
                    node: dst.name.clone(),
                    ref_incarnation: dst.incarnation,
                    current: p.id.incarnation,
                });
            }
        }
        let direct = || {
            self.peer(&dst.name)
                .filter(|p| p.id == *dst)
                .ok_or_else(|| SendError::Unreachable(dst.name.clone()))
        };
        match self.overlay_route(dst) {
            Route::Direct => direct(),
            // A node connected to us is reachable even before the overlay lists it (a reply
            // to a node that is still joining, say). Multi-hop forwarding (`Via`) belongs to
            // the peer-to-peer overlay, which is not built yet.
            Route::Via(_) | Route::Unreachable => direct(),
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
        let peer = self.next_hop(dst)?;
        let slot = self.dispatch.pick(opts, sender, receiver);
        let head = self.head(header, payload.len())?;
        peer.lanes[slot].enqueue(head, payload, true).await
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
        let peer = self.next_hop(dst)?;
        let slot = self.dispatch.pick(opts, sender, receiver);
        let head = self.head(header, payload.len())?;
        peer.lanes[slot].try_enqueue(head, payload)
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

    fn send_control_to(&self, node: &NodeId, header: &Header) {
        match self.peer(&node.name).filter(|p| p.id == *node) {
            Some(p) => self.send_control(&p, header, Bytes::new()),
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
                let (lane, task) = Lane::new(
                    LaneId::new(spec.name.clone(), index),
                    slot,
                    self.config.lane_queue_bytes,
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

    /// Hands an arriving frame on: to a mailbox, a waiting call, the overlay, or a monitor.
    pub(crate) async fn handle_frame(&self, peer: &Arc<Peer>, frame: Frame) {
        let Frame { header, payload } = frame;
        match header {
            Header::Send {
                to,
                incarnation,
                from: _,
                call,
            } => {
                if incarnation != 0 && incarnation != self.id.incarnation {
                    self.counters.stale_target.inc();
                    if let Some(call) = call {
                        self.reply_status(&peer.id, call, ReplyStatus::NoProc);
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
                            from_node: peer.id.clone(),
                            call,
                        })
                        .await
                        .is_ok(),
                    None => false,
                };
                if !delivered {
                    self.counters.unknown_actor.inc();
                    if let Some(call) = call {
                        self.reply_status(&peer.id, call, ReplyStatus::NoProc);
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
            Header::Overlay => {
                let _ = self
                    .control
                    .send(Control::OverlayMsg {
                        from: peer.id.clone(),
                        payload,
                    })
                    .await;
            }
            Header::Heartbeat { seq, sent_us } => {
                self.send_control(peer, &Header::HeartbeatAck { seq, sent_us }, Bytes::new());
            }
            Header::HeartbeatAck { sent_us, .. } => {
                let rtt = self.now_us().saturating_sub(sent_us).max(1);
                peer.rtt_us.store(rtt, Ordering::Relaxed);
            }
            Header::Monitor { watch, target } => {
                let w = Watcher::Remote {
                    node: peer.id.clone(),
                    watch,
                };
                if self.registry.watch(target, w).is_err() {
                    self.send_down(&peer.id, watch, target, DownReason::NoProc);
                }
            }
            Header::Demonitor { watch, target } => self.registry.unwatch(target, watch),
            Header::Down { watch, reason, .. } => self.monitors.fire(watch, reason),
            Header::Bye => {
                let _ = self
                    .control
                    .send(Control::Bye {
                        peer: peer.id.clone(),
                    })
                    .await;
            }
        }
    }
}
