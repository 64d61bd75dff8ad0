//! Request/response: pending calls by id, and the `ReplyTo` handle a responder answers with.

use std::any::Any;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio::sync::oneshot;

use super::actors::Actors;
use super::scope::{current_actor, decode_node};
use super::Message;
use crate::dispatch::SendOpts;
use crate::error::SendError;
use crate::id::NodeId;
use crate::wire::frame::{ActorHeader, ReplyStatus};

/// How a call ended, before decoding.
pub(crate) enum CallOutcome {
    /// A local actor's reply, as a value.
    Local(Box<dyn Any + Send>),
    /// A remote reply, encoded, with its type's fingerprint.
    Remote {
        payload: Bytes,
        ty: u64,
    },
    NoProc,
    Failed(String),
    /// The called actor takes another type than the request's.
    TypeMismatch,
}

/// Calls waiting for their reply. An entry lives until its reply arrives or its caller's
/// timeout fires, so the table holds at most the calls in flight.
#[derive(Default)]
pub(crate) struct PendingCalls {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiting>>,
}

/// A waiting call: the node of the actor it waits on (`None` if local or several), where the
/// outcome goes, and whether only an answer ends it (a request published to a group: every
/// member gets a copy, and the copies that are dropped unanswered fail nothing).
type Waiting = (Option<NodeId>, oneshot::Sender<CallOutcome>, bool);

impl PendingCalls {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens a call to an actor on `target` (`None`: a local actor).
    pub(crate) fn open(&self, target: Option<NodeId>) -> (u64, oneshot::Receiver<CallOutcome>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id, (target, tx, false));
        (id, rx)
    }

    /// Opens a call that any of several copies of its request may answer: only an answer
    /// ends it (or its caller's timeout).
    pub(crate) fn open_any(&self) -> (u64, oneshot::Receiver<CallOutcome>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        self.lock().insert(id, (None, tx, true));
        (id, rx)
    }

    /// Opens a call to a local actor: its id and both ends of its outcome's channel. The
    /// sending end travels in the [`ReplyTo`], not in the table, unless the request leaves the
    /// node (then the table adopts it).
    pub(crate) fn open_local(
        &self,
    ) -> (
        u64,
        oneshot::Sender<CallOutcome>,
        oneshot::Receiver<CallOutcome>,
    ) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        (id, tx, rx)
    }

    /// Takes over a local call's outcome channel (its `ReplyTo` is leaving the node).
    fn adopt(&self, id: u64, tx: oneshot::Sender<CallOutcome>) {
        self.lock().insert(id, (None, tx, false));
    }

    pub(crate) fn cancel(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// How call `id` ended, from its exchange (its request sent, then its outcome awaited)
    /// run under one deadline for both (`Deadlines::until`; `None`: the deadline passed): a
    /// failure, or `timeout` at the deadline, cancels the call. Not a future wrapped around
    /// the exchange: each layer around a call's future copies it.
    #[inline]
    pub(crate) fn settle<E>(
        &self,
        id: u64,
        ran: Option<Result<CallOutcome, E>>,
        timeout: E,
    ) -> Result<CallOutcome, E> {
        let r = ran.unwrap_or(Err(timeout));
        if r.is_err() {
            self.cancel(id);
        }
        r
    }

    /// Completes a call; false when nobody waits for it any more (late or unknown reply).
    pub(crate) fn complete(&self, id: u64, outcome: CallOutcome) -> bool {
        let mut map = self.lock();
        let answer = matches!(outcome, CallOutcome::Local(_) | CallOutcome::Remote { .. });
        if !answer && map.get(&id).is_some_and(|w| w.2) {
            // A copy of a published request went unanswered: another may answer.
            return true;
        }
        let waiting = map.remove(&id);
        drop(map);
        match waiting {
            Some((_, tx, _)) => tx.send(outcome).is_ok(),
            None => false,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Fails at once every call waiting on an actor of `node` (it went down or left).
    pub(crate) fn fail_node(&self, node: &NodeId) {
        let mut map = self.lock();
        let hit: Vec<u64> = map
            .iter()
            .filter(|(_, (t, _, _))| t.as_ref() == Some(node))
            .map(|(id, _)| *id)
            .collect();
        for id in hit {
            if let Some((_, tx, _)) = map.remove(&id) {
                let _ = tx.send(CallOutcome::Failed(format!("node {} went away", node.name)));
            }
        }
    }

    /// Fails every waiting call (node shutdown).
    pub(crate) fn fail_all(&self, why: &str) {
        let all: Vec<_> = self.lock().drain().collect();
        for (_, (_, tx, _)) in all {
            let _ = tx.send(CallOutcome::Failed(why.to_string()));
        }
    }
}

/// Why a call fails when its `ReplyTo` is dropped unanswered.
const DROPPED: &str = "the request was dropped without an answer (its actor stopped or panicked)";

/// The handle a responder uses to answer one call. It is serializable, so it can travel inside
/// the request to another node and be answered from there.
///
/// Dropped without an answer (the actor stopped or panicked while it held the request, or
/// simply let it go), it fails its call at once with `CallError::NoReply` instead of leaving
/// the caller waiting for its timeout. Serializing it hands the duty on: the copy that
/// arrives elsewhere answers, or fails the call when it is dropped there.
pub struct ReplyTo<R> {
    /// The caller's node, shared (a local call's is this node's one identity).
    node: Arc<NodeId>,
    call: u64,
    caller: u64,
    channel: Option<String>,
    partition_key: Option<u64>,
    rt: Weak<Actors>,
    /// A local call's outcome channel: answered straight through it, not through the table of
    /// pending calls (handed to the table if this handle is serialized).
    local: Mutex<Option<oneshot::Sender<CallOutcome>>>,
    /// Answered, or sent on: dropping it fails nothing.
    done: AtomicBool,
    /// One of several copies of a request (published to a group): dropped unanswered, it
    /// sends nothing, as the call waits for an answer only.
    quiet: bool,
    _m: PhantomData<fn(R) -> R>,
}

impl<R> Drop for ReplyTo<R> {
    fn drop(&mut self) {
        if self.quiet || self.done.load(Ordering::Relaxed) {
            return;
        }
        let local = self.local.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = local.take() {
            let _ = tx.send(CallOutcome::Failed(DROPPED.into()));
            return;
        }
        let Some(rt) = self.rt.upgrade() else {
            return;
        };
        match rt.router.is_local(&self.node) {
            Ok(true) => {
                rt.calls
                    .complete(self.call, CallOutcome::Failed(DROPPED.into()));
            }
            Ok(false) => {
                let status = ReplyStatus::Failed(DROPPED.into());
                rt.router.reply_status(&self.node, self.call, status);
            }
            Err(_) => {}
        }
    }
}

impl<R> std::fmt::Debug for ReplyTo<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplyTo({}#call{})", self.node, self.call)
    }
}

/// A reply address on the wire (a borrowed copy is written, an owned one read).
#[derive(Serialize, Deserialize)]
struct ReplyWire<N, C> {
    node: N,
    call: u64,
    caller: u64,
    channel: Option<C>,
    partition_key: Option<u64>,
    quiet: bool,
}

impl<R> Serialize for ReplyTo<R> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The serialized copy answers (or fails the call) wherever it is decoded; an answer
        // that comes back here finds the call in the table.
        self.done.store(true, Ordering::Relaxed);
        let local = self
            .local
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let (Some(tx), Some(rt)) = (local, self.rt.upgrade()) {
            rt.calls.adopt(self.call, tx);
        }
        ReplyWire {
            node: &*self.node,
            call: self.call,
            caller: self.caller,
            channel: self.channel.as_deref(),
            partition_key: self.partition_key,
            quiet: self.quiet,
        }
        .serialize(s)
    }
}

impl<'de, R> Deserialize<'de> for ReplyTo<R> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = ReplyWire::<NodeId, String>::deserialize(d)?;
        Ok(ReplyTo {
            node: Arc::new(w.node),
            call: w.call,
            caller: w.caller,
            channel: w.channel,
            partition_key: w.partition_key,
            rt: decode_node(),
            local: Mutex::new(None),
            done: AtomicBool::new(false),
            quiet: w.quiet,
            _m: PhantomData,
        })
    }
}

impl<R: Message> ReplyTo<R> {
    pub(crate) fn new(
        node: Arc<NodeId>,
        call: u64,
        caller: u64,
        opts: &SendOpts,
        rt: &Arc<Actors>,
        local: Option<oneshot::Sender<CallOutcome>>,
    ) -> Self {
        ReplyTo {
            node,
            call,
            caller,
            channel: opts.channel.clone(),
            partition_key: opts.partition_key,
            rt: Arc::downgrade(rt),
            local: Mutex::new(local),
            done: AtomicBool::new(false),
            quiet: false,
            _m: PhantomData,
        }
    }

    /// Marks the handle as one of several copies of a request ([`crate::Node::publish_call`]):
    /// its call ends only with an answer, so a copy dropped unanswered sends nothing (not a
    /// failure across the network that the caller would ignore).
    pub(crate) fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    /// The node of the caller.
    pub fn caller_node(&self) -> &NodeId {
        &self.node
    }

    /// Lets this handle go without failing the call: for a spare copy (made with
    /// [`crate::encode`] and [`crate::Node::decode`], say, to answer if a forward fails) once
    /// another copy has taken the duty to answer.
    pub fn forget(self) {
        self.done.store(true, Ordering::Relaxed);
    }

    /// Sends the reply, waiting while the lane's queue is full. It travels on the request's
    /// channel and partition key, so request and reply share a lane. A reply whose caller has
    /// given up (timed out) is dropped on arrival.
    pub async fn send(mut self, value: R) -> Result<(), SendError> {
        self.done.store(true, Ordering::Relaxed);
        let local = self.local.get_mut().unwrap_or_else(PoisonError::into_inner);
        if let Some(tx) = local.take() {
            // The caller may have timed out: then nobody waits, as with a late remote reply.
            let _ = tx.send(CallOutcome::Local(Box::new(value)));
            return Ok(());
        }
        let rt = self.rt.upgrade().ok_or(SendError::NodeStopped)?;
        if rt.router.is_local(&self.node)? {
            rt.calls
                .complete(self.call, CallOutcome::Local(Box::new(value)));
            return Ok(());
        }
        let payload = crate::slab::encode(&value).map_err(|e| SendError::Encode(e.to_string()))?;
        let header = ActorHeader::Reply {
            call: self.call,
            status: ReplyStatus::Ok,
            ty: super::fingerprint::fingerprint::<R>(),
        };
        let opts = SendOpts {
            channel: self.channel.clone(),
            partition_key: self.partition_key,
            acked: None,
        };
        rt.router
            .send_frame(
                &self.node,
                &opts,
                current_actor(),
                self.caller,
                header,
                payload,
            )
            .await
    }
}
