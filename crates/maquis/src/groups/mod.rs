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
//! changed: a user that keeps its own view of a group reads it again then.
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
//! dropped and counted); at most 1,024 publishes are being handed to local members at once
//! on a node (the service waits for room). Group names have 1 to 255 bytes.

mod driver;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::oneshot;

use crate::id::NodeId;
use maquis_proto::groups::{Actor, GroupMsg};

pub(crate) use driver::spawn;
pub use maquis_proto::groups::GroupStats;

/// The local name of every node's groups service.
pub(crate) const SERVICE: &str = "$maquis/groups";

/// Requests from the API queued for the service at most (a caller waits when it is full).
pub(crate) const COMMAND_QUEUE: usize = 1024;

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
    /// Hand a publish to this node's members (the publisher is on this node).
    Deliver {
        group: String,
        ty: u64,
        payload: Bytes,
    },
    Stats {
        reply: oneshot::Sender<GroupStats>,
    },
}
