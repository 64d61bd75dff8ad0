//! The summary two replicas compare: per key range, a hash of every (key, version) in it.

use crate::object::Version;

/// Segments of a tree: a key's segment is the low bits of its ring hash (the high bits pick
/// its partition, so the keys of one partition spread over all segments).
pub const SEGMENTS: usize = 1024;

/// Per segment, the XOR of the entry hashes of the keys in it: updated in O(1) when an object
/// changes, equal on two replicas that hold the same versions of the same keys (up to 64-bit
/// hash collisions).
///
/// Two replicas compare all 1,024 segment hashes at once (8 KiB): with the ring's key counts a
/// deeper tree would save little, and one level keeps an exchange to three round trips.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    segments: Vec<u64>,
    keys: u64,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            segments: vec![0; SEGMENTS],
            keys: 0,
        }
    }
}

/// SplitMix64's finaliser: a fixed, well-mixing 64-bit permutation.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The segment of a key with ring hash `hash`.
pub fn segment_of(hash: u64) -> usize {
    (hash as usize) % SEGMENTS
}

/// The hash of one (key, version) entry; the key enters through its ring hash.
pub fn entry_hash(hash: u64, version: &Version) -> u64 {
    mix(hash ^ mix(version.ts ^ mix(version.origin)))
}

impl Tree {
    /// Accounts for a key whose stored version went from `old` to `new` (`None`: absent).
    pub fn update(&mut self, hash: u64, old: Option<&Version>, new: Option<&Version>) {
        let s = &mut self.segments[segment_of(hash)];
        if let Some(o) = old {
            *s ^= entry_hash(hash, o);
            self.keys -= 1;
        }
        if let Some(n) = new {
            *s ^= entry_hash(hash, n);
            self.keys += 1;
        }
    }

    /// The segment hashes.
    pub fn segments(&self) -> &[u64] {
        &self.segments
    }

    /// Keys accounted for.
    pub fn keys(&self) -> u64 {
        self.keys
    }
}

/// The segments whose hashes differ (all of them if the lengths differ, as from a peer that
/// sent something else than a tree).
pub fn diff(a: &[u64], b: &[u64]) -> Vec<u32> {
    if a.len() != b.len() {
        return (0..SEGMENTS as u32).collect();
    }
    a.iter()
        .zip(b)
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| i as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::key_hash;

    fn v(ts: u64) -> Version {
        Version { ts, origin: 1 }
    }

    #[test]
    fn same_content_same_tree_whatever_the_order() {
        let keys: Vec<u64> = (0..500u32).map(|i| key_hash(&i.to_be_bytes())).collect();
        let (mut a, mut b) = (Tree::default(), Tree::default());
        for (i, h) in keys.iter().enumerate() {
            a.update(*h, None, Some(&v(i as u64)));
        }
        // b sees older versions first, then the same final ones, in reverse order.
        for (i, h) in keys.iter().enumerate().rev() {
            b.update(*h, None, Some(&v(0)));
            b.update(*h, Some(&v(0)), Some(&v(i as u64)));
        }
        assert_eq!(a, b);
        assert!(diff(a.segments(), b.segments()).is_empty());
        assert_eq!(a.keys(), 500);
    }

    #[test]
    fn one_changed_version_shows_in_its_segment_only() {
        let h = key_hash(b"k");
        let (mut a, mut b) = (Tree::default(), Tree::default());
        a.update(h, None, Some(&v(1)));
        b.update(h, None, Some(&v(2)));
        assert_eq!(diff(a.segments(), b.segments()), vec![segment_of(h) as u32]);
        // Removing the key empties the tree again.
        a.update(h, Some(&v(1)), None);
        assert_eq!(a, Tree::default());
    }

    #[test]
    fn a_malformed_peer_tree_differs_everywhere() {
        assert_eq!(diff(&[0; 3], Tree::default().segments()).len(), SEGMENTS);
    }
}
