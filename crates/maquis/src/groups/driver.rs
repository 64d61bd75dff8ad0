//! The groups service: the actor that drives a node's [`Groups`] machine and hands published
//! messages to the node's members.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, Semaphore};

use super::{Cmd, Envelope, GroupError, Wire, DELIVERIES, SERVICE};
use crate::actor::registry::RemoteMsg;
use crate::id::NodeId;
use crate::node::{Inner, Node};
use crate::service::{send_to, Service, Watches};
use maquis_proto::groups::{GroupOutput, Groups, JoinError};

struct Driver {
    inner: Arc<Inner>,
    machine: Groups<NodeId>,
    watches: Watches,
    /// Room for publishes being handed to local members.
    deliveries: Arc<Semaphore>,
    /// The machine's change count last told to `Node::group_changes`.
    told: u64,
}

/// Starts the service on `node`: registers it as [`SERVICE`] and returns at once.
pub(crate) fn spawn(node: &Node, inner: Arc<Inner>, cmds: mpsc::Receiver<Cmd>) {
    let driver = Driver {
        machine: Groups::new(inner.router.id.clone(), inner.config.services.groups()),
        inner,
        watches: Watches::default(),
        deliveries: Arc::new(Semaphore::new(DELIVERIES)),
        told: 0,
    };
    crate::service::spawn(node, SERVICE, driver, cmds);
}

impl Service for Driver {
    type Msg = Envelope;
    type Cmd = Cmd;

    fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    fn watches(&mut self) -> &mut Watches {
        &mut self.watches
    }

    fn next_timeout(&self) -> Option<Duration> {
        self.machine.poll_timeout()
    }

    fn on_members(&mut self, now: Duration, members: &[NodeId]) {
        self.machine.handle_members(now, members);
    }

    async fn on_message(&mut self, now: Duration, Envelope { from, wire }: Envelope) {
        match wire {
            Wire::Proto(msg) => self.machine.handle_message(now, from, msg),
            Wire::Publish { group, ty, payload } => self.deliver(&from, &group, ty, payload).await,
        }
    }

    async fn on_command(&mut self, now: Duration, c: Cmd) {
        self.command(now, c).await;
    }

    fn on_actor_down(&mut self, now: Duration, id: u64) {
        self.machine.remove_actor(now, id);
    }

    fn on_timeout(&mut self, now: Duration) {
        self.machine.handle_timeout(now);
    }

    fn flush(&mut self) {
        let changes = self.machine.changes();
        if changes != self.told {
            self.told = changes;
            self.inner.group_changes.send_replace(changes);
        }
        while let Some(GroupOutput::Send { to, msg }) = self.machine.poll_output() {
            let envelope = Envelope {
                from: self.inner.router.id.clone(),
                wire: Wire::Proto(msg),
            };
            let failed = &self.inner.router.counters.groups_send_failed;
            send_to(&self.inner, to, SERVICE, envelope, failed);
        }
    }
}

impl Driver {
    async fn command(&mut self, now: Duration, c: Cmd) {
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
}
