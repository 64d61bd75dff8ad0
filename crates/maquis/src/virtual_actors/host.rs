//! A node's side of virtual actors: the kinds it offers, and the keys it is activating or
//! deactivating with the messages held for them meanwhile.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures::future::BoxFuture;

use super::store::{StateStore, StoreError};
use super::{KindError, PREFIX};
use crate::actor::registry::RemoteMsg;
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
    /// before it is told it is named.
    Running(ActorId, tokio::sync::oneshot::Sender<()>),
    /// Another node's activation holds the name.
    Elsewhere(String),
    /// It could not be registered, or its state not loaded.
    Failed(String),
}

/// Makes and registers the activation of a key (the name, the key).
type Factory = dyn Fn(Node, String, String) -> BoxFuture<'static, Activated> + Send + Sync;

/// Limits, from `[services]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Deactivate after this long without a message (zero: never).
    pub idle: Duration,
    /// Activations a node runs at most.
    pub max_activations: usize,
    /// Messages held per key while it (de)activates.
    pub buffer: usize,
}

/// A node's virtual-actor host.
pub(crate) struct Host {
    limits: Limits,
    node: std::sync::OnceLock<Weak<Inner>>,
    kinds: RwLock<HashMap<String, Arc<Factory>>>,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    /// Keys activating or deactivating, by name, with the messages that came meanwhile.
    held: HashMap<String, VecDeque<Unnamed>>,
    /// Activations running (deactivating ones included).
    active: usize,
    /// Keys another node's activation holds, learnt when activating them here lost: their
    /// messages are passed on there at once. At most [`MOVED`], the oldest forgotten first.
    moved: HashMap<String, NodeId>,
    moved_order: VecDeque<String>,
}

/// How long an activation is tried again while the directory names a node that left as the
/// holder (backing off from 50 ms).
const RETRY_FOR: Duration = Duration::from_secs(2);

/// Keys a node remembers as held elsewhere.
const MOVED: usize = 4096;

impl Table {
    fn moved(&mut self, name: &str, to: NodeId) {
        if self.moved.insert(name.to_string(), to).is_none() {
            self.moved_order.push_back(name.to_string());
            while self.moved_order.len() > MOVED {
                if let Some(old) = self.moved_order.pop_front() {
                    self.moved.remove(&old);
                }
            }
        }
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
    let receiver = hash_of(&Dest::Name(name.to_string()));
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
                let actors = &inner.actors;
                if let Some(id) = actors.registry.resolve(&l.name) {
                    tracing::info!(name = %l.name, winner = %l.winner, "duplicate activation stopped");
                    actors.kill(id, crate::DownReason::Shutdown);
                }
            }
        });
    }

    /// Activations running here.
    pub(crate) fn active(&self) -> usize {
        self.lock().active
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
        let factory: Arc<Factory> = Arc::new(move |node: Node, name: String, key: String| {
            let host = host.clone();
            let build = build.clone();
            let persist = persist.clone();
            Box::pin(async move {
                let (ready, actor_rx) = tokio::sync::oneshot::channel();
                let (named, wait) = tokio::sync::oneshot::channel();
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
                match node.register_global(&name, &me).await {
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
                            GlobalNameError::Taken { holder, .. } => Activated::Elsewhere(holder),
                            other => Activated::Failed(other.to_string()),
                        }
                    }
                }
            }) as BoxFuture<'static, Activated>
        });
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
            let mut outcome = factory(node.clone(), name.clone(), key.clone()).await;
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
                outcome = factory(node.clone(), name.clone(), key.clone()).await;
            }
            host.activated(node.inner(), name, outcome);
        });
    }

    fn activated(self: &Arc<Self>, inner: &Arc<Inner>, name: String, outcome: Activated) {
        let actors = &inner.actors;
        match outcome {
            Activated::Running(id, named) => {
                inner.router.counters.virtual_activations.inc();
                let mut refused = Vec::new();
                {
                    let mut t = self.lock();
                    let held = t.held.remove(&name).unwrap_or_default();
                    t.moved.remove(&name);
                    t.active += 1;
                    let mailbox = actors.registry.by_id(id);
                    for m in held {
                        let msg = RemoteMsg {
                            payload: m.payload.clone(),
                            from_node: m.from.clone(),
                            call: m.call,
                        };
                        let pushed = mailbox.as_ref().map(|mb| mb.try_push_remote(msg).is_ok());
                        if pushed != Some(true) {
                            refused.push(m);
                        }
                    }
                    // Named last, under the table's lock: what arrives from now on goes
                    // straight to the mailbox, behind what was held.
                    if actors.registry.register(&name, id).is_err() {
                        tracing::warn!(%name, "activation's local name taken");
                    }
                    let _ = named.send(());
                }
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
                    match &to {
                        Some(to) => {
                            t.moved(&name, to.clone());
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
                let held = self.lock().held.remove(&name).unwrap_or_default();
                tracing::warn!(%name, error = %e, "activation failed");
                for m in held {
                    self.refuse(inner, m, "activation failed");
                }
            }
        }
    }

    /// An activation begins to deactivate: its local name goes, under the table's lock, and
    /// messages for it are held from now on.
    fn deactivating(&self, inner: &Inner, name: &str) {
        let mut t = self.lock();
        inner.actors.registry.unregister(name);
        t.held.entry(name.to_string()).or_default();
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
        if !name.starts_with(PREFIX) {
            return Offer::NotMine(msg);
        }
        let Some(inner) = self.node.get().and_then(Weak::upgrade) else {
            return Offer::NotMine(msg);
        };
        let Some(factory) = self.factory_of(name) else {
            self.refuse(&inner, msg, "unknown kind");
            return Offer::Taken;
        };
        let mut t = self.lock();
        if inner.actors.registry.resolve(name).is_some() {
            return Offer::Named(msg);
        }
        if let Some(to) = t.moved.get(name).cloned() {
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
            self.refuse(&inner, msg, "too many activations");
            return Offer::Taken;
        }
        t.held.insert(name.to_string(), VecDeque::from([msg]));
        drop(t);
        // `self` is the node's host, kept in an `Arc` by the node.
        let host = inner.virtuals.clone();
        host.activate(&inner, name.to_string(), factory);
        Offer::Taken
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

/// What an activation's task starts with.
struct Start<A> {
    host: Weak<Host>,
    name: String,
    idle: Duration,
    /// The actor, once its name is won and its state loaded (dropped: it stops).
    actor: tokio::sync::oneshot::Receiver<A>,
    /// Its local name is set (dropped: it stops).
    named: tokio::sync::oneshot::Receiver<()>,
    persist: Option<Persist<A>>,
}

/// Spawns an activation: it waits for its actor and its name, handles messages until the
/// actor stops itself or has been idle for `idle`, then deactivates (see the module doc).
fn spawn_activation<A: Actor>(node: &Node, start: Start<A>) -> crate::ActorRef<A::Msg> {
    let node2 = node.clone();
    node.spawn_fn(move |mut inbox: Inbox<A::Msg>| async move {
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
        if named.await.is_err() {
            return;
        }
        let inner = node2.inner().clone();
        let mut ctx = Context {
            me: inbox.myself(),
            node: node2.clone(),
            stop: false,
        };
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
        loop {
            tokio::select! {
                biased;
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
        host.deactivated(&inner, &name);
    })
}
