//! The durable backend: one redb database per node (one table, keys prefixed by their
//! partition) and a write-ahead log, written by one thread: whatever is queued goes into the
//! log as one record (one `fdatasync`) and into the database without an fsync; a checkpoint
//! every second makes the database durable and empties the log; opening replays the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, TableDefinition, TableError};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use super::wal::{self, Recovered, Wal};
use super::{Counters, Storage, StorageError, StorageStats, Ticket};
use crate::object::Object;
use crate::vnode::Entry;

/// The database file in the data directory.
pub const FILE_NAME: &str = "ring.redb";

/// The first byte of every stored value: the encoding's version (postcard of [`Object`]).
const FORMAT: u8 = 1;

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
    /// How often the database is made durable on its own, so that the log can be emptied
    /// (while writes come in). Default 1 s.
    pub checkpoint_every: Duration,
    /// The log is emptied (after making the database durable) once it holds this many bytes.
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

enum Op {
    Write {
        partition: u32,
        entries: Vec<Entry>,
        done: oneshot::Sender<Result<(), StorageError>>,
    },
    Clear {
        partition: u32,
        done: oneshot::Sender<Result<(), StorageError>>,
    },
}

impl Op {
    fn size(&self) -> (usize, usize) {
        match self {
            Op::Write { entries, .. } => (
                entries.len(),
                entries.iter().map(|(k, o)| k.len() + o.size()).sum(),
            ),
            Op::Clear { .. } => (1, 0),
        }
    }

    fn finish(self, result: Result<(), StorageError>) {
        let done = match self {
            Op::Write { done, .. } | Op::Clear { done, .. } => done,
        };
        let _ = done.send(result);
    }
}

/// Partitions in a redb database: a write is acknowledged once committed with an fsync.
///
/// Dropping it stops the writer thread after the queued operations and closes the file.
pub struct Durable {
    path: PathBuf,
    db: Arc<Database>,
    tx: Option<mpsc::Sender<Op>>,
    writer: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    queue: usize,
}

impl std::fmt::Debug for Durable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Durable").field("path", &self.path).finish()
    }
}

/// Every partition's objects, in one table: a key is its partition (4 bytes, big-endian) and
/// then the object's key, so that a commit updates one tree however many partitions it
/// touches, and a partition is one key range.
const OBJECTS: TableDefinition<'static, &'static [u8], &'static [u8]> =
    TableDefinition::new("objects");

/// The objects table, opened for reading.
type Objects = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The stored key of an object.
fn stored_key(partition: u32, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + key.len());
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// The stored keys of a partition: `[p, p + 1)` as prefixes.
fn bounds(partition: u32) -> (Vec<u8>, Option<Vec<u8>>) {
    let lo = partition.to_be_bytes().to_vec();
    let hi = partition.checked_add(1).map(|n| n.to_be_bytes().to_vec());
    (lo, hi)
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
        let (mut log, found) =
            Wal::open(&dir.join(wal::FILE_NAME)).map_err(|e| open_err(format!("log: {e}")))?;
        replay(&db, &mut log, found, &counters).map_err(|e| open_err(e.to_string()))?;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let writer = {
            let (db, counters, config) = (db.clone(), counters.clone(), config.clone());
            std::thread::Builder::new()
                .name("ring-storage".into())
                .spawn(move || write_loop(&db, log, rx, &config, &counters))
                .map_err(|e| open_err(e.to_string()))?
        };
        tracing::info!(path = %path.display(), "durable storage open");
        Ok(Durable {
            path,
            db,
            tx: Some(tx),
            writer: Some(writer),
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
            let Some(p) = k
                .value()
                .get(..4)
                .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            else {
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

    fn load(&self, partition: u32) -> Result<Vec<Entry>, StorageError> {
        let read = |e: &dyn std::fmt::Display| StorageError::Read(e.to_string());
        let Some(table) = self.objects()? else {
            return Ok(Vec::new());
        };
        let (lo, hi) = bounds(partition);
        let rows = match &hi {
            Some(hi) => table.range(lo.as_slice()..hi.as_slice()),
            None => table.range(lo.as_slice()..),
        }
        .map_err(|e| read(&e))?;
        let mut out = Vec::new();
        for row in rows {
            let (k, v) = row.map_err(|e| read(&e))?;
            let key = Bytes::copy_from_slice(&k.value()[4..]);
            match decode(v.value()) {
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

fn encode(object: &Object) -> Result<Vec<u8>, StorageError> {
    let mut out = vec![FORMAT];
    postcard::to_io(object, &mut out).map_err(|e| StorageError::Write(e.to_string()))?;
    Ok(out)
}

fn decode(bytes: &[u8]) -> Option<Object> {
    match bytes.split_first() {
        Some((&FORMAT, rest)) => postcard::from_bytes(rest).ok(),
        _ => None,
    }
}

/// One change to the database, as the log records it.
#[derive(Debug, Serialize, Deserialize)]
enum Change {
    /// A key of a partition now holds this encoded object.
    Put(u32, Vec<u8>, Vec<u8>),
    /// A partition is emptied.
    Clear(u32),
}

fn changes(batch: &[Op]) -> Result<Vec<Change>, StorageError> {
    let mut out = Vec::new();
    for op in batch {
        match op {
            Op::Write {
                partition, entries, ..
            } => {
                for (key, object) in entries {
                    out.push(Change::Put(*partition, key.to_vec(), encode(object)?));
                }
            }
            Op::Clear { partition, .. } => out.push(Change::Clear(*partition)),
        }
    }
    Ok(out)
}

/// Applies changes in one transaction.
fn apply(db: &Database, changes: &[Change], durability: Durability) -> Result<(), StorageError> {
    let write = |e: &dyn std::fmt::Display| StorageError::Write(e.to_string());
    let mut txn = db.begin_write().map_err(|e| write(&e))?;
    txn.set_durability(durability).map_err(|e| write(&e))?;
    {
        let mut table = txn.open_table(OBJECTS).map_err(|e| write(&e))?;
        for change in changes {
            match change {
                Change::Put(partition, key, value) => {
                    table
                        .insert(stored_key(*partition, key).as_slice(), value.as_slice())
                        .map_err(|e| write(&e))?;
                }
                Change::Clear(partition) => {
                    let (lo, hi) = bounds(*partition);
                    let r = match &hi {
                        Some(hi) => table.retain_in(lo.as_slice()..hi.as_slice(), |_, _| false),
                        None => table.retain_in(lo.as_slice().., |_, _| false),
                    };
                    r.map_err(|e| write(&e))?;
                }
            }
        }
    }
    txn.commit().map_err(|e| write(&e))
}

/// Makes the database durable (with the commits made without an fsync since the last
/// checkpoint), then empties the log.
fn checkpoint(db: &Database, log: &mut Wal) -> Result<(), StorageError> {
    apply(db, &[], Durability::Immediate)?;
    log.reset()
        .map_err(|e| StorageError::Write(format!("log: {e}")))
}

/// At open: the log's records (written after the last checkpoint) go into the database.
fn replay(
    db: &Database,
    log: &mut Wal,
    found: Recovered,
    c: &Counters,
) -> Result<(), StorageError> {
    if found.dropped > 0 {
        tracing::warn!(
            bytes = found.dropped,
            "the storage log ends with an incomplete record (a write a crash cut short); dropped"
        );
    }
    if found.records.is_empty() {
        return log
            .reset()
            .map_err(|e| StorageError::Write(format!("log: {e}")));
    }
    let mut all = Vec::new();
    for record in &found.records {
        match postcard::from_bytes::<Vec<Change>>(record) {
            Ok(changes) => all.extend(changes),
            Err(e) => {
                // A record with a valid checksum that does not decode: another format. What
                // follows it is not applied either (order matters).
                Counters::add(&c.corrupt, 1);
                tracing::error!(error = %e, "a storage log record does not decode; replay stops");
                break;
            }
        }
    }
    tracing::info!(
        records = found.records.len(),
        changes = all.len(),
        "storage log replayed"
    );
    Counters::add(&c.replayed, found.records.len() as u64);
    apply(db, &all, Durability::Immediate)?;
    log.reset()
        .map_err(|e| StorageError::Write(format!("log: {e}")))
}

/// The writer thread: takes the next operation, adds whatever else is queued (up to the batch
/// limits), appends them to the log as one record with one `fdatasync`, applies them to the
/// database without an fsync, completes their tickets; every `checkpoint_every` (or once the
/// log holds `log_max_bytes`) it makes the database durable and empties the log.
fn write_loop(
    db: &Database,
    mut log: Wal,
    mut rx: mpsc::Receiver<Op>,
    config: &DurableConfig,
    c: &Counters,
) {
    let mut last_checkpoint = Instant::now();
    while let Some(first) = rx.blocking_recv() {
        let (mut objects, mut bytes) = first.size();
        let mut batch = vec![first];
        while objects < config.max_batch_objects && bytes < config.max_batch_bytes {
            match rx.try_recv() {
                Ok(op) => {
                    let (o, b) = op.size();
                    objects += o;
                    bytes += b;
                    batch.push(op);
                }
                Err(_) => break,
            }
        }
        let started = Instant::now();
        let result = changes(&batch).and_then(|ch| {
            let record =
                postcard::to_stdvec(&ch).map_err(|e| StorageError::Write(e.to_string()))?;
            log.append(&record)
                .map_err(|e| StorageError::Write(format!("log: {e}")))?;
            apply(db, &ch, Durability::None)
        });
        Counters::add(&c.commit_us, started.elapsed().as_micros() as u64);
        match &result {
            Ok(()) => {
                Counters::add(&c.commits, 1);
                for op in &batch {
                    match op {
                        Op::Write { entries, .. } => {
                            Counters::add(&c.objects, entries.len() as u64)
                        }
                        Op::Clear { .. } => Counters::add(&c.clears, 1),
                    }
                }
            }
            Err(e) => {
                Counters::add(&c.errors, batch.len() as u64);
                tracing::error!(error = %e, operations = batch.len(), "storage commit failed");
            }
        }
        for op in batch {
            op.finish(result.clone());
        }
        if last_checkpoint.elapsed() >= config.checkpoint_every || log.len() >= config.log_max_bytes
        {
            last_checkpoint = Instant::now();
            if let Err(e) = checkpoint(db, &mut log) {
                Counters::add(&c.errors, 1);
                tracing::error!(error = %e, "storage checkpoint failed (the log keeps the writes)");
            }
        }
    }
    #[cfg(test)]
    if config.crash_on_drop {
        return;
    }
    if let Err(e) = checkpoint(db, &mut log) {
        tracing::error!(error = %e, "final storage checkpoint failed (the log keeps the writes)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::Version;

    fn entry(key: &str, value: Option<&str>, ts: u64) -> Entry {
        let object = Object {
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            version: Version { ts, origin: 9 },
        };
        (Bytes::copy_from_slice(key.as_bytes()), object)
    }

    fn wait(t: Ticket) -> Result<(), StorageError> {
        futures::executor::block_on(t)
    }

    #[test]
    fn what_is_written_is_there_after_a_reopen_until_cleared() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Durable::open(dir.path(), DurableConfig::default()).unwrap();
            assert_eq!(s.partitions().unwrap(), Vec::<u32>::new());
            wait(s.write(3, vec![entry("b", Some("2"), 2), entry("a", Some("1"), 1)])).unwrap();
            wait(s.write(5, vec![entry("gone", None, 7)])).unwrap();
            // A later write of a key replaces it.
            wait(s.write(3, vec![entry("a", Some("1+"), 3)])).unwrap();
            let st = s.stats();
            assert_eq!(st.objects, 4);
            assert!(st.commits >= 1 && st.commits <= 3, "{st:?}");
        }
        let s = Durable::open(dir.path(), DurableConfig::default()).unwrap();
        assert_eq!(s.partitions().unwrap(), vec![3, 5]);
        assert_eq!(
            s.load(3).unwrap(),
            vec![entry("a", Some("1+"), 3), entry("b", Some("2"), 2)]
        );
        assert_eq!(s.load(5).unwrap(), vec![entry("gone", None, 7)]);
        assert_eq!(s.load(4).unwrap(), vec![]);
        wait(s.clear(3)).unwrap();
        assert_eq!(s.partitions().unwrap(), vec![5]);
        assert_eq!(s.load(3).unwrap(), vec![]);
        // Clearing a partition that holds nothing is fine.
        wait(s.clear(60)).unwrap();
    }

    #[test]
    fn what_only_the_log_holds_after_a_crash_is_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = DurableConfig {
            // No checkpoint while it runs, and none at the end: as if killed.
            checkpoint_every: Duration::from_secs(3600),
            crash_on_drop: true,
            ..DurableConfig::default()
        };
        {
            let s = Durable::open(dir.path(), cfg).unwrap();
            wait(s.write(2, vec![entry("a", Some("1"), 1)])).unwrap();
            wait(s.write(2, vec![entry("a", Some("2"), 2), entry("b", Some("x"), 1)])).unwrap();
            wait(s.clear(9)).unwrap();
            assert_eq!(s.stats().replayed, 0);
        }
        // A torn record at the end (the crash cut a write short) is dropped.
        let log = dir.path().join(wal::FILE_NAME);
        let mut bytes = std::fs::read(&log).unwrap();
        assert!(!bytes.is_empty(), "the writes are in the log");
        bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
        std::fs::write(&log, &bytes).unwrap();
        let s = Durable::open(dir.path(), DurableConfig::default()).unwrap();
        assert_eq!(s.stats().replayed, 3);
        assert_eq!(
            s.load(2).unwrap(),
            vec![entry("a", Some("2"), 2), entry("b", Some("x"), 1)]
        );
        // Replayed into the database: the log is empty again.
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_the_rest_completes() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = DurableConfig {
            queue: 1,
            ..DurableConfig::default()
        };
        let s = Durable::open(dir.path(), cfg).unwrap();
        // Hold redb's write lock: the writer takes one operation and waits for it.
        let held = s.db.begin_write().unwrap();
        let tickets: Vec<Ticket> = (0..3)
            .map(|i| s.write(i, vec![entry("k", Some("v"), 1)]))
            .collect();
        drop(held);
        let results: Vec<_> = tickets.into_iter().map(wait).collect();
        // One in the writer's hands and one queued at most: the third is refused (the
        // second too if the writer had not taken the first yet), the first is stored.
        assert!(results[0].is_ok());
        assert_eq!(results[2], Err(StorageError::Full(1)));
        let refused = results.iter().filter(|r| r.is_err()).count();
        assert_eq!(s.stats().errors, refused as u64);
        assert_eq!(s.partitions().unwrap().len(), 3 - refused);
    }

    #[test]
    fn an_object_that_does_not_decode_is_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let s = Durable::open(dir.path(), DurableConfig::default()).unwrap();
        wait(s.write(1, vec![entry("good", Some("v"), 1)])).unwrap();
        let txn = s.db.begin_write().unwrap();
        {
            let mut t = txn.open_table(OBJECTS).unwrap();
            t.insert(
                stored_key(1, b"bad").as_slice(),
                [FORMAT, 0xff, 0xff].as_slice(),
            )
            .unwrap();
            t.insert(stored_key(1, b"future").as_slice(), [FORMAT + 1].as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
        assert_eq!(s.load(1).unwrap(), vec![entry("good", Some("v"), 1)]);
        assert_eq!(s.stats().corrupt, 2);
    }

    #[test]
    fn a_directory_that_cannot_be_created_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"not a directory").unwrap();
        let err = Durable::open(&file, DurableConfig::default()).unwrap_err();
        assert!(matches!(err, StorageError::Open { .. }), "{err}");
    }
}
