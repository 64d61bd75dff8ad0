//! The groups service: the actor that drives a node's [`Groups`] machine and hands published
//! messages to the node's members.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{broadcast, mpsc, Semaphore};

use super::{Cmd, Envelope, GroupError, Wire, DELIVERIES, SERVICE};
use crate::actor::registry::RemoteMsg;
use crate::actor::ActorRef;
use crate::id::NodeId;
use crate::node::{Inbox, Inner, Node};
use crate::service::{deadline, sleep_until, Watches};
use crate::wire::frame::Dest;
use maquis_proto::groups::{GroupOutput, Groups, JoinError};

struct Driver {
    inner: Arc<Inner>,
    machine: Groups<NodeId>,
    watches: Watches,
    /// Room for publishes being handed to local members.
    deliveries: Arc<Semaphore>,
}

/// Starts the service on `node`: registers it as [`SERVICE`] and returns at once.
pub(crate) fn spawn(node: &Node, inner: Arc<Inner>, cmds: mpsc::Receiver<Cmd>) {
    let me = inner.router.id.clone();
    let cfg = inner.config.services.groups();
    let events = inner.events.subscribe();
    let service = node.spawn_fn(move |inbox: Inbox<Envelope>| {
        let mut d = Driver {
            machine: Groups::new(me, cfg),
            inner,
            watches: Watches::default(),
            deliveries: Arc::new(Semaphore::new(DELIVERIES)),
        };
        async move { d.run(inbox, cmds, events).await }
    });
    node.register_system(SERVICE, &service);
}

impl Driver {
    fn now(&self) -> Duration {
        self.inner.router.started().elapsed()
    }

    async fn run(
        &mut self,
        mut inbox: Inbox<Envelope>,
        mut cmds: mpsc::Receiver<Cmd>,
        mut events: broadcast::Receiver<crate::MembershipEvent>,
    ) {
        let members = self.inner.members_now();
        self.machine.handle_members(self.now(), &members);
        self.flush();
        let shutdown = self.inner.router.shutdown.clone();
        loop {
            let at = deadline(&self.inner, self.machine.poll_timeout());
            tokio::select! {
                _ = shutdown.cancelled() => return,
                m = inbox.recv() => match m {
                    Some(Envelope { from, wire: Wire::Proto(msg) }) => {
                        let now = self.now();
                        self.machine.handle_message(now, from, msg);
                    }
                    Some(Envelope { from, wire: Wire::Publish { group, ty, payload } }) => {
                        self.deliver(&from, &group, ty, payload).await;
                    }
                    None => return,
                },
                c = cmds.recv() => match c {
                    Some(c) => self.command(c).await,
                    None => return,
                },
                e = events.recv() => match e {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        let members = self.inner.members_now();
                        let now = self.now();
                        self.machine.handle_members(now, &members);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                id = self.watches.next() => {
                    let now = self.now();
                    self.machine.remove_actor(now, id);
                }
                () = sleep_until(at) => {
                    let now = self.now();
                    self.machine.handle_timeout(now);
                }
            }
            self.flush();
        }
    }

    async fn command(&mut self, c: Cmd) {
        let now = self.now();
        match c {
            Cmd::Join {
                group,
                actor,
                reply,
            } => {
                let r = self.machine.join(now, &group, actor).map_err(|e| match e {
                    JoinError::Full => GroupError::Full,
                    JoinError::BadName => GroupError::BadName,
                });
                if r.is_ok() {
                    self.watches.watch(&self.inner, actor.id);
                }
                let _ = reply.send(r);
            }
            Cmd::Leave {
                group,
                actor,
                reply,
            } => {
                let left = self.machine.leave(now, &group, actor);
                if self.machine.groups_of(actor.id).is_empty() {
                    self.watches.unwatch(actor.id);
                }
                let _ = reply.send(left);
            }
            Cmd::Members { group, reply } => {
                let _ = reply.send(self.machine.members(&group));
            }
            Cmd::Deliver { group, ty, payload } => {
                let me = self.inner.router.id.clone();
                self.deliver(&me, &group, ty, payload).await;
            }
            Cmd::Stats { reply } => {
                let _ = reply.send(self.machine.stats());
            }
        }
    }

    /// Hands a published message to this node's members of `group` of type `ty`, in a task
    /// (waiting here only for room among the deliveries in progress).
    async fn deliver(&mut self, from: &NodeId, group: &str, ty: u64, payload: Bytes) {
        let me = self.inner.router.id.clone();
        let targets: Vec<u64> = self
            .machine
            .members(group)
            .into_iter()
            .filter(|(n, a)| *n == me && crate::actor::compatible(ty, a.ty))
            .map(|(_, a)| a.id)
            .collect();
        if targets.is_empty() {
            return;
        }
        let Ok(permit) = self.deliveries.clone().acquire_owned().await else {
            return;
        };
        let inner = self.inner.clone();
        let from = from.clone();
        tokio::spawn(async move {
            for id in targets {
                if let Some(mailbox) = inner.actors.registry.by_id(id) {
                    let msg = RemoteMsg {
                        payload: payload.clone(),
                        from_node: from.clone(),
                        call: None,
                    };
                    let _ = mailbox.push_remote(msg).await;
                }
            }
            drop(permit);
        });
    }

    /// Carries out what the machine produced.
    fn flush(&mut self) {
        while let Some(GroupOutput::Send { to, msg }) = self.machine.poll_output() {
            send(&self.inner, to, Wire::Proto(msg));
        }
    }
}

/// Sends a message to `to`'s groups service.
pub(crate) fn send(inner: &Arc<Inner>, to: NodeId, wire: Wire) {
    let actors = Arc::downgrade(&inner.actors);
    let service: ActorRef<Envelope> = ActorRef::new(to, Dest::Name(SERVICE.into()), actors);
    let from = inner.router.id.clone();
    if let Err(e) = service.try_send(Envelope { from, wire }) {
        // Deltas lost here are repaired by the next delta or the digest.
        inner.router.counters.groups_send_failed.inc();
        tracing::debug!(error = %e, to = %service.node(), "groups message not sent");
    }
}
