//! A small log-linear histogram of nanosecond values (about 3% relative
//! precision, exact below 64 ns), used for the wire's lateness percentiles.

/// Sub-buckets per power of two.
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS; // 32
const LINEAR: u64 = 2 * SUB; // values below this are exact
const BUCKETS: usize = (LINEAR + (63 - SUB_BITS as u64) * SUB) as usize;

/// Counts of nanosecond values in log-linear buckets.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            count: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - v.leading_zeros(); // >= SUB_BITS + 1
    let mantissa = v >> (e - SUB_BITS); // in [SUB, 2*SUB)
    (LINEAR + u64::from(e - SUB_BITS - 1) * SUB + (mantissa - SUB)) as usize
}

/// Largest value that falls in bucket `i`.
fn upper(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let k = i - LINEAR;
    let e = k / SUB + u64::from(SUB_BITS) + 1;
    let mantissa = k % SUB + SUB;
    let shift = e - u64::from(SUB_BITS);
    let low = mantissa << shift;
    low.saturating_add((1u64 << shift) - 1)
}

impl Histogram {
    /// Records one value.
    pub fn record(&mut self, v: u64) {
        let i = index(v).min(BUCKETS - 1);
        self.counts[i] += 1;
        self.count += 1;
        self.sum += u128::from(v);
        self.max = self.max.max(v);
    }

    /// Number of values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Largest value recorded (exact), 0 when empty.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Mean of the recorded values, 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The value at quantile `q` in `[0, 1]` (upper edge of its bucket,
    /// never above the exact maximum), 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper(i).min(self.max);
            }
        }
        self.max
    }

    /// Forgets everything recorded.
    pub fn clear(&mut self) {
        *self = Histogram::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_cover_values() {
        for v in [
            0u64,
            1,
            63,
            64,
            65,
            100,
            1000,
            12_345,
            1 << 40,
            u64::MAX / 3,
        ] {
            let i = index(v);
            assert!(upper(i) >= v, "v={v} upper={}", upper(i));
            if i > 0 {
                assert!(upper(i - 1) < v, "v={v}");
            }
        }
        assert!(index(u64::MAX) < BUCKETS);
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.04, "{p50}");
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.04, "{p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert_eq!(h.max(), 1_000_000);
        assert_eq!(h.count(), 1000);
        assert!((h.mean() - 500_500.0).abs() < 1.0);
        h.clear();
        assert_eq!(h.count(), 0);
    }
}
