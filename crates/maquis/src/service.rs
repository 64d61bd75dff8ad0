//! What the runtime's cluster services (global names, groups) share: watches on the local
//! actors they hold, and a sleep until their machine's next deadline.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::{AbortHandle, BoxFuture};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;

use crate::actor::ActorRef;
use crate::node::{Inner, Node};
use crate::wire::frame::Dest;

/// Monitors of local actors, each ending with its actor's id when the actor stops.
#[derive(Default)]
pub(crate) struct Watches {
    downs: FuturesUnordered<BoxFuture<'static, Option<u64>>>,
    aborts: HashMap<u64, AbortHandle>,
}

impl Watches {
    /// Watches local actor `id` (once, however often it is asked).
    pub(crate) fn watch(&mut self, inner: &Arc<Inner>, id: u64) {
        if self.aborts.contains_key(&id) {
            return;
        }
        let node = Node::from_inner(inner.clone());
        let target: ActorRef<()> = ActorRef::new(
            inner.router.id.clone(),
            Dest::Id(id),
            Arc::downgrade(&inner.actors),
        );
        let (watch, abort) = futures::future::abortable(node.monitor(&target));
        self.downs
            .push(watch.map(move |r| r.ok().map(|_| id)).boxed());
        self.aborts.insert(id, abort);
    }

    /// Stops watching `id`.
    pub(crate) fn unwatch(&mut self, id: u64) {
        if let Some(a) = self.aborts.remove(&id) {
            a.abort();
        }
    }

    /// The next watched actor that stops (pending while none is watched).
    pub(crate) async fn next(&mut self) -> u64 {
        loop {
            match self.downs.next().await {
                Some(Some(id)) => {
                    self.aborts.remove(&id);
                    return id;
                }
                // An unwatched one, ended by its abort.
                Some(None) => continue,
                None => std::future::pending::<()>().await,
            }
        }
    }
}

/// Sleeps until `deadline` (for ever without one).
pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The deadline of a machine's timer, `d` after the node started.
pub(crate) fn deadline(
    inner: &Inner,
    d: Option<std::time::Duration>,
) -> Option<tokio::time::Instant> {
    d.map(|d| tokio::time::Instant::from_std(inner.router.started() + d))
}
