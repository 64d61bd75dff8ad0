//! The lookup cache: a bounded map that forgets its oldest entry when full.

use std::collections::{HashMap, VecDeque};

/// At most `capacity` values by name; inserting into a full cache evicts the entry inserted
/// longest ago.
#[derive(Debug)]
pub(crate) struct Cache<V> {
    map: HashMap<String, (V, u64)>,
    order: VecDeque<(String, u64)>,
    capacity: usize,
    seq: u64,
    evicted: u64,
}

impl<V> Cache<V> {
    pub fn new(capacity: usize) -> Self {
        Cache {
            map: HashMap::new(),
            order: VecDeque::new(),
            capacity,
            seq: 0,
            evicted: 0,
        }
    }

    pub fn get(&self, name: &str) -> Option<&V> {
        self.map.get(name).map(|(v, _)| v)
    }

    pub fn insert(&mut self, name: String, value: V) {
        if self.capacity == 0 {
            return;
        }
        self.seq += 1;
        self.order.push_back((name.clone(), self.seq));
        self.map.insert(name, (value, self.seq));
        while self.map.len() > self.capacity {
            let Some((old, seq)) = self.order.pop_front() else {
                break;
            };
            // Stale positions (the name was inserted again, or removed) are skipped.
            if self.map.get(&old).is_some_and(|(_, s)| *s == seq) {
                self.map.remove(&old);
                self.evicted += 1;
            }
        }
        // Keep the order queue from growing with stale positions.
        if self.order.len() > 2 * self.capacity + 16 {
            let map = &self.map;
            self.order
                .retain(|(n, s)| map.get(n).is_some_and(|(_, cur)| cur == s));
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<V> {
        self.map.remove(name).map(|(v, _)| v)
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&V) -> bool) {
        self.map.retain(|_, (v, _)| keep(v));
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn evicted(&self) -> u64 {
        self.evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_goes_first_and_the_queue_stays_small() {
        let mut c = Cache::new(2);
        c.insert("a".into(), 1);
        c.insert("b".into(), 2);
        c.insert("a".into(), 3);
        c.insert("c".into(), 4);
        // "b" was the oldest live entry.
        assert_eq!(c.get("b"), None);
        assert_eq!((c.get("a"), c.get("c")), (Some(&3), Some(&4)));
        assert_eq!(c.evicted(), 1);
        for i in 0..1000 {
            c.insert("a".into(), i);
        }
        assert!(c.order.len() <= 2 * 2 + 16);
        assert_eq!(c.len(), 2);
        let mut none = Cache::new(0);
        none.insert("x".into(), 1);
        assert_eq!(none.len(), 0);
    }
}
