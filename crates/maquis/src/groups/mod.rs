//! Process groups: named groups of actors across the cluster, with publish, anycast and
//! `call_any` (Erlang's `pg`, psaDB's groups).
//!
//! ```no_run
//! # use std::time::Duration;
//! # use maquis::{ActorRef, Node, ReplyTo};
//! # async fn f(a: Node, b: Node, w1: ActorRef<String>, w2: ActorRef<String>) -> Result<(), maquis::groups::GroupError> {
//! a.join_group("workers", &w1).await?;
//! b.join_group("workers", &w2).await?;
//! // Every member gets it once.
//! a.publish("workers", &"reload".to_string()).await?;
//! // Exactly one member gets it.
//! b.anycast("workers", "job 42".to_string()).await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! Every node runs a groups service (an actor registered locally as `$maquis/groups`) that
//! drives the groups machine of `maquis_proto::groups`: each node owns the memberships of its
//! own actors and keeps a replica of every other node's, updated by deltas that every change
//! sends to every member node (and repaired by whole-state syncs when a delta is lost). So
//! [`Node::group_members`](crate::Node::group_members) is answered locally. A member that
//! stops leaves its groups (the service watches it); a node that leaves the members takes its
//! actors out of every group on every node.
//!
//! **Publish** encodes the message once and sends one copy to each *node* that has members of
//! the group (not one per member); that node's service hands it to its members. On a large
//! cluster this costs the publisher one message per node that hosts members, whatever the
//! number of members. (Broadcasting over the Plumtree tree instead would cost the publisher a
//! message per neighbour but every node in the cluster a copy, members or not: it pays only
//! for groups spread over most of the nodes, and is not built.)
//!
//! **publish_call** publishes a request with one [`ReplyTo`](crate::ReplyTo) and returns the
//! first answer: the members agree among themselves which one answers (psaDB's requests to a
//! group, where every member keeps a replica and one answers); the others drop their copy,
//! which fails nothing.
//!
//! [`Node::group_changes`](crate::Node::group_changes) moves whenever the members may have
//! changed: a user that keeps its own view of a group reads it again then. The node does the
//! same: `publish`, `anycast`, `call_any` and `group_members` read a group's members from a
//! cache that serves until the count moves, so a publish costs no round trip to the service,
//! and a publish's copy for this node's own members goes straight to their mailboxes.
//!
//! **Anycast** and **call_any** pick a member at random (the local ones first); a `call_any`
//! whose member stops or whose node goes down before it answers is tried on another member,
//! until one answers, the timeout passes, or no member is left.
//!
//! Members have a message type: a group may hold actors of several types; `group_members`,
//! `publish`, `anycast` and `call_any` of type `M` consider only the members of type `M`.
//!
//! # What it guarantees
//!
//! Eventual consistency, as `pg`: a join is visible on its node at once and on the others one
//! message later; during a partition each side sees its own side's members, and the groups
//! merge when it heals. Delivery of a publish is best effort, at most once per member.
//!
//! # Bounds
//!
//! From `[services]`: a node keeps at most `max_group_members` memberships, its own and the
//! replicas together (a join beyond fails with [`GroupError::Full`]; a remote one beyond is
//! dropped and counted); a publish goes into each local member's mailbox at once when it has
//! room, and at most 1,024 publishes wait for room in full mailboxes on a node (beyond, the
//! publisher, or the service for a remote publish, waits); the members cache holds at most
//! 256 groups (emptied when a group beyond comes). Group names have 1 to 255 bytes.

mod driver;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::oneshot;

use crate::actor::mailbox::RemoteMsg;
use crate::id::NodeId;
use maquis_proto::groups::{Actor, GroupMsg};

pub(crate) use driver::spawn;
pub use maquis_proto::groups::GroupStats;

/// The local name of every node's groups service.
pub(crate) const SERVICE: &str = "$maquis/groups";

/// Requests from the API queued for the service at most (a caller waits when it is full).
pub(crate) const COMMAND_QUEUE: usize = 1024;

/// Groups whose members [`MembersCache`] keeps at most; a group beyond empties it (the next
/// reads ask the service again).
pub(crate) const MEMBERS_CACHE: usize = 256;

/// Each group's members as the service last answered, tagged with the change count
/// (`Node::group_changes`) read just before asking: an entry serves while the count has not
/// moved, so reading a group's members costs no round trip to the service. The service moves
/// the count before it answers a local join or leave, so the joiner's next read sees it.
#[derive(Default)]
pub(crate) struct MembersCache(Mutex<HashMap<String, (u64, Members)>>);

/// A group's members, each as (node, actor).
pub(crate) type Members = Arc<[(NodeId, Actor)]>;

impl MembersCache {
    /// `group`'s members if they were read at change count `changes`.
    pub(crate) fn get(&self, group: &str, changes: u64) -> Option<Members> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(group)
            .filter(|(at, _)| *at == changes)
            .map(|(_, m)| m.clone())
    }

    /// Keeps `group`'s members as read at change count `changes`.
    pub(crate) fn put(&self, group: &str, changes: u64, members: Members) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MEMBERS_CACHE && !map.contains_key(group) {
            map.clear();
        }
        map.insert(group.to_string(), (changes, members));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Hands a published message to each of this node's actors `targets`: into each mailbox with
/// room at once, the others in a task that waits for room (so a publisher that is a member
/// itself, its mailbox full, does not wait on itself). At most [`DELIVERIES`] such tasks run
/// on a node; beyond, this waits for one to end.
pub(crate) async fn deliver(
    inner: &crate::node::Inner,
    targets: impl Iterator<Item = u64>,
    from: &NodeId,
    payload: &Bytes,
) {
    let mut full = Vec::new();
    for id in targets {
        let Some(mailbox) = inner.actors.registry.by_id(id) else {
            continue;
        };
        let msg = RemoteMsg {
            payload: payload.clone(),
            from_node: from.clone(),
            call: None,
        };
        if let Err(msg) = mailbox.try_push_remote(msg) {
            full.push((mailbox, msg));
        }
    }
    if full.is_empty() {
        return;
    }
    let Ok(permit) = inner.group_deliveries.clone().acquire_owned().await else {
        return;
    };
    tokio::spawn(async move {
        for (mailbox, msg) in full {
            let _ = mailbox.push_remote(msg).await;
        }
        drop(permit);
    });
}

/// Publishes being handed to local members at once, per node.
pub(crate) const DELIVERIES: usize = 1024;

/// Why a group operation failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GroupError {
    /// The group has no member of the message type asked for (or none left to try).
    #[error("group {0:?} has no member of this message type")]
    NoMembers(String),
    /// Only a live actor of this node can join or leave through this node.
    #[error("only a live actor of this node can join a group")]
    NotLocal,
    /// The group name is empty or longer than 255 bytes.
    #[error("a group name has 1 to 255 bytes")]
    BadName,
    /// The node keeps as many memberships as `services.max_group_members` allows.
    #[error("the node keeps as many group memberships as it may (services.max_group_members)")]
    Full,
    /// No member answered within the timeout.
    #[error("no member answered in time")]
    Timeout,
    /// The message could not be encoded.
    #[error("the message does not encode: {0}")]
    Encode(String),
    /// A send or call failed in a way another member would not change.
    #[error("{0}")]
    Failed(String),
    /// The node is shutting down.
    #[error("the node stopped")]
    Stopped,
}

/// What one groups service sends another.
#[derive(Serialize, Deserialize)]
pub(crate) enum Wire {
    /// The groups machine's own messages.
    Proto(GroupMsg),
    /// Hand this message to your members of `group` whose type is `ty`.
    Publish {
        group: String,
        ty: u64,
        payload: Bytes,
    },
}

/// A message between two nodes' groups services.
#[derive(Serialize, Deserialize)]
pub(crate) struct Envelope {
    pub(crate) from: NodeId,
    pub(crate) wire: Wire,
}

/// A request from the API to the service.
pub(crate) enum Cmd {
    Join {
        group: String,
        actor: Actor,
        reply: oneshot::Sender<Result<(), GroupError>>,
    },
    Leave {
        group: String,
        actor: Actor,
        reply: oneshot::Sender<bool>,
    },
    Members {
        group: String,
        reply: oneshot::Sender<Vec<(NodeId, Actor)>>,
    },
    Stats {
        reply: oneshot::Sender<GroupStats>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: u64) -> Members {
        let node = NodeId::new("a", "127.0.0.1:1".parse().unwrap(), 1);
        (0..n)
            .map(|id| (node.clone(), Actor { id, ty: 7 }))
            .collect()
    }

    #[test]
    fn the_members_cache_serves_only_at_the_count_it_was_read_at_and_stays_bounded() {
        let cache = MembersCache::default();
        cache.put("g", 3, members(2));
        assert_eq!(cache.get("g", 3).map(|m| m.len()), Some(2));
        assert!(cache.get("g", 4).is_none(), "the count moved: ask again");
        assert!(cache.get("h", 3).is_none());
        for i in 0..MEMBERS_CACHE {
            cache.put(&format!("x{i}"), 3, members(1));
        }
        assert!(cache.len() <= MEMBERS_CACHE, "{} groups kept", cache.len());
        // Emptied when a group beyond the bound came: the latest is there.
        assert!(cache.get(&format!("x{}", MEMBERS_CACHE - 1), 3).is_some());
    }
}
