//! `Node`'s global names (see [`crate::names`] for how they work and what they guarantee).

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::broadcast;

use super::Node;
use crate::actor::{compatible, fingerprint, ActorRef, Message};
use crate::names::{Cmd, DirStats, GlobalNameError, NameLost, Target};
use crate::wire::frame::Dest;

impl Node {
    /// Registers a live local actor under a cluster-wide name, with its message type. Returns
    /// once the name's home granted it: one round trip to one member, whatever the size of
    /// the cluster.
    ///
    /// The name stays the actor's until [`Node::unregister_global`], until the actor stops, or
    /// until this node leaves the cluster or is declared down. Registering a name this actor
    /// holds again is accepted; one held by another actor of this node moves to this one.
    ///
    /// Errors: [`GlobalNameError::Taken`] (another node's actor holds it), `NotLocal`,
    /// `BadName`, `Full`, `Busy`, `Timeout`, `Stopped`.
    pub async fn register_global<M: Message>(
        &self,
        name: &str,
        actor: &ActorRef<M>,
    ) -> Result<(), GlobalNameError> {
        self.register_global_as(name, actor, None).await
    }

    /// [`Node::register_global`], taking the name over from `replaces` when given: the node
    /// that handed it here ([`Node::hand_over_global`]); granted while the name is still
    /// that node's (or nobody's).
    pub(crate) async fn register_global_as<M: Message>(
        &self,
        name: &str,
        actor: &ActorRef<M>,
        replaces: Option<crate::NodeId>,
    ) -> Result<(), GlobalNameError> {
        let id = match (actor.id(), self.inner.router.is_local(actor.node())) {
            (Some(id), Ok(true)) if self.inner.actors.registry.by_id(id).is_some() => id,
            _ => return Err(GlobalNameError::NotLocal),
        };
        let (ty, ty_name) = crate::names::type_of::<M>();
        let target = Target {
            ty,
            ty_name,
            node: self.inner.router.id.clone(),
            id,
        };
        let target = maquis_proto::encode(&target)
            .map(Bytes::from)
            .map_err(|e| GlobalNameError::Corrupt(e.to_string()))?;
        let name = name.to_string();
        self.inner
            .names
            .queue
            .ask(|reply| Cmd::Register {
                name,
                actor: id,
                target,
                replaces,
                reply,
            })
            .await
            .ok_or(GlobalNameError::Stopped)?
    }

    /// Releases a global name this node holds; returns whether it held it.
    pub async fn unregister_global(&self, name: &str) -> bool {
        let name = name.to_string();
        self.inner
            .names
            .queue
            .ask(|reply| Cmd::Unregister { name, reply })
            .await
            .unwrap_or(false)
    }

    /// The actor registered under a global name, typed: from this node's cache when it has
    /// the answer, else from the name's home (one round trip), then cached. `Ok(None)`: no
    /// actor holds the name.
    ///
    /// Errors: [`GlobalNameError::TypeMismatch`] (registered for another message type),
    /// `Busy`, `Timeout`, `Corrupt`, `Stopped`.
    pub async fn whereis_global<M: Message>(
        &self,
        name: &str,
    ) -> Result<Option<ActorRef<M>>, GlobalNameError> {
        let owned = name.to_string();
        let entry = self
            .inner
            .names
            .queue
            .ask(|reply| Cmd::Whereis { name: owned, reply })
            .await
            .ok_or(GlobalNameError::Stopped)??;
        let Some(entry) = entry else {
            return Ok(None);
        };
        let target: Target = postcard::from_bytes(&entry.target)
            .map_err(|_| GlobalNameError::Corrupt(name.to_string()))?;
        if !compatible(target.ty, fingerprint::<M>()) {
            return Err(GlobalNameError::TypeMismatch {
                name: name.to_string(),
                registered: target.ty_name,
            });
        }
        Ok(Some(ActorRef::new(
            target.node,
            Dest::Id(target.id),
            Arc::downgrade(&self.inner.actors),
        )))
    }

    /// Stops holding a global name without releasing it: its home keeps naming this node
    /// (which passes messages on) until the node it is handed to registers it with
    /// [`Node::register_global_as`]. Returns whether this node held it. Its actor may stop
    /// afterwards without releasing it.
    pub(crate) async fn hand_over_global(&self, name: &str) -> bool {
        let name = name.to_string();
        self.inner
            .names
            .queue
            .ask(|reply| Cmd::HandOver { name, reply })
            .await
            .unwrap_or(false)
    }

    /// Releases a name this node handed over if its home still names this node.
    pub(crate) async fn release_if_left(&self, name: &str) {
        let _ = self
            .inner
            .names
            .queue
            .cmds
            .send(Cmd::ReleaseIfLeft {
                name: name.to_string(),
            })
            .await;
    }

    /// Forgets this node's cached lookup of a global name (a send to it failed): the next
    /// [`Node::whereis_global`] asks the name's home.
    pub async fn invalidate_global(&self, name: &str) {
        let _ = self
            .inner
            .names
            .queue
            .cmds
            .send(Cmd::Invalidate {
                name: name.to_string(),
            })
            .await;
    }

    /// Global names of this node that lose a conflict from now on (two registrations of one
    /// name made on the two sides of a partition: the older wins when it heals). Buffers
    /// `node.event_buffer` notices; a subscriber that falls further behind gets
    /// `RecvError::Lagged`.
    pub fn subscribe_names(&self) -> broadcast::Receiver<NameLost> {
        self.inner.names.lost.subscribe()
    }

    /// The directory's counters on this node (names stored, cached, lookups served locally,
    /// conflicts, timeouts, ...).
    pub async fn directory_stats(&self) -> Result<DirStats, GlobalNameError> {
        self.inner
            .names
            .queue
            .ask(|reply| Cmd::Stats { reply })
            .await
            .ok_or(GlobalNameError::Stopped)
    }
}
