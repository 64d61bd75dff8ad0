//! The actor side: the `Actor` trait, an actor's `Inbox` and `Context`, and the per-task and
//! per-decode context the runtime sets up.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Weak;

use tokio::sync::mpsc;

use super::registry::Delivery;
use super::{ActorId, ActorRef, Message};
use crate::node::{Inner, Node};
use crate::wire::frame::ReplyStatus;

tokio::task_local! {
    static CURRENT_ACTOR: ActorId;
}

thread_local! {
    static DECODE_NODE: RefCell<Option<Weak<Inner>>> = const { RefCell::new(None) };
}

/// The id of the actor running the current task; outside an actor, a per-task value so that
/// affinity still separates independent tasks.
pub(crate) fn current_actor() -> u64 {
    CURRENT_ACTOR
        .try_with(|id| *id)
        .unwrap_or_else(|_| match tokio::task::try_id() {
            Some(id) => crate::dispatch::hash_of(&id) | (1 << 63),
            None => 0,
        })
}

/// Runs `fut` as actor `id`.
pub(crate) fn scope<F: Future>(id: ActorId, fut: F) -> impl Future<Output = F::Output> {
    CURRENT_ACTOR.scope(id, fut)
}

/// Decodes `bytes` so that refs inside bind to `node`.
pub(crate) fn decode_in<T: serde::de::DeserializeOwned>(
    node: &Weak<Inner>,
    bytes: &[u8],
) -> Result<T, postcard::Error> {
    let prev = DECODE_NODE.with(|c| c.replace(Some(node.clone())));
    let out = postcard::from_bytes(bytes);
    DECODE_NODE.with(|c| *c.borrow_mut() = prev);
    out
}

/// Decodes a received frame's payload so that refs inside bind to `node` and
/// [`crate::Payload`] fields borrow from the frame instead of copying.
pub(crate) fn decode_frame_in<T: serde::de::DeserializeOwned>(
    node: &Weak<Inner>,
    frame: &bytes::Bytes,
) -> Result<T, postcard::Error> {
    crate::payload::with_source(frame, || decode_in(node, frame))
}

/// The node that refs decoded right now bind to.
pub(crate) fn decode_node() -> Weak<Inner> {
    DECODE_NODE.with(|c| c.borrow().clone()).unwrap_or_default()
}

/// An actor's mailbox, for actors written as a receive loop (see [`Node::spawn_fn`]).
pub struct Inbox<M> {
    pub(crate) rx: mpsc::Receiver<Delivery<M>>,
    pub(crate) me: ActorRef<M>,
    pub(crate) node: Weak<Inner>,
}

impl<M: Message> Inbox<M> {
    /// The next message; `None` once the node stops (or the actor was removed).
    ///
    /// A message from another node that does not decode as `M` is dropped (logged and counted);
    /// if it was a call, the caller gets an error reply at once.
    pub async fn recv(&mut self) -> Option<M> {
        loop {
            match self.rx.recv().await? {
                Delivery::Local(m) => return Some(m),
                Delivery::Remote(r) => match decode_frame_in::<M>(&self.node, &r.payload) {
                    Ok(m) => return Some(m),
                    Err(e) => {
                        if let Some(inner) = self.node.upgrade() {
                            inner.counters.decode_errors.inc();
                            tracing::warn!(from = %r.from_node, error = %e, "dropping a message that does not decode");
                            if let Some(call) = r.call {
                                inner.reply_status(
                                    &r.from_node,
                                    call,
                                    ReplyStatus::Failed(format!("decode: {e}")),
                                );
                            }
                        }
                    }
                },
            }
        }
    }

    /// A ref to this actor.
    pub fn myself(&self) -> ActorRef<M> {
        self.me.clone()
    }

    /// The node the actor runs on, unless it has stopped.
    pub fn node(&self) -> Option<Node> {
        self.node.upgrade().map(Node::from_inner)
    }
}

/// A typed actor: state plus a handler. Spawn it with [`Node::spawn`].
pub trait Actor: Send + Sized + 'static {
    /// The messages it takes.
    type Msg: Message;

    /// Runs once before the first message.
    fn started(&mut self, _ctx: &mut Context<Self::Msg>) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Handles one message; messages are handled one at a time, in mailbox order.
    fn handle(
        &mut self,
        msg: Self::Msg,
        ctx: &mut Context<Self::Msg>,
    ) -> impl Future<Output = ()> + Send;
}

/// What a running [`Actor`] can reach: itself, its node, and a way to stop.
pub struct Context<M> {
    pub(crate) me: ActorRef<M>,
    pub(crate) node: Node,
    pub(crate) stop: bool,
}

impl<M: Message> Context<M> {
    /// A ref to this actor.
    pub fn myself(&self) -> ActorRef<M> {
        self.me.clone()
    }

    /// The node the actor runs on.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Stops the actor after the current message.
    pub fn stop(&mut self) {
        self.stop = true;
    }
}
