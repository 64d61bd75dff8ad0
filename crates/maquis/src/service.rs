//! What the runtime's cluster services (global names, groups) share: the loop that drives
//! a protocol machine from an actor ([`run`]: members from the membership events, messages
//! from the service's inbox, the API's requests, stopped actors, the machine's timer), the
//! watches on the local actors they hold, the API's request queue, and sends to the same
//! service on another node.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{AbortHandle, BoxFuture};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::actor::{ActorRef, Message};
use crate::counters::Counter;
use crate::id::NodeId;
use crate::node::{Inbox, Inner, Node};
use crate::wire::frame::Dest;
use crate::MembershipEvent;

/// A cluster service: an actor that drives a protocol machine.
pub(crate) trait Service: Send + 'static {
    /// What other nodes' services send it.
    type Msg: Message;
    /// What the API asks of it.
    type Cmd: Send + 'static;
    /// The node.
    fn inner(&self) -> &Arc<Inner>;
    /// The watches on its local actors.
    fn watches(&mut self) -> &mut Watches;
    /// The machine's next deadline (since the node started).
    fn next_timeout(&self) -> Option<Duration>;
    /// The members changed.
    fn on_members(&mut self, now: Duration, members: &[NodeId]);
    /// A message from another node's service.
    fn on_message(&mut self, now: Duration, msg: Self::Msg) -> impl Future<Output = ()> + Send;
    /// A request of the API.
    fn on_command(&mut self, now: Duration, cmd: Self::Cmd) -> impl Future<Output = ()> + Send;
    /// A watched local actor stopped.
    fn on_actor_down(&mut self, now: Duration, id: u64);
    /// The machine's deadline passed.
    fn on_timeout(&mut self, now: Duration);
    /// Carries out what the machine produced.
    fn flush(&mut self);
}

/// Spawns `service` as an actor registered under `name`, running until the node stops.
pub(crate) fn spawn<S: Service>(node: &Node, name: &str, service: S, cmds: mpsc::Receiver<S::Cmd>) {
    let events = service.inner().events.subscribe();
    let actor = node.spawn_fn(move |inbox: Inbox<S::Msg>| run(service, inbox, cmds, events));
    node.register_system(name, &actor);
}

async fn run<S: Service>(
    mut s: S,
    mut inbox: Inbox<S::Msg>,
    mut cmds: mpsc::Receiver<S::Cmd>,
    mut events: broadcast::Receiver<MembershipEvent>,
) {
    let inner = s.inner().clone();
    let now = || inner.router.started().elapsed();
    let mut members = inner.members_now();
    s.on_members(now(), &members);
    s.flush();
    let shutdown = inner.router.shutdown.clone();
    loop {
        let at = deadline(&inner, s.next_timeout());
        tokio::select! {
            _ = shutdown.cancelled() => return,
            m = inbox.recv() => match m {
                Some(m) => s.on_message(now(), m).await,
                None => return,
            },
            c = cmds.recv() => match c {
                Some(c) => s.on_command(now(), c).await,
                None => return,
            },
            e = events.recv() => match e {
                // The member list is what counts, not the events: the events already queued
                // are taken with this one (the list shows them all), and a list already
                // handled is not handed again (a service's work on a new list grows with
                // the cluster; a forming cluster makes many).
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) =
                        events.try_recv()
                    {}
                    let now_members = inner.members_now();
                    if !Arc::ptr_eq(&now_members, &members) {
                        members = now_members;
                        s.on_members(now(), &members);
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
            id = s.watches().next() => s.on_actor_down(now(), id),
            () = sleep_until(at) => s.on_timeout(now()),
        }
        s.flush();
    }
}

/// The API's queue to a service.
pub(crate) struct Queue<C> {
    pub(crate) cmds: mpsc::Sender<C>,
}

impl<C> Queue<C> {
    /// A request and its answer; `None` if the service is gone (the node stopped).
    pub(crate) async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> C) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.cmds.send(make(tx)).await.ok()?;
        rx.await.ok()
    }
}

/// Sends `msg` to the service `name` on node `to` without waiting; a failure is counted in
/// `failed` (the services repair what they lose: requests are sent again, states resynced).
pub(crate) fn send_to<M: Message>(
    inner: &Arc<Inner>,
    to: NodeId,
    name: &str,
    msg: M,
    failed: &Counter,
) {
    let actors = Arc::downgrade(&inner.actors);
    let service: ActorRef<M> = ActorRef::new(to, Dest::Name(name.into()), actors);
    if let Err(e) = service.try_send(msg) {
        failed.inc();
        tracing::debug!(error = %e, to = %service.node(), service = name, "message not sent");
    }
}

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
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The deadline of a machine's timer, `d` after the node started.
fn deadline(inner: &Inner, d: Option<std::time::Duration>) -> Option<tokio::time::Instant> {
    d.map(|d| tokio::time::Instant::from_std(inner.router.started() + d))
}
