//! The membership machine's timers, as a table: one deadline per key.
//!
//! Setting a key that is already set moves its deadline (a timer is replaced, never doubled);
//! cancelling removes it. The driver asks for the earliest deadline ([`Timers::next`]) and
//! hands back the time when it has passed; the machine then takes the expired keys in deadline
//! order ([`Timers::expired`]).

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;
use std::time::Duration;

/// Deadlines by key, with an index by time.
#[derive(Debug)]
pub(crate) struct Timers<K> {
    by_key: HashMap<K, (Duration, u64)>,
    by_time: BTreeSet<(Duration, u64)>,
    keys: HashMap<u64, K>,
    seq: u64,
}

impl<K> Default for Timers<K> {
    fn default() -> Self {
        Timers {
            by_key: HashMap::new(),
            by_time: BTreeSet::new(),
            keys: HashMap::new(),
            seq: 0,
        }
    }
}

impl<K: Clone + Eq + Hash> Timers<K> {
    /// Sets `key` to fire at `at`, replacing its earlier deadline if it had one.
    pub fn set(&mut self, key: K, at: Duration) {
        self.cancel(&key);
        self.seq += 1;
        let slot = (at, self.seq);
        self.by_time.insert(slot);
        self.keys.insert(self.seq, key.clone());
        self.by_key.insert(key, slot);
    }

    /// Removes `key`'s deadline; returns whether it had one.
    pub fn cancel(&mut self, key: &K) -> bool {
        match self.by_key.remove(key) {
            Some(slot) => {
                self.by_time.remove(&slot);
                self.keys.remove(&slot.1);
                true
            }
            None => false,
        }
    }

    /// The deadline of `key`, if it is set.
    pub fn next_of(&self, key: &K) -> Option<Duration> {
        self.by_key.get(key).map(|(at, _)| *at)
    }

    /// The earliest deadline.
    pub fn next(&self) -> Option<Duration> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// Takes the earliest key whose deadline is at or before `now`.
    pub fn expired(&mut self, now: Duration) -> Option<K> {
        let &(at, seq) = self.by_time.first()?;
        if at > now {
            return None;
        }
        self.by_time.remove(&(at, seq));
        let key = self.keys.remove(&seq)?;
        self.by_key.remove(&key);
        Some(key)
    }

    /// How many timers are set.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replaces_cancel_removes_and_expiry_is_in_order() {
        let ms = Duration::from_millis;
        let mut t = Timers::default();
        t.set("a", ms(30));
        t.set("b", ms(10));
        t.set("c", ms(20));
        t.set("a", ms(5));
        assert_eq!(t.len(), 3, "setting a key again replaces it");
        assert_eq!(t.next(), Some(ms(5)));
        assert!(t.cancel(&"c"));
        assert!(!t.cancel(&"c"));
        assert_eq!(t.expired(ms(4)), None);
        assert_eq!(t.expired(ms(10)), Some("a"));
        assert_eq!(t.expired(ms(10)), Some("b"));
        assert_eq!(t.expired(ms(100)), None);
        assert_eq!(t.next(), None);
        t.set("d", ms(7));
        t.set("e", ms(7));
        assert_eq!(
            t.expired(ms(7)),
            Some("d"),
            "equal deadlines fire in the order set"
        );
        assert_eq!(t.expired(ms(7)), Some("e"));
    }
}
