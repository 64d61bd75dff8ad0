//! `ActorRef<M>`: a typed, serializable address of an actor on any node.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::actors::Actors;
use super::call::{CallOutcome, ReplyTo};
use super::fingerprint::{compatible, fingerprint};
use super::mailbox::{Delivery, ErasedMailbox, Mailbox, TrySendError};
use super::scope::{current_actor, decode_node};
use super::{ActorId, Message};
use crate::dispatch::{hash_of, SendOpts};
use crate::error::{CallError, SendError};
use crate::id::NodeId;
use crate::router::Now;
use crate::wire::frame::{ActorHeader, Dest, ReplyStatus};

/// A typed address of an actor, by id or by registered name, on any node.
///
/// It serializes as (node, id or name): a ref sent inside a message to another node can be used
/// there to send back. A ref decoded by a node binds to that node; one decoded elsewhere is
/// unbound and its sends fail with [`SendError::NodeStopped`].
///
/// A ref to a local actor that [`crate::Node::spawn`], [`crate::Context::myself`] or
/// [`crate::Node::whereis`] returned (and its clones) holds the actor's mailbox: after the actor
/// stops, the mailbox (about two hundred bytes, and what messages it still holds) is freed with
/// the last such ref.
pub struct ActorRef<M> {
    /// Shared: a ref is copied into messages, tables and every actor's inbox, and the local
    /// node's refs all point at its one identity.
    pub(crate) node: Arc<NodeId>,
    pub(crate) to: Dest,
    pub(crate) rt: Weak<Actors>,
    /// A local actor's mailbox, when the ref was made where it was known (by
    /// [`crate::Node::spawn`], [`crate::Context::myself`], [`crate::Node::whereis`]): local
    /// sends skip the runtime and the registry. Ids are never reused, so it can never name
    /// another actor; the actor's end closes the mailbox, so sends to a stopped actor still fail
    /// with `NoProc`. (A weak handle, upgraded on every send, cost a third of the throughput of
    /// eight senders to one actor; a cache filled on first use would make the ref a mutable
    /// key in users' sets and maps.)
    local: Option<Arc<dyn ErasedMailbox>>,
    _m: PhantomData<fn(M) -> M>,
}

impl<M> Clone for ActorRef<M> {
    fn clone(&self) -> Self {
        ActorRef {
            node: self.node.clone(),
            to: self.to.clone(),
            rt: self.rt.clone(),
            local: self.local.clone(),
            _m: PhantomData,
        }
    }
}

impl<M> fmt::Debug for ActorRef<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.to {
            Dest::Id(id) => write!(f, "ActorRef({}#{id})", self.node),
            Dest::Name(n) => write!(f, "ActorRef({}/{n})", self.node),
        }
    }
}

impl<M> PartialEq for ActorRef<M> {
    fn eq(&self, other: &Self) -> bool {
        self.node == other.node && self.to == other.to
    }
}

impl<M> Eq for ActorRef<M> {}

impl<M> std::hash::Hash for ActorRef<M> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.node.hash(state);
        self.to.hash(state);
    }
}

/// Refs order by node (name, then incarnation and address), then by id or name: a stable
/// order for sets, maps and deterministic choices.
impl<M> Ord for ActorRef<M> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.node, &self.to).cmp(&(&other.node, &other.to))
    }
}

impl<M> PartialOrd for ActorRef<M> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A ref on the wire: its node and its address there (a borrowed copy is written, an owned
/// one read).
#[derive(Serialize, Deserialize)]
struct RefWire<N, D> {
    node: N,
    to: D,
}

impl<M> Serialize for ActorRef<M> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RefWire {
            node: &*self.node,
            to: &self.to,
        }
        .serialize(s)
    }
}

impl<'de, M> Deserialize<'de> for ActorRef<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = RefWire::<NodeId, Dest>::deserialize(d)?;
        Ok(ActorRef {
            node: Arc::new(w.node),
            to: w.to,
            rt: decode_node(),
            local: None,
            _m: PhantomData,
        })
    }
}

impl<M: Message> ActorRef<M> {
    pub(crate) fn new(node: impl Into<Arc<NodeId>>, to: Dest, rt: Weak<Actors>) -> Self {
        ActorRef {
            node: node.into(),
            to,
            rt,
            local: None,
            _m: PhantomData,
        }
    }

    /// A ref to a local actor by id whose mailbox is known.
    pub(crate) fn local(
        node: Arc<NodeId>,
        id: ActorId,
        rt: Weak<Actors>,
        mailbox: Arc<dyn ErasedMailbox>,
    ) -> Self {
        ActorRef {
            local: Some(mailbox),
            ..ActorRef::new(node, Dest::Id(id), rt)
        }
    }

    /// The mailbox the ref was made with, if it was.
    pub(crate) fn mailbox(&self) -> Option<&Arc<dyn ErasedMailbox>> {
        self.local.as_ref()
    }

    /// The mailbox of the local actor this ref names, if the ref was made with it.
    fn cached(&self) -> Option<&Mailbox<M>> {
        Mailbox::<M>::typed(self.local.as_deref()?)
    }

    /// The same address without its message type (for tables of refs of several types).
    pub(crate) fn erase(self) -> ActorRef<()> {
        ActorRef::new(self.node, self.to, self.rt)
    }

    /// The node the actor lives on.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// The actor's id, when the ref names one (refs by name have none).
    pub fn id(&self) -> Option<ActorId> {
        match self.to {
            Dest::Id(id) => Some(id),
            Dest::Name(_) => None,
        }
    }

    /// The registered name, when the ref is by name.
    pub fn name(&self) -> Option<&str> {
        match &self.to {
            Dest::Name(n) => Some(n),
            Dest::Id(_) => None,
        }
    }

    fn runtime(&self) -> Result<Arc<Actors>, SendError> {
        self.rt.upgrade().ok_or(SendError::NodeStopped)
    }

    /// Sends a message, waiting while the mailbox or the lane's queue is full.
    pub async fn send(&self, msg: M) -> Result<(), SendError> {
        self.send_with(msg, &SendOpts::default()).await
    }

    /// Sends with options (channel, partition key, acknowledged delivery).
    ///
    /// With [`SendOpts::acked`], a message to another node returns once that node has put it in
    /// the actor's mailbox, or with why not (`NoProc`, `TypeMismatch`, `Unacknowledged`); see
    /// [`crate::Acked`]. A local message is put in the mailbox directly either way.
    pub async fn send_with(&self, msg: M, opts: &SendOpts) -> Result<(), SendError> {
        if let Some(policy) = opts.acked {
            // Boxed for the same reason as the way out in `deliver`.
            return Box::pin(self.send_acked(msg, opts, policy, true)).await;
        }
        self.deliver(msg, opts, None, true).await
    }

    async fn send_acked(
        &self,
        msg: M,
        opts: &SendOpts,
        policy: crate::dispatch::Acked,
        wait: bool,
    ) -> Result<(), SendError> {
        let rt = self.runtime()?;
        if rt.router.is_local(&self.node)? {
            return self.deliver(msg, opts, None, wait).await;
        }
        let payload = crate::slab::encode(&msg).map_err(|e| SendError::Encode(e.to_string()))?;
        let send = super::reliable::AckedSend {
            node: &self.node,
            to: self.to.clone(),
            ty: fingerprint::<M>(),
            payload,
            opts,
            policy,
            sender: current_actor(),
            receiver: hash_of(&self.to),
        };
        rt.send_acked(send, wait).await
    }

    /// Sends without waiting: fails with [`SendError::Backpressure`] when the mailbox or the
    /// lane's queue is full.
    pub fn try_send(&self, msg: M) -> Result<(), SendError> {
        self.try_send_with(msg, &SendOpts::default())
    }

    /// [`ActorRef::try_send`] with options. With [`SendOpts::acked`] the message is queued for
    /// acknowledged delivery without waiting for its outcome (`Backpressure` when the window
    /// to that node is full); a give-up is then counted in `acked_given_up` and logged.
    pub fn try_send_with(&self, msg: M, opts: &SendOpts) -> Result<(), SendError> {
        if let Some(policy) = opts.acked {
            // Nothing in it waits: without `wait`, the future is ready at its first poll.
            return futures::FutureExt::now_or_never(self.send_acked(msg, opts, policy, false))
                .unwrap_or(Err(SendError::Backpressure("acknowledged-delivery window")));
        }
        if let Some(tx) = self.cached() {
            return try_put(tx, msg);
        }
        let rt = self.runtime()?;
        if rt.router.is_local(&self.node)? {
            let mailbox = self.local_mailbox(&rt)?;
            return try_put(&mailbox, msg);
        }
        let (header, payload) = self.encode(&msg, None)?;
        let receiver = hash_of(&self.to);
        rt.router
            .try_send_frame(&self.node, opts, current_actor(), receiver, header, payload)
    }

    /// Request/response: builds the request with a fresh [`ReplyTo`], sends it, and waits up to
    /// `timeout` in all: waiting for room in a full mailbox or lane queue counts against the same
    /// deadline as waiting for the reply. Each call has its own id, so a late reply never satisfies
    /// another call.
    pub async fn call<R: Message>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, CallError> {
        self.call_with(make, timeout, &SendOpts::default()).await
    }

    /// [`ActorRef::call`] with send options (the reply travels on the same channel).
    pub async fn call_with<R: Message>(
        &self,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
        opts: &SendOpts,
    ) -> Result<R, CallError> {
        let rt = self.runtime()?;
        let cached = self.cached();
        let local = cached.is_some() || rt.router.is_local(&self.node)?;
        let (call, rx, answer) = if local {
            let (call, tx, rx) = rt.calls.open_local();
            (call, rx, Some(tx))
        } else {
            let (call, rx) = rt.calls.open(Some(NodeId::clone(&self.node)));
            (call, rx, None)
        };
        let reply = ReplyTo::new(rt.node.clone(), call, current_actor(), opts, &rt, answer);
        let msg = make(reply);
        // A local actor with room takes the request now, before any future is built around
        // the send: the way through `deliver` is a large future, copied at every layer it is
        // wrapped in, and most local calls never wait for room.
        let unsent = match cached {
            Some(tx) => match tx.try_send(Delivery::Local(msg)) {
                Ok(()) => None,
                Err(TrySendError::Closed(_)) => return Err(CallError::NoProc),
                Err(TrySendError::Full(d)) => Some(d),
            },
            None => Some(Delivery::Local(msg)),
        };
        // (Only local deliveries are made above: `unsent` is one or nothing.)
        // One deadline (a slot in the node's table, not a timer of its own) covers both the
        // wait for room (a full mailbox or lane queue) and the wait for the reply.
        let exchange = async {
            if let Some(Delivery::Local(msg)) = unsent {
                Box::pin(self.deliver(msg, opts, Some(call), true))
                    .await
                    .map_err(|e| match e {
                        // A missing local actor reads the same as a missing remote one.
                        SendError::NoProc => CallError::NoProc,
                        e => e.into(),
                    })?;
            }
            rx.await
                .map_err(|_| CallError::NoReply("the node stopped".into()))
        };
        let ran = rt.deadlines.until(timeout, exchange).await;
        let outcome = rt.calls.settle(call, ran, CallError::Timeout)?;
        outcome_of(&self.rt, outcome)
    }

    async fn deliver(
        &self,
        msg: M,
        opts: &SendOpts,
        call: Option<u64>,
        wait: bool,
    ) -> Result<(), SendError> {
        if let Some(tx) = self.cached() {
            return put(tx, msg, wait).await.map_err(|r| r.error(false));
        }
        let rt = self.runtime()?;
        if rt.router.is_local(&self.node)? {
            // A name no actor holds, or whose actor closed its mailbox meanwhile (a virtual
            // actor deactivating), may be one the node's sink serves.
            let offer = self.name().is_some() && rt.unnamed.get().is_some();
            let mailbox = match self.local_mailbox(&rt) {
                Err(SendError::NoProc) if offer => {
                    return Box::pin(self.offer_unnamed(&rt, &msg, call)).await
                }
                mailbox => mailbox?,
            };
            return match put(&mailbox, msg, wait).await {
                Err(Refused::Closed(Delivery::Local(msg))) if offer && wait => {
                    Box::pin(self.offer_unnamed(&rt, &msg, call)).await
                }
                r => r.map_err(|r| r.error(offer)),
            };
        }
        let (header, payload) = self.encode(&msg, call)?;
        let receiver = hash_of(&self.to);
        let now =
            rt.router
                .send_frame_now(&self.node, opts, current_actor(), receiver, header, payload);
        match now {
            Now::Done(r) => r,
            // Boxed: the way out when it waits is a large future, and a local send (and every
            // actor that sends) would carry its size otherwise.
            Now::Later(later) => Box::pin(rt.router.send_later(&self.node, later)).await,
        }
    }

    /// A message for a local name no actor holds: encoded and handled as if it had come from
    /// another node (a name the virtual actors' host serves activates its actor).
    async fn offer_unnamed(
        &self,
        rt: &Actors,
        msg: &M,
        call: Option<u64>,
    ) -> Result<(), SendError> {
        let body = crate::slab::encode(msg).map_err(|e| SendError::Encode(e.to_string()))?;
        let payload = match body.bufs() {
            [one] => one.clone(),
            bufs => bufs.concat().into(),
        };
        match rt
            .push(&self.node, &self.to, fingerprint::<M>(), payload, call)
            .await
        {
            ReplyStatus::Ok => Ok(()),
            ReplyStatus::TypeMismatch => Err(SendError::TypeMismatch),
            _ => Err(SendError::NoProc),
        }
    }

    fn encode(
        &self,
        msg: &M,
        call: Option<u64>,
    ) -> Result<(ActorHeader, crate::wire::Body), SendError> {
        let payload = crate::slab::encode(msg).map_err(|e| SendError::Encode(e.to_string()))?;
        let header = ActorHeader::Send {
            to: self.to.clone(),
            incarnation: self.node.incarnation,
            call,
            ty: fingerprint::<M>(),
        };
        Ok((header, payload))
    }

    /// The mailbox of the local actor this ref names, checked to take `M`.
    fn local_mailbox(&self, rt: &Actors) -> Result<Arc<Mailbox<M>>, SendError> {
        let id = match &self.to {
            Dest::Id(id) => *id,
            Dest::Name(n) => rt.registry.resolve(n).ok_or(SendError::NoProc)?,
        };
        let mailbox = rt.registry.by_id(id).ok_or(SendError::NoProc)?;
        mailbox
            .into_any()
            .downcast::<Mailbox<M>>()
            .map_err(|_| SendError::TypeMismatch)
    }
}

/// Puts a local message in a mailbox if there is room now.
fn try_put<M>(tx: &Mailbox<M>, msg: M) -> Result<(), SendError> {
    tx.try_send(Delivery::Local(msg)).map_err(|e| match e {
        TrySendError::Full(_) => SendError::Backpressure("mailbox"),
        TrySendError::Closed(_) => SendError::NoProc,
    })
}

/// Why a local message did not go into its mailbox.
enum Refused<M> {
    /// Full, and the sender would not wait.
    Full,
    /// The actor stopped: the message comes back.
    Closed(Delivery<M>),
}

impl<M> Refused<M> {
    /// What the send reports. A closed mailbox is `NoProc`, unless the node's sink would take
    /// a message for the name once asked, which only a send that may wait does: then it is
    /// `Backpressure`, and a retry (or a send that waits) gets there.
    fn error(self, sink_would_take: bool) -> SendError {
        match self {
            Refused::Closed(_) if !sink_would_take => SendError::NoProc,
            _ => SendError::Backpressure("mailbox"),
        }
    }
}

/// Puts a local message in a mailbox, waiting for room or not. A send that may wait spends
/// the task's cooperative budget, as a wait would: a task that sends in a loop yields now and
/// then (without it, a sender filled its receiver's mailbox before the receiver ran).
async fn put<M>(tx: &Mailbox<M>, msg: M, wait: bool) -> Result<(), Refused<M>> {
    let d = Delivery::Local(msg);
    if !wait {
        return match tx.try_send(d) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(Refused::Full),
            Err(TrySendError::Closed(d)) => Err(Refused::Closed(d)),
        };
    }
    tx.send(d).await.map_err(Refused::Closed)?;
    tokio::task::coop::consume_budget().await;
    Ok(())
}

/// A call's outcome as its caller sees it: the answer, decoded for node `rt` if it came from
/// another node, or why there is none.
pub(crate) fn outcome_of<R: Message>(
    rt: &Weak<Actors>,
    outcome: CallOutcome,
) -> Result<R, CallError> {
    match outcome {
        CallOutcome::Local(b) => b.downcast::<R>().map(|b| *b).map_err(|_| {
            CallError::Decode("the reply has another type than the call expects".into())
        }),
        CallOutcome::Remote { ty, .. } if !compatible(ty, fingerprint::<R>()) => Err(
            CallError::Decode("the reply has another type than the call expects".into()),
        ),
        CallOutcome::Remote { payload, .. } => {
            super::decode_frame_in::<R>(rt, &payload).map_err(|e| CallError::Decode(e.to_string()))
        }
        CallOutcome::TypeMismatch => Err(CallError::Send(SendError::TypeMismatch)),
        CallOutcome::NoProc => Err(CallError::NoProc),
        CallOutcome::Failed(why) => Err(CallError::NoReply(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ref is copied into every actor's inbox and into users' tables, a reply address into
    /// every request (and moved with it at each step of a call): both share their node's
    /// identity instead of holding it inline (an idle actor's memory counts a ref twice).
    #[test]
    fn refs_and_reply_addresses_hold_their_node_identity_shared() {
        let (actor_ref, reply_to) = (
            std::mem::size_of::<ActorRef<u64>>(),
            std::mem::size_of::<ReplyTo<u64>>(),
        );
        assert!(actor_ref <= 56, "ActorRef grew to {actor_ref} bytes");
        assert!(reply_to <= 104, "ReplyTo grew to {reply_to} bytes");
    }
}
