//! How the database is laid out: one table of objects whose keys are prefixed by their
//! partition, and one bookkeeping table; the encoding of stored objects; and the transaction
//! that applies a generation of changes.

use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, TableDefinition, TableError};

use super::pending::Generation;
use crate::object::Object;
use crate::storage::StorageError;

/// The first byte of every stored value: the encoding's version (postcard of [`Object`]).
pub(super) const FORMAT: u8 = 1;

/// Every partition's objects, in one table: a key is its partition (4 bytes, big-endian) and
/// then the object's key, so that a commit updates one tree however many partitions it
/// touches, and a partition is one key range.
pub(super) const OBJECTS: TableDefinition<'static, &'static [u8], &'static [u8]> =
    TableDefinition::new("objects");

/// The objects table, opened for reading.
pub(super) type Objects = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The stored key of an object.
pub(super) fn stored_key(partition: u32, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + key.len());
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// The partition a stored key belongs to.
pub(super) fn partition_of(stored: &[u8]) -> Option<u32> {
    stored
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// The bookkeeping table: `log_applied` is the number of the last log segment whose changes the
/// database holds (segments up to it are not replayed).
pub(super) const META: TableDefinition<'static, &'static str, u64> = TableDefinition::new("meta");
/// The key of the last applied log segment in [`META`].
pub(super) const LOG_APPLIED: &str = "log_applied";

/// The stored keys of a partition: `[p, p + 1)` as prefixes.
pub(super) fn bounds(partition: u32) -> (Vec<u8>, Option<Vec<u8>>) {
    let lo = partition.to_be_bytes().to_vec();
    let hi = partition.checked_add(1).map(|n| n.to_be_bytes().to_vec());
    (lo, hi)
}

/// A stored value: [`FORMAT`], then the object in postcard.
pub(super) fn encode(object: &Object) -> Result<Vec<u8>, StorageError> {
    let mut out = vec![FORMAT];
    postcard::to_io(object, &mut out).map_err(|e| StorageError::Write(e.to_string()))?;
    Ok(out)
}

/// The object of a stored value (`None`: another format, or corrupt).
pub(super) fn decode(bytes: &[u8]) -> Option<Object> {
    match bytes.split_first() {
        Some((&FORMAT, rest)) => postcard::from_bytes(rest).ok(),
        _ => None,
    }
}

/// Applies a generation in one transaction with an fsync, recording `applied` as the last log
/// segment the database holds.
pub(super) fn apply(db: &Database, g: &Generation, applied: u64) -> Result<(), StorageError> {
    let write = |e: &dyn std::fmt::Display| StorageError::Write(e.to_string());
    let mut txn = db.begin_write().map_err(|e| write(&e))?;
    txn.set_durability(Durability::Immediate)
        .map_err(|e| write(&e))?;
    {
        let mut table = txn.open_table(OBJECTS).map_err(|e| write(&e))?;
        for partition in &g.cleared {
            let (lo, hi) = bounds(*partition);
            let r = match &hi {
                Some(hi) => table.retain_in(lo.as_slice()..hi.as_slice(), |_, _| false),
                None => table.retain_in(lo.as_slice().., |_, _| false),
            };
            r.map_err(|e| write(&e))?;
        }
        for (key, value) in &g.puts {
            table
                .insert(key.as_slice(), value.as_slice())
                .map_err(|e| write(&e))?;
        }
        let mut meta = txn.open_table(META).map_err(|e| write(&e))?;
        meta.insert(LOG_APPLIED, applied).map_err(|e| write(&e))?;
    }
    txn.commit().map_err(|e| write(&e))
}

/// The last log segment the database holds (`None`: a database that never had one applied).
pub(super) fn log_applied(db: &Database) -> Result<Option<u64>, StorageError> {
    let read = |e: &dyn std::fmt::Display| StorageError::Read(e.to_string());
    let txn = db.begin_read().map_err(|e| read(&e))?;
    match txn.open_table(META) {
        Ok(t) => Ok(t.get(LOG_APPLIED).map_err(|e| read(&e))?.map(|v| v.value())),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(read(&e)),
    }
}
