//! What one DE-Bench process reports, in the shape both sides print it (the Erlang side
//! builds the same JSON by hand): per command kind a count, errors, and latencies in
//! logarithmic buckets 2 % wide (bucket `b` holds `[1.02^b, 1.02^(b+1))` microseconds), which
//! merge across processes by adding counts. A bucket scheme both languages compute in one line
//! is why this is not an HDR histogram.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const BASE: f64 = 1.02;

/// One command kind's outcomes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KindStats {
    /// Commands that succeeded.
    pub count: u64,
    /// Commands that failed.
    pub errors: u64,
    /// The first failure's message (Maquis only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
    /// Latency buckets (see the module docs) and their counts.
    #[serde(serialize_with = "pairs_out", deserialize_with = "pairs_in")]
    pub buckets: BTreeMap<i32, u64>,
}

fn pairs_out<S: Serializer>(m: &BTreeMap<i32, u64>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(m.iter())
}

fn pairs_in<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<i32, u64>, D::Error> {
    let v: Vec<(i32, u64)> = Vec::deserialize(d)?;
    let mut m = BTreeMap::new();
    for (b, n) in v {
        *m.entry(b).or_insert(0) += n;
    }
    Ok(m)
}

/// The bucket of a latency in microseconds.
pub fn bucket(us: u64) -> i32 {
    ((us.max(1) as f64).ln() / BASE.ln()).floor() as i32
}

impl KindStats {
    /// Counts one success of `us` microseconds.
    pub fn record(&mut self, us: u64) {
        self.count += 1;
        *self.buckets.entry(bucket(us)).or_insert(0) += 1;
    }

    /// Counts one failure.
    pub fn error(&mut self, why: &str) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(why.to_string());
        }
    }

    /// Adds another process's (or worker's) outcomes.
    pub fn merge(&mut self, other: &KindStats) {
        self.count += other.count;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        for (b, n) in &other.buckets {
            *self.buckets.entry(*b).or_insert(0) += n;
        }
    }

    /// The latency below which `p` % of the successes fall, in microseconds (the geometric
    /// middle of its bucket; within 1 %); 0 when there is none.
    pub fn percentile(&self, p: f64) -> u64 {
        let total: u64 = self.buckets.values().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return BASE.powf(f64::from(*b) + 0.5).round() as u64;
            }
        }
        0
    }
}

/// What one process (one Erlang VM, or one Maquis process of several nodes) measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeResult {
    /// Wall time of the measurement, seconds.
    pub seconds: f64,
    /// The process's own CPU seconds over it (the driver measures all processes itself).
    pub cpu_s: f64,
    /// Per command kind.
    pub commands: BTreeMap<String, KindStats>,
    /// What the runtime's counters rose by over the measurement, all the process's nodes
    /// together (Maquis only: routed messages dropped, sends that failed, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_within_two_percent_and_merge_by_adding() {
        let mut a = KindStats::default();
        for us in 1..=1000u64 {
            a.record(us);
        }
        for (p, want) in [(50.0, 500.0), (99.0, 990.0)] {
            let got = a.percentile(p) as f64;
            assert!((got - want).abs() / want < 0.02, "p{p}: {got}");
        }
        let mut b = KindStats::default();
        b.record(1_000_000);
        b.error("timeout");
        a.merge(&b);
        assert_eq!((a.count, a.errors), (1001, 1));
        assert!(a.percentile(100.0) > 990_000);
        // The JSON both sides print.
        let text = serde_json::to_string(&b).unwrap();
        assert!(text.contains("\"buckets\":[[697,1]]"), "{text}");
        let back: KindStats = serde_json::from_str(&text).unwrap();
        assert_eq!(back, b);
        assert_eq!(bucket(1), 0);
        assert_eq!(KindStats::default().percentile(50.0), 0);
    }
}
