//! Global names: actors registered under a cluster-wide name, found from any node.
//!
//! A local name ([`Node::register`](crate::Node::register)) names an actor on one node; others
//! reach it as (node, name). A *global* name names one actor in the whole cluster:
//!
//! ```no_run
//! # use maquis::{Node, ActorRef};
//! # async fn f(a: Node, b: Node, worker: ActorRef<String>) -> Result<(), maquis::names::GlobalNameError> {
//! // On node a: register a local actor under a cluster-wide name.
//! a.register_global("billing", &worker).await?;
//! // On node b (any member): find it, typed.
//! let found: Option<ActorRef<String>> = b.whereis_global("billing").await?;
//! if let Some(billing) = found {
//!     let _ = billing.send("invoice 42".to_string()).await;
//! }
//! // A lookup with another message type is refused, not decoded wrongly at the receiver.
//! assert!(b.whereis_global::<u64>("billing").await.is_err());
//! a.unregister_global("billing").await;
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! Every node runs a directory service (an actor registered locally as `$maquis/names`) that
//! drives the directory state machine of `maquis_proto::names`: each name has a *home*, the
//! member with the highest rendezvous-hash weight for it, and `services.name_replicas − 1`
//! replicas after it. A registration is a claim to the home and copies to the replicas — a
//! constant number of messages, whatever the size of the cluster, and no lock on any other
//! node. A lookup is answered from the node's cache when it can, else by the home, and cached.
//! Directory messages are ordinary actor messages to `$maquis/names` on the other node, so on
//! the peer-to-peer overlay they are routed hop by hop like any send to a non-neighbour.
//!
//! # What it guarantees
//!
//! - In a connected cluster, a name has at most one registration: a second
//!   [`Node::register_global`](crate::Node::register_global) of a held name fails with
//!   [`GlobalNameError::Taken`], naming the holder.
//! - A name goes away when its actor stops (the service watches it), when it is unregistered,
//!   and when its node goes down or leaves (every node drops the names of a node that leaves
//!   its member list: within the failure detector's bound).
//! - During a partition each side has its own homes, so both sides may register a name, and a
//!   lookup returns what its side knows. When the partition heals, the two registrations meet
//!   at the name's home, which keeps the older one (the smaller wall-clock stamp, then the
//!   smaller node): the same winner on every node. The loser's node drops it and reports a
//!   [`NameLost`] to [`Node::subscribe_names`](crate::Node::subscribe_names).
//! - A lookup may return a ref to an actor that has just stopped or lost its name (a cache line
//!   a moment old); sending to it then fails or is dropped as for any stopped actor, and
//!   [`Node::invalidate_global`](crate::Node::invalidate_global) makes the next lookup ask
//!   the home.
//!
//! # Bounds
//!
//! From `[services]`: a node keeps at most `max_names` names as home or replica and registers
//! at most `max_names` itself (more: [`GlobalNameError::Full`]), caches `name_cache` lookups
//! (the oldest is evicted), and has at most `max_pending` directory requests waiting for an
//! answer (more: [`GlobalNameError::Busy`]); a request not answered within
//! `request_timeout_ms` fails with [`GlobalNameError::Timeout`]. Names have 1 to 255 bytes.

mod driver;

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{broadcast, oneshot};

use crate::id::NodeId;
use maquis_proto::names::{Entry, LookupError, RegisterError};

pub use maquis_proto::names::DirStats;

pub(crate) use driver::{spawn, type_of};

/// The local name of every node's directory service.
pub(crate) const SERVICE: &str = "$maquis/names";

/// Requests from the API queued for the service at most (a caller waits when it is full).
pub(crate) const COMMAND_QUEUE: usize = 1024;

/// Why a global-name operation failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GlobalNameError {
    /// Another actor holds the name.
    #[error("the global name {name:?} is held by an actor on {holder}")]
    Taken {
        /// The name.
        name: String,
        /// The node of the actor that holds it.
        holder: String,
    },
    /// The name is registered for another message type than the one asked for.
    #[error("the global name {name:?} is registered for message type {registered}")]
    TypeMismatch {
        /// The name.
        name: String,
        /// The message type it was registered with (its Rust name on the registering node).
        registered: String,
    },
    /// The actor is not a live actor of this node.
    #[error("only a live actor of this node can be registered")]
    NotLocal,
    /// The name is empty or longer than 255 bytes.
    #[error("a global name has 1 to 255 bytes")]
    BadName,
    /// The name's home, or this node, holds as many names as `services.max_names` allows.
    #[error("the directory holds as many names as it may (services.max_names)")]
    Full,
    /// Too many directory requests wait for an answer on this node
    /// (`services.max_pending`).
    #[error("too many directory requests in flight (services.max_pending)")]
    Busy,
    /// The name's home did not answer within `services.request_timeout_ms`.
    #[error("the name's home did not answer in time")]
    Timeout,
    /// The registration the home returned does not decode (a node of another version).
    #[error("the registration of {0:?} does not decode")]
    Corrupt(String),
    /// The node is shutting down.
    #[error("the node stopped")]
    Stopped,
}

impl GlobalNameError {
    fn from_register(name: &str, e: RegisterError<NodeId>) -> Self {
        match e {
            RegisterError::Taken(held) => GlobalNameError::Taken {
                name: name.to_string(),
                holder: held.owner.to_string(),
            },
            RegisterError::Full => GlobalNameError::Full,
            RegisterError::Busy => GlobalNameError::Busy,
            RegisterError::Timeout => GlobalNameError::Timeout,
            RegisterError::BadName => GlobalNameError::BadName,
        }
    }

    fn from_lookup(e: LookupError) -> Self {
        match e {
            LookupError::Busy => GlobalNameError::Busy,
            LookupError::Timeout => GlobalNameError::Timeout,
        }
    }
}

/// One of this node's global names was lost to another registration when a partition healed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameLost {
    /// The name.
    pub name: String,
    /// The node whose registration kept it.
    pub winner: NodeId,
}

impl fmt::Display for NameLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "global name {:?} lost to {}", self.name, self.winner)
    }
}

/// What a registration points at, as the directory stores it.
#[derive(Serialize, Deserialize)]
pub(crate) struct Target {
    /// The fingerprint of the actor's message type.
    pub(crate) ty: u64,
    /// The message type's Rust name (for the error of a lookup of another type).
    pub(crate) ty_name: String,
    /// The actor's node.
    pub(crate) node: NodeId,
    /// The actor.
    pub(crate) id: u64,
}

/// A directory message between two nodes' services.
#[derive(Serialize, Deserialize)]
pub(crate) struct Envelope {
    pub(crate) from: NodeId,
    pub(crate) msg: maquis_proto::names::DirMsg<NodeId>,
}

/// A request from the API to the service.
pub(crate) enum Cmd {
    Register {
        name: String,
        actor: u64,
        target: Bytes,
        /// The node that handed the name to this one, if it is a hand-over.
        replaces: Option<NodeId>,
        reply: oneshot::Sender<Result<(), GlobalNameError>>,
    },
    Unregister {
        name: String,
        reply: oneshot::Sender<bool>,
    },
    /// Stop holding a name without releasing it: the next holder takes it over.
    HandOver {
        name: String,
        reply: oneshot::Sender<bool>,
    },
    /// Release a handed-over name if no one took it over.
    ReleaseIfLeft {
        name: String,
    },
    Whereis {
        name: String,
        reply: oneshot::Sender<Result<Option<Entry<NodeId>>, GlobalNameError>>,
    },
    Invalidate {
        name: String,
    },
    Stats {
        reply: oneshot::Sender<DirStats>,
    },
}

/// The API's side of the service.
pub(crate) struct Names {
    pub(crate) queue: crate::service::Queue<Cmd>,
    pub(crate) lost: broadcast::Sender<NameLost>,
}
