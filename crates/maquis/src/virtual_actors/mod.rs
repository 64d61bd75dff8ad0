//! Virtual actors: actors addressed by a kind and a key, activated by the runtime where it
//! chooses, on their first message.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use maquis::{Actor, Context, Node, ReplyTo};
//! # use maquis::virtual_actors::Placement;
//! # use serde::{Deserialize, Serialize};
//! #[derive(Serialize, Deserialize)]
//! enum Player { Join(u64), Score(ReplyTo<u64>) }
//!
//! struct PlayerActor { score: u64 }
//! impl Actor for PlayerActor {
//!     type Msg = Player;
//!     async fn handle(&mut self, msg: Player, _ctx: &mut Context<Player>) {
//!         match msg {
//!             Player::Join(n) => self.score += n,
//!             Player::Score(reply) => { let _ = reply.send(self.score).await; }
//!         }
//!     }
//! }
//!
//! # async fn f(a: Node, b: Node) -> Result<(), Box<dyn std::error::Error>> {
//! // Every node that may host players offers the kind.
//! for node in [&a, &b] {
//!     node.register_virtual("player", |_key: &str| PlayerActor { score: 0 })?;
//! }
//! // Any node reaches player "7" without knowing where, or whether, it runs.
//! let p = a.virtual_ref::<Player>("player", "7")?.placement(Placement::Random);
//! p.send(Player::Join(3)).await?;
//! let score: u64 = p.call(Player::Score, Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! An activation of kind `k` and key `x` is a local actor named `$maquis/v/k/x` on its node,
//! and holds the global name of the same spelling ([`crate::names`]): the directory's rule
//! that a name has at most one registration in a connected cluster is what keeps a key to
//! one activation.
//!
//! A [`VirtualRef`] finds the node to send to from the directory (the node's cache first);
//! when no activation holds the name, its placement picks a member ([`Placement`]). It then
//! sends to the name on that node. A node that gets a message for such a name with no actor
//! under it activates one: it makes the actor with the kind's factory, registers the global
//! name, and hands it the messages that arrived meanwhile, in their order, before the local
//! name is set (so later messages cannot overtake them). If another node's activation holds
//! the name already (two nodes placed the key at once), the new one is stopped and the
//! messages go on to the holder, by name.
//!
//! An activation that received nothing for `services.virtual_idle_ms` deactivates: its
//! local name goes first (messages arriving from then on are held), it handles what is left
//! in its mailbox, and stops (its global name goes with it); held messages then activate it
//! again. When a node goes down, its names leave the directory and a ref whose node is no
//! longer a member looks the key up again: the next message activates the key elsewhere.
//! A kind registered with [`Node::register_persistent`] starts each activation from the state
//! its store holds, loaded once the name is won, and saves its state after every message that
//! changed it.
//!
//! # Moving an activation
//!
//! [`Node::migrate`] moves an activation the way it deactivates, with a destination: its
//! local name goes, it handles what is in its mailbox, hands its global name over, and
//! remembers where the key went. Handing the name over keeps it in the directory under the
//! old node, which passes messages on, until the destination's registration replaces it (the
//! home grants that to the node the key was handed to while the name is still the old
//! node's); if the destination never takes it, the old node releases it after 10 s. Messages held meanwhile go to the destination under a *hand-over* name
//! (`$maquis/vh/GEN/k/x`, or an empty one if none was held), which makes that node activate
//! the key whatever it thought of where it was (from the stored state, for a persistent
//! kind); later messages that reach the old node are passed on. Every message about a key
//! that a node passes on takes one lane, so a node passes a key's messages on in the order it
//! got them.
//!
//! A key handed to a node that was itself passing the key's messages on (it moves back, or
//! round a cycle) may still have messages on the way round, behind the newer ones that reach
//! that node directly. The node sends a *fence* the way it passed messages on; every node on
//! the way passes the fence on behind them, and until it is back, messages that come from
//! elsewhere than the node that handed the key over wait (bounded by `activation_buffer`;
//! after 2 s without the fence, they go anyway, logged). The hand-over's generation tells a
//! hand-over from the tail of an older one that arrives after the key has moved on.
//!
//! # What it guarantees
//!
//! - In a connected cluster, at most one activation of a key handles messages at a time.
//!   During a partition each side may activate a key; when it heals, the directory keeps the
//!   older registration and the other activation leaves as a move does: it handles what is
//!   in its mailbox, and what reaches its node later goes on to the winner. The two states
//!   are not merged: the winner's goes on, the other's (and what it handled during the
//!   partition) is left behind, in its store if it has one.
//! - Messages from one sender to one key are handled in the order sent, across activation,
//!   deactivation and moves, as long as the nodes on their way stay up. A message sent to a
//!   node that goes down before handling it is lost (a call fails with `NodeDown` or times
//!   out). A first lookup while the key moves finds the node it is leaving (the name is
//!   handed over, never free in between), so no sender places a moving key afresh.
//! - Nothing is dropped silently: a message the host cannot take (unknown kind, too many
//!   activations or held messages, a failed registration) is counted in
//!   `virtual_refused`, and a call is answered `NoProc`.
//!
//! # Bounds
//!
//! From `[services]`: at most `max_activations` activations per node (a message that would
//! make one more is refused), at most `activation_buffer` messages held per key while it
//! activates, deactivates or waits for a fence (more are refused). A node remembers where at
//! most 4,096 keys went (the oldest is forgotten: its next message activates it here, and
//! learns the holder again).

mod actop;
mod host;
mod store;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;

use crate::actor::{ActorRef, Message};
use crate::error::{CallError, SendError};
use crate::id::NodeId;
use crate::names::GlobalNameError;
use crate::wire::frame::Dest;
use crate::{Actor, Node, ReplyTo};

pub(crate) use actop::Settings as ActopSettings;
pub(crate) use host::{Host, Limits};
pub use store::{MemoryStore, RedbStore, StateStore, StoreError};

/// The prefix of the names activations hold, locally and globally.
pub(crate) const PREFIX: &str = "$maquis/v/";

/// The prefix of the names a key is handed over under when it moves (to be activated by
/// the node it arrives at).
pub(crate) const HANDED: &str = "$maquis/vh/";

/// The prefix of a fence's name: it follows a moved key's messages to the node they are
/// passed on to and back (see the host).
pub(crate) const FENCE: &str = "$maquis/vf/";

/// The name of the activation of `kind` and `key`.
fn name_of(kind: &str, key: &str) -> String {
    format!("{PREFIX}{kind}/{key}")
}

/// Where a key with no activation is activated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// A member chosen at random (Orleans' default): the same one for every message this
    /// node sends to the key while it has no activation, so that they stay in order; other
    /// nodes choose their own.
    #[default]
    Random,
    /// The node that sends the first message.
    Local,
    /// The member the key hashes to (rendezvous hashing over the members).
    Hash,
}

/// Why a virtual actor could not be reached.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VirtualError {
    /// The kind or key is empty, or contains `/` (kind) or is too long for a name.
    #[error("bad virtual actor address: {0}")]
    BadAddress(String),
    /// The directory could not say where the actor runs.
    #[error("directory: {0}")]
    Directory(#[from] GlobalNameError),
    /// The message could not be sent.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The call failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// This node has no members to place the actor on (it is stopping).
    #[error("no member to place the actor on")]
    NoMember,
}

/// Why a kind could not be registered.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum KindError {
    /// The name is empty or contains `/`.
    #[error("bad virtual actor kind {0:?}: empty, or contains '/'")]
    BadKind(String),
    /// A kind of that name is registered on this node already.
    #[error("virtual actor kind {0:?} is registered already")]
    Exists(String),
}

/// Why an activation could not be moved.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MigrateError {
    /// No activation of that kind and key runs on this node (or it is leaving already).
    #[error("no activation of {0} on this node")]
    NotHere(String),
    /// The destination is not another member.
    #[error("{0:?} is not another member")]
    NotMember(String),
}

/// A ref to a virtual actor: its kind and key, wherever (and whether) it runs. Cheap to make
/// and to clone; sends find the activation, or make one.
pub struct VirtualRef<M> {
    node: Node,
    name: String,
    placement: Placement,
    /// Where the activation was last found.
    host: Arc<Mutex<Option<NodeId>>>,
    _m: std::marker::PhantomData<fn(M)>,
}

impl<M> Clone for VirtualRef<M> {
    fn clone(&self) -> Self {
        VirtualRef {
            node: self.node.clone(),
            name: self.name.clone(),
            placement: self.placement,
            host: self.host.clone(),
            _m: std::marker::PhantomData,
        }
    }
}

impl<M> std::fmt::Debug for VirtualRef<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VirtualRef({})", &self.name[PREFIX.len()..])
    }
}

impl<M: Message> VirtualRef<M> {
    /// The same actor, placed by `placement` if it has no activation when a message comes.
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Sends a message (waiting for room).
    pub async fn send(&self, msg: M) -> Result<(), VirtualError> {
        let to = self.target().await?;
        self.count(&to);
        Ok(to.send(msg).await?)
    }

    /// Calls the actor: `make` builds the request around its reply handle.
    pub async fn call<R: Message>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, VirtualError> {
        let to = self.target().await?;
        self.count(&to);
        Ok(to.call(make, timeout).await?)
    }

    /// A message from an activation: counted as its edge to this actor (ActOp), and as local
    /// or remote.
    fn count(&self, to: &ActorRef<M>) {
        if let Some(me) = actop::current() {
            let inner = self.node.inner();
            inner.virtuals.sent(inner, me, &self.name, to.node());
        }
    }

    /// The node the activation is on, as last found (`None`: not looked up yet, or forgotten
    /// after its node left).
    pub fn last_host(&self) -> Option<NodeId> {
        self.host.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The activation's name on the node it runs on, or is to be activated on.
    async fn target(&self) -> Result<ActorRef<M>, VirtualError> {
        // Per message: a lookup of the cached host's name, not a copy of the member list.
        let member = |h: &NodeId| self.node.member(&h.name).as_ref() == Some(h);
        let cached = self.last_host().filter(|h| member(h));
        let host = match cached {
            Some(h) => h,
            None => {
                let members = self.node.members();
                let found = self.node.whereis_global::<M>(&self.name).await?;
                let host = match found.map(|r| r.node().clone()) {
                    Some(h) if members.contains(&h) => h,
                    Some(_) => {
                        // The directory still names a node that left: ask the home again.
                        self.node.invalidate_global(&self.name).await;
                        self.place(&members)?
                    }
                    None => self.place(&members)?,
                };
                *self.host.lock().unwrap_or_else(|e| e.into_inner()) = Some(host.clone());
                host
            }
        };
        Ok(ActorRef::new(
            host,
            Dest::Name(self.name.clone()),
            Arc::downgrade(self.node.actors()),
        ))
    }

    /// The member a key with no activation goes to.
    fn place(&self, members: &[NodeId]) -> Result<NodeId, VirtualError> {
        match self.placement {
            Placement::Local => Ok(self.node.id().clone()),
            Placement::Random => {
                // Random across keys, fixed for a key on this node: a seed drawn once per node.
                let seed = (self.node.id().incarnation, &*self.node.id().name);
                let i = crate::dispatch::hash_of(&(seed, self.name.as_str()));
                members
                    .get(usize::try_from(i % members.len().max(1) as u64).unwrap_or(0))
                    .cloned()
                    .ok_or(VirtualError::NoMember)
            }
            Placement::Hash => members
                .iter()
                .max_by_key(|m| crate::dispatch::hash_of(&(&*m.name, &*self.name)))
                .cloned()
                .ok_or(VirtualError::NoMember),
        }
    }
}

/// A virtual actor whose state is kept between its activations
/// ([`Node::register_persistent`]).
pub trait Persistent: Actor {
    /// What is stored (in postcard).
    type State: Serialize + DeserializeOwned + Send + 'static;
    /// The state to store now.
    fn state(&self) -> Self::State;
}

fn encode_state<A: Persistent>(a: &A) -> Result<Vec<u8>, String> {
    postcard::to_stdvec(&a.state()).map_err(|e| e.to_string())
}

fn check_kind(kind: &str) -> Result<(), KindError> {
    if kind.is_empty() || kind.contains('/') {
        return Err(KindError::BadKind(kind.to_string()));
    }
    Ok(())
}

impl Node {
    /// Offers a kind of virtual actor on this node: `make` builds the actor for a key when a
    /// message for a key of this kind with no activation arrives here. Register it on every
    /// node the placement may choose (a message for an unknown kind is refused and counted).
    pub fn register_virtual<A, F>(&self, kind: &str, make: F) -> Result<(), KindError>
    where
        A: Actor,
        F: Fn(&str) -> A + Send + Sync + 'static,
    {
        check_kind(kind)?;
        let make = Arc::new(make);
        let build = move |key: String| {
            let actor = make(&key);
            Box::pin(async move { Ok(actor) }) as BoxFuture<'static, Result<A, StoreError>>
        };
        self.inner().virtuals.register(kind, build, None)
    }

    /// Offers a kind of virtual actor whose state outlives its activations: an activation
    /// starts from what `store` holds for its key (`make(key, None)` the first time), and its
    /// state ([`Persistent::state`]) is saved after every message that changed it, before the
    /// next message is handled. For the state to follow a key to another node (its node went
    /// down), every node must reach the same store.
    ///
    /// A state that cannot be loaded or decoded fails the activation (its messages are refused
    /// as for an unknown kind); one that cannot be saved is counted in `virtual_save_errors`
    /// and logged, and the actor goes on.
    pub fn register_persistent<A, F>(
        &self,
        kind: &str,
        store: Arc<dyn StateStore>,
        make: F,
    ) -> Result<(), KindError>
    where
        A: Persistent,
        F: Fn(&str, Option<A::State>) -> A + Send + Sync + 'static,
    {
        check_kind(kind)?;
        let make = Arc::new(make);
        let loader = store.clone();
        let kind_ = kind.to_string();
        let build = move |key: String| {
            let (make, store, id) = (make.clone(), loader.clone(), format!("{kind_}/{key}"));
            Box::pin(async move {
                let state = match store.load(&id).await? {
                    Some(bytes) => Some(
                        postcard::from_bytes::<A::State>(&bytes)
                            .map_err(|e| StoreError::Corrupt(id.clone(), e.to_string()))?,
                    ),
                    None => None,
                };
                Ok(make(&key, state))
            }) as BoxFuture<'static, Result<A, StoreError>>
        };
        let persist = host::Persistence {
            store,
            encode: encode_state::<A>,
        };
        self.inner().virtuals.register(kind, build, Some(persist))
    }

    /// A ref to the virtual actor of `kind` and `key` (placed at random unless set otherwise
    /// with [`VirtualRef::placement`]); no message is sent until it is used. Errors:
    /// [`VirtualError::BadAddress`] for an empty kind or key, or a kind with `/`.
    pub fn virtual_ref<M: Message>(
        &self,
        kind: &str,
        key: &str,
    ) -> Result<VirtualRef<M>, VirtualError> {
        if kind.is_empty() || kind.contains('/') || key.is_empty() {
            return Err(VirtualError::BadAddress(format!("{kind:?} / {key:?}")));
        }
        let name = name_of(kind, key);
        if name.len() > maquis_proto::names::MAX_NAME_BYTES {
            return Err(VirtualError::BadAddress(format!(
                "{} bytes of kind and key, at most {}",
                kind.len() + key.len(),
                maquis_proto::names::MAX_NAME_BYTES - PREFIX.len() - 1
            )));
        }
        Ok(VirtualRef {
            node: self.clone(),
            name,
            placement: Placement::default(),
            host: Arc::default(),
            _m: std::marker::PhantomData,
        })
    }

    /// Moves the activation of `kind` and `key` on this node to member `to` (a node name):
    /// it handles the messages already in its mailbox, saves its state, releases its name,
    /// and passes what arrives from then on to `to`, where the next message activates it
    /// (from the stored state, for a [`Persistent`] kind; a kind without a store starts
    /// afresh). Senders see only latency: messages are held or passed on, in order.
    ///
    /// Errors: [`MigrateError::NotHere`] (no such activation here, or it is already leaving),
    /// [`MigrateError::NotMember`].
    pub fn migrate(&self, kind: &str, key: &str, to: &str) -> Result<(), MigrateError> {
        let to = self
            .member(to)
            .filter(|m| m != self.id())
            .ok_or_else(|| MigrateError::NotMember(to.to_string()))?;
        if self.inner().virtuals.migrate(&name_of(kind, key), to) {
            Ok(())
        } else {
            Err(MigrateError::NotHere(format!("{kind}/{key}")))
        }
    }

    /// The virtual actors active on this node now.
    pub fn activations(&self) -> usize {
        self.inner().virtuals.active()
    }

    /// Starts ActOp on this node if `services.actop_interval_ms` is set (the node's start
    /// does this).
    pub(crate) fn start_actop(&self) {
        actop::start(self, self.inner().virtuals.actop_settings());
    }
}
