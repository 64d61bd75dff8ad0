//! The heaviest items of a stream in constant space (Metwally et al., "Efficient computation
//! of frequent and top-k elements in data streams"): ActOp §4.3 keeps each server's heaviest
//! communication edges this way.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// The at most `capacity` items with the largest counts seen, each count an overestimate by
/// at most its `error` (the count of the item it replaced). An item whose true count exceeds
/// the total weight seen divided by `capacity` is always among them.
#[derive(Clone, Debug)]
pub struct SpaceSaving<K> {
    capacity: usize,
    /// Each item's count and its slot (a number unique among the items kept).
    counts: HashMap<K, (Counted, u64)>,
    /// The items by count: (count, slot); the smallest first.
    order: BTreeSet<(u64, u64)>,
    /// The item in each slot.
    slots: HashMap<u64, K>,
    next_slot: u64,
}

/// An item's estimated count and how much of it may belong to items it replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// The estimate (never below the true count).
    pub count: u64,
    /// How much the estimate may exceed the true count.
    pub error: u64,
}

impl<K: Eq + Hash + Clone> SpaceSaving<K> {
    /// An empty summary of at most `capacity` items (at least one).
    pub fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            counts: HashMap::new(),
            order: BTreeSet::new(),
            slots: HashMap::new(),
            next_slot: 0,
        }
    }

    fn insert(&mut self, key: K, c: Counted) {
        let slot = self.next_slot;
        self.next_slot += 1;
        self.order.insert((c.count, slot));
        self.slots.insert(slot, key.clone());
        self.counts.insert(key, (c, slot));
    }

    /// Counts `weight` more for `key`. When the summary is full and `key` is not in it, the item
    /// with the smallest count gives its place to `key`, whose count starts from that one's.
    /// O(log capacity).
    pub fn observe(&mut self, key: K, weight: u64) {
        if let Some((c, slot)) = self.counts.get_mut(&key) {
            self.order.remove(&(c.count, *slot));
            c.count = c.count.saturating_add(weight);
            self.order.insert((c.count, *slot));
            return;
        }
        if self.counts.len() < self.capacity {
            self.insert(
                key,
                Counted {
                    count: weight,
                    error: 0,
                },
            );
            return;
        }
        let Some((min, slot)) = self.order.pop_first() else {
            return;
        };
        if let Some(old) = self.slots.remove(&slot) {
            self.counts.remove(&old);
        }
        self.insert(
            key,
            Counted {
                count: min.saturating_add(weight),
                error: min,
            },
        );
    }

    /// The items kept, heaviest first.
    pub fn top(&self) -> Vec<(K, Counted)> {
        let mut v: Vec<(K, Counted)> = self
            .counts
            .iter()
            .map(|(k, (c, _))| (k.clone(), *c))
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.1.count));
        v
    }

    /// Items kept.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing was seen since the last [`SpaceSaving::clear`].
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Halves every count (and error), dropping the items that reach zero: older traffic
    /// weighs less than newer.
    pub fn decay(&mut self) {
        let (order, slots) = (&mut self.order, &mut self.slots);
        order.clear();
        self.counts.retain(|_, (c, slot)| {
            c.count /= 2;
            c.error /= 2;
            if c.count == 0 {
                slots.remove(slot);
                return false;
            }
            order.insert((c.count, *slot));
            true
        });
    }

    /// Forgets everything (a new measuring period).
    pub fn clear(&mut self) {
        self.counts.clear();
        self.order.clear();
        self.slots.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the stream: at most `capacity` items, the index agrees with the counts,
        /// every estimate bounds the true count from above within its error, and the counts
        /// add up to the weight seen (Space-Saving's invariants).
        #[test]
        fn the_summary_keeps_its_invariants(
            cap in 1..8usize,
            stream in prop::collection::vec((0..20u32, 1..5u64), 0..200),
        ) {
            let mut s = SpaceSaving::new(cap);
            let mut truth: HashMap<u32, u64> = HashMap::new();
            for (k, w) in &stream {
                s.observe(*k, *w);
                *truth.entry(*k).or_default() += w;
                prop_assert!(s.len() <= cap);
                prop_assert_eq!(s.order.len(), s.len());
                prop_assert_eq!(s.slots.len(), s.len());
            }
            let total: u64 = stream.iter().map(|(_, w)| w).sum();
            prop_assert_eq!(s.top().iter().map(|(_, c)| c.count).sum::<u64>(), total);
            for (k, c) in s.top() {
                prop_assert!(c.count >= truth[&k] && c.count - c.error <= truth[&k]);
            }
            s.decay();
            prop_assert_eq!(s.order.len(), s.len());
            prop_assert_eq!(s.slots.len(), s.len());
            s.observe(99, 1);
            prop_assert!(s.top().iter().any(|(k, _)| *k == 99));
        }
    }

    #[test]
    fn heavy_items_are_kept_and_estimates_never_undercount() {
        let mut s = SpaceSaving::new(4);
        // Two heavy items among many light ones.
        let mut truth: HashMap<u32, u64> = HashMap::new();
        for i in 0..2_000u32 {
            let key = match i % 10 {
                0..=3 => 1,
                4..=6 => 2,
                _ => 100 + i,
            };
            s.observe(key, 1);
            *truth.entry(key).or_default() += 1;
        }
        let top = s.top();
        assert_eq!(top.len(), 4);
        assert_eq!((top[0].0, top[1].0), (1, 2));
        for (k, c) in &top {
            let t = truth[k];
            assert!(c.count >= t && c.count - c.error <= t, "{k}: {c:?} vs {t}");
        }
    }

    #[test]
    fn capacity_bounds_the_items_kept() {
        let mut s = SpaceSaving::new(3);
        for i in 0..100u32 {
            s.observe(i, u64::from(i));
        }
        assert_eq!(s.len(), 3);
        let before: Vec<u64> = s.top().iter().map(|(_, c)| c.count).collect();
        s.decay();
        let after: Vec<u64> = s.top().iter().map(|(_, c)| c.count).collect();
        assert_eq!(after, before.iter().map(|c| c / 2).collect::<Vec<_>>());
        s.clear();
        assert!(s.is_empty());
    }
}
