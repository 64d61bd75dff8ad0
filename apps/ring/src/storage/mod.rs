//! Where vnodes keep their objects across restarts.
//!
//! A vnode always serves from memory (a sorted map of its partition's objects); a
//! [`Storage`] backend decides whether that map outlives the process:
//!
//! - [`Memory`] keeps nothing: a node that restarts comes back empty (the other replicas hold
//!   the data);
//! - [`Durable`] keeps every partition in a [redb](https://docs.rs/redb) database file and
//!   loads it again when the vnode starts. A write (a client's put or delete, a read repair, a
//!   handoff chunk) is acknowledged only once it is durable: the vnodes hand their writes to one
//!   writer thread, which appends everything queued to a write-ahead log as one record with one
//!   `fdatasync` (group commit) and acknowledges it. Every second a second thread applies the
//!   changes since the previous checkpoint to the database in one transaction with an fsync
//!   and deletes the log segment that held them; until then loads read them from memory over
//!   the database, and opening the database replays what only the log holds (a crash in
//!   between).
//!
//! Both keep the serving copy in memory, so a node's data must fit in its memory.
//!
//! Choose one with [`StorageConfig`] in [`RingConfig`](crate::RingConfig) (`ring serve
//! --data-dir DIR`), or pass any implementation of [`Storage`] to
//! [`Ring::start_with_storage`](crate::Ring::start_with_storage).

mod durable;
mod memory;
mod wal;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

pub use self::durable::{Durable, DurableConfig};
pub use self::memory::Memory;
use crate::vnode::Entry;

/// Which backend a ring node uses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StorageConfig {
    /// Nothing survives a restart (the default).
    #[default]
    Memory,
    /// A redb database in this directory (created if missing; one node per directory).
    Durable(PathBuf),
}

/// A storage backend failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The database could not be opened.
    #[error("cannot open the storage at {path}: {reason}")]
    Open {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// Reading stored objects failed.
    #[error("storage read failed: {0}")]
    Read(String),
    /// Committing writes failed; they are not durable.
    #[error("storage write failed: {0}")]
    Write(String),
    /// The writer's queue is full (more operations in flight than it was sized for).
    #[error("storage queue full ({0} operations waiting)")]
    Full(usize),
    /// The writer has stopped.
    #[error("storage closed")]
    Closed,
}

/// A backend: what a vnode persists, and what it finds when it starts.
///
/// Calls that do I/O (`partitions`, `load`) block and are made from blocking threads;
/// `write` and `clear` only queue the operation and return a [`Ticket`] that completes once
/// it is durable. Operations of one partition complete in the order they were queued.
pub trait Storage: Send + Sync + 'static {
    /// A short name for logs and `INFO` (`memory`, `redb`).
    fn name(&self) -> &'static str;

    /// Whether anything survives a restart. Vnodes of a backend that is not durable
    /// acknowledge writes without waiting for tickets.
    fn is_durable(&self) -> bool;

    /// The partitions that have objects stored (their vnodes start when the node does, to
    /// serve them or hand them off).
    fn partitions(&self) -> Result<Vec<u32>, StorageError>;

    /// Every stored object of a partition, in key order.
    fn load(&self, partition: u32) -> Result<Vec<Entry>, StorageError>;

    /// Stores objects of a partition (each replaces what the key held).
    fn write(&self, partition: u32, entries: Vec<Entry>) -> Ticket;

    /// Forgets a partition (its data was handed off).
    fn clear(&self, partition: u32) -> Ticket;

    /// What the backend has done so far.
    fn stats(&self) -> StorageStats;
}

/// Completes when a queued operation is durable (or has failed). A future; [`Ticket::wait`]
/// reads better where it is awaited at once.
#[derive(Debug)]
pub struct Ticket(TicketInner);

#[derive(Debug)]
enum TicketInner {
    Ready(Option<Result<(), StorageError>>),
    Pending(oneshot::Receiver<Result<(), StorageError>>),
}

impl Ticket {
    /// A ticket that is already complete.
    pub fn ready(result: Result<(), StorageError>) -> Ticket {
        Ticket(TicketInner::Ready(Some(result)))
    }

    /// A ticket completed through the returned sender (dropping it unsent completes it with
    /// [`StorageError::Closed`]).
    pub fn pending() -> (oneshot::Sender<Result<(), StorageError>>, Ticket) {
        let (tx, rx) = oneshot::channel();
        (tx, Ticket(TicketInner::Pending(rx)))
    }

    /// Waits until the operation is durable.
    pub async fn wait(self) -> Result<(), StorageError> {
        self.await
    }
}

impl Future for Ticket {
    type Output = Result<(), StorageError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.0 {
            TicketInner::Ready(r) => Poll::Ready(r.take().unwrap_or(Err(StorageError::Closed))),
            TicketInner::Pending(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or(Err(StorageError::Closed))),
        }
    }
}

/// Counters of a backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Group commits: batches made durable (each one log record and one `fdatasync`).
    pub commits: u64,
    /// Objects written.
    pub objects: u64,
    /// Partitions cleared.
    pub clears: u64,
    /// Operations that failed.
    pub errors: u64,
    /// Stored objects that could not be decoded when loaded (skipped, logged).
    pub corrupt: u64,
    /// Microseconds spent in group commits (fsync included).
    pub commit_us: u64,
    /// Log records replayed into the database when it was opened (writes a crash had left
    /// only in the log).
    pub replayed: u64,
    /// Checkpoints: batches of changes applied from the log to the database.
    pub checkpoints: u64,
}

/// The shared counters behind [`StorageStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub commits: AtomicU64,
    pub objects: AtomicU64,
    pub clears: AtomicU64,
    pub errors: AtomicU64,
    pub corrupt: AtomicU64,
    pub commit_us: AtomicU64,
    pub replayed: AtomicU64,
    pub checkpoints: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StorageStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StorageStats {
            commits: get(&self.commits),
            objects: get(&self.objects),
            clears: get(&self.clears),
            errors: get(&self.errors),
            corrupt: get(&self.corrupt),
            commit_us: get(&self.commit_us),
            replayed: get(&self.replayed),
            checkpoints: get(&self.checkpoints),
        }
    }
}
