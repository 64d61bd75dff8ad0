//! The ring: who owns each partition, which transfers are pending, and the claim function that
//! computes a new ownership when the membership changes.
//!
//! A [`RingState`] is a value: the claimant computes a new one, gives it a higher version and
//! gossips it; every node adopts the highest ring it sees (see [`RingState::supersedes`]).
//! Ownership changes in two steps, as in Riak Core: the claimant first records the future owner
//! of a partition in `next` (the current owner keeps serving and hands its data off), and only
//! when the old owner reports the transfer complete does the claimant make the new node the
//! owner.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::hash::{key_hash, partition_of_hash};

/// `next` entry meaning "no pending transfer".
const NO_NEXT: u16 = u16::MAX;

/// The ring as gossiped between nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingState {
    /// Bumped by the claimant on every change.
    pub version: u64,
    /// The node that produced this version.
    pub claimant: String,
    /// Number of partitions `P`.
    pub partitions: u32,
    /// Ring members, sorted by name (owners and nodes still handing off while leaving).
    pub nodes: Vec<String>,
    /// Owner of each partition, as an index into `nodes`.
    pub owners: Vec<u16>,
    /// Pending owner of each partition (index into `nodes`), or `u16::MAX` for none.
    pub next: Vec<u16>,
    /// Members that asked to leave: they own partitions only until their transfers complete.
    pub leaving: Vec<String>,
    /// Members that left after handing everything off, with the incarnation that left; a later
    /// incarnation of the same name may join again. Pruned once the node is gone.
    pub departed: Vec<(String, u64)>,
}

/// What a node is for one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// The node owns the partition; `Some(next)` when it must hand it off to `next`.
    Owner(Option<String>),
    /// The node will own the partition once the current owner has handed it off.
    Next,
    /// Neither: any data it holds for the partition is fallback data to hand back.
    Other,
}

impl RingState {
    /// The ring of a node that is alone: it owns every partition.
    pub fn fresh(node: &str, partitions: u32) -> RingState {
        let p = partitions.max(1) as usize;
        RingState {
            version: 1,
            claimant: node.to_string(),
            partitions: p as u32,
            nodes: vec![node.to_string()],
            owners: vec![0; p],
            next: vec![NO_NEXT; p],
            leaving: Vec::new(),
            departed: Vec::new(),
        }
    }

    /// Whether `self` should replace `other`: a higher version wins; at equal versions (two
    /// claimants during a partition of the membership) the lower claimant name wins, then the
    /// content digest, so that every node picks the same ring.
    pub fn supersedes(&self, other: &RingState) -> bool {
        if self.version != other.version {
            return self.version > other.version;
        }
        if self.claimant != other.claimant {
            return self.claimant < other.claimant;
        }
        self.digest() > other.digest()
    }

    /// A digest of the content (not the version), to compare rings cheaply.
    pub fn digest(&self) -> u64 {
        let mut bytes = Vec::with_capacity(self.owners.len() * 4 + 64);
        for n in &self.nodes {
            bytes.extend_from_slice(n.as_bytes());
            bytes.push(0);
        }
        for (o, n) in self.owners.iter().zip(&self.next) {
            bytes.extend_from_slice(&o.to_be_bytes());
            bytes.extend_from_slice(&n.to_be_bytes());
        }
        for n in &self.leaving {
            bytes.extend_from_slice(n.as_bytes());
            bytes.push(1);
        }
        key_hash(&bytes)
    }

    /// Checks the internal consistency of a ring received from another node.
    pub fn is_well_formed(&self) -> bool {
        let p = self.partitions as usize;
        let n = self.nodes.len();
        p >= 1
            && p <= crate::config::MAX_PARTITIONS as usize
            && n >= 1
            && n < NO_NEXT as usize
            && self.owners.len() == p
            && self.next.len() == p
            && self.owners.iter().all(|&o| (o as usize) < n)
            && self.next.iter().all(|&x| x == NO_NEXT || (x as usize) < n)
            && self.nodes.windows(2).all(|w| w[0] < w[1])
    }

    /// The owner of partition `p`.
    pub fn owner(&self, p: u32) -> &str {
        &self.nodes[self.owners[p as usize] as usize]
    }

    /// The pending owner of partition `p`, if a transfer is planned.
    pub fn next_owner(&self, p: u32) -> Option<&str> {
        match self.next[p as usize] {
            NO_NEXT => None,
            i => Some(&self.nodes[i as usize]),
        }
    }

    /// What `node` is for partition `p`.
    pub fn role(&self, p: u32, node: &str) -> Role {
        let next = self.next_owner(p);
        if self.owner(p) == node {
            Role::Owner(next.filter(|n| *n != node).map(str::to_string))
        } else if next == Some(node) {
            Role::Next
        } else {
            Role::Other
        }
    }

    /// Partitions owned by `node`.
    pub fn owned_by(&self, node: &str) -> Vec<u32> {
        (0..self.partitions)
            .filter(|&p| self.owner(p) == node)
            .collect()
    }

    /// Number of planned transfers not yet completed.
    pub fn pending_transfers(&self) -> usize {
        self.next.iter().filter(|&&n| n != NO_NEXT).count()
    }

    /// Whether `node` is a member of this ring.
    pub fn has_node(&self, node: &str) -> bool {
        self.nodes
            .binary_search_by(|n| n.as_str().cmp(node))
            .is_ok()
    }

    /// Whether nothing is pending: no transfer planned, nobody leaving.
    pub fn is_settled(&self) -> bool {
        self.pending_transfers() == 0 && self.leaving.is_empty()
    }

    /// The partition that owns `key`.
    pub fn partition_of(&self, key: &[u8]) -> u32 {
        partition_of_hash(key_hash(key), self.partitions)
    }

    /// The preference list of partition `p`: `p` itself, then the partitions met walking
    /// clockwise whose owners are not yet in the list, until `n` entries. When the ring has
    /// fewer than `n` distinct owners, the remaining slots are filled with the next
    /// partitions clockwise whatever their owner (so a one-node ring still keeps `n` copies).
    pub fn preflist(&self, p: u32, n: usize) -> Vec<(u32, String)> {
        let total = self.partitions;
        let n = n.min(total as usize);
        let mut out: Vec<(u32, String)> = Vec::with_capacity(n);
        for i in 0..total {
            if out.len() == n {
                return out;
            }
            let q = (p + i) % total;
            let owner = self.owner(q);
            if !out.iter().any(|(_, o)| o == owner) {
                out.push((q, owner.to_string()));
            }
        }
        for i in 0..total {
            if out.len() == n {
                break;
            }
            let q = (p + i) % total;
            if !out.iter().any(|(x, _)| *x == q) {
                out.push((q, self.owner(q).to_string()));
            }
        }
        out
    }

    /// Nodes met walking clockwise from partition `p` (owners, in order, each once): where
    /// fallbacks for unreachable primaries are looked for.
    pub fn owners_clockwise(&self, p: u32) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for i in 0..self.partitions {
            let o = self.owner((p + i) % self.partitions);
            if !out.iter().any(|x| x == o) {
                out.push(o.to_string());
                if out.len() == self.nodes.len() {
                    break;
                }
            }
        }
        for n in &self.nodes {
            if !out.contains(n) {
                out.push(n.clone());
            }
        }
        out
    }

    /// Builds a ring from owner names (`next` by name too), re-indexing `nodes`.
    pub fn from_names(
        version: u64,
        claimant: &str,
        nodes: &BTreeSet<String>,
        owners: &[String],
        next: &[Option<String>],
        leaving: &BTreeSet<String>,
        departed: Vec<(String, u64)>,
    ) -> RingState {
        let list: Vec<String> = nodes.iter().cloned().collect();
        let index = |name: &str| -> u16 {
            list.binary_search_by(|n| n.as_str().cmp(name))
                .map(|i| i as u16)
                .unwrap_or(0)
        };
        RingState {
            version,
            claimant: claimant.to_string(),
            partitions: owners.len() as u32,
            owners: owners.iter().map(|o| index(o)).collect(),
            next: next
                .iter()
                .map(|x| x.as_deref().map(index).unwrap_or(NO_NEXT))
                .collect(),
            nodes: list,
            leaving: leaving.iter().cloned().collect(),
            departed,
        }
    }

    /// Owner names of every partition.
    pub fn owner_names(&self) -> Vec<String> {
        (0..self.partitions)
            .map(|p| self.owner(p).to_string())
            .collect()
    }

    /// Pending owner names of every partition.
    pub fn next_names(&self) -> Vec<Option<String>> {
        (0..self.partitions)
            .map(|p| self.next_owner(p).map(str::to_string))
            .collect()
    }
}

/// Counts the partitions whose owner also owns one of the `n - 1` partitions after it
/// (clockwise, wrapping): such partitions get a preference list that skips ahead.
pub fn spacing_violations(owners: &[String], n: usize) -> usize {
    let p = owners.len();
    (0..p)
        .filter(|&i| (1..n.min(p)).any(|d| owners[(i + d) % p] == owners[i]))
        .count()
}

/// The claim function: the ownership for `members` (sorted, not empty), starting from `base`
/// (the current or planned owner of each partition; `None` for partitions whose owner is gone
/// or leaving).
///
/// Deterministic (same inputs, same output on every node) and incremental:
/// 1. each member's target is `P / m` partitions, plus one for the `P mod m` members holding
///    the most partitions now (ties by name);
/// 2. a member gives up the partitions that sit within `w = min(n, m) - 1` partitions after
///    another of its own, then its excess over the target, spread evenly around the ring;
/// 3. free partitions go, in ring order, to a member below its target that owns none of the
///    `w` partitions on either side, preferring the previous owner, then the member furthest
///    below its target, then the name.
///
/// So a join moves about `P / m` partitions to the new node, taken evenly around the ring, and
/// a leave moves only the leaver's partitions. When that leaves clearly more partitions too
/// close to another of the same owner than a fresh round robin would (typically when the
/// member count first reaches `n`), the claim is a round robin instead, with the member order
/// that keeps the most partitions in place (Riak Core's claim makes the same trade).
pub fn claim(base: &[Option<String>], members: &[String], n: usize) -> Vec<String> {
    let p = base.len();
    let m = members.len();
    assert!(m > 0, "claim needs at least one member");
    if p == 0 {
        return Vec::new();
    }
    let index = |name: &str| members.iter().position(|x| x == name);
    let base_idx: Vec<Option<usize>> = base.iter().map(|b| b.as_deref().and_then(index)).collect();
    let mut held = vec![0usize; m];
    for a in base_idx.iter().flatten() {
        held[*a] += 1;
    }
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(held[i]), i));
    let mut target = vec![p / m; m];
    for &i in order.iter().take(p % m) {
        target[i] += 1;
    }
    // Spacing that can be achieved: n - 1 partitions, or m - 1 with fewer members.
    let window = (n.max(1) - 1).min(m - 1).min(p - 1);
    let inc = claim_incremental(&base_idx, &target, window);
    let out = if window == 0 {
        inc
    } else {
        let rr = round_robin(&base_idx, m, p);
        let (vi, vr) = (violations(&inc, window), violations(&rr, window));
        if vi > vr + (p / 32).max(1) {
            rr
        } else {
            inc
        }
    };
    out.into_iter().map(|i| members[i].clone()).collect()
}

/// Partitions whose owner also owns one of the `window` partitions after it (wrapping).
fn violations(owners: &[usize], window: usize) -> usize {
    let p = owners.len();
    (0..p)
        .filter(|&i| (1..=window).any(|d| owners[(i + d) % p] == owners[i]))
        .count()
}

fn claim_incremental(base: &[Option<usize>], target: &[usize], window: usize) -> Vec<usize> {
    let p = base.len();
    let m = target.len();
    let mut assign = base.to_vec();
    let mut counts = vec![0usize; m];
    for a in assign.iter().flatten() {
        counts[*a] += 1;
    }
    // 2a. Too close to an earlier kept partition of the same owner (wrapping at the end).
    for i in 0..p {
        let Some(o) = assign[i] else { continue };
        let before = (1..=window).any(|d| d <= i && assign[i - d] == Some(o));
        let wraps = (1..=window).any(|d| i + d >= p && assign[i + d - p] == Some(o));
        if before || wraps {
            assign[i] = None;
            counts[o] -= 1;
        }
    }
    // 2b. The excess, spread around the ring.
    let mut excess: Vec<usize> = (0..m)
        .map(|i| counts[i].saturating_sub(target[i]))
        .collect();
    let total: usize = excess.iter().sum();
    if let Some(even) = p.checked_div(total) {
        let mut spacing = even.max(1);
        while excess.iter().sum::<usize>() > 0 {
            let mut last: Option<usize> = None;
            for (i, slot) in assign.iter_mut().enumerate() {
                let Some(o) = *slot else { continue };
                if excess[o] == 0 || last.is_some_and(|l| i - l < spacing) {
                    continue;
                }
                *slot = None;
                excess[o] -= 1;
                counts[o] -= 1;
                last = Some(i);
            }
            spacing = (spacing / 2).max(1);
        }
    }
    // 3. Free partitions.
    for i in 0..p {
        if assign[i].is_some() {
            continue;
        }
        let conflicts = |c: usize, assign: &[Option<usize>]| {
            (1..=window)
                .any(|d| assign[(i + d) % p] == Some(c) || assign[(i + p - d) % p] == Some(c))
        };
        let best = (0..m).filter(|&c| counts[c] < target[c]).min_by_key(|&c| {
            (
                conflicts(c, &assign),
                base[i] != Some(c),
                std::cmp::Reverse(target[c] - counts[c]),
                c,
            )
        });
        // Targets sum to P and nobody holds more than its target here, so a candidate exists.
        let c = best.unwrap_or(0);
        assign[i] = Some(c);
        counts[c] += 1;
    }
    assign.into_iter().map(|a| a.unwrap_or(0)).collect()
}

/// `partition ↦ perm[partition mod m]`, with the permutation that keeps the most of `base`.
fn round_robin(base: &[Option<usize>], m: usize, p: usize) -> Vec<usize> {
    let mut overlap = vec![vec![0usize; m]; m];
    for (i, b) in base.iter().enumerate() {
        if let Some(c) = b {
            overlap[i % m][*c] += 1;
        }
    }
    let mut perm = vec![usize::MAX; m];
    let mut taken = vec![false; m];
    for _ in 0..m {
        let mut best: Option<(usize, usize, usize)> = None;
        for (r, row) in overlap.iter().enumerate() {
            if perm[r] != usize::MAX {
                continue;
            }
            for (c, &o) in row.iter().enumerate() {
                if taken[c] {
                    continue;
                }
                if best.is_none_or(|(_, _, bo)| o > bo) {
                    best = Some((r, c, o));
                }
            }
        }
        if let Some((r, c, _)) = best {
            perm[r] = c;
            taken[c] = true;
        }
    }
    (0..p).map(|i| perm[i % m]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn counts(owners: &[String], members: &[String]) -> Vec<usize> {
        members
            .iter()
            .map(|m| owners.iter().filter(|o| *o == m).count())
            .collect()
    }

    fn step(prev: &[String], members: &[String]) -> Vec<String> {
        let base: Vec<Option<String>> = prev
            .iter()
            .map(|o| members.contains(o).then(|| o.clone()))
            .collect();
        claim(&base, members, 3)
    }

    #[test]
    fn grows_and_shrinks_balanced_with_little_movement() {
        for p in [8usize, 64, 100, 1024] {
            let all = names(&["a", "b", "c", "d", "e"]);
            let mut owners = vec!["a".to_string(); p];
            for m in 2..=5 {
                let members = all[..m].to_vec();
                let new = step(&owners, &members);
                eprintln!(
                    "{p}/{m}: moved {}, violations {}",
                    owners.iter().zip(&new).filter(|(a, b)| a != b).count(),
                    spacing_violations(&new, 3)
                );
                let c = counts(&new, &members);
                assert!(
                    c.iter().max().unwrap() - c.iter().min().unwrap() <= 1,
                    "{p}/{m}: {c:?}"
                );
                let moved = owners.iter().zip(&new).filter(|(a, b)| a != b).count();
                if m == 3 {
                    // The spacing window grows from 1 to 2: the ring is re-laid as a round
                    // robin, keeping what it can.
                    assert!(moved <= 2 * p / 3 + m, "{p}/{m}: moved {moved}");
                } else if m > 3 {
                    // About P/m partitions move to the newcomer (plus rounding).
                    assert!(moved <= p / m + m, "{p}/{m}: moved {moved}");
                }
                if m >= 3 && p >= 64 {
                    let v = spacing_violations(&new, 3);
                    assert!(v <= p / 16, "{p}/{m}: {v} spacing violations");
                }
                // A fixed point: claiming again changes nothing.
                assert_eq!(step(&new, &members), new);
                owners = new;
            }
            for m in (3..5).rev() {
                let members = all[..m].to_vec();
                let new = step(&owners, &members);
                let c = counts(&new, &members);
                assert!(c.iter().max().unwrap() - c.iter().min().unwrap() <= 1);
                // Only the leaver's partitions move (plus rank-based rounding).
                let moved = owners.iter().zip(&new).filter(|(a, b)| a != b).count();
                assert!(moved <= p / (m + 1) + m + 1, "{p}/{m}: moved {moved}");
                owners = new;
            }
        }
    }

    #[test]
    fn preflist_distinct_owners_and_wraps() {
        let members = names(&["a", "b", "c"]);
        let owners = step(&vec!["a".to_string(); 64], &members);
        let ring = RingState::from_names(
            2,
            "a",
            &members.iter().cloned().collect(),
            &owners,
            &vec![None; 64],
            &BTreeSet::new(),
            Vec::new(),
        );
        assert!(ring.is_well_formed());
        for p in 0..64 {
            let pl = ring.preflist(p, 3);
            assert_eq!(pl.len(), 3);
            assert_eq!(pl[0].0, p);
            let distinct: BTreeSet<_> = pl.iter().map(|(_, o)| o.clone()).collect();
            assert_eq!(distinct.len(), 3, "{pl:?}");
        }
        let one = RingState::fresh("solo", 16);
        let pl = one.preflist(15, 3);
        assert_eq!(
            pl.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            vec![15, 0, 1]
        );
        assert_eq!(one.role(3, "solo"), Role::Owner(None));
        assert_eq!(one.role(3, "x"), Role::Other);
    }

    #[test]
    fn supersedes_is_a_total_order() {
        let a = RingState::fresh("a", 8);
        let b = RingState::fresh("b", 8);
        assert!(a.supersedes(&b) && !b.supersedes(&a));
        let mut c = b.clone();
        c.version = 2;
        assert!(c.supersedes(&a));
        assert!(!a.supersedes(&a));
    }
}
