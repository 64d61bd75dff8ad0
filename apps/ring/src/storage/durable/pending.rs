//! The changes that are in the log but not in the database yet, kept in memory so that loads
//! see them, and what the writer, the checkpointer and the readers share.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use super::layout::{bounds, partition_of, stored_key};

/// One change to the database, as the log records it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Change {
    /// A key of a partition now holds this encoded object.
    Put(u32, Vec<u8>, Vec<u8>),
    /// A partition is emptied.
    Clear(u32),
}

/// What a generation holds for one partition.
pub(super) struct Slice {
    /// The partition was cleared (the database's objects of it are gone).
    pub(super) cleared: bool,
    /// Stored key and encoded object of every key written (after the clear, if any).
    pub(super) puts: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Changes not in the database yet, as they apply to it: the partitions cleared (the
/// database's objects of those are gone) and the latest encoded object of every key written
/// (after the clear, if its partition was cleared too).
#[derive(Debug, Default)]
pub(super) struct Generation {
    pub(super) cleared: BTreeSet<u32>,
    pub(super) puts: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Generation {
    pub(super) fn add(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Put(partition, key, value) => {
                    self.puts.insert(stored_key(partition, &key), value);
                }
                Change::Clear(partition) => {
                    let (lo, hi) = bounds(partition);
                    let gone: Vec<Vec<u8>> = match &hi {
                        Some(hi) => self
                            .puts
                            .range(lo..hi.clone())
                            .map(|(k, _)| k.clone())
                            .collect(),
                        None => self.puts.range(lo..).map(|(k, _)| k.clone()).collect(),
                    };
                    for k in gone {
                        self.puts.remove(&k);
                    }
                    self.cleared.insert(partition);
                }
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.cleared.is_empty() && self.puts.is_empty()
    }

    /// What it holds for one partition.
    pub(super) fn partition(&self, partition: u32) -> Slice {
        let (lo, hi) = bounds(partition);
        let puts = match &hi {
            Some(hi) => self.puts.range(lo..hi.clone()),
            None => self.puts.range(lo..),
        }
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
        Slice {
            cleared: self.cleared.contains(&partition),
            puts,
        }
    }

    /// The partitions it writes objects of.
    pub(super) fn written(&self) -> BTreeSet<u32> {
        self.puts.keys().filter_map(|k| partition_of(k)).collect()
    }
}

/// The generations not in the database yet: the sealed one being applied, and the current.
#[derive(Debug, Default)]
pub(super) struct Generations {
    pub(super) sealed: Option<Arc<Generation>>,
    pub(super) current: Generation,
}

impl Generations {
    /// The generations not in the database, oldest first (the order they apply in).
    pub(super) fn oldest_first(&self) -> impl Iterator<Item = &Generation> {
        self.sealed.iter().map(|s| &**s).chain([&self.current])
    }
}

/// What the writer, the checkpointer and the readers share.
#[derive(Debug, Default)]
pub(super) struct Pending {
    pub(super) generations: Mutex<Generations>,
    /// Signalled when the checkpointer has applied the sealed generation.
    pub(super) applied: Condvar,
    /// Set when the backend is dropped (a failing checkpoint gives up).
    pub(super) stopping: AtomicBool,
    /// Set when the checkpointer has stopped (the writer no longer waits for it).
    pub(super) checkpointer_gone: AtomicBool,
}

impl Pending {
    pub(super) fn lock(&self) -> MutexGuard<'_, Generations> {
        self.generations.lock().unwrap_or_else(|e| e.into_inner())
    }
}
