//! The restart intensity: at most `max` restarts within any window of `within`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The times of the recent restarts, at most `max` of them.
#[derive(Debug)]
pub(crate) struct Intensity {
    max: u32,
    within: Duration,
    recent: VecDeque<Instant>,
}

impl Intensity {
    pub(crate) fn new(max: u32, within: Duration) -> Self {
        Intensity {
            max,
            within,
            recent: VecDeque::with_capacity(max as usize),
        }
    }

    pub(crate) fn max(&self) -> u32 {
        self.max
    }

    pub(crate) fn within(&self) -> Duration {
        self.within
    }

    /// Records a restart at `now`; false if it would be one more than `max` within `within`
    /// (the supervisor gives up instead).
    pub(crate) fn record(&mut self, now: Instant) -> bool {
        while let Some(&t) = self.recent.front() {
            if now.saturating_duration_since(t) >= self.within {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        if self.recent.len() >= self.max as usize {
            return false;
        }
        self.recent.push_back(now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_max_restarts_within_the_window_and_no_more() {
        let t0 = Instant::now();
        let mut i = Intensity::new(3, Duration::from_secs(5));
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(i.record(at(0)));
        assert!(i.record(at(1000)));
        assert!(i.record(at(2000)));
        assert!(!i.record(at(3000)), "a fourth restart within 5 s");
    }

    #[test]
    fn restarts_older_than_the_window_no_longer_count() {
        let t0 = Instant::now();
        let mut i = Intensity::new(2, Duration::from_secs(5));
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(i.record(at(0)));
        assert!(i.record(at(4000)));
        assert!(i.record(at(5000)), "the first one left the window");
        assert!(!i.record(at(5500)));
        assert!(i.record(at(9000)));
    }

    #[test]
    fn zero_restarts_allows_none() {
        let mut i = Intensity::new(0, Duration::from_secs(1));
        assert!(!i.record(Instant::now()));
    }
}
