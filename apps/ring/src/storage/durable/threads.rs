//! The two threads of the durable backend: the writer (group commits to the log) and the
//! checkpointer (sealed generations into the database), and the replay at open.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redb::Database;
use tokio::sync::{mpsc, oneshot};

use super::layout::{apply, encode, log_applied};
use super::pending::{Change, Generation, Pending};
use super::DurableConfig;
use crate::storage::wal::{self, Wal};
use crate::storage::{Counters, StorageError};
use crate::vnode::Entry;

/// One operation for the writer.
pub(super) enum Op {
    /// Objects of a partition to store.
    Write {
        partition: u32,
        entries: Vec<Entry>,
        done: oneshot::Sender<Result<(), StorageError>>,
    },
    /// A partition to empty.
    Clear {
        partition: u32,
        done: oneshot::Sender<Result<(), StorageError>>,
    },
}

impl Op {
    /// Objects and bytes it writes.
    pub(super) fn size(&self) -> (usize, usize) {
        match self {
            Op::Write { entries, .. } => (
                entries.len(),
                entries.iter().map(|(k, o)| k.len() + o.size()).sum(),
            ),
            Op::Clear { .. } => (1, 0),
        }
    }

    /// Completes its ticket.
    pub(super) fn finish(self, result: Result<(), StorageError>) {
        let done = match self {
            Op::Write { done, .. } | Op::Clear { done, .. } => done,
        };
        let _ = done.send(result);
    }
}

/// A batch as the log records it.
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

/// Deletes the log segments up to `upto` (the database holds them).
fn delete_segments(dir: &Path, upto: u64) {
    let result = wal::segments(dir).and_then(|segs| {
        for (_, path) in segs.into_iter().filter(|(seq, _)| *seq <= upto) {
            std::fs::remove_file(path)?;
        }
        wal::sync_dir(dir)
    });
    if let Err(e) = result {
        // Harmless: the database records which segments it holds, and those are not replayed.
        tracing::warn!(error = %e, "old storage log segments not deleted");
    }
}

/// At open: the records of the segments the database does not hold go into it, and the
/// segments are deleted. Returns the number of the last segment seen.
pub(super) fn replay(db: &Database, dir: &Path, c: &Counters) -> Result<u64, StorageError> {
    let io = |e: std::io::Error| StorageError::Write(format!("log: {e}"));
    let applied = log_applied(db)?;
    let segments = wal::segments(dir).map_err(io)?;
    let last = segments
        .iter()
        .map(|(seq, _)| *seq)
        .chain(applied)
        .max()
        .unwrap_or(0);
    let mut g = Generation::default();
    let mut records = 0u64;
    'segments: for (seq, path) in segments
        .iter()
        .filter(|(seq, _)| applied.is_none_or(|a| *seq > a))
    {
        let found = wal::read(path).map_err(io)?;
        for record in &found.records {
            match postcard::from_bytes::<Vec<Change>>(record) {
                Ok(changes) => g.add(changes),
                Err(e) => {
                    // A record with a valid checksum that does not decode: another format. What
                    // follows it is not applied either (order matters).
                    Counters::add(&c.corrupt, 1);
                    tracing::error!(error = %e, segment = seq, "a storage log record does not decode; replay stops");
                    break 'segments;
                }
            }
            records += 1;
        }
        if found.dropped > 0 {
            tracing::warn!(
                bytes = found.dropped,
                segment = seq,
                "a storage log segment ends with an incomplete record (a write a crash cut short); dropped"
            );
        }
    }
    if records > 0 {
        tracing::info!(records, changes = g.puts.len(), "storage log replayed");
    }
    Counters::add(&c.replayed, records);
    apply(db, &g, last)?;
    delete_segments(dir, last);
    Ok(last)
}

/// The checkpointer thread: applies each sealed generation (its log segment's number comes on
/// `sealed`), then deletes the segment. A failed commit is retried every second; the writer
/// meanwhile goes on until its segment is full, then waits.
pub(super) fn checkpoint_loop(
    db: &Database,
    dir: &Path,
    pending: &Pending,
    sealed: std::sync::mpsc::Receiver<u64>,
    c: &Counters,
) {
    apply_sealed(db, dir, pending, sealed, c);
    pending.checkpointer_gone.store(true, Ordering::Relaxed);
    pending.applied.notify_all();
}

fn apply_sealed(
    db: &Database,
    dir: &Path,
    pending: &Pending,
    sealed: std::sync::mpsc::Receiver<u64>,
    c: &Counters,
) {
    while let Ok(seq) = sealed.recv() {
        let Some(g) = pending.lock().sealed.clone() else {
            continue;
        };
        loop {
            match apply(db, &g, seq) {
                Ok(()) => break,
                Err(e) => {
                    Counters::add(&c.errors, 1);
                    tracing::error!(error = %e, "storage checkpoint failed (the log keeps the writes); retrying");
                    if pending.stopping.load(Ordering::Relaxed) {
                        // Left in the log, for the next open to replay.
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        Counters::add(&c.checkpoints, 1);
        pending.lock().sealed = None;
        pending.applied.notify_all();
        delete_segments(dir, seq);
    }
}

/// The writer thread: takes the next operation, adds whatever else is queued (up to the batch
/// limits), appends them to the log as one record with one `fdatasync`, adds them to the
/// current generation and completes their tickets; then seals the generation if it is time.
/// When the queue closes, seals what is left for the checkpointer.
pub(super) fn write_loop(
    mut log: Wal,
    mut rx: mpsc::Receiver<Op>,
    sealed: std::sync::mpsc::SyncSender<u64>,
    pending: &Pending,
    config: &DurableConfig,
    c: &Counters,
) {
    let mut since = Instant::now();
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
            Ok(ch)
        });
        Counters::add(&c.commit_us, started.elapsed().as_micros() as u64);
        let result = match result {
            Ok(ch) => {
                Counters::add(&c.commits, 1);
                for op in &batch {
                    match op {
                        Op::Write { entries, .. } => {
                            Counters::add(&c.objects, entries.len() as u64)
                        }
                        Op::Clear { .. } => Counters::add(&c.clears, 1),
                    }
                }
                // Readable by `load` before it is acknowledged.
                pending.lock().current.add(ch);
                Ok(())
            }
            Err(e) => {
                Counters::add(&c.errors, batch.len() as u64);
                tracing::error!(error = %e, operations = batch.len(), "storage commit failed");
                Err(e)
            }
        };
        for op in batch {
            op.finish(result.clone());
        }
        let full = log.len() >= config.log_max_bytes;
        if (full || since.elapsed() >= config.checkpoint_every)
            && seal(&mut log, &sealed, pending, full, c)
        {
            since = Instant::now();
        }
    }
    #[cfg(test)]
    if config.crash_on_drop {
        return;
    }
    seal(&mut log, &sealed, pending, true, c);
}

/// Hands the current generation and its segment to the checkpointer, the writer going on in a
/// new segment. If the previous one is still being applied: waits for it when `wait`, else
/// leaves it for later. Returns whether it sealed.
fn seal(
    log: &mut Wal,
    sealed: &std::sync::mpsc::SyncSender<u64>,
    pending: &Pending,
    wait: bool,
    c: &Counters,
) -> bool {
    let mut g = pending.lock();
    if g.current.is_empty() {
        return false;
    }
    while g.sealed.is_some() {
        if !wait || pending.checkpointer_gone.load(Ordering::Relaxed) {
            return false;
        }
        let (next, _) = pending
            .applied
            .wait_timeout(g, Duration::from_secs(1))
            .unwrap_or_else(|e| e.into_inner());
        g = next;
    }
    let seq = match log.rotate() {
        Ok(seq) => seq,
        Err(e) => {
            // Goes on in the same segment; the next seal tries again.
            Counters::add(&c.errors, 1);
            tracing::error!(error = %e, "storage log segment not rotated");
            return false;
        }
    };
    g.sealed = Some(Arc::new(std::mem::take(&mut g.current)));
    drop(g);
    // Room for one: the checkpointer has taken the previous number (nothing was sealed).
    let _ = sealed.try_send(seq);
    true
}
