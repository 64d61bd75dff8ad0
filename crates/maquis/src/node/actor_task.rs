//! The task an actor runs in: its future, its exit signal, and what happens when it ends.
//!
//! One small future per actor, written out rather than composed from `select!`,
//! `catch_unwind` and a task-local scope: each of those layers keeps the future it wraps both
//! as its capture and in its own state, and the task's allocation is as large as all of them
//! (tokio rounds it up to 128 bytes). The actor's own future is boxed once.
//!
//! On each poll the actor's future runs first, as the actor (`current_actor`), with a panic
//! caught; then the exit signal. Whichever ends it, the actor's future is dropped first (its
//! inbox fails the calls left in it), then the actor leaves the registry and its watchers and
//! links hear why. A task dropped before it ended (the runtime shutting down) ends the same
//! way, with `Stopped`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};

use crate::actor::mailbox::Exit;
use crate::actor::{in_actor, ActorId, Actors};
use crate::wire::frame::DownReason;

/// An actor's future, boxed: the reason it ended with.
pub(crate) type Body = Pin<Box<dyn Future<Output = DownReason> + Send>>;

/// The future of an actor's task.
pub(crate) struct ActorTask<M> {
    /// The actor's own future, until it ends.
    body: Option<Body>,
    /// The exit signal, unless the actor's future takes it itself.
    exit: Option<Exit<M>>,
    id: ActorId,
    actors: Weak<Actors>,
}

impl<M> ActorTask<M> {
    /// The task of actor `id` of `actors`; `exit` is polled after `body` unless `body` handles
    /// it.
    pub(crate) fn new(
        id: ActorId,
        actors: Weak<Actors>,
        body: Body,
        exit: Option<Exit<M>>,
    ) -> Self {
        ActorTask {
            body: Some(body),
            exit,
            id,
            actors,
        }
    }

    /// Ends the actor: its future dropped (as the actor when `scoped`: a task dropped by its
    /// runtime may be dropped where the task-local cannot be set), then its entry removed.
    fn finish(&mut self, reason: DownReason, scoped: bool) {
        let body = self.body.take();
        if scoped {
            in_actor(self.id, || drop(body));
        } else {
            drop(body);
        }
        self.exit = None;
        if let Some(actors) = self.actors.upgrade() {
            actors.remove(self.id, reason);
        }
    }
}

impl<M> Future for ActorTask<M> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(());
        };
        let polled = in_actor(this.id, || {
            std::panic::catch_unwind(AssertUnwindSafe(|| body.as_mut().poll(cx)))
        });
        let reason = match polled {
            Ok(Poll::Ready(reason)) => reason,
            Ok(Poll::Pending) => match this.exit.as_mut().map(|e| Pin::new(e).poll(cx)) {
                Some(Poll::Ready(reason)) => reason,
                _ => return Poll::Pending,
            },
            Err(panic) => {
                let message = super::panic_message(panic.as_ref());
                tracing::warn!(actor = this.id, %message, "actor panicked; it stops");
                DownReason::Panicked(message)
            }
        };
        this.finish(reason, true);
        Poll::Ready(())
    }
}

impl<M> Drop for ActorTask<M> {
    fn drop(&mut self) {
        if self.body.is_some() {
            self.finish(DownReason::Stopped, false);
        }
    }
}
