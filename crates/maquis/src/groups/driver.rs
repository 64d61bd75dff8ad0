//! The groups service: the actor that drives a node's [`Groups`] machine and hands published
//! messages to the node's members.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::{Cmd, Envelope, GroupError, Wire, SERVICE};
use crate::id::NodeId;
use crate::node::{Inner, Node};
use crate::service::{send_to, Service, Watches};
use maquis_proto::groups::{GroupOutput, Groups, JoinError};

struct Driver {
    inner: Arc<Inner>,
    machine: Groups<NodeId>,
    watches: Watches,
    /// The machine's change count last told to `Node::group_changes`.
    told: u64,
}

/// Starts the service on `node`: registers it as [`SERVICE`] and returns at once.
pub(crate) fn spawn(node: &Node, inner: Arc<Inner>, cmds: mpsc::Receiver<Cmd>) {
    let driver = Driver {
        machine: Groups::new(inner.router.id.clone(), inner.config.services.groups()),
        inner,
        watches: Watches::default(),
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
        self.tell_changes();
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
                // Before the answer: the joiner's next read of the members must not be
                // served from a cache entry of before the join.
                self.tell_changes();
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
                self.tell_changes();
                let _ = reply.send(left);
            }
            Cmd::Members { group, reply } => {
                let _ = reply.send(self.machine.members(&group));
            }
            Cmd::Stats { reply } => {
                let _ = reply.send(self.machine.stats());
            }
        }
    }

    /// Tells `Node::group_changes` (and so the members cache) that the members may have
    /// changed, if they may have.
    fn tell_changes(&mut self) {
        let changes = self.machine.changes();
        if changes != self.told {
            self.told = changes;
            self.inner.group_changes.send_replace(changes);
        }
    }

    /// Hands a message another node published to this node's members of `group` of type
    /// `ty` (see `groups::deliver`).
    async fn deliver(&mut self, from: &NodeId, group: &str, ty: u64, payload: Bytes) {
        let targets = self
            .machine
            .local_members(group)
            .filter(|a| crate::actor::compatible(ty, a.ty))
            .map(|a| a.id);
        super::deliver(&self.inner, targets, from, &payload).await;
    }
}
