//! Remote spawn and RPC: start an actor of a registered kind on another node, or call a
//! registered function there.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use maquis::{ActorRef, Node};
//! # async fn f(a: Node, b: Node) -> Result<(), Box<dyn std::error::Error>> {
//! // Node b offers a kind of actor and a function.
//! b.register_kind("greeter", |node: &Node, greeting: String| {
//!     node.spawn_fn(move |mut inbox| async move {
//!         while let Some(name) = inbox.recv().await {
//!             let _: String = name;
//!             println!("{greeting}, {name}");
//!         }
//!     })
//! });
//! b.register_fn("add", |(x, y): (u64, u64)| async move { x + y });
//!
//! // Node a uses them by b's name.
//! let t = Duration::from_secs(5);
//! let greeter: ActorRef<String> = a.spawn_remote("b", "greeter", &"hello".to_string(), t).await?;
//! greeter.send("world".to_string()).await?;
//! let sum: u64 = a.rpc("b", "add", &(2u64, 3u64), t).await?;
//! assert_eq!(sum, 5);
//! # Ok(()) }
//! ```
//!
//! Each node runs two services, `$maquis/spawn` and `$maquis/rpc` (actors registered under
//! those local names); a request is a call to the named node's service, routed like any call.
//!
//! - **Spawn**: the service decodes the arguments as the kind's argument type, runs its factory
//!   (which spawns the actor) and answers with the new actor's ref. The argument and message
//!   types are checked by fingerprint before anything runs: a mismatch is
//!   [`SpawnError::TypeMismatch`], arguments that do not decode are [`SpawnError::BadArgs`].
//!   [`Node::spawn_remote_link`](crate::Node::spawn_remote_link) links the child to a local
//!   actor on the child's node before the answer leaves, so no exit of the child can be missed;
//!   [`Node::spawn_remote_monitor`](crate::Node::spawn_remote_monitor) returns a monitor with
//!   the child (a child that stopped before the monitor was set resolves it with `NoProc`).
//! - **RPC**: the service runs every call as a task of its own: a slow function delays no other
//!   call (Erlang's `rex`, one server per node, serializes them; DE-Bench shows its latency
//!   growing with the cluster). At most `services.max_rpc_tasks` calls run at once on a node;
//!   beyond, a call fails at once with [`RpcError::Busy`]. A function that panics fails its call
//!   with [`RpcError::Failed`].
//!
//! Both wait at most the given timeout (a late answer is dropped), and fail with
//! `NodeDown` when the named node is not a member or goes down while they wait.

mod rpc;
mod spawn;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::Semaphore;

use crate::error::{CallError, SendError};

pub(crate) use rpc::{Function, RpcReq, RPC_SERVICE};
pub(crate) use spawn::{Kind, SpawnReq, SPAWN_SERVICE};

/// Starts a node's spawn and RPC services.
pub(crate) fn spawn_services(node: &crate::Node) {
    spawn::spawn_service(node);
    rpc::spawn_service(node);
}

/// Why a remote spawn failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SpawnError {
    /// The node is not a member, or went down before it answered.
    #[error("node {0} is down or not a member")]
    NodeDown(String),
    /// The node has no kind of this name.
    #[error("node has no actor kind {0:?}")]
    UnknownKind(String),
    /// The kind takes other arguments, or its actors another message type, than asked for.
    #[error("actor kind {kind:?} is ({registered})")]
    TypeMismatch {
        /// The kind.
        kind: String,
        /// Its argument and message types, by their Rust names on the remote node.
        registered: String,
    },
    /// The arguments did not decode as the kind's argument type.
    #[error("bad arguments: {0}")]
    BadArgs(String),
    /// The child stopped before it could be linked.
    #[error("the child stopped before it could be linked")]
    Exited,
    /// No answer came within the timeout.
    #[error("remote spawn timed out")]
    Timeout,
    /// The request or the answer could not be encoded, sent or decoded.
    #[error("remote spawn failed: {0}")]
    Failed(String),
}

/// Why an RPC failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RpcError {
    /// The node is not a member, or went down before it answered.
    #[error("node {0} is down or not a member")]
    NodeDown(String),
    /// The node has no function of this name.
    #[error("node has no function {0:?}")]
    UnknownFunction(String),
    /// The function takes or returns other types than asked for.
    #[error("function {function:?} is ({registered})")]
    TypeMismatch {
        /// The function.
        function: String,
        /// Its argument and result types, by their Rust names on the remote node.
        registered: String,
    },
    /// The arguments did not decode as the function's argument type.
    #[error("bad arguments: {0}")]
    BadArgs(String),
    /// The node runs `services.max_rpc_tasks` calls already.
    #[error("the node runs as many calls as it may (services.max_rpc_tasks)")]
    Busy,
    /// The function panicked.
    #[error("the function failed: {0}")]
    Failed(String),
    /// No answer came within the timeout.
    #[error("rpc timed out")]
    Timeout,
    /// The request or the answer could not be encoded, sent or decoded.
    #[error("rpc failed: {0}")]
    Transport(String),
}

/// What a service answers instead of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Refusal {
    Unknown,
    TypeMismatch(String),
    BadArgs(String),
    Busy,
    Exited,
    Failed(String),
}

/// The kinds and functions a node offers, and the bound on running calls.
pub(crate) struct Registry {
    pub(crate) kinds: RwLock<HashMap<String, Arc<Kind>>>,
    pub(crate) functions: RwLock<HashMap<String, Arc<Function>>>,
    pub(crate) rpc_permits: Arc<Semaphore>,
}

impl Registry {
    pub(crate) fn new(max_rpc_tasks: usize) -> Self {
        Registry {
            kinds: RwLock::default(),
            functions: RwLock::default(),
            rpc_permits: Arc::new(Semaphore::new(max_rpc_tasks)),
        }
    }
}

/// How a failed call to a service reads for the caller.
pub(crate) enum CallFailure {
    /// The node is unreachable, down, or went down while the call waited.
    NodeDown,
    /// No answer within the timeout.
    Timeout,
    /// Anything else (encoding, decoding, a missing service).
    Other(String),
}

impl From<CallError> for CallFailure {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Send(SendError::Unreachable(_) | SendError::StaleIncarnation { .. })
            | CallError::NoReply(_) => CallFailure::NodeDown,
            CallError::Timeout => CallFailure::Timeout,
            other => CallFailure::Other(other.to_string()),
        }
    }
}

/// A type's Rust name, cut to 128 bytes (for error messages only).
pub(crate) fn short_type_name<T>() -> String {
    let mut name = std::any::type_name::<T>().to_string();
    if name.len() > 128 {
        let mut cut = 128;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    name
}
