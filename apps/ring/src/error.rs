//! Error types.

use maquis::{CallError, JoinError, StartError};
use thiserror::Error;

/// Why a ring operation failed.
#[derive(Debug, Error)]
pub enum RingError {
    /// The ring configuration is invalid.
    #[error("invalid ring configuration: {0}")]
    Config(String),
    /// The node could not start.
    #[error("node start: {0}")]
    Start(#[from] StartError),
    /// Joining the cluster failed.
    #[error("join: {0}")]
    Join(#[from] JoinError),
    /// Not enough replicas answered in time.
    #[error("quorum not reached: {got} of {needed} replicas answered ({detail})")]
    Quorum {
        /// Replies (or acknowledgements) needed.
        needed: usize,
        /// Replies received.
        got: usize,
        /// The first failure seen.
        detail: String,
    },
    /// No live node serves the partition.
    #[error("no live node for partition {0}")]
    Unavailable(u32),
    /// A request to a vnode failed.
    #[error("vnode request: {0}")]
    Call(#[from] CallError),
    /// The request did not complete within the request timeout.
    #[error("request timed out")]
    Timeout,
    /// Too many requests are in flight, or the node is stopping.
    #[error("overloaded or stopping")]
    Overloaded,
    /// The cluster did not converge within the timeout.
    #[error("not converged: {0}")]
    NotConverged(String),
    /// The node is joining a cluster and has not heard its ring yet; try again shortly.
    #[error("not ready: joining the cluster, its ring not heard yet")]
    NotReady,
    /// The storage backend failed.
    #[error("storage: {0}")]
    Storage(#[from] crate::storage::StorageError),
    /// Binding or serving a socket failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}
