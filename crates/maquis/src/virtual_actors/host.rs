//! A node's side of virtual actors: the kinds it offers, and the keys it is activating or
//! deactivating with the messages held for them meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures::future::BoxFuture;

use super::store::{StateStore, StoreError};
use super::{KindError, FENCE, HANDED, PREFIX};
use crate::actor::mailbox::RemoteMsg;
use crate::actor::{ActorId, Offer, Unnamed, UnnamedSink};
use crate::dispatch::{hash_of, SendOpts};
use crate::id::NodeId;
use crate::names::GlobalNameError;
use crate::node::Inner;
use crate::wire::frame::{ActorHeader, Dest, ReplyStatus};
use crate::wire::Body;
use crate::{Actor, Context, Inbox, Node};

/// What activating a key came to.
enum Activated {
    /// The actor's task runs (not named yet) and holds the global name; it handles nothing
    /// before it is told it is named (and given the way to tell it to move).
    Running(ActorId, Named),
    /// Another node's activation holds the name.
    Elsewhere(String),
    /// It could not be registered, or its state not loaded.
    Failed(String),
}

/// Makes and registers the activation of a key (the name, the key).
/// Activates a key: the node, the activation's name, the key, and the node it is taken over
/// from (a hand-over whose holder still holds the name).
type Factory =
    dyn Fn(Node, String, String, Option<NodeId>) -> BoxFuture<'static, Activated> + Send + Sync;

/// Limits, from `[services]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Deactivate after this long without a message (zero: never).
    pub idle: Duration,
    /// Activations a node runs at most.
    pub max_activations: usize,
    /// Messages held per key while it (de)activates.
    pub buffer: usize,
    /// ActOp's partitioning.
    pub actop: super::actop::Settings,
}

/// A node's virtual-actor host.
pub(crate) struct Host {
    limits: Limits,
    node: std::sync::OnceLock<Weak<Inner>>,
    kinds: RwLock<HashMap<String, Arc<Factory>>>,
    table: Mutex<Table>,
    /// The edges from this node's activations (ActOp).
    edges: Mutex<super::actop::Edges>,
    /// What ActOp's last interval showed, for `/status`.
    pub(crate) actop_gauges: super::actop::Gauges,
}

#[derive(Default)]
struct Table {
    /// Keys activating or deactivating, by name, with the messages that came meanwhile.
    held: HashMap<String, VecDeque<Unnamed>>,
    /// Activations running (deactivating ones included).
    active: usize,
    /// Keys another node's activation holds, learnt when activating them here lost: their
    /// messages are passed on there at once. At most [`MOVED`], the oldest forgotten first.
    /// With each, the hand-over generation this node gave it there with (0: it learnt of the
    /// holder otherwise).
    moved: HashMap<String, (NodeId, u64)>,
    moved_order: VecDeque<String>,
    /// Keys handed back to this node while it was passing their messages on to the node they
    /// went to: what it passed on may still come back that way, behind which a fence it sent
    /// marks the end (bounded by the keys being activated).
    fences: HashMap<String, Fence>,
    /// Keys handed over to this node (by a node they moved from) and not active yet: their
    /// activation takes the name over from that node, which holds it meanwhile (bounded by
    /// the keys being activated). With each, the generation of its hand-over and the node
    /// that handed it.
    handed: HashMap<String, (u64, NodeId)>,
    /// The activations running here, by name, and how to tell one to move (bounded by
    /// `max_activations`).
    /// With each, the generation it was handed over with (0: activated afresh).
    running: HashMap<String, (Leave, u64)>,
}

/// How long an activation is tried again while the directory names a node that left as the
/// holder (backing off from 50 ms).
const RETRY_FOR: Duration = Duration::from_secs(2);

/// How long a node that handed a key over keeps its name in the directory for the next
/// holder to take over; then it releases it if no one did (the next node was unreachable).
const HAND_OVER_FOR: Duration = Duration::from_secs(10);

/// A key waiting for its fence (see [`Table::fences`]).
struct Fence {
    /// Which fence (a late one of an earlier wait is ignored).
    id: u64,
    /// Where this node passed the key's messages on to (the fence went there).
    via: NodeId,
    /// The node that handed the key back: what this node passed on comes back through it
    /// (its messages go first; those from elsewhere wait for the fence).
    back: NodeId,
    /// Messages from elsewhere meanwhile, to go after.
    later: VecDeque<Unnamed>,
    /// The activation (and its hand-over's generation), once made: named when the fence is
    /// back.
    ready: Option<(ActorId, Named, u64)>,
}

/// Where an activation is told to move to, and the generation of the hand-over.
type LeaveRx = tokio::sync::oneshot::Receiver<(NodeId, u64)>;
/// Tells an activation where to move to.
type Leave = tokio::sync::oneshot::Sender<(NodeId, u64)>;
/// Tells an activation its name is set, with where it will be told to move to.
type Named = tokio::sync::oneshot::Sender<LeaveRx>;

/// Keys a node remembers as held elsewhere.
const MOVED: usize = 4096;

impl Table {
    fn moved(&mut self, name: &str, to: NodeId, generation: u64) {
        if self
            .moved
            .insert(name.to_string(), (to, generation))
            .is_none()
        {
            self.moved_order.push_back(name.to_string());
            while self.moved_order.len() > MOVED {
                if let Some(old) = self.moved_order.pop_front() {
                    self.moved.remove(&old);
                }
            }
        }
    }
}

/// Puts a message into local activation `id`'s mailbox if there is room now; gives it back
/// if not (full, or the actor stopped).
fn try_push(inner: &Inner, id: ActorId, m: Unnamed) -> Result<(), Unnamed> {
    let msg = RemoteMsg {
        payload: m.payload.clone(),
        from_node: m.from.clone(),
        call: m.call,
    };
    let pushed = inner
        .actors
        .registry
        .by_id(id)
        .is_some_and(|mb| mb.try_push_remote(msg).is_ok());
    if pushed {
        Ok(())
    } else {
        Err(m)
    }
}

/// Passes a message on to the activation of `name` on `to`, without waiting (so that it stays
/// behind what was passed on before it); gives it back if the lane is full or `to` gone.
/// Passed on without the call's number: `to`'s status answers would come here, where that
/// number means another call (replies go straight to the caller: its reply handle is in the
/// message).
fn forward(inner: &Inner, to: &NodeId, name: &str, m: Unnamed) -> Result<(), Unnamed> {
    let header = ActorHeader::Send {
        to: Dest::Name(name.to_string()),
        incarnation: to.incarnation,
        call: None,
        ty: m.ty,
    };
    // One lane for everything about a key, under whichever name: its messages, hand-over and
    // fence stay in order.
    let rest = if let Some(rest) = name.strip_prefix(HANDED) {
        rest.split_once('/').map(|(_, rest)| rest)
    } else {
        name.strip_prefix(FENCE)
    };
    let key = rest.map_or_else(|| name.to_string(), |rest| format!("{PREFIX}{rest}"));
    let receiver = hash_of(&Dest::Name(key));
    let sent = inner.router.try_send_frame(
        to,
        &SendOpts::default(),
        0,
        receiver,
        header,
        Body::from(m.payload.clone()),
    );
    match sent {
        Ok(()) => {
            inner.router.counters.virtual_forwarded.inc();
            Ok(())
        }
        Err(_) => Err(m),
    }
}

impl Host {
    pub(crate) fn new(limits: Limits) -> Self {
        Host {
            limits,
            node: Default::default(),
            kinds: Default::default(),
            table: Default::default(),
            edges: Mutex::new(super::actop::Edges::new(limits.actop.edges)),
            actop_gauges: Default::default(),
        }
    }

    /// Starts serving: messages for missing activation names come here from now on, and
    /// activations that lose their name to an older one (a healed partition) stop.
    pub(crate) fn start(self: &Arc<Self>, node: &Node) {
        let _ = self.node.set(Arc::downgrade(node.inner()));
        let _ = node.actors().unnamed.set(self.clone());
        let mut lost = node.subscribe_names();
        let weak = Arc::downgrade(node.inner());
        tokio::spawn(async move {
            loop {
                let l = match lost.recv().await {
                    Ok(l) => l,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return,
                };
                if !l.name.starts_with(PREFIX) {
                    continue;
                }
                let Some(inner) = weak.upgrade() else { return };
                // The duplicate hands its key over to the winner, as a move does: what is in
                // its mailbox is handled, later messages go on to the winner's activation.
                tracing::info!(name = %l.name, winner = %l.winner, "duplicate activation leaves");
                if !inner.virtuals.migrate(&l.name, l.winner.clone()) {
                    if let Some(id) = inner.actors.registry.resolve(&l.name) {
                        inner.actors.kill(id, crate::DownReason::Shutdown);
                    }
                }
            }
        });
    }

    /// Activations running here.
    pub(crate) fn active(&self) -> usize {
        self.lock().active
    }

    /// Activation `from` here sent to virtual actor `to`, on `host`: an edge counted, and the
    /// message counted local or remote.
    pub(crate) fn sent(&self, inner: &Inner, from: Arc<str>, to: &str, host: &NodeId) {
        let counters = &inner.router.counters;
        if *host == inner.router.id {
            counters.virtual_sent_local.inc();
        } else {
            counters.virtual_sent_remote.inc();
        }
        if !self.limits.actop.interval.is_zero() {
            self.edges
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .sent(from, to, host);
        }
    }

    /// What this node knows of the communication graph now, and how many activations run here.
    pub(crate) fn actop_view(
        &self,
        me: &NodeId,
    ) -> (maquis_proto::actop::View<String, String>, usize) {
        let (running, active): (std::collections::HashSet<String>, usize) = {
            let t = self.lock();
            (t.running.keys().cloned().collect(), t.active)
        };
        let view = self
            .edges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .view(me, &running);
        (view, active)
    }

    /// ActOp's settings.
    pub(crate) fn actop_settings(&self) -> super::actop::Settings {
        self.limits.actop
    }

    /// Older edges weigh half as much from now on.
    pub(crate) fn actop_decay(&self) {
        self.edges.lock().unwrap_or_else(|e| e.into_inner()).decay();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Offers `kind`: `build` makes a key's actor (after its name is won, so that it may load
    /// what the last activation stored), `persist` stores its state after each message.
    pub(crate) fn register<A, B>(
        self: &Arc<Self>,
        kind: &str,
        build: B,
        persist: Option<Persistence<A>>,
    ) -> Result<(), KindError>
    where
        A: Actor,
        B: Fn(String) -> BoxFuture<'static, Result<A, StoreError>> + Send + Sync + 'static,
    {
        let host = Arc::downgrade(self);
        let idle = self.limits.idle;
        let build = Arc::new(build);
        let factory: Arc<Factory> = Arc::new(
            move |node: Node, name: String, key: String, replaces: Option<NodeId>| {
                let host = host.clone();
                let build = build.clone();
                let persist = persist.clone();
                Box::pin(async move {
                    let (ready, actor_rx) = tokio::sync::oneshot::channel();
                    let (named, wait) = tokio::sync::oneshot::channel::<LeaveRx>();
                    let me = spawn_activation(
                        &node,
                        Start {
                            host,
                            name: name.clone(),
                            idle,
                            actor: actor_rx,
                            named: wait,
                            persist: persist.map(|p| Persist {
                                p,
                                id: name[PREFIX.len()..].to_string(),
                                last: None,
                            }),
                        },
                    );
                    let id = me.id().expect("a local actor has an id");
                    let stop = |node: &Node| node.actors().kill(id, crate::DownReason::Shutdown);
                    match node.register_global_as(&name, &me, replaces).await {
                        Ok(()) => match build(key).await {
                            Ok(actor) => {
                                let _ = ready.send(actor);
                                Activated::Running(id, named)
                            }
                            Err(e) => {
                                stop(&node);
                                node.unregister_global(&name).await;
                                Activated::Failed(e.to_string())
                            }
                        },
                        Err(e) => {
                            stop(&node);
                            match e {
                                GlobalNameError::Taken { holder, .. } => {
                                    Activated::Elsewhere(holder)
                                }
                                other => Activated::Failed(other.to_string()),
                            }
                        }
                    }
                }) as BoxFuture<'static, Activated>
            },
        );
        let mut kinds = self.kinds.write().unwrap_or_else(|e| e.into_inner());
        if kinds.contains_key(kind) {
            return Err(KindError::Exists(kind.to_string()));
        }
        kinds.insert(kind.to_string(), factory);
        Ok(())
    }

    /// A message refused: counted, and a call answered `NoProc`.
    fn refuse(&self, inner: &Inner, msg: Unnamed, why: &str) {
        let n = inner.router.counters.virtual_refused.inc_get();
        if n.is_power_of_two() {
            tracing::warn!(from = %msg.from, why, refused_so_far = n, "virtual actor message refused");
        }
        if let Some(call) = msg.call {
            if msg.from == inner.router.id {
                inner.actors.no_proc_call(call);
            } else {
                inner
                    .router
                    .reply_status(&msg.from, call, ReplyStatus::NoProc);
            }
        }
    }

    /// Starts activating `name` (its entry in the table holds its messages).
    fn activate(self: &Arc<Self>, inner: &Arc<Inner>, name: String, factory: Arc<Factory>) {
        let host = self.clone();
        let node = Node::from_inner(inner.clone());
        let key = name[PREFIX.len()..]
            .split_once('/')
            .map(|(_, k)| k.to_string())
            .unwrap_or_default();
        tokio::spawn(async move {
            // Handed over here: the node that handed it holds the name until this one takes
            // it over, so that no lookup finds the key nowhere in between.
            let hander = host.lock().handed.get(&name).map(|(_, h)| h.clone());
            let again = || factory(node.clone(), name.clone(), key.clone(), hander.clone());
            let mut outcome = again().await;
            // A holder that is no longer a member is a registration its name's home has not
            // dropped yet (it does once it sees the node gone): try again a little later.
            let mut wait = Duration::from_millis(50);
            while let Activated::Elsewhere(holder) = &outcome {
                let gone = !node.members().iter().any(|m| m.to_string() == *holder);
                if !gone || wait > RETRY_FOR {
                    break;
                }
                tokio::time::sleep(wait).await;
                wait *= 2;
                outcome = again().await;
            }
            host.activated(node.inner(), name, outcome);
        });
    }

    fn activated(self: &Arc<Self>, inner: &Arc<Inner>, name: String, outcome: Activated) {
        match &outcome {
            Activated::Running(id, _) => tracing::debug!(%name, id, "activated"),
            Activated::Elsewhere(holder) => tracing::debug!(%name, %holder, "held elsewhere"),
            Activated::Failed(e) => tracing::debug!(%name, error = %e, "activation failed"),
        }
        match outcome {
            Activated::Running(id, named) => {
                inner.router.counters.virtual_activations.inc();
                let refused = {
                    let mut t = self.lock();
                    t.moved.remove(&name);
                    let handed = t.handed.remove(&name);
                    t.active += 1;
                    if handed.is_some() {
                        inner.router.counters.virtual_arrivals.inc();
                    }
                    let generation = handed.map_or(0, |(g, _)| g);
                    match t.fences.get_mut(&name) {
                        // Named when what this node passed on has come back.
                        Some(f) => {
                            f.ready = Some((id, named, generation));
                            Vec::new()
                        }
                        None => self.finish(&mut t, inner, &name, (id, named, generation)),
                    }
                };
                for m in refused {
                    self.refuse(inner, m, "mailbox full or actor stopped");
                }
            }
            Activated::Elsewhere(holder) => {
                // The holder as the directory names it (`name@address`).
                let to = inner
                    .members_now()
                    .iter()
                    .find(|m| m.to_string() == holder)
                    .cloned();
                let mut refused = Vec::new();
                {
                    let mut t = self.lock();
                    let held = t.held.remove(&name).unwrap_or_default();
                    if t.handed.remove(&name).is_some() {
                        inner.router.counters.virtual_arrivals.inc();
                    }
                    match &to {
                        Some(to) => {
                            t.moved(&name, to.clone(), 0);
                            for m in held {
                                if let Err(m) = forward(inner, to, &name, m) {
                                    refused.push(m);
                                }
                            }
                        }
                        None => refused.extend(held),
                    }
                }
                for m in refused {
                    self.refuse(inner, m, "the holder is not reachable");
                }
            }
            Activated::Failed(e) => {
                let held = {
                    let mut t = self.lock();
                    if t.handed.remove(&name).is_some() {
                        inner.router.counters.virtual_arrivals.inc();
                    }
                    t.held.remove(&name).unwrap_or_default()
                };
                tracing::warn!(%name, error = %e, "activation failed");
                for m in held {
                    self.refuse(inner, m, "activation failed");
                }
            }
        }
    }

    /// Gives a new activation the messages held for it, then its name (under the table's
    /// lock: what arrives from now on goes straight to the mailbox, behind them); what does
    /// not fit is returned, to be refused.
    fn finish(
        &self,
        t: &mut Table,
        inner: &Inner,
        name: &str,
        (id, named, generation): (ActorId, Named, u64),
    ) -> Vec<Unnamed> {
        let actors = &inner.actors;
        let refused = t
            .held
            .remove(name)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| try_push(inner, id, m).err())
            .collect();
        if actors.registry.register(name, id).is_err() {
            tracing::warn!(%name, "activation's local name taken");
        }
        let (leave, told) = tokio::sync::oneshot::channel();
        let ok = named.send(told).is_ok();
        if ok {
            t.running.insert(name.to_string(), (leave, generation));
        }
        tracing::debug!(node = %inner.router.id.name, %name, id, ok, "named");
        refused
    }

    /// Starts waiting for what this node passed on to `via` to come back: sends a fence
    /// behind it, and ends the wait after [`RETRY_FOR`] if it does not return (`via` gone).
    fn fence(
        self: &Arc<Self>,
        t: &mut Table,
        inner: &Arc<Inner>,
        name: &str,
        via: NodeId,
        back: NodeId,
    ) {
        let id = inner.router.counters.virtual_fences.inc_get();
        let fence = Unnamed {
            from: inner.router.id.clone(),
            ty: 0,
            payload: bytes::Bytes::new(),
            call: None,
        };
        let fenced = format!("{FENCE}{}", &name[PREFIX.len()..]);
        if forward(inner, &via, &fenced, fence).is_err() {
            return;
        }
        tracing::debug!(%name, %via, id, "fence sent");
        t.fences.insert(
            name.to_string(),
            Fence {
                id,
                via,
                back,
                later: VecDeque::new(),
                ready: None,
            },
        );
        let (host, inner, name) = (self.clone(), inner.clone(), name.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(RETRY_FOR).await;
            host.fence_back(&inner, &name, Some(id));
        });
    }

    /// A fence came back (`id`: `None`), or the wait for fence `id` ended: the messages from
    /// elsewhere go behind what came back, and an activation already made is named.
    fn fence_back(&self, inner: &Inner, name: &str, id: Option<u64>) {
        let refused = {
            let mut t = self.lock();
            match t.fences.get(name) {
                Some(f) if id.is_none_or(|id| id == f.id) => {}
                _ => return,
            }
            let Some(f) = t.fences.remove(name) else {
                return;
            };
            tracing::debug!(%name, timed_out = id.is_some(), later = f.later.len(), ready = f.ready.is_some(), "fence back");
            if id.is_some() {
                tracing::warn!(%name, via = %f.via, "fence not back in time: messages may be out of order");
            }
            t.held.entry(name.to_string()).or_default().extend(f.later);
            match f.ready {
                Some(ready) => self.finish(&mut t, inner, name, ready),
                None => Vec::new(),
            }
        };
        for m in refused {
            self.refuse(inner, m, "mailbox full or actor stopped");
        }
    }

    /// An activation begins to deactivate: its local name goes, under the table's lock, and
    /// messages for it are held from now on.
    fn deactivating(&self, inner: &Inner, name: &str) {
        let mut t = self.lock();
        inner.actors.registry.unregister(name);
        t.running.remove(name);
        t.held.entry(name.to_string()).or_default();
    }

    /// Tells the activation of `name` here to move to `to`; false if there is none.
    pub(crate) fn migrate(&self, name: &str, to: NodeId) -> bool {
        let leave = self.lock().running.remove(name);
        let found = leave.is_some();
        let sent = leave.is_some_and(|(tx, generation)| tx.send((to, generation + 1)).is_ok());
        tracing::debug!(%name, found, sent, "migrate");
        sent
    }

    /// An activation that moves has handled its last message: its name is handed over (kept
    /// in the directory until `to` takes it over, released after [`HAND_OVER_FOR`] if `to`
    /// never does); what was held meanwhile, and what comes later, is passed on to `to`,
    /// whose next message activates the key there (from its stored state).
    async fn departed(
        self: &Arc<Self>,
        inner: &Arc<Inner>,
        name: &str,
        (to, generation): (NodeId, u64),
    ) {
        let node = Node::from_inner(inner.clone());
        let held = node.hand_over_global(name).await;
        tracing::debug!(%name, %to, held, "moving");
        if held {
            let name = name.to_string();
            let stop = inner.router.shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(HAND_OVER_FOR) => node.release_if_left(&name).await,
                    () = stop.cancelled() => {}
                }
            });
        }
        inner.router.counters.virtual_migrations.inc();
        let mut refused = Vec::new();
        {
            let mut t = self.lock();
            t.active = t.active.saturating_sub(1);
            t.moved(name, to.clone(), generation);
            // Under the handed name: `to` activates the key whatever it thought of where it
            // was; with nothing held, an empty message says so.
            let handed = format!("{HANDED}{generation}/{}", &name[PREFIX.len()..]);
            let held = t.held.remove(name).unwrap_or_default();
            if held.is_empty() {
                let nudge = Unnamed {
                    from: inner.router.id.clone(),
                    ty: 0,
                    payload: bytes::Bytes::new(),
                    call: None,
                };
                if forward(inner, &to, &handed, nudge).is_err() {
                    tracing::warn!(%name, %to, "hand-over notice not sent");
                }
            }
            for m in held {
                if let Err(m) = forward(inner, &to, &handed, m) {
                    refused.push(m);
                }
            }
        }
        for m in refused {
            self.refuse(inner, m, "the new node is not reachable");
        }
    }

    /// An activation has handled its last message: messages held meanwhile activate the key
    /// again.
    fn deactivated(self: &Arc<Self>, inner: &Arc<Inner>, name: &str) {
        inner.router.counters.virtual_deactivations.inc();
        let again = {
            let mut t = self.lock();
            t.active = t.active.saturating_sub(1);
            match t.held.get(name) {
                Some(h) if !h.is_empty() => true,
                _ => {
                    t.held.remove(name);
                    false
                }
            }
        };
        if again {
            match self.factory_of(name) {
                Some(f) => self.activate(inner, name.to_string(), f),
                None => {
                    let held = self.lock().held.remove(name).unwrap_or_default();
                    for m in held {
                        self.refuse(inner, m, "unknown kind");
                    }
                }
            }
        }
    }

    fn factory_of(&self, name: &str) -> Option<Arc<Factory>> {
        let kind = name.strip_prefix(PREFIX)?.split_once('/')?.0;
        self.kinds
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(kind)
            .cloned()
    }
}

impl UnnamedSink for Host {
    fn offer(&self, name: &str, msg: Unnamed) -> Offer {
        // A key handed over by a node it moved from comes under a name of its own: it is to
        // be activated here, whatever this node thought of where the key was. A fence comes
        // under another.
        let (name, handed) = if let Some(rest) = name.strip_prefix(HANDED) {
            let Some((generation, rest)) = rest
                .split_once('/')
                .and_then(|(g, rest)| Some((g.parse::<u64>().ok()?, rest)))
            else {
                return Offer::NotMine(msg);
            };
            (format!("{PREFIX}{rest}"), Some(generation))
        } else if let Some(rest) = name.strip_prefix(FENCE) {
            let Some(inner) = self.node.get().and_then(Weak::upgrade) else {
                return Offer::NotMine(msg);
            };
            self.fence_arrived(&inner, &format!("{PREFIX}{rest}"), name, msg);
            return Offer::Taken;
        } else if name.starts_with(PREFIX) {
            (name.to_string(), None)
        } else {
            return Offer::NotMine(msg);
        };
        let name = name.as_str();
        let Some(inner) = self.node.get().and_then(Weak::upgrade) else {
            return Offer::NotMine(msg);
        };
        let Some(factory) = self.factory_of(name) else {
            self.refuse(&inner, msg, "unknown kind");
            return Offer::Taken;
        };
        let mut t = self.lock();
        // A hand-over older than the one this node has since made of the key (to the node
        // that handed it here, say) is the tail of that older one, overtaken: passed on like
        // any message for the key.
        let handed = handed.filter(|g| t.moved.get(name).is_none_or(|(_, mine)| g > mine));
        let nudge = handed.is_some() && msg.ty == 0 && msg.payload.is_empty();
        if let Some(id) = inner.actors.registry.resolve(name) {
            if handed.is_none() {
                return Offer::Named(msg);
            }
            // Active here already: straight into its mailbox (the handed name is no actor's).
            drop(t);
            if !nudge {
                self.push_now(&inner, id, msg);
            }
            return Offer::Taken;
        }
        if let Some(generation) = handed {
            // A handed message comes from the node that hands the key over.
            t.handed
                .insert(name.to_string(), (generation, msg.from.clone()));
            if let Some((via, _)) = t.moved.remove(name) {
                if !t.fences.contains_key(name) {
                    let back = msg.from.clone();
                    inner
                        .virtuals
                        .clone()
                        .fence(&mut t, &inner, name, via, back);
                }
            }
        }
        if let Some(f) = t.fences.get_mut(name) {
            if msg.from != f.back && handed.is_none() {
                if f.later.len() >= self.limits.buffer {
                    drop(t);
                    self.refuse(&inner, msg, "too many messages held for the key");
                } else {
                    f.later.push_back(msg);
                }
                return Offer::Taken;
            }
        }
        if let Some((to, _)) = t.moved.get(name).cloned() {
            if inner.members_now().binary_search(&to).is_ok() {
                let back = forward(&inner, &to, name, msg);
                drop(t);
                if let Err(m) = back {
                    self.refuse(&inner, m, "the holder is not reachable");
                }
                return Offer::Taken;
            }
            // Its node left: the key may be activated here.
            t.moved.remove(name);
        }
        if let Some(held) = t.held.get_mut(name) {
            if nudge {
                return Offer::Taken;
            }
            if held.len() >= self.limits.buffer {
                drop(t);
                self.refuse(&inner, msg, "too many messages held for the key");
            } else {
                held.push_back(msg);
            }
            return Offer::Taken;
        }
        if t.active + t.held.len() >= self.limits.max_activations {
            drop(t);
            if !nudge {
                self.refuse(&inner, msg, "too many activations");
            }
            return Offer::Taken;
        }
        let first = if nudge {
            VecDeque::new()
        } else {
            VecDeque::from([msg])
        };
        t.held.insert(name.to_string(), first);
        drop(t);
        // `self` is the node's host, kept in an `Arc` by the node.
        let host = inner.virtuals.clone();
        host.activate(&inner, name.to_string(), factory);
        Offer::Taken
    }
}

impl Host {
    /// A fence for `name`: back at the node that sent it (its wait ends), or passed on the way
    /// the key's messages go from here.
    fn fence_arrived(&self, inner: &Inner, name: &str, fenced: &str, msg: Unnamed) {
        if msg.from == inner.router.id || self.lock().fences.contains_key(name) {
            self.fence_back(inner, name, None);
            return;
        }
        let to = self.lock().moved.get(name).map(|(to, _)| to.clone());
        match to {
            Some(to) => {
                tracing::debug!(%name, %to, "fence passed on");
                if forward(inner, &to, fenced, msg).is_err() {
                    tracing::debug!(%name, %to, "fence not passed on");
                }
            }
            None => tracing::debug!(%name, "fence with nowhere to go dropped"),
        }
    }

    /// Puts a message into a local activation's mailbox if there is room now; refused if not.
    fn push_now(&self, inner: &Inner, id: ActorId, m: Unnamed) {
        if let Err(m) = try_push(inner, id, m) {
            self.refuse(inner, m, "mailbox full or actor stopped");
        }
    }
}

/// How a kind's actors keep their state: the store, and the actor's state encoded.
pub(crate) struct Persistence<A> {
    pub store: Arc<dyn StateStore>,
    pub encode: fn(&A) -> Result<Vec<u8>, String>,
}

impl<A> Clone for Persistence<A> {
    fn clone(&self) -> Self {
        Persistence {
            store: self.store.clone(),
            encode: self.encode,
        }
    }
}

/// An activation's state being kept: saved after a message that changed it.
struct Persist<A> {
    p: Persistence<A>,
    /// `kind/key`.
    id: String,
    /// What was saved last.
    last: Option<Vec<u8>>,
}

impl<A> Persist<A> {
    /// The actor's state if it changed since it was last saved (an encoding failure is
    /// counted, and nothing is saved).
    fn changed(&self, actor: &A, inner: &Inner) -> Option<Vec<u8>> {
        match (self.p.encode)(actor) {
            Ok(bytes) if self.last.as_ref() == Some(&bytes) => None,
            Ok(bytes) => Some(bytes),
            Err(e) => {
                self.failed(inner, StoreError::Encode(self.id.clone(), e));
                None
            }
        }
    }

    async fn save(&mut self, bytes: Vec<u8>, inner: &Inner) {
        match self.p.store.save(&self.id, bytes.clone()).await {
            Ok(()) => self.last = Some(bytes),
            Err(e) => self.failed(inner, e),
        }
    }

    fn failed(&self, inner: &Inner, e: StoreError) {
        let n = inner.router.counters.virtual_save_errors.inc_get();
        if n.is_power_of_two() {
            tracing::warn!(actor = %self.id, error = %e, failed_so_far = n, "virtual actor state not saved");
        }
    }
}

/// Takes an activation out of its host's count if its task ends without deactivating.
struct Counted {
    host: Weak<Host>,
    name: String,
    armed: bool,
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let (true, Some(host)) = (self.armed, self.host.upgrade()) {
            let mut t = host.lock();
            t.running.remove(&self.name);
            t.active = t.active.saturating_sub(1);
        }
    }
}

/// What an activation's task starts with.
struct Start<A> {
    host: Weak<Host>,
    name: String,
    idle: Duration,
    /// The actor, once its name is won and its state loaded (dropped: it stops).
    actor: tokio::sync::oneshot::Receiver<A>,
    /// Its local name is set, with the way it is told to move (dropped: it stops).
    named: tokio::sync::oneshot::Receiver<LeaveRx>,
    persist: Option<Persist<A>>,
}

/// Spawns an activation: it waits for its actor and its name, handles messages until the
/// actor stops itself or has been idle for `idle`, then deactivates (see the module doc).
fn spawn_activation<A: Actor>(node: &Node, start: Start<A>) -> crate::ActorRef<A::Msg> {
    let node2 = node.clone();
    let current: Arc<str> = Arc::from(start.name.as_str());
    node.spawn_fn(move |mut inbox: Inbox<A::Msg>| {
        super::actop::scope(current, async move {
            let Start {
                host,
                name,
                idle,
                actor,
                named,
                mut persist,
            } = start;
            // Not a live activation until its name is set (its registration lost: stopped).
            let Ok(mut actor) = actor.await else { return };
            let Ok(mut leave) = named.await else { return };
            let inner = node2.inner().clone();
            // An activation stopped from outside (its node's shutdown, `Node::stop_actor`) ends
            // without deactivating: the guard takes it out of the host's count.
            let mut guard = Counted {
                host: host.clone(),
                name: name.clone(),
                armed: true,
            };
            let mut ctx = Context::new(&inbox, node2.clone());
            actor.started(&mut ctx).await;
            let forever = idle.is_zero();
            let idle = if forever {
                Duration::from_secs(3600)
            } else {
                idle
            };
            let mut last = tokio::time::Instant::now();
            let sleep = tokio::time::sleep_until(last + idle);
            tokio::pin!(sleep);
            let (mut to, mut may_move) = (None, true);
            loop {
                tokio::select! {
                    biased;
                    moving = &mut leave, if may_move => match moving {
                        Ok(node) => {
                            to = Some(node);
                            break;
                        }
                        Err(_) => may_move = false,
                    },
                    m = inbox.recv() => match m {
                        Some(m) => {
                            last = tokio::time::Instant::now();
                            actor.handle(m, &mut ctx).await;
                            let changed = persist.as_ref().and_then(|p| p.changed(&actor, &inner));
                            if let (Some(p), Some(bytes)) = (persist.as_mut(), changed) {
                                p.save(bytes, &inner).await;
                            }
                            if ctx.stop {
                                break;
                            }
                        }
                        None => return,
                    },
                    () = &mut sleep => {
                        if forever || last.elapsed() < idle {
                            sleep.as_mut().reset(last + idle);
                            continue;
                        }
                        break;
                    }
                }
            }
            guard.armed = false;
            let Some(host) = host.upgrade() else { return };
            host.deactivating(&inner, &name);
            // What reached the mailbox before it closed is handled here, by this activation, and
            // so is a send that had room reserved before (`recv` ends only when none is left); a
            // send that finds it closed offers its message to the host, which holds it.
            inbox.close();
            while let Some(m) = inbox.recv().await {
                actor.handle(m, &mut ctx).await;
                let changed = persist.as_ref().and_then(|p| p.changed(&actor, &inner));
                if let (Some(p), Some(bytes)) = (persist.as_mut(), changed) {
                    p.save(bytes, &inner).await;
                }
            }
            match to {
                Some(to) => host.departed(&inner, &name, to).await,
                None => host.deactivated(&inner, &name),
            }
        })
    })
}
