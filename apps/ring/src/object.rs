//! Stored objects and their versions: last-writer-wins on hybrid logical clocks.
//!
//! Every write gets a [`Version`] from the coordinating node's [`Clock`]: a hybrid logical
//! timestamp (milliseconds since the epoch in the high 48 bits, a counter in the low 16) and the
//! writer's node hash as a tie-break. Replicas keep the object with the highest version, so they
//! converge whatever the order in which writes, handoffs and read repairs arrive. A delete
//! writes a tombstone (an object without a value) so that an older value cannot come back
//! through read repair or handoff.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The version of a stored object; larger wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Version {
    /// Hybrid logical timestamp.
    pub ts: u64,
    /// Hash of the coordinating node's name (tie-break between equal timestamps).
    pub origin: u64,
}

/// A value (or a tombstone) with its version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Object {
    /// The value; `None` for a tombstone (a deleted key).
    pub value: Option<Bytes>,
    /// Its version.
    pub version: Version,
}

impl Object {
    /// Bytes the object holds (value only).
    pub fn size(&self) -> usize {
        self.value.as_ref().map_or(0, Bytes::len)
    }

    /// Whether this is a live value (not a tombstone).
    pub fn is_live(&self) -> bool {
        self.value.is_some()
    }
}

/// Picks the winner of two optional objects (last writer wins).
pub fn newest(a: Option<Object>, b: Option<Object>) -> Option<Object> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.version > a.version { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}

/// A hybrid logical clock: never goes backwards, and moves past every timestamp it observes.
#[derive(Debug)]
pub struct Clock {
    last: AtomicU64,
    origin: u64,
}

impl Clock {
    /// A clock for the node whose name hashes to `origin`.
    pub fn new(origin: u64) -> Clock {
        Clock {
            last: AtomicU64::new(0),
            origin,
        }
    }

    fn physical() -> u64 {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        ms << 16
    }

    /// A fresh version, larger than every version this clock issued or observed.
    pub fn tick(&self) -> Version {
        let phys = Self::physical();
        let mut cur = self.last.load(Ordering::Relaxed);
        loop {
            let next = phys.max(cur + 1);
            match self
                .last
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Version {
                        ts: next,
                        origin: self.origin,
                    }
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// Moves the clock past a timestamp seen in a stored object.
    pub fn observe(&self, ts: u64) {
        self.last.fetch_max(ts, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_and_observes() {
        let c = Clock::new(7);
        let a = c.tick();
        let b = c.tick();
        assert!(b > a);
        c.observe(b.ts + 1_000_000);
        assert!(c.tick().ts > b.ts + 1_000_000);
    }

    #[test]
    fn newest_wins() {
        let v = |ts| Version { ts, origin: 0 };
        let a = Object {
            value: Some(Bytes::from_static(b"a")),
            version: v(1),
        };
        let t = Object {
            value: None,
            version: v(2),
        };
        assert_eq!(newest(Some(a.clone()), Some(t.clone())), Some(t.clone()));
        assert_eq!(newest(Some(t.clone()), Some(a.clone())), Some(t));
        assert_eq!(newest(None, Some(a.clone())), Some(a));
    }
}
