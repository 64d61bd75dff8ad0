//! Tests of the durable backend.

use std::time::Instant;

use super::layout::{encode, stored_key, FORMAT};
use super::pending::Change;
use super::*;
use crate::object::{Object, Version};
use crate::storage::wal;

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
    let log = wal::segment_path(dir.path(), 1);
    let mut bytes = std::fs::read(&log).unwrap();
    assert!(!bytes.is_empty(), "the writes are in the log");
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
    std::fs::write(&log, &bytes).unwrap();
    let s = Durable::open(dir.path(), DurableConfig::default()).unwrap();
    assert_eq!(s.stats().replayed, 3);
    let want = vec![entry("a", Some("2"), 2), entry("b", Some("x"), 1)];
    assert_eq!(s.load(2).unwrap(), want);
    // Replayed into the database: the segment is gone, the writer is in the next one.
    assert_eq!(s.stored(2).unwrap().len(), 2);
    assert!(!log.exists());
    let left: Vec<u64> = wal::segments(dir.path())
        .unwrap()
        .into_iter()
        .map(|(seq, _)| seq)
        .collect();
    assert_eq!(left, vec![2]);
}

/// Waits (up to 10 s) until the checkpointer has applied `n` generations.
fn checkpointed(s: &Durable, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.stats().checkpoints < n {
        assert!(Instant::now() < deadline, "no checkpoint: {:?}", s.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn writes_are_read_before_and_after_the_checkpoint_that_applies_them() {
    let dir = tempfile::tempdir().unwrap();
    let every_batch = DurableConfig {
        checkpoint_every: Duration::ZERO,
        ..DurableConfig::default()
    };
    {
        let s = Durable::open(dir.path(), every_batch.clone()).unwrap();
        wait(s.write(2, vec![entry("x", Some("1"), 1)])).unwrap();
        checkpointed(&s, 1);
        assert_eq!(s.stored(2).unwrap().len(), 1);
        assert!(!wal::segment_path(dir.path(), 1).exists());
    }
    // Now without checkpoints while it runs: a clear and a write only in the log and in
    // memory, over the database's older objects.
    let later = DurableConfig {
        checkpoint_every: Duration::from_secs(3600),
        ..DurableConfig::default()
    };
    {
        let s = Durable::open(dir.path(), later).unwrap();
        assert_eq!(s.partitions().unwrap(), vec![2]);
        wait(s.clear(2)).unwrap();
        assert_eq!(s.partitions().unwrap(), Vec::<u32>::new());
        assert_eq!(s.load(2).unwrap(), vec![]);
        assert_eq!(s.stored(2).unwrap().len(), 1, "not in the database yet");
        wait(s.write(2, vec![entry("y", Some("2"), 2)])).unwrap();
        wait(s.write(7, vec![entry("z", None, 3)])).unwrap();
        assert_eq!(s.partitions().unwrap(), vec![2, 7]);
        assert_eq!(s.load(2).unwrap(), vec![entry("y", Some("2"), 2)]);
        assert_eq!(s.stats().checkpoints, 0);
    }
    // Dropped cleanly: the last generation was applied on the way out.
    let s = Durable::open(dir.path(), every_batch).unwrap();
    assert_eq!(s.stats().replayed, 0);
    assert_eq!(s.load(2).unwrap(), vec![entry("y", Some("2"), 2)]);
    assert_eq!(s.stored(7).unwrap().len(), 1);
}

#[test]
fn a_segment_the_database_already_holds_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let crash = DurableConfig {
        checkpoint_every: Duration::from_secs(3600),
        crash_on_drop: true,
        ..DurableConfig::default()
    };
    // An old value, left in segment 1 by a crash.
    {
        let s = Durable::open(dir.path(), crash).unwrap();
        wait(s.write(4, vec![entry("k", Some("old"), 1)])).unwrap();
    }
    let old = std::fs::read(wal::segment_path(dir.path(), 1)).unwrap();
    // Replayed at the next open; then a newer value, applied on a clean close.
    {
        let s = Durable::open(dir.path(), DurableConfig::default()).unwrap();
        assert_eq!(s.stats().replayed, 1);
        wait(s.write(4, vec![entry("k", Some("new"), 2)])).unwrap();
    }
    // Segment 1 back, as if its deletion had not reached the disk: the database records
    // that it holds it, so the old value does not come back.
    std::fs::write(wal::segment_path(dir.path(), 1), old).unwrap();
    let s = Durable::open(dir.path(), DurableConfig::default()).unwrap();
    assert_eq!(s.stats().replayed, 0);
    assert_eq!(s.load(4).unwrap(), vec![entry("k", Some("new"), 2)]);
    assert!(!wal::segment_path(dir.path(), 1).exists());
}

#[test]
fn the_log_of_an_earlier_version_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let record = postcard::to_stdvec(&vec![Change::Put(
        6,
        b"legacy".to_vec(),
        encode(&entry("legacy", Some("v"), 5).1).unwrap(),
    )])
    .unwrap();
    {
        let mut log = Wal::create(dir.path(), 0).unwrap();
        log.append(&record).unwrap();
    }
    assert!(dir.path().join(wal::FILE_NAME).exists());
    let s = Durable::open(dir.path(), DurableConfig::default()).unwrap();
    assert_eq!(s.stats().replayed, 1);
    assert_eq!(s.load(6).unwrap(), vec![entry("legacy", Some("v"), 5)]);
    assert!(!dir.path().join(wal::FILE_NAME).exists());
}

#[test]
fn a_full_queue_refuses_at_once_and_the_rest_completes() {
    let dir = tempfile::tempdir().unwrap();
    // One operation per batch: a writer that woke late would otherwise take the first two
    // at once and leave room for the third.
    let cfg = DurableConfig {
        queue: 1,
        max_batch_objects: 1,
        ..DurableConfig::default()
    };
    let s = Durable::open(dir.path(), cfg).unwrap();
    // Hold the pending changes: the writer takes one operation, logs it and waits.
    let held = s.pending.lock();
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
