//! `Node`'s process groups (see [`crate::groups`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::seq::SliceRandom;

use super::Node;
use crate::actor::{compatible, fingerprint, ActorRef, Message, ReplyTo};
use crate::error::{CallError, SendError};
use crate::groups::{Cmd, Envelope, GroupError, GroupStats, Members, Wire, SERVICE};
use crate::id::NodeId;
use crate::wire::frame::Dest;
use maquis_proto::groups::Actor;

impl Node {
    /// A live local actor joins `group` (joining twice is one membership). It leaves when
    /// it stops, when [`Node::leave_group`] is called, or when this node leaves the cluster.
    ///
    /// Errors: [`GroupError::NotLocal`], `BadName`, `Full`, `Stopped`.
    pub async fn join_group<M: Message>(
        &self,
        group: &str,
        actor: &ActorRef<M>,
    ) -> Result<(), GroupError> {
        let actor = self.group_actor(actor)?;
        let group = group.to_string();
        self.inner
            .groups
            .ask(|reply| Cmd::Join {
                group,
                actor,
                reply,
            })
            .await
            .ok_or(GroupError::Stopped)?
    }

    /// A local actor leaves `group`; whether it was in it.
    pub async fn leave_group<M: Message>(&self, group: &str, actor: &ActorRef<M>) -> bool {
        let Ok(actor) = self.group_actor(actor) else {
            return false;
        };
        let group = group.to_string();
        self.inner
            .groups
            .ask(|reply| Cmd::Leave {
                group,
                actor,
                reply,
            })
            .await
            .unwrap_or(false)
    }

    fn group_actor<M: Message>(&self, actor: &ActorRef<M>) -> Result<Actor, GroupError> {
        match (actor.id(), self.inner.router.is_local(actor.node())) {
            (Some(id), Ok(true)) if self.inner.actors.registry.by_id(id).is_some() => Ok(Actor {
                id,
                ty: fingerprint::<M>(),
            }),
            _ => Err(GroupError::NotLocal),
        }
    }

    /// The members of `group` whose message type is `M`, this node's first (answered from
    /// this node's replica of the groups: no message).
    pub async fn group_members<M: Message>(
        &self,
        group: &str,
    ) -> Result<Vec<ActorRef<M>>, GroupError> {
        let rt = Arc::downgrade(&self.inner.actors);
        Ok(self
            .typed_members::<M>(group)
            .await?
            .into_iter()
            .map(|(node, id)| ActorRef::new(node, Dest::Id(id), rt.clone()))
            .collect())
    }

    async fn typed_members<M: Message>(
        &self,
        group: &str,
    ) -> Result<Vec<(NodeId, u64)>, GroupError> {
        let all = self.all_members(group).await?;
        let ty = fingerprint::<M>();
        Ok(all
            .iter()
            .filter(|(_, a)| compatible(ty, a.ty))
            .map(|(n, a)| (n.clone(), a.id))
            .collect())
    }

    /// Every member of `group`, from the cache while `group_changes` has not moved since it
    /// was read (see `groups::MembersCache`), else from the service.
    async fn all_members(&self, group: &str) -> Result<Members, GroupError> {
        let changes = *self.inner.group_changes.borrow();
        if let Some(all) = self.inner.group_members.get(group, changes) {
            return Ok(all);
        }
        let g = group.to_string();
        let all: Members = self
            .inner
            .groups
            .ask(|reply| Cmd::Members { group: g, reply })
            .await
            .ok_or(GroupError::Stopped)?
            .into();
        self.inner.group_members.put(group, changes, all.clone());
        Ok(all)
    }

    /// Sends `msg` to every member of `group` of type `M`, once each: encoded once, one copy
    /// to each node that has members, handed to them there. Returns how many members it was
    /// sent to. Best effort: a member that stops meanwhile, or a node that goes down, misses
    /// it. Waits while a node's lane is full.
    pub async fn publish<M: Message>(&self, group: &str, msg: &M) -> Result<usize, GroupError> {
        let members = self.typed_members::<M>(group).await?;
        if members.is_empty() {
            return Err(GroupError::NoMembers(group.to_string()));
        }
        let payload =
            Bytes::from(crate::encode(msg).map_err(|e| GroupError::Encode(e.to_string()))?);
        let ty = fingerprint::<M>();
        // Each node with members once, in order.
        let mut nodes: Vec<&NodeId> = members.iter().map(|(n, _)| n).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let me = &self.inner.router.id;
        let rt = Arc::downgrade(&self.inner.actors);
        for node in nodes {
            if node == me {
                // This node's members: straight into their mailboxes.
                let local = members.iter().filter(|(n, _)| n == me).map(|(_, id)| *id);
                crate::groups::deliver(&self.inner, local, me, &payload).await;
                continue;
            }
            let (group, payload) = (group.to_string(), payload.clone());
            let service: ActorRef<Envelope> =
                ActorRef::new(node.clone(), Dest::Name(SERVICE.into()), rt.clone());
            let envelope = Envelope {
                from: me.clone(),
                wire: Wire::Publish { group, ty, payload },
            };
            if let Err(e) = service.send(envelope).await {
                tracing::debug!(error = %e, to = %node, "publish not sent to a node");
            }
        }
        Ok(members.len())
    }

    /// Publishes a request to `group` (as [`Node::publish`]: every member of type `M` gets a
    /// copy) and returns the first answer: psaDB's group request, which the members agree
    /// among themselves who answers. The members that do not answer simply drop their
    /// [`ReplyTo`] (that fails nothing, and sends nothing back); the call ends at the first
    /// answer, or with [`GroupError::Timeout`] after `timeout` (no member answered, or the
    /// copies were lost: a publish is best effort).
    pub async fn publish_call<M: Message, R: Message>(
        &self,
        group: &str,
        make: impl FnOnce(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, GroupError> {
        let actors = &self.inner.actors;
        let (call, rx) = actors.calls.open_any();
        let reply = ReplyTo::new(
            actors.node.clone(),
            call,
            crate::actor::current_actor(),
            &crate::dispatch::SendOpts::default(),
            actors,
            None,
        )
        .quiet();
        let msg = make(reply);
        let exchange = async {
            self.publish(group, &msg).await?;
            drop(msg);
            rx.await.map_err(|_| GroupError::Stopped)
        };
        let ran = actors.deadlines.until(timeout, exchange).await;
        let outcome = actors.calls.settle(call, ran, GroupError::Timeout)?;
        crate::actor::outcome_of(&Arc::downgrade(actors), outcome)
            .map_err(|e| GroupError::Failed(e.to_string()))
    }

    /// Sends `msg` to one member of `group` of type `M`, chosen at random among this node's
    /// members if it has any, else among all (waiting while its lane is full). A member that
    /// stopped a moment ago may be chosen: the send then fails (a local one) or the message is
    /// dropped at its node (a remote one), as any send to a stopped actor; [`Node::call_any`]
    /// is the form that tries another member.
    pub async fn anycast<M: Message>(&self, group: &str, msg: M) -> Result<(), GroupError> {
        let target = self
            .candidates::<M>(group)
            .await?
            .pop()
            .ok_or_else(|| GroupError::NoMembers(group.to_string()))?;
        target
            .send(msg)
            .await
            .map_err(|e| GroupError::Failed(e.to_string()))
    }

    /// Calls one member of `group` of type `M` (chosen as [`Node::anycast`] does) and returns
    /// its answer. If the member stops, or its node goes down, before it answers, the call is
    /// made again on another member, until one answers, `timeout` passes
    /// ([`GroupError::Timeout`]) or none is left ([`GroupError::NoMembers`]).
    pub async fn call_any<M: Message, R: Message>(
        &self,
        group: &str,
        make: impl Fn(ReplyTo<R>) -> M,
        timeout: Duration,
    ) -> Result<R, GroupError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut candidates = self.candidates::<M>(group).await?;
        while let Some(target) = candidates.pop() {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Err(GroupError::Timeout);
            }
            match target.call(&make, left).await {
                Ok(r) => return Ok(r),
                Err(CallError::Timeout) => return Err(GroupError::Timeout),
                Err(
                    CallError::NoProc
                    | CallError::NoReply(_)
                    | CallError::Send(
                        SendError::NoProc
                        | SendError::Unreachable(_)
                        | SendError::StaleIncarnation { .. },
                    ),
                ) => continue,
                Err(e) => return Err(GroupError::Failed(e.to_string())),
            }
        }
        Err(GroupError::NoMembers(group.to_string()))
    }

    /// The members to try, in order of `pop`: the remote ones shuffled, then this node's
    /// shuffled (tried first).
    async fn candidates<M: Message>(&self, group: &str) -> Result<Vec<ActorRef<M>>, GroupError> {
        let me = self.inner.router.id.clone();
        let rt = Arc::downgrade(&self.inner.actors);
        let members = self.typed_members::<M>(group).await?;
        let (mut local, mut remote): (Vec<_>, Vec<_>) =
            members.into_iter().partition(|(n, _)| *n == me);
        let mut rng = rand::thread_rng();
        local.shuffle(&mut rng);
        remote.shuffle(&mut rng);
        Ok(remote
            .into_iter()
            .chain(local)
            .map(|(n, id)| ActorRef::new(n, Dest::Id(id), rt.clone()))
            .collect())
    }

    /// Tells when the members of the groups may have changed: the value moves with every
    /// join or leave seen here, local or remote, and every member node added or gone (read
    /// the members again with [`Node::group_members`] when it does). Cheaper than asking for
    /// the members over and over; many changes close together may show as one.
    pub fn group_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.group_changes.subscribe()
    }

    /// The groups machine's counters on this node.
    pub async fn group_stats(&self) -> Result<GroupStats, GroupError> {
        self.inner
            .groups
            .ask(|reply| Cmd::Stats { reply })
            .await
            .ok_or(GroupError::Stopped)
    }
}
