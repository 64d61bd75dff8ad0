//! Deciding how the scheduler waits for the next due frame.
//!
//! Timed sleeps on this kind of machine (a VM) end 100–300 µs late even at
//! real-time priority. The pacer therefore sleeps until a *margin* before
//! the due time — the margin tracks the observed oversleep — and spins for
//! the rest. Spinning is bounded by a CPU budget (a small share of wall
//! time) so that a busy wire never burns a core: without budget it simply
//! sleeps to the due time and accepts the lateness.

/// Share of wall time the scheduler may spend spinning (1/SPIN_SHARE).
const SPIN_SHARE: u64 = 20; // 5%
/// Most spin budget that can be saved up, in ns.
const MAX_BUDGET_NS: u64 = 2_000_000;
/// Bounds of the early-wake margin, in ns.
const MIN_MARGIN_NS: u64 = 20_000;
const MAX_MARGIN_NS: u64 = 400_000;

/// How to wait for a frame due `gap` ns from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Sleep (timed condition-variable wait) this many ns, then re-check.
    Sleep(u64),
    /// Busy-wait until the due time (without holding the queue lock).
    Spin,
}

/// Early-wake margin estimator plus spin budget.
#[derive(Debug, Clone)]
pub struct Pacer {
    margin_ns: u64,
    budget_ns: u64,
    refilled_at: u64,
    enabled: bool,
    spun_total_ns: u64,
    sleeps: u64,
}

impl Pacer {
    /// A pacer; with `enabled == false` it always sleeps to the due time.
    pub fn new(enabled: bool, now: u64) -> Self {
        Pacer {
            margin_ns: 100_000,
            budget_ns: MAX_BUDGET_NS,
            refilled_at: now,
            enabled,
            spun_total_ns: 0,
            sleeps: 0,
        }
    }

    /// Plans the wait for a frame due `gap` ns after `now`.
    pub fn plan(&mut self, now: u64, gap: u64) -> Wait {
        if !self.enabled {
            return Wait::Sleep(gap);
        }
        let earned = now.saturating_sub(self.refilled_at) / SPIN_SHARE;
        self.budget_ns = (self.budget_ns + earned).min(MAX_BUDGET_NS);
        self.refilled_at = now;
        if gap <= self.margin_ns {
            if gap <= self.budget_ns {
                Wait::Spin
            } else {
                Wait::Sleep(gap)
            }
        } else {
            Wait::Sleep(gap - self.margin_ns)
        }
    }

    /// Records that a timed sleep asked for `asked` ns and took `took` ns.
    pub fn slept(&mut self, asked: u64, took: u64) {
        self.sleeps += 1;
        let over = took.saturating_sub(asked);
        // Move the margin 1/8 of the way towards 1.5x the oversleep: it
        // follows the typical oversleep but not single outliers.
        let target = over + over / 2;
        let m = self.margin_ns as i64 + (target as i64 - self.margin_ns as i64) / 8;
        self.margin_ns = (m.max(0) as u64).clamp(MIN_MARGIN_NS, MAX_MARGIN_NS);
    }

    /// Records `ns` spent spinning.
    pub fn spun(&mut self, ns: u64) {
        self.budget_ns = self.budget_ns.saturating_sub(ns);
        self.spun_total_ns += ns;
    }

    /// The current early-wake margin in ns.
    pub fn margin_ns(&self) -> u64 {
        self.margin_ns
    }

    /// Total ns spent spinning and number of timed sleeps so far.
    pub fn totals(&self) -> (u64, u64) {
        (self.spun_total_ns, self.sleeps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_until_margin_then_spins() {
        let mut p = Pacer::new(true, 0);
        assert_eq!(p.plan(0, 1_000_000), Wait::Sleep(900_000));
        assert_eq!(p.plan(0, 50_000), Wait::Spin);
        let mut off = Pacer::new(false, 0);
        assert_eq!(off.plan(0, 50_000), Wait::Sleep(50_000));
    }

    #[test]
    fn budget_limits_spinning() {
        let mut p = Pacer::new(true, 0);
        p.spun(MAX_BUDGET_NS);
        assert_eq!(p.plan(0, 50_000), Wait::Sleep(50_000));
        // 1 ms later 5% of it (50 µs) has been earned back.
        assert_eq!(p.plan(1_000_000, 50_000), Wait::Spin);
    }

    #[test]
    fn margin_tracks_oversleep() {
        let mut p = Pacer::new(true, 0);
        for _ in 0..100 {
            p.slept(1_000_000, 1_200_000);
        }
        assert!(
            (290_000..=310_000).contains(&p.margin_ns),
            "{}",
            p.margin_ns
        );
        for _ in 0..100 {
            p.slept(1_000_000, 1_000_000);
        }
        assert_eq!(p.margin_ns, MIN_MARGIN_NS);
    }
}
