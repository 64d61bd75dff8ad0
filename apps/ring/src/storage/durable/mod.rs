//! The durable backend: one redb database per node (one table, keys prefixed by their
//! partition) behind a write-ahead log.
//!
//! Two threads. The *writer* takes whatever is queued, appends it to the log as one record
//! with one `fdatasync`, and acknowledges it; the changes also go into an in-memory
//! *generation* (the latest value of each key, the partitions cleared), which loads read over
//! the database. Every `checkpoint_every` (or once the log segment holds `log_max_bytes`) the
//! writer seals the generation and its log segment and goes on in a new one; the
//! *checkpointer* applies the sealed generation to the database in one transaction with an
//! fsync, which also records the number of the last segment the database holds, and then
//! deletes that segment. Opening replays the segments the database does not hold yet.

mod layout;
mod pending;
mod threads;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use redb::{Database, ReadableDatabase, TableError};
use tokio::sync::{mpsc, oneshot};

use self::layout::{bounds, decode, partition_of, Objects, OBJECTS};
use self::pending::{Pending, Slice};
use self::threads::{checkpoint_loop, replay, write_loop, Op};
use super::wal::Wal;
use super::{Counters, Storage, StorageError, StorageStats, Ticket};
use crate::vnode::Entry;

/// The database file in the data directory.
pub const FILE_NAME: &str = "ring.redb";

/// Settings of the [`Durable`] backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurableConfig {
    /// Operations (a vnode's batch of writes, or a clear) waiting for the writer at most; one
    /// more fails at once with [`StorageError::Full`]. A vnode has at most two in flight, so
    /// the default, 4,096, is never reached with the ring's 1,024 partitions at most.
    pub queue: usize,
    /// Objects committed in one transaction at most (a larger single operation goes alone).
    /// Default 65,536.
    pub max_batch_objects: usize,
    /// Key and value bytes committed in one transaction at most. Default 64 MiB.
    pub max_batch_bytes: usize,
    /// redb's page cache, in bytes. Default 64 MiB.
    pub cache_bytes: usize,
    /// How often (while writes come in) the writer seals the changes since the last time and
    /// their log segment, for the checkpointer to apply to the database. Default 1 s.
    pub checkpoint_every: Duration,
    /// A log segment is sealed once it holds this many bytes, even before `checkpoint_every`.
    /// If the previous one is still being applied then, the writer waits for it: the changes
    /// not yet in the database (held in memory, and in the log) stay under about twice this.
    /// Default 64 MiB.
    pub log_max_bytes: u64,
    /// Tests: leave the database without its final checkpoint when dropped, as a crash would.
    #[cfg(test)]
    pub(crate) crash_on_drop: bool,
}

impl Default for DurableConfig {
    fn default() -> Self {
        DurableConfig {
            queue: 4096,
            max_batch_objects: 65_536,
            max_batch_bytes: 64 << 20,
            cache_bytes: 64 << 20,
            checkpoint_every: Duration::from_secs(1),
            log_max_bytes: 64 << 20,
            #[cfg(test)]
            crash_on_drop: false,
        }
    }
}

/// Partitions in a redb database behind a write-ahead log: a write is acknowledged once its
/// log record is on disk (see the module docs).
///
/// Dropping it stops the writer after the queued operations, applies what the database does
/// not hold yet, and closes the files.
pub struct Durable {
    path: PathBuf,
    db: Arc<Database>,
    tx: Option<mpsc::Sender<Op>>,
    writer: Option<JoinHandle<()>>,
    pending: Arc<Pending>,
    counters: Arc<Counters>,
    queue: usize,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable").field("path", &self.path).finish()
    }
}

impl Durable {
    /// Opens (or creates) the database in directory `dir` and starts its writer thread.
    pub fn open(dir: impl AsRef<Path>, config: DurableConfig) -> Result<Durable, StorageError> {
        let dir = dir.as_ref();
        let open_err = |reason: String| StorageError::Open {
            path: dir.display().to_string(),
            reason,
        };
        std::fs::create_dir_all(dir).map_err(|e| open_err(e.to_string()))?;
        let path = dir.join(FILE_NAME);
        let db = Database::builder()
            .set_cache_size(config.cache_bytes)
            .create(&path)
            .map_err(|e| open_err(e.to_string()))?;
        let counters = Arc::new(Counters::default());
        let last = replay(&db, dir, &counters).map_err(|e| open_err(e.to_string()))?;
        let log = Wal::create(dir, last + 1).map_err(|e| open_err(format!("log: {e}")))?;
        let db = Arc::new(db);
        let pending = Arc::new(Pending::default());
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let checkpointer = {
            let (db, pending, counters) = (db.clone(), pending.clone(), counters.clone());
            let (sealed_tx, sealed_rx) = std::sync::mpsc::sync_channel(1);
            let dir = dir.to_path_buf();
            let handle = std::thread::Builder::new()
                .name("ring-checkpoint".into())
                .spawn(move || checkpoint_loop(&db, &dir, &pending, sealed_rx, &counters))
                .map_err(|e| open_err(e.to_string()))?;
            (sealed_tx, handle)
        };
        let writer = {
            let (pending, counters, config) = (pending.clone(), counters.clone(), config.clone());
            std::thread::Builder::new()
                .name("ring-storage".into())
                .spawn(move || {
                    let (sealed_tx, handle) = checkpointer;
                    write_loop(log, rx, sealed_tx, &pending, &config, &counters);
                    let _ = handle.join();
                })
                .map_err(|e| open_err(e.to_string()))?
        };
        tracing::info!(path = %path.display(), "durable storage open");
        Ok(Durable {
            path,
            db,
            tx: Some(tx),
            writer: Some(writer),
            pending,
            counters,
            queue: config.queue.max(1),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The objects table, for reading (`None` before anything was ever written).
    fn objects(&self) -> Result<Option<Objects>, StorageError> {
        let read = |e: &dyn std::fmt::Display| StorageError::Read(e.to_string());
        let txn = self.db.begin_read().map_err(|e| read(&e))?;
        match txn.open_table(OBJECTS) {
            Ok(t) => Ok(Some(t)),
            Err(TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(read(&e)),
        }
    }

    fn submit(&self, make: impl FnOnce(oneshot::Sender<Result<(), StorageError>>) -> Op) -> Ticket {
        let (done, ticket) = Ticket::pending();
        let Some(tx) = &self.tx else {
            return Ticket::ready(Err(StorageError::Closed));
        };
        match tx.try_send(make(done)) {
            Ok(()) => ticket,
            Err(e) => {
                Counters::add(&self.counters.errors, 1);
                let err = match e {
                    mpsc::error::TrySendError::Full(_) => StorageError::Full(self.queue),
                    mpsc::error::TrySendError::Closed(_) => StorageError::Closed,
                };
                tracing::error!(error = %err, "storage operation refused");
                Ticket::ready(Err(err))
            }
        }
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        self.tx = None;
        self.pending.stopping.store(true, Ordering::Relaxed);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl Storage for Durable {
    fn name(&self) -> &'static str {
        "redb"
    }

    fn is_durable(&self) -> bool {
        true
    }

    fn partitions(&self) -> Result<Vec<u32>, StorageError> {
        // The changes not in the database yet, oldest first, copied before the database is
        // read: a generation applied meanwhile is then in both, which comes to the same.
        let overlays: Vec<(BTreeSet<u32>, BTreeSet<u32>)> = {
            let g = self.pending.lock();
            g.oldest_first()
                .map(|g| (g.cleared.clone(), g.written()))
                .collect()
        };
        let mut out: BTreeSet<u32> = self.stored_partitions()?.into_iter().collect();
        for (cleared, written) in overlays {
            out.retain(|p| !cleared.contains(p));
            out.extend(written);
        }
        Ok(out.into_iter().collect())
    }

    fn load(&self, partition: u32) -> Result<Vec<Entry>, StorageError> {
        // As in `partitions`: the pending changes first, then the database under them.
        let overlays: Vec<Slice> = {
            let g = self.pending.lock();
            g.oldest_first().map(|g| g.partition(partition)).collect()
        };
        let mut objects: BTreeMap<Vec<u8>, Vec<u8>> = self.stored(partition)?;
        for slice in overlays {
            if slice.cleared {
                objects.clear();
            }
            objects.extend(slice.puts);
        }
        let mut out = Vec::with_capacity(objects.len());
        for (k, v) in objects {
            let key = Bytes::copy_from_slice(&k[4..]);
            match decode(&v) {
                Some(object) => out.push((key, object)),
                None => {
                    Counters::add(&self.counters.corrupt, 1);
                    tracing::error!(
                        partition,
                        key = ?key,
                        "stored object does not decode; skipped"
                    );
                }
            }
        }
        Ok(out)
    }

    fn write(&self, partition: u32, entries: Vec<Entry>) -> Ticket {
        if entries.is_empty() {
            return Ticket::ready(Ok(()));
        }
        self.submit(|done| Op::Write {
            partition,
            entries,
            done,
        })
    }

    fn clear(&self, partition: u32) -> Ticket {
        self.submit(|done| Op::Clear { partition, done })
    }

    fn stats(&self) -> StorageStats {
        self.counters.snapshot()
    }
}

impl Durable {
    /// The partitions the database holds objects of.
    fn stored_partitions(&self) -> Result<Vec<u32>, StorageError> {
        let read = |e: &dyn std::fmt::Display| StorageError::Read(e.to_string());
        let Some(table) = self.objects()? else {
            return Ok(Vec::new());
        };
        // Jump from one partition's first key to the next partition's.
        let mut out = Vec::new();
        let mut from = 0u32.to_be_bytes().to_vec();
        loop {
            let mut range = table.range(from.as_slice()..).map_err(|e| read(&e))?;
            let Some(row) = range.next() else { break };
            let (k, _) = row.map_err(|e| read(&e))?;
            let Some(p) = partition_of(k.value()) else {
                break;
            };
            out.push(p);
            match p.checked_add(1) {
                Some(n) => from = n.to_be_bytes().to_vec(),
                None => break,
            }
        }
        Ok(out)
    }

    /// The database's objects of one partition (stored key → encoded object).
    fn stored(&self, partition: u32) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, StorageError> {
        let read = |e: &dyn std::fmt::Display| StorageError::Read(e.to_string());
        let Some(table) = self.objects()? else {
            return Ok(BTreeMap::new());
        };
        let (lo, hi) = bounds(partition);
        let rows = match &hi {
            Some(hi) => table.range(lo.as_slice()..hi.as_slice()),
            None => table.range(lo.as_slice()..),
        }
        .map_err(|e| read(&e))?;
        let mut out = BTreeMap::new();
        for row in rows {
            let (k, v) = row.map_err(|e| read(&e))?;
            out.insert(k.value().to_vec(), v.value().to_vec());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
