//! What an actor sees of the runtime: the [`Actor`] trait, an actor's [`Inbox`] (for actors
//! written as a receive loop) and the [`Context`] a typed actor's handler gets.

use std::future::Future;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

use super::{Inner, Node};
use crate::actor::mailbox::{Delivery, ErasedMailbox, Receiver};
use crate::actor::{decode_frame_in, ActorId, ActorRef, Message};
use crate::wire::frame::ReplyStatus;

/// An actor's mailbox, for actors written as a receive loop (see [`Node::spawn_fn`]).
pub struct Inbox<M> {
    pub(crate) rx: Receiver<M>,
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
            let d = self.rx.recv().await?;
            if let Some(m) = self.open(d) {
                return Some(m);
            }
        }
    }

    /// Closes the mailbox: sends fail from now on; what is in it can still be taken.
    pub(crate) fn close(&mut self) {
        self.rx.close();
    }

    /// A delivery's message, decoded if it came from another node.
    fn open(&self, d: Delivery<M>) -> Option<M> {
        match d {
            Delivery::Local(m) => Some(m),
            Delivery::Remote(r) => match decode_frame_in::<M>(&self.me.rt, &r.payload) {
                Ok(m) => Some(m),
                Err(e) => {
                    if let Some(actors) = self.me.rt.upgrade() {
                        actors.router.counters.decode_errors.inc();
                        tracing::warn!(from = %r.from_node, error = %e, "dropping a message that does not decode");
                        if let Some(call) = r.call {
                            actors.router.reply_status(
                                &r.from_node,
                                call,
                                ReplyStatus::Failed(format!("decode: {e}")),
                            );
                        }
                    }
                    None
                }
            },
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

/// When an actor ends, the calls still in its mailbox fail at once instead of waiting for
/// their timeout: a remote caller gets `NoProc`, a local request's [`crate::ReplyTo`] fails its
/// call as it is dropped.
impl<M> Drop for Inbox<M> {
    fn drop(&mut self) {
        self.rx.close();
        let actors = self.me.rt.upgrade();
        while let Some(d) = self.rx.try_recv() {
            if let (Delivery::Remote(r), Some(actors)) = (d, actors.as_ref()) {
                if let Some(call) = r.call {
                    actors
                        .router
                        .reply_status(&r.from_node, call, ReplyStatus::NoProc);
                }
            }
        }
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
    /// This actor's id and mailbox: its ref is made from them when asked for, rather than kept
    /// beside its inbox's own (an idle actor's memory is mostly such copies).
    id: ActorId,
    mailbox: Arc<dyn ErasedMailbox>,
    pub(crate) node: Node,
    pub(crate) stop: bool,
    _m: PhantomData<fn(M) -> M>,
}

impl<M: Message> Context<M> {
    /// The context of the actor whose inbox is `inbox`, on `node`.
    pub(crate) fn new(inbox: &Inbox<M>, node: Node) -> Self {
        let (Some(id), Some(mailbox)) = (inbox.me.id(), inbox.me.mailbox()) else {
            unreachable!("an inbox's ref names its actor by id, with its mailbox");
        };
        Context {
            id,
            mailbox: mailbox.clone(),
            node,
            stop: false,
            _m: PhantomData,
        }
    }

    /// A ref to this actor.
    pub fn myself(&self) -> ActorRef<M> {
        let inner = self.node.inner();
        ActorRef::local(
            inner.actors.node.clone(),
            self.id,
            Arc::downgrade(&inner.actors),
            self.mailbox.clone(),
        )
    }

    /// The node the actor runs on.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Stops the actor after the current message.
    pub fn stop(&mut self) {
        self.stop = true;
    }

    /// Links this actor with `other` (see [`Node::link`]).
    pub fn link<N: Message>(&self, other: &ActorRef<N>) -> Result<(), crate::LinkError> {
        self.node.link(&self.myself(), other)
    }
}
