//! Rendezvous (highest-random-weight) hashing: the replicas of a name are the members with the
//! highest weights `hash(name, member)`. A member that joins or leaves moves only the names
//! whose replica set it enters or leaves.
//!
//! The hash must give the same answer on every node, whatever its build, so it is written out
//! here (64-bit FNV-1a, then the SplitMix64 finalizer to spread FNV's weak low bits) rather
//! than taken from `std`, whose hasher is allowed to change between releases.

/// FNV-1a over `bytes`, continuing from `h`.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The weight of `member` (its name's bytes) for `name`.
pub fn weight(name: &str, member: &[u8]) -> u64 {
    let h = fnv(0xcbf2_9ce4_8422_2325, name.as_bytes());
    // A separator, so that ("ab", "c") and ("a", "bc") differ.
    let h = fnv(h, &[0xff]);
    mix(fnv(h, member))
}

/// The indices of the `n` members (given by their names' bytes) with the highest weights for
/// `name`, highest first; ties (equal weights) go to the smaller bytes.
pub fn top(name: &str, members: &[Vec<u8>], n: usize) -> Vec<usize> {
    let mut scored: Vec<(u64, usize)> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (weight(name, m), i))
        .collect();
    scored.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| members[a.1].cmp(&members[b.1])));
    scored.into_iter().take(n).map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("node{i}").into_bytes()).collect()
    }

    #[test]
    fn weights_are_fixed() {
        // The same on every build: a change here moves every name in a running cluster.
        assert_eq!(weight("a", b"n1"), weight("a", b"n1"));
        assert_ne!(weight("ab", b"c"), weight("a", b"bc"));
        assert_eq!(weight("name", b"node"), 0xc3fa_8f78_c910_d90c);
    }

    #[test]
    fn homes_spread_and_move_little() {
        let ten = names(10);
        let mut per = [0usize; 10];
        for k in 0..10_000 {
            per[top(&format!("k{k}"), &ten, 1)[0]] += 1;
        }
        assert!(per.iter().all(|&c| (700..1300).contains(&c)), "{per:?}");
        // Adding an eleventh member moves only the names it takes over.
        let eleven = names(11);
        let mut moved = 0;
        for k in 0..10_000 {
            let name = format!("k{k}");
            let before = top(&name, &ten, 1)[0];
            let after = top(&name, &eleven, 1)[0];
            if before != after {
                assert_eq!(after, 10);
                moved += 1;
            }
        }
        assert!((600..1300).contains(&moved), "{moved}");
    }

    #[test]
    fn top_n_is_a_prefix_of_the_order() {
        let m = names(7);
        let three = top("x", &m, 3);
        assert_eq!(three.len(), 3);
        assert_eq!(top("x", &m, 1)[0], three[0]);
        assert_eq!(&top("x", &m, 7)[..3], &three[..]);
        assert_eq!(top("x", &m, 99).len(), 7);
    }
}
