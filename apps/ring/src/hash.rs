//! Consistent hashing: keys to points on a 64-bit ring, points to partitions.
//!
//! The hash is the first 8 bytes (big-endian) of SHA-256 over the key, so it is the same on
//! every node, every build and every platform (unlike `std`'s hashers, which promise nothing
//! across releases). Partition `p` of `P` covers the points `[p·2⁶⁴/P, (p+1)·2⁶⁴/P)`; walking
//! the ring clockwise means walking partition indices upwards, wrapping from `P-1` to `0`.

use sha2::{Digest, Sha256};

/// The point of a key on the 64-bit ring.
pub fn key_hash(key: &[u8]) -> u64 {
    let digest = Sha256::digest(key);
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The partition (of `partitions`) that owns a point of the ring.
///
/// `partitions` must be at least 1.
pub fn partition_of_hash(hash: u64, partitions: u32) -> u32 {
    ((hash as u128 * partitions.max(1) as u128) >> 64) as u32
}

/// The partition (of `partitions`) that owns a key.
pub fn partition_of(key: &[u8], partitions: u32) -> u32 {
    partition_of_hash(key_hash(key), partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_in_range() {
        // Pinned: a change here would move every key of an existing cluster.
        assert_eq!(key_hash(b""), 0xe3b0_c442_98fc_1c14);
        for p in [1u32, 7, 64, 1024] {
            for i in 0..1000u32 {
                assert!(partition_of(&i.to_be_bytes(), p) < p);
            }
        }
        assert_eq!(partition_of_hash(0, 64), 0);
        assert_eq!(partition_of_hash(u64::MAX, 64), 63);
    }

    #[test]
    fn spreads_keys_evenly() {
        let p = 64u32;
        let mut counts = vec![0u32; p as usize];
        for i in 0..64_000u32 {
            counts[partition_of(format!("key:{i}").as_bytes(), p) as usize] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 800 && *max < 1200, "uneven: {min}..{max}");
    }
}
