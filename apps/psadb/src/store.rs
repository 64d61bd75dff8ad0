//! A member's copy of its group's keys: a last-writer-wins map that every replica converges
//! on whatever order the writes reach it in.
//!
//! Every write carries a [`Version`] chosen by the client that made it (a Lamport clock and
//! the client's id, so two writes never share one). A key holds a string value (field `""`
//! of kind string) or the fields of a hash, each with the version that wrote it, and a
//! `cleared` version: fields older than it are gone. A write applies field by field, each
//! field keeping the newer of what it has and what comes, so applying the same writes in any
//! order, any number of times, gives the same state:
//!
//! - `SET k v` at version `w`: `cleared = w`, the string is `v` at `w` (a hash there is gone).
//! - `DEL k` at `w`: `cleared = w`, the string is a tombstone at `w`.
//! - `HSET k f v …` at `w`: each field `f` is `v` at `w`; the string is a tombstone at `w`
//!   (so `HSET` on a string key replaces it, where Redis would answer `WRONGTYPE`).
//! - `HDEL k f …` at `w`: each field is a tombstone at `w`.
//!
//! What a key shows is its live fields: those at or above `cleared` that are not tombstones.
//! The string and hash fields are never live together (the newer write cleared the other).
//!
//! # Bounds
//!
//! At most `max_keys` keys, tombstoned ones included: a write of a new key beyond is refused
//! ([`Full`]). A key that shows nothing stays as a tombstone (so a late, older write cannot
//! bring it back) until [`Store::prune`] drops the oldest ones beyond `max_tombstones`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The order of writes: a Lamport clock, then the writing client's id.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Version {
    /// The client's Lamport clock when it wrote.
    pub clock: u64,
    /// The client's id (breaks ties).
    pub writer: u64,
}

/// A write to one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Write {
    /// `SET key value`.
    Set(Bytes),
    /// `DEL key`.
    Del,
    /// `HSET key field value …` (`HMSET` too).
    HSet(Vec<(Bytes, Bytes)>),
    /// `HDEL key field …`.
    HDel(Vec<Bytes>),
}

/// What a key shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shown {
    /// Nothing (never written, deleted, or every field deleted).
    Nothing,
    /// A string.
    Str(Bytes),
    /// A hash: its fields in order.
    Hash(Vec<(Bytes, Bytes)>),
}

/// The store holds `max_keys` keys and a write would add one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the store holds as many keys as it may")]
pub struct Full;

/// A field's name: `None` is the string value, `Some(f)` a hash field.
type Field = Option<Bytes>;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    cleared: Version,
    /// Each field's value (`None`: a tombstone) and the version that wrote it.
    fields: BTreeMap<Field, (Option<Bytes>, Version)>,
}

impl Entry {
    /// About the bytes it takes on the wire: field names, values, and room for versions.
    fn size(&self) -> usize {
        self.fields
            .iter()
            .map(|(f, (v, _))| {
                f.as_ref().map_or(0, Bytes::len) + v.as_ref().map_or(0, Bytes::len) + 32
            })
            .sum::<usize>()
            + 32
    }

    fn put(&mut self, field: Field, value: Option<Bytes>, v: Version) {
        if v < self.cleared {
            return;
        }
        match self.fields.get(&field) {
            Some((_, old)) if *old >= v => {}
            _ => {
                self.fields.insert(field, (value, v));
            }
        }
    }

    fn clear(&mut self, v: Version) {
        if v > self.cleared {
            self.cleared = v;
            let c = self.cleared;
            self.fields.retain(|_, (_, fv)| *fv >= c);
        }
    }

    fn apply(&mut self, w: &Write, v: Version) {
        match w {
            Write::Set(value) => {
                self.clear(v);
                self.put(None, Some(value.clone()), v);
            }
            Write::Del => {
                self.clear(v);
                self.put(None, None, v);
            }
            Write::HSet(fields) => {
                for (f, value) in fields {
                    self.put(Some(f.clone()), Some(value.clone()), v);
                }
                self.put(None, None, v);
            }
            Write::HDel(fields) => {
                for f in fields {
                    self.put(Some(f.clone()), None, v);
                }
            }
        }
    }

    fn merge(&mut self, other: &Entry) {
        self.clear(other.cleared);
        for (f, (value, v)) in &other.fields {
            self.put(f.clone(), value.clone(), *v);
        }
    }

    fn shown(&self) -> Shown {
        let mut hash = Vec::new();
        for (f, (value, _)) in &self.fields {
            match (f, value) {
                (None, Some(s)) => return Shown::Str(s.clone()),
                (Some(f), Some(v)) => hash.push((f.clone(), v.clone())),
                _ => {}
            }
        }
        if hash.is_empty() {
            Shown::Nothing
        } else {
            Shown::Hash(hash)
        }
    }

    /// Whether it shows nothing (`shown` would be [`Shown::Nothing`]: no field holds a value),
    /// found without copying what it shows.
    fn shows_nothing(&self) -> bool {
        self.fields.values().all(|(value, _)| value.is_none())
    }

    /// The newest version it holds.
    fn newest(&self) -> Version {
        self.fields
            .values()
            .map(|(_, v)| *v)
            .max()
            .unwrap_or_default()
            .max(self.cleared)
    }
}

/// A copy of a group's keys (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Store {
    /// Every key's entry: found by hash (a key's bytes compared once), not by a search
    /// through the ordered keys.
    entries: HashMap<Bytes, Entry>,
    /// The same keys in byte order, for scans and snapshot pages (changed only when a key
    /// comes or goes, not when a key's entry does).
    order: BTreeSet<Bytes>,
    /// Keys that show nothing, by the newest version they hold (oldest first).
    tombstones: BTreeSet<(Version, Bytes)>,
    max_keys: usize,
    max_tombstones: usize,
}

/// A store's state, or a page of it, for a member that joins (see [`Store::snapshot`] and
/// [`Store::snapshot_page`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    entries: Vec<(Bytes, Entry)>,
    /// Whether keys after the last one remain (a page cut short by its size).
    more: bool,
}

impl Snapshot {
    /// The key to ask the next page after, if keys remain.
    pub fn next_after(&self) -> Option<&Bytes> {
        if self.more {
            self.entries.last().map(|(k, _)| k)
        } else {
            None
        }
    }

    /// Keys in it.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl Store {
    /// An empty store of at most `max_keys` keys, keeping at most `max_tombstones` of them
    /// as tombstones after [`Store::prune`].
    pub fn new(max_keys: usize, max_tombstones: usize) -> Self {
        Store {
            entries: HashMap::new(),
            order: BTreeSet::new(),
            tombstones: BTreeSet::new(),
            max_keys,
            max_tombstones,
        }
    }

    /// Keys held, tombstones included.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keys that show nothing but are kept.
    pub fn tombstones(&self) -> usize {
        self.tombstones.len()
    }

    /// Applies a write (again: nothing changes).
    pub fn apply(&mut self, key: &Bytes, w: &Write, v: Version) -> Result<(), Full> {
        self.with_entry(key, |e| e.apply(w, v))
    }

    fn with_entry(&mut self, key: &Bytes, f: impl FnOnce(&mut Entry)) -> Result<(), Full> {
        let entry = match self.entries.get_mut(key) {
            Some(e) => {
                if e.shows_nothing() {
                    self.tombstones.remove(&(e.newest(), key.clone()));
                }
                e
            }
            None => {
                if self.entries.len() >= self.max_keys {
                    return Err(Full);
                }
                self.order.insert(key.clone());
                self.entries.entry(key.clone()).or_default()
            }
        };
        f(entry);
        if entry.shows_nothing() {
            self.tombstones.insert((entry.newest(), key.clone()));
        }
        Ok(())
    }

    /// What `key` shows.
    pub fn get(&self, key: &[u8]) -> Shown {
        self.entries.get(key).map_or(Shown::Nothing, Entry::shown)
    }

    /// The newest version `key` holds (the default version if none).
    pub fn version(&self, key: &[u8]) -> Version {
        self.entries
            .get(key)
            .map_or_else(Version::default, Entry::newest)
    }

    /// Drops the oldest tombstones beyond `max_tombstones`; how many it dropped.
    pub fn prune(&mut self) -> usize {
        let mut dropped = 0;
        while self.tombstones.len() > self.max_tombstones {
            let Some((_, key)) = self.tombstones.pop_first() else {
                break;
            };
            self.entries.remove(&key);
            self.order.remove(&key);
            dropped += 1;
        }
        dropped
    }

    /// The keys showing something, in order, from `from` on, at most `count`.
    pub fn scan(&self, from: &[u8], count: usize) -> Vec<Bytes> {
        self.order
            .range::<[u8], _>((std::ops::Bound::Included(from), std::ops::Bound::Unbounded))
            .filter(|k| self.entries.get(*k).is_some_and(|e| !e.shows_nothing()))
            .take(count)
            .cloned()
            .collect()
    }

    /// Everything it holds.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_page(None, usize::MAX)
    }

    /// The keys after `after` (from the first without it), in order, as many as fit in about
    /// `max_bytes` (keys, field names and values counted; at least one key): a joining member
    /// takes a large store page by page, each well inside a frame.
    pub fn snapshot_page(&self, after: Option<&[u8]>, max_bytes: usize) -> Snapshot {
        let start = match after {
            Some(k) => std::ops::Bound::Excluded(k),
            None => std::ops::Bound::Unbounded,
        };
        let mut entries = Vec::new();
        let mut bytes = 0usize;
        let mut more = false;
        let ordered = self
            .order
            .range::<[u8], _>((start, std::ops::Bound::Unbounded))
            .filter_map(|k| self.entries.get(k).map(|e| (k, e)));
        for (k, e) in ordered {
            let size = k.len() + e.size();
            if !entries.is_empty() && bytes.saturating_add(size) > max_bytes {
                more = true;
                break;
            }
            bytes = bytes.saturating_add(size);
            entries.push((k.clone(), e.clone()));
        }
        Snapshot { entries, more }
    }

    /// Takes in what a snapshot holds (field by field, the newer wins); keys beyond
    /// `max_keys` are left out and counted.
    pub fn merge(&mut self, s: &Snapshot) -> usize {
        let mut left_out = 0;
        for (k, e) in &s.entries {
            if self.with_entry(k, |mine| mine.merge(e)).is_err() {
                left_out += 1;
            }
        }
        left_out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(clock: u64) -> Version {
        Version { clock, writer: 0 }
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn the_newer_write_wins_whatever_the_order() {
        let (k, mut a, mut c) = (b("k"), Store::new(10, 10), Store::new(10, 10));
        a.apply(&k, &Write::Set(b("old")), v(1)).unwrap();
        a.apply(&k, &Write::Set(b("new")), v(2)).unwrap();
        c.apply(&k, &Write::Set(b("new")), v(2)).unwrap();
        c.apply(&k, &Write::Set(b("old")), v(1)).unwrap();
        assert_eq!(a.get(&k), Shown::Str(b("new")));
        assert_eq!(a, c);
    }

    #[test]
    fn a_set_clears_a_hash_and_a_hset_replaces_a_string() {
        let (k, mut s) = (b("k"), Store::new(10, 10));
        s.apply(
            &k,
            &Write::HSet(vec![(b("f"), b("1")), (b("g"), b("2"))]),
            v(1),
        )
        .unwrap();
        assert_eq!(
            s.get(&k),
            Shown::Hash(vec![(b("f"), b("1")), (b("g"), b("2"))])
        );
        s.apply(&k, &Write::Set(b("s")), v(2)).unwrap();
        assert_eq!(s.get(&k), Shown::Str(b("s")));
        s.apply(&k, &Write::HSet(vec![(b("h"), b("3"))]), v(3))
            .unwrap();
        assert_eq!(
            s.get(&k),
            Shown::Hash(vec![(b("h"), b("3"))]),
            "old fields stay gone"
        );
        s.apply(&k, &Write::HDel(vec![b("h")]), v(4)).unwrap();
        assert_eq!(s.get(&k), Shown::Nothing, "the string does not come back");
    }

    #[test]
    fn a_deleted_key_stays_deleted_against_an_older_write_until_pruned() {
        let (k, mut s) = (b("k"), Store::new(10, 0));
        s.apply(&k, &Write::Del, v(5)).unwrap();
        s.apply(&k, &Write::Set(b("late")), v(3)).unwrap();
        assert_eq!(s.get(&k), Shown::Nothing);
        assert_eq!(s.tombstones(), 1);
        assert_eq!(s.prune(), 1);
        assert!(s.is_empty());
    }

    #[test]
    fn a_full_store_refuses_new_keys_and_takes_writes_to_its_own() {
        let mut s = Store::new(2, 2);
        s.apply(&b("a"), &Write::Set(b("1")), v(1)).unwrap();
        s.apply(&b("b"), &Write::Set(b("1")), v(1)).unwrap();
        assert_eq!(s.apply(&b("c"), &Write::Set(b("1")), v(2)), Err(Full));
        s.apply(&b("a"), &Write::Set(b("2")), v(2)).unwrap();
        assert_eq!(s.get(b"a"), Shown::Str(b("2")));
        assert_eq!(s.scan(b"", 10), vec![b("a"), b("b")]);
    }

    #[test]
    fn pages_of_a_snapshot_together_hold_the_store() {
        let mut s = Store::new(1000, 10);
        for i in 0..100u64 {
            let k = Bytes::from(format!("key{i:03}"));
            s.apply(
                &k,
                &Write::HSet(vec![(b("f"), Bytes::from(vec![b'x'; 100]))]),
                v(i + 1),
            )
            .unwrap();
        }
        let mut copy = Store::new(1000, 10);
        let mut after: Option<Bytes> = None;
        let mut pages = 0;
        loop {
            let page = s.snapshot_page(after.as_deref(), 1000);
            assert!(!page.is_empty());
            copy.merge(&page);
            pages += 1;
            match page.next_after() {
                Some(k) => after = Some(k.clone()),
                None => break,
            }
        }
        assert!(pages > 10, "{pages} pages of about 1,000 bytes");
        assert_eq!(copy.snapshot().entries, s.snapshot().entries);
        // A key larger than a page still travels, alone.
        assert_eq!(s.snapshot_page(None, 1).len(), 1);
    }

    fn write() -> impl Strategy<Value = Write> {
        let name = prop::sample::select(vec!["f", "g", "h"]).prop_map(b);
        let val = prop::sample::select(vec!["1", "2"]).prop_map(b);
        prop_oneof![
            val.clone().prop_map(Write::Set),
            Just(Write::Del),
            prop::collection::vec((name.clone(), val), 1..3).prop_map(Write::HSet),
            prop::collection::vec(name, 1..3).prop_map(Write::HDel),
        ]
    }

    proptest! {
        /// Replicas that get the same writes, in any order, some twice, or part of them
        /// by a snapshot, hold the same state.
        #[test]
        fn replicas_converge_whatever_the_order(
            writes in prop::collection::vec((0..3usize, write()), 1..24),
            order in any::<prop::sample::Index>(),
            split in 0..24usize,
        ) {
            let keys = [b("x"), b("y"), b("z")];
            let ws: Vec<(Bytes, Write, Version)> = writes
                .into_iter()
                .enumerate()
                .map(|(i, (k, w))| (keys[k].clone(), w, Version { clock: i as u64, writer: 7 }))
                .collect();
            let mut a = Store::new(100, 100);
            for (k, w, v) in &ws {
                a.apply(k, w, *v).unwrap();
            }
            // Another order: a rotation, each write applied twice.
            let mut c = Store::new(100, 100);
            let r = order.index(ws.len());
            for (k, w, v) in ws[r..].iter().chain(&ws[..r]).rev() {
                c.apply(k, w, *v).unwrap();
                c.apply(k, w, *v).unwrap();
            }
            prop_assert_eq!(&a.entries, &c.entries);
            // Half by writes, the rest by a snapshot of a replica that had them.
            let cut = split.min(ws.len());
            let mut d = Store::new(100, 100);
            let mut e = Store::new(100, 100);
            for (k, w, v) in &ws[..cut] {
                d.apply(k, w, *v).unwrap();
            }
            for (k, w, v) in &ws[cut..] {
                e.apply(k, w, *v).unwrap();
            }
            d.merge(&e.snapshot());
            prop_assert_eq!(&a.entries, &d.entries);
            for k in &keys {
                prop_assert_eq!(a.get(k), d.get(k));
            }
            // What a key shows and whether it shows nothing agree.
            for e in a.entries.values() {
                prop_assert_eq!(e.shows_nothing(), matches!(e.shown(), Shown::Nothing));
            }
            prop_assert_eq!(a.tombstones(), d.tombstones());
            // The ordered keys are the entries' keys, also after pruning every tombstone; a
            // scan sees the same keys either way.
            let mut p = Store::new(100, 0);
            for (k, w, v) in &ws {
                p.apply(k, w, *v).unwrap();
            }
            p.prune();
            prop_assert_eq!(p.tombstones(), 0);
            for s in [&a, &c, &d, &p] {
                let held: BTreeSet<&Bytes> = s.entries.keys().collect();
                let ordered: BTreeSet<&Bytes> = s.order.iter().collect();
                prop_assert_eq!(held, ordered);
            }
            prop_assert_eq!(a.scan(b"", 10), p.scan(b"", 10));
            prop_assert_eq!(a.scan(b"y", 10), d.scan(b"y", 10));
        }
    }
}
