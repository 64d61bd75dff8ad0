//! Active anti-entropy: replicas compare summaries of what they hold and repair each other in
//! the background, without waiting for a read.
//!
//! The replicas of a key are the vnodes of its preference list: the key's primary partition
//! `q` and the next partitions clockwise on other nodes. So every vnode holds keys of a few
//! primary partitions, and for each such `q` it keeps a [`Tree`]: per segment (a slice of the
//! key space), the XOR of a hash of every (key, version) it holds, updated as objects change.
//! Two vnodes that both replicate `q` are a *pair*. An exchange of a pair (run by the node of
//! the first vnode, on the `handoff` channel so that it never queues before requests):
//!
//! 1. both trees for `q` (1,024 segment hashes each); equal: done, the pair is in sync;
//! 2. the keys and versions of both sides in the segments that differ (at most
//!    [`MAX_SEGMENTS`] segments a round);
//! 3. each side gets the objects it lacks or holds older, in chunks of at most
//!    `handoff_chunk_entries` (acknowledged once stored, and durable with a durable backend);
//!
//! then again from 1, for at most [`MAX_ROUNDS`] rounds and `aae_max_objects` objects.
//!
//! In the background a node runs one exchange at a time: every `aae_interval` it starts the
//! next of its pairs, round robin. A vnode that is *recovering* (its node came back, or took
//! its partition over without the data) goes first: recovering vnodes run their exchanges
//! back to back, `aae_recovery_concurrency` vnodes at once (each vnode's pairs one after the
//! other), and once a vnode has had one exchange in sync with every live replica of every `q`
//! it holds, it is trusted again.

mod exchange;
mod schedule;
mod tree;

use std::collections::BTreeMap;

pub use self::tree::{diff, entry_hash, segment_of, Tree, SEGMENTS};
pub(crate) use exchange::{exchange, Outcome};
pub(crate) use schedule::Scheduler;

use crate::ring::RingState;

/// Differing segments compared in one round of an exchange.
pub const MAX_SEGMENTS: usize = 64;

/// Rounds of one exchange at most (writes arriving meanwhile can keep trees apart).
pub const MAX_ROUNDS: usize = 16;

/// Two vnodes that replicate the keys of one primary partition.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pair {
    /// The local vnode's partition.
    pub local: u32,
    /// The primary partition whose keys both replicate.
    pub q: u32,
    /// The other vnode's node.
    pub peer: String,
    /// The other vnode's partition.
    pub peer_partition: u32,
}

/// The pairs of every vnode of `me`, by its partition: for each primary partition `q`, the
/// entries of `q`'s preference list on `me` paired with the list's other entries. One pass
/// over the ring (`P` preference lists).
pub fn pairs_by_partition(ring: &RingState, me: &str, n_val: usize) -> BTreeMap<u32, Vec<Pair>> {
    let mut out: BTreeMap<u32, Vec<Pair>> = BTreeMap::new();
    for q in 0..ring.partitions {
        let list = ring.preflist(q, n_val);
        for (p, o) in list.iter().filter(|(_, o)| o == me) {
            for (pp, oo) in list
                .iter()
                .filter(|e| (e.0, e.1.as_str()) != (*p, o.as_str()))
            {
                out.entry(*p).or_default().push(Pair {
                    local: *p,
                    q,
                    peer: oo.clone(),
                    peer_partition: *pp,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_the_other_replicas_of_each_primary_partition() {
        let ring = RingState::fresh("a", 8);
        // One node: every preference list is three of its own partitions.
        let all = pairs_by_partition(&ring, "a", 3);
        let ps = &all[&3];
        // Partition 3 replicates primaries 1, 2 and 3, each with two other partitions.
        let qs: std::collections::BTreeSet<u32> = ps.iter().map(|p| p.q).collect();
        assert_eq!(qs, std::collections::BTreeSet::from([1, 2, 3]));
        assert_eq!(ps.len(), 6);
        assert!(ps
            .iter()
            .all(|p| p.peer == "a" && p.peer_partition != 3 && p.local == 3));
        assert_eq!(all.values().map(Vec::len).sum::<usize>(), 8 * 6);
        assert!(pairs_by_partition(&ring, "b", 3).is_empty());
    }
}
