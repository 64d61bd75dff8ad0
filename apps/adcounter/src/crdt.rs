//! The replicated state: grow-only counters ([`GCounter`]) and a bounded table of them, one
//! per advertisement ([`Ads`]). Both are state-based CRDTs: [`GCounter::merge`] and
//! [`Ads::merge`] are commutative, associative and idempotent (property-tested below), so
//! replicas that exchange their states in any order, any number of times, end equal.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A grow-only counter: one count per replica, the value their sum. A replica only ever
/// raises its own count; a merge keeps, per replica, the larger count.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GCounter {
    counts: BTreeMap<String, u64>,
}

impl GCounter {
    /// An empty counter (value 0).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `n` for `replica` (saturating at `u64::MAX`).
    pub fn increment(&mut self, replica: &str, n: u64) {
        let c = self.counts.entry(replica.to_string()).or_insert(0);
        *c = c.saturating_add(n);
    }

    /// The counter's value: the sum of the replicas' counts (saturating).
    pub fn value(&self) -> u64 {
        self.counts
            .values()
            .fold(0u64, |sum, c| sum.saturating_add(*c))
    }

    /// Takes in `other`: per replica, the larger count. Whether this counter changed.
    pub fn merge(&mut self, other: &GCounter) -> bool {
        let mut changed = false;
        for (replica, &c) in &other.counts {
            match self.counts.get_mut(replica) {
                Some(mine) if *mine >= c => {}
                Some(mine) => {
                    *mine = c;
                    changed = true;
                }
                None => {
                    self.counts.insert(replica.clone(), c);
                    changed = true;
                }
            }
        }
        changed
    }

    /// What this counter has beyond `old`: the counts that are larger here, or not in `old`
    /// (a delta: merging it into `old` gives what merging this counter would).
    pub fn delta_from(&self, old: &GCounter) -> GCounter {
        let counts = self
            .counts
            .iter()
            .filter(|(replica, c)| old.counts.get(*replica).is_none_or(|o| o < c))
            .map(|(replica, c)| (replica.clone(), *c))
            .collect();
        GCounter { counts }
    }

    /// Replicas with a count.
    pub fn replicas(&self) -> usize {
        self.counts.len()
    }
}

/// Why an increment was not counted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdError {
    /// The ad has reached its limit: it is no longer shown.
    #[error("ad {0:?} is disabled: it reached its limit")]
    Disabled(String),
    /// The table holds as many ads as it may: a new one is refused.
    #[error("no room for ad {0:?}: the table holds {1} ads at most")]
    Full(String, usize),
}

/// The ads' counters, at most `max_ads` of them. An ad is disabled once its counter reaches
/// the limit (every replica agrees: the limit is the same everywhere and counters only grow).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ads {
    limit: u64,
    max_ads: usize,
    counters: BTreeMap<String, GCounter>,
}

impl Ads {
    /// An empty table: ads are disabled at `limit` impressions; at most `max_ads` ads.
    pub fn new(limit: u64, max_ads: usize) -> Self {
        Ads {
            limit,
            max_ads,
            counters: BTreeMap::new(),
        }
    }

    /// Counts one impression of `ad` at `replica`; refused once the ad is disabled, or when
    /// it is new and the table is full.
    pub fn impression(&mut self, replica: &str, ad: &str) -> Result<u64, AdError> {
        if !self.counters.contains_key(ad) && self.counters.len() >= self.max_ads {
            return Err(AdError::Full(ad.to_string(), self.max_ads));
        }
        let c = self.counters.entry(ad.to_string()).or_default();
        if c.value() >= self.limit {
            return Err(AdError::Disabled(ad.to_string()));
        }
        c.increment(replica, 1);
        Ok(c.value())
    }

    /// Impressions of `ad` counted so far (as this replica knows).
    pub fn value(&self, ad: &str) -> u64 {
        self.counters.get(ad).map_or(0, GCounter::value)
    }

    /// Whether `ad` is still shown.
    pub fn enabled(&self, ad: &str) -> bool {
        self.value(ad) < self.limit
    }

    /// Ads that reached their limit.
    pub fn disabled(&self) -> usize {
        self.counters
            .values()
            .filter(|c| c.value() >= self.limit)
            .count()
    }

    /// Impressions of every ad, summed.
    pub fn total(&self) -> u64 {
        self.counters
            .values()
            .fold(0u64, |s, c| s.saturating_add(c.value()))
    }

    /// Ads in the table.
    pub fn len(&self) -> usize {
        self.counters.len()
    }

    /// Whether the table has no ad.
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
    }

    /// What this table has beyond `old`, as a table of the same bounds: the ads `old` lacks,
    /// and per ad the counts that are larger here or not in `old` (a delta: merging it into `old` gives what
    /// merging this table would; an earlier state of this table is a typical `old`).
    pub fn delta_from(&self, old: &Ads) -> Ads {
        let counters = self
            .counters
            .iter()
            .filter_map(|(ad, c)| match old.counters.get(ad) {
                Some(o) => {
                    let d = c.delta_from(o);
                    (d.replicas() > 0).then(|| (ad.clone(), d))
                }
                None => Some((ad.clone(), c.clone())),
            })
            .collect();
        Ads {
            limit: self.limit,
            max_ads: self.max_ads,
            counters,
        }
    }

    /// Takes in `other`'s counters. An ad this table has no room for is left out (counted by
    /// the caller): a table never grows past `max_ads`.
    pub fn merge(&mut self, other: &Ads) -> Merged {
        let mut out = Merged::default();
        for (ad, c) in &other.counters {
            let room = self.counters.len() < self.max_ads;
            match self.counters.get_mut(ad) {
                Some(mine) => out.changed |= mine.merge(c),
                None if room => {
                    self.counters.insert(ad.clone(), c.clone());
                    out.changed = true;
                }
                None => out.left_out.push(ad.clone()),
            }
        }
        out
    }
}

/// What [`Ads::merge`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// Whether the table changed (a count grew or an ad came).
    pub changed: bool,
    /// The ads left out for want of room.
    pub left_out: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counter() -> impl Strategy<Value = GCounter> {
        prop::collection::btree_map("[a-e]", 0u64..1000, 0..5)
            .prop_map(|counts| GCounter { counts })
    }

    fn ads() -> impl Strategy<Value = Ads> {
        prop::collection::btree_map("ad[0-3]", counter(), 0..4).prop_map(|counters| Ads {
            limit: 5000,
            max_ads: 8,
            counters,
        })
    }

    fn merged(a: &GCounter, b: &GCounter) -> GCounter {
        let mut m = a.clone();
        m.merge(b);
        m
    }

    fn merged_ads(a: &Ads, b: &Ads) -> Ads {
        let mut m = a.clone();
        let out = m.merge(b);
        assert!(out.left_out.is_empty(), "room for every ad here");
        // A merge says it changed the table exactly when it did.
        assert_eq!(out.changed, m != *a);
        m
    }

    proptest! {
        #[test]
        fn counter_merge_is_commutative_associative_idempotent(
            a in counter(), b in counter(), c in counter()
        ) {
            prop_assert_eq!(merged(&a, &b), merged(&b, &a));
            prop_assert_eq!(merged(&merged(&a, &b), &c), merged(&a, &merged(&b, &c)));
            prop_assert_eq!(merged(&a, &a), a.clone());
            let mut m = a.clone();
            let changed = m.merge(&b);
            prop_assert_eq!(changed, m != a, "merge says whether it changed the counter");
            // A merge never loses what either side counted.
            let m = merged(&a, &b);
            prop_assert!(m.value() >= a.value().max(b.value()));
        }

        #[test]
        fn ads_merge_is_commutative_associative_idempotent(
            a in ads(), b in ads(), c in ads()
        ) {
            prop_assert_eq!(merged_ads(&a, &b), merged_ads(&b, &a));
            prop_assert_eq!(
                merged_ads(&merged_ads(&a, &b), &c),
                merged_ads(&a, &merged_ads(&b, &c))
            );
            prop_assert_eq!(merged_ads(&a, &a), a.clone());
        }

        #[test]
        fn a_delta_brings_what_the_whole_state_would(a in ads(), b in ads()) {
            let d = a.delta_from(&b);
            // Merged into the table it was taken against, the delta does the whole state's work.
            prop_assert_eq!(merged_ads(&b, &d), merged_ads(&b, &a));
            // It holds nothing that is not in `a`, and nothing at all against `a` itself.
            prop_assert_eq!(merged_ads(&a, &d), a.clone());
            prop_assert!(a.delta_from(&a).is_empty());
            // The counters alike.
            for (ad, c) in &a.counters {
                let old = b.counters.get(ad).cloned().unwrap_or_default();
                prop_assert_eq!(merged(&old, &c.delta_from(&old)), merged(&old, c));
            }
        }

        #[test]
        fn replicas_that_count_apart_and_exchange_end_with_every_increment(
            incs in prop::collection::vec((0usize..4, 0usize..3), 0..200),
            order in prop::collection::vec((0usize..4, 0usize..4), 0..40),
        ) {
            let names = ["r0", "r1", "r2", "r3"];
            let mut rs: Vec<Ads> = (0..4).map(|_| Ads::new(u64::MAX, 8)).collect();
            for (r, ad) in &incs {
                rs[*r].impression(names[*r], &format!("ad{ad}")).unwrap();
            }
            // Exchanges in an arbitrary order, then everyone with everyone once.
            for (from, to) in order.iter().copied().chain((0..4).flat_map(|i| (0..4).map(move |j| (i, j)))) {
                let s = rs[from].clone();
                rs[to].merge(&s);
            }
            for r in &rs {
                prop_assert_eq!(r, &rs[0]);
                prop_assert_eq!(r.total(), incs.len() as u64);
            }
        }
    }

    #[test]
    fn an_ad_is_disabled_at_its_limit_and_the_table_is_bounded() {
        let mut a = Ads::new(3, 2);
        assert_eq!(a.impression("r0", "x"), Ok(1));
        assert_eq!(a.impression("r1", "x"), Ok(2));
        assert_eq!(a.impression("r0", "x"), Ok(3));
        assert!(!a.enabled("x"));
        assert_eq!(a.impression("r2", "x"), Err(AdError::Disabled("x".into())));
        assert_eq!(a.impression("r0", "y"), Ok(1));
        assert_eq!(a.impression("r0", "z"), Err(AdError::Full("z".into(), 2)));
        let mut b = Ads::new(3, 2);
        b.impression("r9", "w").unwrap();
        // Merging into a full table leaves the new ad out, and says so.
        assert_eq!(
            a.merge(&b),
            Merged {
                changed: false,
                left_out: vec!["w".to_string()]
            }
        );
        assert_eq!(a.len(), 2);
        // Another replica learns the limit was reached by merging.
        let mut c = Ads::new(3, 2);
        c.merge(&a);
        assert_eq!(c.impression("r3", "x"), Err(AdError::Disabled("x".into())));
    }
}
