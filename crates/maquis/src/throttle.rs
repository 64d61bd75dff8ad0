//! Warnings that cannot flood the log: a [`Throttle`] lets a warning through at most once per
//! interval and counts the ones it holds back, so the next line can say how many there were.
//! A peer that reconnects with a wrong cookie hundreds of times a second costs one line a
//! second, not hundreds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One call site's limit: a line at most every `interval`.
#[derive(Debug)]
pub(crate) struct Throttle {
    interval_us: u64,
    /// When the next line may go out, in microseconds since the process's first throttle.
    next_us: AtomicU64,
    /// Lines held back since the last one that went out.
    held: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl Throttle {
    /// At most one line per `interval`.
    pub(crate) const fn new(interval: Duration) -> Self {
        Throttle {
            interval_us: interval.as_micros() as u64,
            next_us: AtomicU64::new(0),
            held: AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last line)` if a line may go out now, `None` if this one is
    /// held back (and counted).
    pub(crate) fn allow(&self) -> Option<u64> {
        self.allow_at(epoch().elapsed().as_micros() as u64)
    }

    fn allow_at(&self, now_us: u64) -> Option<u64> {
        let next = self.next_us.load(Ordering::Relaxed);
        if now_us >= next
            && self
                .next_us
                .compare_exchange(
                    next,
                    now_us + self.interval_us,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.held.swap(0, Ordering::Relaxed));
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_counted() {
        let t = Throttle::new(Duration::from_secs(1));
        assert_eq!(t.allow_at(10), Some(0));
        for i in 0..500 {
            assert_eq!(t.allow_at(20 + i), None);
        }
        assert_eq!(t.allow_at(999_999), None);
        assert_eq!(t.allow_at(1_000_010), Some(501));
        assert_eq!(t.allow_at(1_000_011), None);
        assert_eq!(t.allow_at(5_000_000), Some(1));
    }
}
