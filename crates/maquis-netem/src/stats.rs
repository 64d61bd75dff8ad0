//! Counters kept by the wire and the report built from them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::hist::Histogram;

/// Per-direction counters (one direction = an ordered pair of hosts).
#[derive(Debug, Default)]
pub(crate) struct DirCounters {
    pub packets: AtomicU64,
    pub bytes: AtomicU64,
    /// Wire clock (ns) of the first and last delivery; first is u64::MAX
    /// until something was delivered.
    pub first_ns: AtomicU64,
    pub last_ns: AtomicU64,
    pub drop_loss: AtomicU64,
    pub drop_partition: AtomicU64,
    pub drop_queue: AtomicU64,
    pub drop_rate_queue: AtomicU64,
    pub write_errors: AtomicU64,
}

/// Per-host counters for frames read from the host's TUN device.
#[derive(Debug, Default)]
pub(crate) struct HostCounters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub unroutable: AtomicU64,
    pub read_errors: AtomicU64,
}

/// All counters of one wire.
#[derive(Debug)]
pub(crate) struct Counters {
    pub dirs: Vec<DirCounters>,
    pub hosts: Vec<HostCounters>,
    pub lateness: Mutex<Histogram>,
    /// Wire clock (ns) of the last reset (or start).
    pub since_ns: AtomicU64,
}

impl Counters {
    pub fn new(hosts: usize) -> Self {
        let c = Counters {
            dirs: (0..hosts * hosts).map(|_| DirCounters::default()).collect(),
            hosts: (0..hosts).map(|_| HostCounters::default()).collect(),
            lateness: Mutex::new(Histogram::default()),
            since_ns: AtomicU64::new(0),
        };
        for d in &c.dirs {
            d.first_ns.store(u64::MAX, Relaxed);
        }
        c
    }

    pub fn delivered(&self, dir: usize, bytes: usize, now_ns: u64) {
        if let Some(d) = self.dirs.get(dir) {
            d.packets.fetch_add(1, Relaxed);
            d.bytes.fetch_add(bytes as u64, Relaxed);
            d.first_ns.fetch_min(now_ns, Relaxed);
            d.last_ns.fetch_max(now_ns, Relaxed);
        }
    }

    pub fn reset(&self, now_ns: u64) {
        for d in &self.dirs {
            for a in [
                &d.packets,
                &d.bytes,
                &d.last_ns,
                &d.drop_loss,
                &d.drop_partition,
                &d.drop_queue,
                &d.drop_rate_queue,
                &d.write_errors,
            ] {
                a.store(0, Relaxed);
            }
            d.first_ns.store(u64::MAX, Relaxed);
        }
        for h in &self.hosts {
            for a in [&h.rx_packets, &h.rx_bytes, &h.unroutable, &h.read_errors] {
                a.store(0, Relaxed);
            }
        }
        self.lateness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.since_ns.store(now_ns, Relaxed);
    }
}

/// A snapshot of an emulated network's configuration and counters, as
/// returned by [`crate::NetemHandle::stats`] and the `stats` control command
/// (serialised as JSON).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NetemStats {
    /// Name prefix of the network's hosts.
    pub prefix: String,
    /// Seconds covered by the counters (since start or the last reset).
    pub elapsed_s: f64,
    /// Current one-way delay per traversal of the wire, in microseconds.
    pub delay_us: f64,
    /// Current loss probability in `[0, 1]`.
    pub loss: f64,
    /// Current per-link rate limit in bits per second, if any.
    pub rate_bit_s: Option<u64>,
    /// Hosts currently cut off from the rest (empty when healed).
    pub partition: Vec<String>,
    /// Whether TUN offloads (checksum, TSO) are on.
    pub offload: bool,
    /// Whether the wire thread runs at real-time (SCHED_FIFO) priority.
    pub realtime: bool,
    /// Per-host counters of frames read from the host.
    pub hosts: Vec<HostStats>,
    /// Per-direction counters; only directions that saw traffic or drops.
    pub directions: Vec<DirectionStats>,
    /// Sum over all directions.
    pub total: DirectionStats,
    /// How late the wire delivered packets relative to their due time.
    pub lateness: LatenessStats,
    /// Problems worth a warning line (e.g. lateness p99 above 10% of the
    /// delay).
    pub warnings: Vec<String>,
    /// TCP-related sysctls as seen inside the first host's namespace.
    pub sysctls: BTreeMap<String, String>,
}

/// Counters of one host's TUN device.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostStats {
    /// Namespace name, e.g. `mq-h1`.
    pub name: String,
    /// The host's IPv4 address.
    pub address: String,
    /// Frames read from the host (GSO segments count once).
    pub rx_packets: u64,
    /// Bytes read from the host, virtio-net headers included.
    pub rx_bytes: u64,
    /// Frames with no destination host (not IPv4, or outside the subnet);
    /// dropped.
    pub unroutable: u64,
    /// Failed reads from the TUN device.
    pub read_errors: u64,
}

/// Counters of one direction (ordered host pair) or of all of them.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DirectionStats {
    /// Sending host (`*` in the total).
    pub from: String,
    /// Receiving host (`*` in the total).
    pub to: String,
    /// Frames delivered (GSO segments count once).
    pub packets: u64,
    /// Bytes delivered, virtio-net headers included.
    pub bytes: u64,
    /// Seconds from the first to the last delivery.
    pub active_s: f64,
    /// Delivered frames per second over `active_s`.
    pub packets_per_s: f64,
    /// Delivered gigabits per second over `active_s`.
    pub gbit_per_s: f64,
    /// Bytes currently queued in this direction.
    pub queued_bytes: u64,
    /// Dropped by random loss.
    pub dropped_loss: u64,
    /// Dropped by a partition.
    pub dropped_partition: u64,
    /// Dropped because the direction's delay queue was full (tail drop).
    pub dropped_queue_full: u64,
    /// Dropped because the rate limiter's backlog was full (tail drop).
    pub dropped_rate_queue_full: u64,
    /// Failed writes into the destination TUN device.
    pub write_errors: u64,
}

impl DirectionStats {
    /// All drops of any kind.
    pub fn dropped(&self) -> u64 {
        self.dropped_loss
            + self.dropped_partition
            + self.dropped_queue_full
            + self.dropped_rate_queue_full
            + self.write_errors
    }
}

/// Lateness = actual send time − due time, per delivered packet, in
/// microseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct LatenessStats {
    /// Packets measured.
    pub count: u64,
    /// Mean lateness.
    pub mean_us: f64,
    /// Median lateness.
    pub p50_us: f64,
    /// 99th percentile lateness.
    pub p99_us: f64,
    /// 99.9th percentile lateness.
    pub p999_us: f64,
    /// Largest lateness.
    pub max_us: f64,
}

impl LatenessStats {
    pub(crate) fn from_histogram(h: &Histogram) -> Self {
        LatenessStats {
            count: h.count(),
            mean_us: h.mean() / 1e3,
            p50_us: h.quantile(0.5) as f64 / 1e3,
            p99_us: h.quantile(0.99) as f64 / 1e3,
            p999_us: h.quantile(0.999) as f64 / 1e3,
            max_us: h.max() as f64 / 1e3,
        }
    }
}

/// The warning for a run whose p99 lateness exceeds 10% of the delay, if
/// it does.
pub(crate) fn lateness_warning(
    lateness: &LatenessStats,
    delay_us: f64,
    realtime: bool,
) -> Option<String> {
    if lateness.count == 0 || delay_us <= 0.0 || lateness.p99_us <= delay_us * 0.1 {
        return None;
    }
    let hint = if realtime {
        "the wire is saturated by the packet rate, or was preempted"
    } else {
        "the wire is not at real-time priority"
    };
    Some(format!(
        "wire lateness p99 {:.0}us exceeds 10% of the {:.0}us delay; emulated delays are \
         inaccurate ({hint})",
        lateness.p99_us, delay_us
    ))
}

impl NetemStats {
    /// A human-readable multi-line report (what `netem up` prints at exit).
    pub fn report(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "netem {}: delay {:.3}ms one-way, loss {:.4}%, rate {}, offload {}, realtime {}, {:.1}s",
            self.prefix,
            self.delay_us / 1e3,
            self.loss * 100.0,
            self.rate_bit_s
                .map(|r| crate::Rate::from_bits_per_sec(r).to_string())
                .unwrap_or_else(|| "unlimited".into()),
            self.offload,
            self.realtime,
            self.elapsed_s
        );
        if !self.partition.is_empty() {
            let _ = writeln!(s, "partitioned: {}", self.partition.join(","));
        }
        for d in self.directions.iter().chain(std::iter::once(&self.total)) {
            let _ = writeln!(
                s,
                "  {:>10} -> {:<10} {:>10} pkts {:>14} bytes  {:>9.0} pkt/s {:>8.3} Gbit/s  dropped loss {} partition {} queue {} rate-queue {} write-err {}",
                d.from,
                d.to,
                d.packets,
                d.bytes,
                d.packets_per_s,
                d.gbit_per_s,
                d.dropped_loss,
                d.dropped_partition,
                d.dropped_queue_full,
                d.dropped_rate_queue_full,
                d.write_errors
            );
        }
        for h in &self.hosts {
            if h.unroutable > 0 || h.read_errors > 0 {
                let _ = writeln!(
                    s,
                    "  {}: {} unroutable frames dropped, {} read errors",
                    h.name, h.unroutable, h.read_errors
                );
            }
        }
        let l = &self.lateness;
        let _ = writeln!(
            s,
            "  lateness over {} packets: p50 {:.1}us p99 {:.1}us p99.9 {:.1}us max {:.1}us mean {:.1}us",
            l.count, l.p50_us, l.p99_us, l.p999_us, l.max_us, l.mean_us
        );
        if !self.sysctls.is_empty() {
            let kv: Vec<String> = self
                .sysctls
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let _ = writeln!(s, "  sysctls (in host namespace): {}", kv.join("; "));
        }
        for w in &self.warnings {
            let _ = writeln!(s, "WARNING: {w}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warning_threshold() {
        let mut l = LatenessStats {
            count: 10,
            p99_us: 900.0,
            ..Default::default()
        };
        assert!(lateness_warning(&l, 10_000.0, true).is_none());
        l.p99_us = 1_100.0;
        assert!(lateness_warning(&l, 10_000.0, true).is_some());
        assert!(lateness_warning(&l, 0.0, true).is_none());
        l.count = 0;
        assert!(lateness_warning(&l, 10_000.0, true).is_none());
    }
}
