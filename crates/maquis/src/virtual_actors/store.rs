//! Where virtual actors keep their state between activations: the [`StateStore`] trait, an
//! in-memory store and a durable one on redb.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use redb::{Database, Durability, ReadableDatabase, TableDefinition};
use thiserror::Error;

/// Why a state could not be loaded or saved.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store holds as many states as it may.
    #[error("the store is full ({0} states)")]
    Full(usize),
    /// A stored state does not decode as the actor's state type.
    #[error("stored state of {0:?} does not decode: {1}")]
    Corrupt(String, String),
    /// The state could not be encoded.
    #[error("state of {0:?} does not encode: {1}")]
    Encode(String, String),
    /// The storage failed.
    #[error("storage: {0}")]
    Io(String),
}

/// A store of virtual actors' states, by the actor's kind and key (`kind/key`). Every node
/// that may activate a kind must reach the same store for the state to follow the actor from
/// node to node: one store shared by the nodes of a process, or one reached over the network
/// (implement the trait on it).
pub trait StateStore: Send + Sync + 'static {
    /// The state stored for `id`, if any.
    fn load(&self, id: &str) -> BoxFuture<'_, Result<Option<Vec<u8>>, StoreError>>;
    /// Stores the state of `id`, replacing what was there.
    fn save(&self, id: &str, state: Vec<u8>) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// States in memory, at most `capacity` of them (saving one more fails with
/// [`StoreError::Full`]). Lost with the process.
#[derive(Debug)]
pub struct MemoryStore {
    capacity: usize,
    states: Mutex<HashMap<String, Vec<u8>>>,
}

impl MemoryStore {
    /// An empty store for at most `capacity` states.
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(MemoryStore {
            capacity,
            states: Mutex::default(),
        })
    }

    /// States stored.
    pub fn len(&self) -> usize {
        self.states.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no state is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl StateStore for MemoryStore {
    fn load(&self, id: &str) -> BoxFuture<'_, Result<Option<Vec<u8>>, StoreError>> {
        let got = self
            .states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        Box::pin(async move { Ok(got) })
    }

    fn save(&self, id: &str, state: Vec<u8>) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut states = self.states.lock().unwrap_or_else(|e| e.into_inner());
        let r = if states.len() >= self.capacity && !states.contains_key(id) {
            Err(StoreError::Full(self.capacity))
        } else {
            states.insert(id.to_string(), state);
            Ok(())
        };
        Box::pin(async move { r })
    }
}

const STATES: TableDefinition<'static, &'static str, &'static [u8]> =
    TableDefinition::new("virtual_actor_states");

/// States in a redb database file: each save is a transaction written through to the disk
/// before it returns. The file may be opened by one process at a time; share the store's
/// `Arc` between the nodes of that process.
pub struct RedbStore {
    db: Arc<Database>,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedbStore")
    }
}

impl RedbStore {
    /// Opens (or creates) the database at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<Self>, StoreError> {
        let db = Database::create(path).map_err(|e| StoreError::Io(e.to_string()))?;
        Ok(Arc::new(RedbStore { db: Arc::new(db) }))
    }
}

impl StateStore for RedbStore {
    fn load(&self, id: &str) -> BoxFuture<'_, Result<Option<Vec<u8>>, StoreError>> {
        let (db, id) = (self.db.clone(), id.to_string());
        Box::pin(async move {
            blocking(move || {
                let txn = db.begin_read().map_err(io)?;
                let table = match txn.open_table(STATES) {
                    Ok(t) => t,
                    Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                    Err(e) => return Err(io(e)),
                };
                let got = table.get(id.as_str()).map_err(io)?;
                Ok(got.map(|v| v.value().to_vec()))
            })
            .await
        })
    }

    fn save(&self, id: &str, state: Vec<u8>) -> BoxFuture<'_, Result<(), StoreError>> {
        let (db, id) = (self.db.clone(), id.to_string());
        Box::pin(async move {
            blocking(move || {
                let mut txn = db.begin_write().map_err(io)?;
                txn.set_durability(Durability::Immediate).map_err(io)?;
                {
                    let mut table = txn.open_table(STATES).map_err(io)?;
                    table.insert(id.as_str(), state.as_slice()).map_err(io)?;
                }
                txn.commit().map_err(io)
            })
            .await
        })
    }
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

/// Runs the database's blocking work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StoreError::Io(e.to_string()))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_store_keeps_states_up_to_its_capacity() {
        let s = MemoryStore::new(2);
        assert_eq!(s.load("k/1").await, Ok(None));
        s.save("k/1", vec![1]).await.unwrap();
        s.save("k/2", vec![2]).await.unwrap();
        s.save("k/1", vec![3]).await.expect("a replacement fits");
        assert_eq!(s.save("k/3", vec![4]).await, Err(StoreError::Full(2)));
        assert_eq!(s.load("k/1").await, Ok(Some(vec![3])));
        assert_eq!(s.len(), 2);
    }

    #[tokio::test]
    async fn the_redb_store_keeps_states_across_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("states.redb");
        {
            let s = RedbStore::open(&path).unwrap();
            assert_eq!(s.load("k/1").await, Ok(None), "no table yet");
            s.save("k/1", vec![1, 2]).await.unwrap();
            s.save("k/1", vec![3]).await.unwrap();
        }
        let s = RedbStore::open(&path).unwrap();
        assert_eq!(s.load("k/1").await, Ok(Some(vec![3])));
        assert_eq!(s.load("k/2").await, Ok(None));
    }
}
