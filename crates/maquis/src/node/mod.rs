//! `Node`: start a node from a [`Config`], join and leave a cluster, spawn and name actors.
//!
//! # What `Node::start` starts
//!
//! It validates the configuration (reading the TLS files when `transport.tls` is on), binds the listen and admin sockets, makes the incarnation
//! (microseconds since the Unix epoch), builds the overlay and the membership machine around
//! it, and spawns:
//!
//! - the listener (`transport::listener::run`): one task per incoming handshake, at most
//!   `transport.max_pending_handshakes` at once;
//! - the control loop (`control::run`), the driver of the membership machine;
//! - the link heartbeat ticker (a `Control::Tick` every `transport.heartbeat_interval_ms`);
//! - the admin HTTP server, if `node.admin` is set;
//! - the `echo` actor, registered as `echo`;
//! - on the gossiping overlays (full mesh, peer-to-peer, client-server), one join per
//!   configured contact, retried until it answers.
//!
//! The state they share is [`Inner`]: the router, the actors, and the membership snapshots the
//! control loop publishes.

mod actor_task;
mod context;
pub(crate) mod control;
pub(crate) mod echo;
mod global;
mod groups;
mod host;
mod inner;
mod refusals;
mod remote;
mod status;
pub use status::TooManySources;
mod topics;
pub use context::{Actor, Context, Inbox};
pub use topics::Subscription;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, oneshot, Semaphore};

pub(crate) use control::{Control, Retry};
pub(crate) use inner::Inner;

use crate::actor::mailbox::{Exit, Mailbox};
use crate::actor::registry::Watcher;
use crate::actor::{ActorRef, Actors, Message, Monitor, WatchTarget};
use crate::broadcast::Topic;
use crate::config::{Config, OverlayConfig, OverlayKind};
use crate::counters::Counters;
use crate::dispatch::Dispatcher;
use crate::error::{BroadcastError, JoinError, LinkError, RegisterError, StartError};
use crate::id::NodeId;
use crate::membership::{Membership, MembershipConfig, RESERVED_PREFIX};
use crate::overlay::{ClientServer, FullMesh, HyParView, Liveness, Overlay, StaticOverlay};
use crate::router::{Router, RouterLimits};
use crate::wire::frame::{Dest, DownReason};
use maquis_proto::overlay::{DynOverlay, Erased};

pub use crate::membership::MembershipEvent;

/// A handle to a running node. Cheap to clone; all clones control the same node.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Node({})", self.inner.router.id)
    }
}

impl Node {
    /// Starts a node with the overlay named in the configuration.
    pub async fn start(config: Config) -> Result<Node, StartError> {
        Node::start_with(config, |id, c| -> Box<dyn DynOverlay> {
            let retry = Duration::from_millis(c.transport.reconnect_max_ms);
            match &c.overlay {
                OverlayConfig::FullMesh(o) => {
                    Box::new(Erased(FullMesh::new(id, o.gossip_interval(), retry)))
                }
                OverlayConfig::Static => {
                    Box::new(Erased(StaticOverlay::new(id, c.node.peers.clone(), retry)))
                }
                OverlayConfig::PeerToPeer(o) => Box::new(Erased(HyParView::new(id, o.hyparview()))),
                OverlayConfig::ClientServer(o) => {
                    Box::new(Erased(ClientServer::new(id, o.client_server())))
                }
            }
        })
        .await
    }

    /// Starts a node with an overlay of your own (`config.overlay` is then only a label).
    pub async fn start_with_overlay<O: Overlay>(
        config: Config,
        make: impl FnOnce(NodeId, &Config) -> O,
    ) -> Result<Node, StartError> {
        Node::start_with(config, |id, c| -> Box<dyn DynOverlay> {
            Box::new(Erased(make(id, c)))
        })
        .await
    }

    async fn start_with(
        config: Config,
        make: impl FnOnce(NodeId, &Config) -> Box<dyn DynOverlay>,
    ) -> Result<Node, StartError> {
        let tls = config.checked()?;
        let listener = TcpListener::bind(config.node.listen)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.node.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.node.listen,
            source,
        })?;
        let admin = match config.node.admin {
            Some(a) => Some(
                TcpListener::bind(a)
                    .await
                    .map_err(|source| StartError::Admin { addr: a, source })?,
            ),
            None => None,
        };
        let admin_addr = match &admin {
            Some(l) => Some(l.local_addr().map_err(|source| StartError::Admin {
                addr: config.node.admin.unwrap_or(config.node.listen),
                source,
            })?),
            None => None,
        };
        let incarnation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1)
            .max(1);
        let id = NodeId::new(config.node.name.clone(), addr, incarnation);
        let overlay = make(id.clone(), &config);
        let overlay_name = overlay.name();
        let liveness = overlay.liveness();
        let machine = Membership::new(
            id.clone(),
            overlay,
            MembershipConfig {
                plumtree: config.broadcast.plumtree(),
                member_timeout: config.broadcast.member_timeout(),
                refresh_every: config.transport.heartbeat_interval(),
                linger: Duration::from_millis(config.transport.handshake_timeout_ms),
                suspicion: config.broadcast.suspicion(),
            },
        );
        let (control_tx, control_rx) = mpsc::channel(control::CONTROL_QUEUE);
        let (events, _) = broadcast::channel(config.node.event_buffer);
        let (router, waiting) = Router::new(
            id.clone(),
            Dispatcher::new(
                config.transport.channel_specs(),
                config.transport.affinity,
                config.transport.stripe_bytes > 0,
            ),
            liveness,
            RouterLimits {
                max_frame_bytes: config.transport.max_frame_bytes,
                lane_queue_bytes: config.transport.lane_queue_bytes,
                node_queue_bytes: config.transport.node_queue_bytes,
                part_bytes: config.transport.part_bytes,
                stripe_bytes: config.transport.stripe_bytes,
                stripe_window_bytes: config.transport.stripe_window_bytes,
                hop_limit: config.broadcast.hop_limit,
                dials_per_peer: config.transport.max_pending_handshakes_per_source / 2,
            },
        );
        let mut router = router;
        router.stages = config.services.stages().map(crate::stages::Stages::new);
        let router = Arc::new(router);
        let actors = Arc::new(Actors::new(router.clone(), config.node.mailbox_capacity));
        let (names_tx, names_rx) = mpsc::channel(crate::names::COMMAND_QUEUE);
        let (lost, _) = broadcast::channel(config.node.event_buffer);
        let (groups_tx, groups_rx) = mpsc::channel(crate::groups::COMMAND_QUEUE);
        let inner = Arc::new(Inner {
            cookie: config.node.cookie.as_bytes().to_vec(),
            tls,
            router,
            actors,
            overlay_name,
            neighbors: RwLock::new(Vec::new()),
            topics: Default::default(),
            events,
            control: control_tx,
            next_conn: AtomicU64::new(0),
            handshakes: Arc::new(Semaphore::new(config.transport.max_pending_handshakes)),
            admin_addr,
            refusals: Default::default(),
            listener_task: Mutex::new(None),
            app_metrics: Mutex::new(Vec::new()),
            names: crate::names::Names {
                queue: crate::service::Queue { cmds: names_tx },
                lost: lost.clone(),
            },
            remote: crate::remote::Registry::new(config.services.max_rpc_tasks),
            groups: crate::service::Queue { cmds: groups_tx },
            group_changes: tokio::sync::watch::channel(0).0,
            group_members: crate::groups::MembersCache::default(),
            group_deliveries: Arc::new(tokio::sync::Semaphore::new(crate::groups::DELIVERIES)),
            virtuals: Arc::new(crate::virtual_actors::Host::new(
                config.services.virtual_limits(config.node.mailbox_capacity),
            )),
            config,
        });
        let accept = tokio::spawn(crate::transport::listener::run(inner.clone(), listener));
        *inner
            .listener_task
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(accept);
        tokio::spawn(control::run(inner.clone(), machine, control_rx));
        tokio::spawn(heartbeats(inner.clone()));
        if let Some(stages) = &inner.router.stages {
            stages.spawn_controller(inner.router.shutdown.clone());
        }
        if let Some(queues) = waiting {
            let actors = inner.actors.clone();
            let fail = move |call, why| actors.fail_call(call, why);
            let router = inner.router.clone();
            tokio::spawn(router.run_waiting(queues.unsent, queues.parked, fail));
        }
        tokio::spawn(crate::actor::run_reliable_timers(
            inner.actors.clone(),
            inner.router.shutdown.clone(),
        ));
        let node = Node { inner };
        if let Some(listener) = admin {
            let source: Arc<dyn crate::admin::AdminSource> = Arc::new(node.clone());
            let stop = node.inner.router.shutdown.clone();
            let token = node.inner.config.node.admin_token.clone();
            tokio::spawn(async move {
                if let Err(e) =
                    crate::admin::serve(
                        listener,
                        source,
                        token,
                        async move { stop.cancelled().await },
                    )
                    .await
                {
                    tracing::error!(error = %e, "admin server stopped");
                }
            });
        }
        echo::spawn_echo(&node);
        crate::names::spawn(&node, node.inner.clone(), names_rx, lost);
        crate::remote::spawn_services(&node);
        crate::groups::spawn(&node, node.inner.clone(), groups_rx);
        node.inner.virtuals.start(&node);
        node.start_actop();
        if matches!(
            node.inner.config.overlay.kind(),
            OverlayKind::FullMesh | OverlayKind::PeerToPeer | OverlayKind::ClientServer
        ) {
            for addr in node.inner.config.node.peers.clone() {
                let _ = node
                    .inner
                    .control
                    .send(Control::Join {
                        addr,
                        done: None,
                        retry: Retry::Forever,
                    })
                    .await;
            }
        }
        tracing::info!(node = %id, overlay = overlay_name, "node started");
        Ok(node)
    }

    pub(crate) fn from_inner(inner: Arc<Inner>) -> Node {
        Node { inner }
    }

    /// The node's shared state.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// This node's identity.
    pub fn id(&self) -> &NodeId {
        &self.inner.router.id
    }

    /// The address the node listens on.
    pub fn addr(&self) -> SocketAddr {
        self.inner.router.id.addr
    }

    /// The address the admin endpoint listens on, if it has one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.inner.admin_addr
    }

    /// The router, for the crate's own tests.
    #[cfg(test)]
    pub(crate) fn router(&self) -> &crate::router::Router {
        &self.inner.router
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Asks to join the cluster that `contact` belongs to; returns once the request is queued.
    /// Failures are logged; use [`Node::join_wait`] to learn the outcome.
    pub async fn join(&self, contact: SocketAddr) -> Result<(), JoinError> {
        self.inner
            .control
            .send(Control::Join {
                addr: contact,
                done: None,
                retry: Retry::Never,
            })
            .await
            .map_err(|_| JoinError::Stopped)
    }

    /// Joins through `contact` and waits until it is connected; returns its identity.
    /// Failures that may pass (connection refused or reset, a handshake that timed out, a
    /// contact too busy to take one more handshake) are tried again with backoff
    /// (`transport.reconnect_min_ms` doubling up to `transport.reconnect_max_ms`) within
    /// `timeout`; a rejection (wrong cookie, incompatible configuration) fails at once.
    pub async fn join_wait(
        &self,
        contact: SocketAddr,
        timeout: Duration,
    ) -> Result<NodeId, JoinError> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .control
            .send(Control::Join {
                addr: contact,
                done: Some(tx),
                retry: Retry::Transient(tokio::time::Instant::now() + timeout),
            })
            .await
            .map_err(|_| JoinError::Stopped)?;
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => Err(JoinError::Timeout),
            Ok(Err(_)) => Err(JoinError::Stopped),
            Ok(Ok(r)) => r,
        }
    }

    /// Leaves the cluster: tells the others (they report `Left`, not `Down`) and closes every
    /// connection. The node keeps running, alone, and can join again.
    pub async fn leave(&self) {
        let (tx, rx) = oneshot::channel();
        if self
            .inner
            .control
            .send(Control::Leave { done: tx })
            .await
            .is_ok()
        {
            let _ = rx.await;
        }
    }

    /// Removes another node from the cluster (on overlays that support it: full-mesh, static;
    /// the peer-to-peer and client-server overlays ignore it).
    pub async fn remove(&self, name: &str) {
        let _ = self
            .inner
            .control
            .send(Control::Remove {
                name: name.to_string(),
            })
            .await;
    }

    /// The members this node sees, itself included. On the peer-to-peer overlay: this node, its
    /// neighbours, and every node whose broadcast heartbeat arrived within
    /// `broadcast.member_timeout_ms`. On the client-server overlay: every node whose record is
    /// alive (a client the servers lost drops out).
    pub fn members(&self) -> Vec<NodeId> {
        self.inner.members_now().to_vec()
    }

    /// How many members this node sees, itself included: [`Node::members`]'s length, without
    /// copying the list.
    pub fn member_count(&self) -> usize {
        self.inner.members_now().len()
    }

    /// The nodes broadcast runs over: on the peer-to-peer overlay the active view (a few
    /// neighbours), on the client-server overlay the direct connections (a client: its
    /// servers; a server: the other servers and its clients), on the others every member with
    /// a connection. Excludes this node.
    pub fn neighbors(&self) -> Vec<NodeId> {
        self.inner
            .neighbors
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Broadcasts a message to every subscriber of `topic` on every member, this node included
    /// (Plumtree: pushed along a spanning tree of the neighbours, announced lazily to the
    /// others, so that a broken tree repairs itself). Returns once it is queued; delivery is
    /// best effort (at most once per subscriber). Topics starting with `$maquis/` are reserved.
    pub async fn broadcast<M: Message>(
        &self,
        topic: impl Into<Topic>,
        msg: &M,
    ) -> Result<(), BroadcastError> {
        let topic = topic.into();
        if topic.as_str().starts_with(RESERVED_PREFIX) {
            return Err(BroadcastError::ReservedTopic(topic.to_string()));
        }
        // The message's type fingerprint first, so that subscribers of another type refuse it.
        let ty = crate::actor::fingerprint::<M>().to_le_bytes();
        let payload = maquis_proto::encode_after(&ty, msg)
            .map_err(|e| BroadcastError::Encode(e.to_string()))?;
        // The payload travels inside a protocol message: leave room for its envelope.
        let max = self
            .inner
            .config
            .transport
            .max_frame_bytes
            .saturating_sub(1024);
        if payload.len() > max {
            return Err(BroadcastError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        self.inner
            .control
            .send(Control::Broadcast {
                topic,
                payload: payload.into(),
            })
            .await
            .map_err(|_| BroadcastError::Stopped)
    }

    /// Subscribes to a broadcast topic: the subscription yields the messages broadcast on it from
    /// now on, decoded as `M`. It buffers `broadcast.subscription_capacity` messages; when full,
    /// the oldest is dropped and counted (see [`Subscription`]).
    pub fn subscribe_topic<M: Message>(&self, topic: impl Into<Topic>) -> Subscription<M> {
        let topic = topic.into();
        let queue = self.inner.topics.add(
            topic.clone(),
            self.inner.config.broadcast.subscription_capacity,
        );
        Subscription {
            topic,
            queue,
            node: Arc::downgrade(&self.inner),
            actors: Arc::downgrade(&self.inner.actors),
            _m: std::marker::PhantomData,
        }
    }

    /// Whether `node` can be watched: a connected peer, or (on overlays where membership, not
    /// connections, says who is alive) a member.
    fn watchable(&self, node: &NodeId) -> bool {
        let inner = &self.inner;
        match inner.router.liveness {
            Liveness::Connection => inner.router.peer_of(node).is_some(),
            Liveness::Membership => self.inner.members_now().binary_search(node).is_ok(),
        }
    }

    /// A member by name.
    pub fn member(&self, name: &str) -> Option<NodeId> {
        self.inner.router.member(name)
    }

    /// Membership events from now on. The buffer holds `node.event_buffer` events; a subscriber
    /// that falls further behind gets `RecvError::Lagged` and should re-read [`Node::members`].
    pub fn subscribe(&self) -> broadcast::Receiver<MembershipEvent> {
        self.inner.events.subscribe()
    }

    /// Spawns an actor written as a receive loop over its [`Inbox`].
    ///
    /// The actor ends when `f`'s future returns (`DownReason::Stopped`), panics (`Panicked`,
    /// the panic's message), or is stopped from outside ([`Node::stop_actor`], its supervisor:
    /// `Shutdown`; a linked actor going down: `Linked`) — then at its next `.await`, dropping
    /// its future: an actor stuck in blocking code cannot be stopped.
    pub fn spawn_fn<M, F, Fut>(&self, f: F) -> ActorRef<M>
    where
        M: Message,
        F: FnOnce(Inbox<M>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.spawn_task(move |inbox, exit| {
            (Box::pin(f(inbox).map(|()| DownReason::Stopped)), Some(exit))
        })
    }

    /// Spawns an actor that handles its own exit signal: its future gets it and returns the
    /// reason the actor ends with (a supervisor stops its children before it ends).
    pub(crate) fn spawn_with_exit<M, F, Fut>(&self, f: F) -> ActorRef<M>
    where
        M: Message,
        F: FnOnce(Inbox<M>, Exit<M>) -> Fut,
        Fut: Future<Output = DownReason> + Send + 'static,
    {
        self.spawn_task(move |inbox, exit| (Box::pin(f(inbox, exit)), None))
    }

    /// Spawns an actor's task (`actor_task.rs`) around the future `f` makes.
    fn spawn_task<M, F>(&self, f: F) -> ActorRef<M>
    where
        M: Message,
        F: FnOnce(Inbox<M>, Exit<M>) -> (actor_task::Body, Option<Exit<M>>),
    {
        let actors = &self.inner.actors;
        let crate::actor::NewActor {
            id,
            rx,
            mailbox,
            exit,
        } = actors.add::<M>();
        crate::actor::note_spawn(actors, id);
        let me = ActorRef::local(actors.node.clone(), id, Arc::downgrade(actors), mailbox);
        let (body, exit) = f(
            Inbox {
                rx,
                me: me.clone(),
                node: Arc::downgrade(&self.inner),
            },
            exit,
        );
        let task = actor_task::ActorTask::new(id, Arc::downgrade(actors), body, exit);
        let stages = self.inner.router.stages.as_ref();
        crate::stages::spawn(stages, crate::stages::Stage::Execute, task);
        me
    }

    /// The node's actors.
    pub(crate) fn actors(&self) -> &Arc<Actors> {
        &self.inner.actors
    }

    /// Stops a local actor from outside: it ends at its next `.await` with
    /// `DownReason::Shutdown` (what its monitors, links and supervisor see).
    pub fn stop_actor<M: Message>(&self, actor: &ActorRef<M>) -> Result<(), LinkError> {
        let id = self.local_id(actor)?;
        if self.inner.actors.kill(id, DownReason::Shutdown) {
            Ok(())
        } else {
            Err(LinkError::NoProc)
        }
    }

    /// Links local actor `a` with actor `b`, on this node or another: when either goes down for
    /// any reason but a normal end (`DownReason::Stopped`), the other is stopped with
    /// `DownReason::Linked` saying which actor went down and why; when a node goes down, the
    /// local actors linked with its actors stop. A link cannot be trapped: to be told
    /// instead of stopped, use a [`Node::monitor`].
    ///
    /// Errors: `a` is not a local actor (`NotLocal`), a local actor does not exist (`NoProc`),
    /// `b`'s node is not reachable now (`NodeDown`), or an actor has too many watchers and
    /// links (`WatcherLimit`). A remote `b` that does not exist is found out on its node: `a`
    /// is then stopped (`Linked`, with `NoProc`), as if `b` had just gone down.
    pub fn link<A: Message, B: Message>(
        &self,
        a: &ActorRef<A>,
        b: &ActorRef<B>,
    ) -> Result<(), LinkError> {
        let a = self.local_id(a)?;
        if !self.inner.router.is_local(b.node()).unwrap_or(false) && !self.watchable(b.node()) {
            return Err(LinkError::NodeDown);
        }
        self.inner.actors.link(a, b.node(), &b.to)
    }

    /// Removes the link between local actor `a` and `b` (named as when linking); whether
    /// there was one.
    pub fn unlink<A: Message, B: Message>(&self, a: &ActorRef<A>, b: &ActorRef<B>) -> bool {
        match self.local_id(a) {
            Ok(a) => self.inner.actors.unlink(a, b.node(), &b.to),
            Err(_) => false,
        }
    }

    /// The id of a local actor named by a ref (by id or by a local name).
    fn local_id<M: Message>(&self, actor: &ActorRef<M>) -> Result<u64, LinkError> {
        match self.inner.router.is_local(actor.node()) {
            Ok(true) => {}
            _ => return Err(LinkError::NotLocal),
        }
        match (actor.id(), actor.name()) {
            (Some(id), _) => Ok(id),
            (None, Some(name)) => self
                .inner
                .actors
                .registry
                .resolve(name)
                .ok_or(LinkError::NoProc),
            (None, None) => Err(LinkError::NoProc),
        }
    }

    /// Spawns a typed [`Actor`].
    pub fn spawn<A: Actor>(&self, mut actor: A) -> ActorRef<A::Msg> {
        let node = self.clone();
        self.spawn_fn(move |mut inbox: Inbox<A::Msg>| async move {
            let mut ctx = Context::new(&inbox, node);
            actor.started(&mut ctx).await;
            while !ctx.stop {
                let Some(msg) = inbox.recv().await else { break };
                actor.handle(msg, &mut ctx).await;
            }
        })
    }

    /// Registers a local actor under a name (a local name: other nodes reach it by
    /// (node, name)). Names starting with `$maquis/` are the runtime's.
    pub fn register<M: Message>(
        &self,
        name: &str,
        actor: &ActorRef<M>,
    ) -> Result<(), RegisterError> {
        if name.starts_with(RESERVED_PREFIX) {
            return Err(RegisterError::Reserved(name.to_string()));
        }
        match (actor.id(), self.inner.router.is_local(actor.node())) {
            (Some(id), Ok(true)) => self.inner.actors.registry.register(name, id),
            _ => Err(RegisterError::NotLocal),
        }
    }

    /// Removes a name; returns whether it was registered.
    pub fn unregister(&self, name: &str) -> bool {
        self.inner.actors.registry.unregister(name)
    }

    /// The local actor registered under `name`.
    pub fn whereis<M: Message>(&self, name: &str) -> Option<ActorRef<M>> {
        let actors = &self.inner.actors;
        let id = actors.registry.resolve(name)?;
        let node = actors.node.clone();
        let rt = Arc::downgrade(actors);
        // A ref of another type than the actor takes is still returned: its sends fail with
        // `TypeMismatch`.
        Some(match actors.registry.by_id(id) {
            Some(mb) if Mailbox::<M>::typed(&*mb).is_some() => ActorRef::local(node, id, rt, mb),
            _ => ActorRef::new(node, Dest::Id(id), rt),
        })
    }

    /// A ref to the actor registered as `name` on member `node` (this node included).
    pub fn remote<M: Message>(&self, node: &str, name: &str) -> Option<ActorRef<M>> {
        let id = self.member(node)?;
        Some(ActorRef::new(
            id,
            Dest::Name(name.to_string()),
            Arc::downgrade(&self.inner.actors),
        ))
    }

    /// Watches an actor: the monitor resolves when it stops (`Stopped`, `Panicked`), does not
    /// exist (`NoProc`), or its node goes down (`NodeDown`). A ref by name is resolved when the
    /// watch is set up (here for a local actor, on arrival at its node for a remote one): the
    /// monitor watches the actor that has the name then.
    pub fn monitor<M: Message>(&self, actor: &ActorRef<M>) -> Monitor {
        let actors = &self.inner.actors;
        let watch = actors.monitors.next_id();
        let (tx, rx) = oneshot::channel();
        let rt = Arc::downgrade(actors);
        let local = match actors.router.is_local(actor.node()) {
            Ok(l) => l,
            Err(_) => {
                let _ = tx.send(DownReason::NodeDown);
                return Monitor {
                    rx,
                    watch,
                    target: WatchTarget::Node(actor.node().clone()),
                    rt,
                    done: false,
                };
            }
        };
        if local {
            let id = actor
                .id()
                .or_else(|| actor.name().and_then(|n| actors.registry.resolve(n)));
            let target = WatchTarget::Local(id.unwrap_or(0));
            match id {
                Some(id) => {
                    if let Err((Watcher::Local { tx, .. }, reason)) =
                        actors.registry.watch(id, Watcher::Local { watch, tx })
                    {
                        let _ = tx.send(reason);
                    }
                }
                None => {
                    let _ = tx.send(DownReason::NoProc);
                }
            }
            return Monitor {
                rx,
                watch,
                target,
                rt,
                done: false,
            };
        }
        let node = actor.node().clone();
        let target = WatchTarget::Actor(node.clone(), actor.to.clone());
        let reachable = self.watchable(&node);
        if reachable {
            actors.monitors.add(watch, target.clone(), tx);
            actors.send_monitor(&node, watch, actor.to.clone());
        } else {
            let _ = tx.send(DownReason::NodeDown);
        }
        Monitor {
            rx,
            watch,
            target,
            rt,
            done: false,
        }
    }

    /// Watches a node: the monitor resolves with `NodeDown` when it goes down or leaves.
    pub fn monitor_node(&self, node: &NodeId) -> Monitor {
        let actors = &self.inner.actors;
        let watch = actors.monitors.next_id();
        let (tx, rx) = oneshot::channel();
        let target = WatchTarget::Node(node.clone());
        if self.watchable(node) {
            actors.monitors.add(watch, target.clone(), tx);
        } else {
            let _ = tx.send(DownReason::NodeDown);
        }
        Monitor {
            rx,
            watch,
            target,
            rt: Arc::downgrade(actors),
            done: false,
        }
    }

    /// Number of connected lanes to a peer, per channel: `(channel, connected, parallelism)`.
    pub fn lanes_connected(&self, peer: &str) -> Vec<(String, usize, usize)> {
        let Some(p) = self.inner.router.peer(peer) else {
            return Vec::new();
        };
        self.inner
            .router
            .dispatch
            .specs()
            .iter()
            .map(|s| {
                let lanes = &p.lanes[s.offset..s.offset + s.parallelism as usize];
                let up = lanes.iter().filter(|l| l.is_connected()).count();
                (s.name.clone(), up, s.parallelism as usize)
            })
            .collect()
    }

    /// Decodes a value encoded with [`crate::encode`]; refs inside bind to this node.
    pub fn decode<T: serde::de::DeserializeOwned>(
        &self,
        bytes: &[u8],
    ) -> Result<T, postcard::Error> {
        crate::actor::decode_in(&Arc::downgrade(&self.inner.actors), bytes)
    }

    /// The node's counters.
    pub fn counters(&self) -> &Counters {
        &self.inner.router.counters
    }

    /// Stops the node at once: connections close (peers see it go down, as after a crash),
    /// actors stop, waiting calls fail. Call [`Node::leave`] first for a clean exit.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.router.shutdown.cancel();
        for p in inner.router.drain_peers() {
            p.abort.cancel();
        }
        inner.actors.stop_all();
        inner.topics.close_all();
        // The listening socket is closed when this returns (a restart may reuse the address).
        let accept = inner
            .listener_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = accept {
            let _ = task.await;
        }
    }

    /// Whether the node has been shut down.
    pub fn is_stopped(&self) -> bool {
        self.inner.router.shutdown.is_cancelled()
    }
}

/// The text of a panic's payload (`panic!` with a literal or a format string).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

async fn heartbeats(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(inner.config.transport.heartbeat_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = inner.router.shutdown.cancelled() => return,
            _ = tick.tick() => {
                if inner.control.send(Control::Tick).await.is_err() {
                    return;
                }
            }
        }
    }
}
