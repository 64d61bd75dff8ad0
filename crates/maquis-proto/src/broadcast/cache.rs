//! The message cache: recent broadcasts, bounded by count and age, evicted oldest first.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use bytes::Bytes;

use super::types::{MsgId, Topic};

/// A fast multiply-rotate hasher with no random state, so that iteration orders (and so runs)
/// are reproducible. Not collision-resistant: the tables it serves are bounded, and their keys
/// come from cluster members.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        // Spread the high bits down: hashbrown takes its control byte from the top bits.
        self.0 ^ (self.0 >> 29)
    }
}

/// The build hasher of Plumtree's tables.
pub(crate) type Fixed = BuildHasherDefault<FxHasher>;

/// A cached broadcast.
#[derive(Clone, Debug)]
pub(crate) struct Cached {
    pub topic: Topic,
    pub payload: Bytes,
    /// Hops from the origin to this node.
    pub round: u16,
}

#[derive(Debug)]
pub(crate) struct Cache {
    map: HashMap<MsgId, Cached, Fixed>,
    /// Insertion order with insertion times (times never decrease).
    order: VecDeque<(MsgId, Duration)>,
    max: usize,
    ttl: Duration,
}

impl Cache {
    pub fn new(max: usize, ttl: Duration) -> Self {
        Cache {
            map: HashMap::default(),
            order: VecDeque::new(),
            max: max.max(1),
            ttl,
        }
    }

    pub fn contains(&self, id: &MsgId) -> bool {
        self.map.contains_key(id)
    }

    pub fn get(&self, id: &MsgId) -> Option<&Cached> {
        self.map.get(id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn insert(&mut self, id: MsgId, c: Cached, now: Duration) {
        self.expire(now);
        if self.map.insert(id, c).is_none() {
            self.order.push_back((id, now));
        }
        while self.map.len() > self.max {
            match self.order.pop_front() {
                Some((old, _)) => {
                    self.map.remove(&old);
                }
                None => break,
            }
        }
    }

    /// Evicts what is older than the time to live.
    pub fn expire(&mut self, now: Duration) {
        while let Some(&(id, at)) = self.order.front() {
            if now.saturating_sub(at) <= self.ttl {
                break;
            }
            self.order.pop_front();
            self.map.remove(&id);
        }
    }

    /// The newest `k` messages received at `since` or later, newest first.
    pub fn recent(&self, k: usize, since: Duration) -> impl Iterator<Item = (MsgId, &Cached)> {
        self.order
            .iter()
            .rev()
            .take_while(move |(_, at)| *at >= since)
            .filter_map(|(id, _)| self.map.get(id).map(|c| (*id, c)))
            .take(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> Cached {
        Cached {
            topic: Topic::from("t"),
            payload: Bytes::new(),
            round: 0,
        }
    }

    fn id(seq: u64) -> MsgId {
        MsgId { origin: 1, seq }
    }

    #[test]
    fn bounded_by_count_and_age_oldest_first() {
        let s = Duration::from_secs;
        let mut cache = Cache::new(3, s(10));
        for i in 0..5 {
            cache.insert(id(i), c(), s(i));
        }
        assert_eq!(cache.len(), 3);
        assert!(!cache.contains(&id(1)) && cache.contains(&id(2)));
        cache.expire(s(13));
        assert!(!cache.contains(&id(2)) && cache.contains(&id(3)));
        let recent: Vec<u64> = cache.recent(5, s(4)).map(|(i, _)| i.seq).collect();
        assert_eq!(recent, vec![4]);
        let recent: Vec<u64> = cache.recent(1, s(0)).map(|(i, _)| i.seq).collect();
        assert_eq!(recent, vec![4]);
    }
}
