//! The handshakes refused lately, by address and direction: what `/status` shows so that a
//! wrong cookie or an incompatible configuration is visible without reading logs. A refusal
//! by this node is counted by the other's IP address (each of its dials comes from another
//! port); a refusal by the other node by the address this node dialed.
//!
//! The table holds at most [`MAX_REFUSALS`] entries; a refusal from a new address when it is
//! full replaces the entry refused longest ago. Each entry keeps its count, the last reason and
//! when it came.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use crate::admin::RefusalStatus;

/// Entries the table keeps.
pub(crate) const MAX_REFUSALS: usize = 32;

/// A warning about one entry at most this often: its first refusal, then a line a minute with
/// the count since the last one.
const LOG_EVERY_US: u64 = 60_000_000;

#[derive(Debug)]
struct Entry {
    count: u64,
    reason: String,
    last_us: u64,
    /// When a warning about it was last logged.
    logged_us: Option<u64>,
    /// Refusals since then.
    unlogged: u64,
}

/// Refused handshakes by (address, refused by this node).
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    table: Mutex<HashMap<(String, bool), Entry>>,
}

impl Refusals {
    /// Records a refusal at `now_us` (microseconds since the node started). `Some(n)` when a
    /// warning about it is due — the first refusal of its address and direction, then at most
    /// one a minute — with the refusals it covers.
    pub(crate) fn record(
        &self,
        addr: SocketAddr,
        by_us: bool,
        reason: &str,
        now_us: u64,
    ) -> Option<u64> {
        let key = if by_us {
            (addr.ip().to_string(), true)
        } else {
            (addr.to_string(), false)
        };
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if !t.contains_key(&key) && t.len() >= MAX_REFUSALS {
            let oldest = t
                .iter()
                .min_by_key(|(_, e)| e.last_us)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                t.remove(&k);
            }
        }
        let e = t.entry(key).or_insert(Entry {
            count: 0,
            reason: String::new(),
            last_us: now_us,
            logged_us: None,
            unlogged: 0,
        });
        e.count += 1;
        e.unlogged += 1;
        e.last_us = now_us;
        if e.reason != reason {
            e.reason = reason.to_string();
        }
        let due = e
            .logged_us
            .is_none_or(|at| now_us.saturating_sub(at) >= LOG_EVERY_US);
        if !due {
            return None;
        }
        e.logged_us = Some(now_us);
        Some(std::mem::take(&mut e.unlogged))
    }

    /// The entries, the most recent first, with their age at `now_us`.
    pub(crate) fn snapshot(&self, now_us: u64) -> Vec<RefusalStatus> {
        let t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = t
            .iter()
            .map(|((addr, by_us), e)| RefusalStatus {
                addr: addr.clone(),
                by_us: *by_us,
                count: e.count,
                reason: e.reason.clone(),
                ago_ms: now_us.saturating_sub(e.last_us) / 1000,
            })
            .collect();
        v.sort_by_key(|r| r.ago_ms);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_persistent_refusal_is_warned_about_once_a_minute() {
        let r = Refusals::default();
        let a: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        assert_eq!(r.record(a, true, "x", 0), Some(1));
        // Every 2 s for a minute: nothing, then one line covering them.
        let mut lines = Vec::new();
        for i in 1..=31u64 {
            lines.extend(r.record(a, true, "x", i * 2_000_000));
        }
        assert_eq!(
            lines,
            vec![30],
            "one line at 60 s, for the 30 refusals since the first"
        );
    }

    #[test]
    fn counts_by_address_and_keeps_the_newest_when_full() {
        let r = Refusals::default();
        let a: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        assert_eq!(r.record(a, true, "authentication failed", 1_000), Some(1));
        // The same node dialing again, from another port: the same row, no new warning.
        let again: SocketAddr = "10.0.0.1:41234".parse().unwrap();
        assert_eq!(r.record(again, true, "authentication failed", 2_000), None);
        assert_eq!(
            r.record(a, false, "incompatible configuration", 3_000),
            Some(1)
        );
        let s = r.snapshot(5_000);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].by_us, s[0].count, s[0].ago_ms), (false, 1, 2));
        assert_eq!(s[0].addr, "10.0.0.1:7000");
        assert_eq!((s[1].by_us, s[1].count, s[1].ago_ms), (true, 2, 3));
        assert_eq!(s[1].addr, "10.0.0.1");
        for i in 0..(MAX_REFUSALS as u8 + 10) {
            let addr = SocketAddr::from(([10, 0, 1, i], 7000));
            r.record(addr, false, "x", 10_000 + 1_000 * u64::from(i));
        }
        let s = r.snapshot(100_000);
        assert_eq!(s.len(), MAX_REFUSALS, "bounded");
        assert!(
            s.iter().all(|e| !e.addr.starts_with("10.0.0.1")),
            "the oldest went first"
        );
        assert_eq!(s[0].addr, "10.0.1.41:7000");
    }
}
