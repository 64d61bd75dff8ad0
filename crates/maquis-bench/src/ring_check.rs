//! Checking what the KVS workload was told against what the store kept, for the fault mode of
//! `maquis-bench kvs` ([`crate::ring_faults`]).
//!
//! Every value written carries, in its first 8 bytes, the wall-clock microsecond at which its
//! write began (its *stamp*). Each key has one writing node (key `k` is written only from node
//! `k mod writers`), and that node's actors take a per-key lock around a write, so the writes of
//! one key are sequential: their stamps, and the versions the ring gives them (the coordinator's
//! hybrid logical clock), grow in the same order. A node restarted after a crash starts its
//! clock at the wall-clock time again, later than any stamp of the process that died.
//!
//! Each agent appends one line per request to an operation log that outlives the process (a
//! plain file, written with one `write` call per line and no user-space buffer, so a kill -9
//! loses no line it wrote):
//!
//! - `w KEY STAMP ACK_US`: a write acknowledged at `ACK_US`;
//! - `r KEY STAMP|- START_US END_US`: a read that began at `START_US` and returned that stamp
//!   (or nil);
//! - `e START_US END_US`: a request that failed.
//!
//! From the logs of every process and a final read of every key through every node,
//! [`analyze`] counts:
//!
//! - **stale reads**: reads that returned a stamp older than the newest write of that key
//!   acknowledged before the read began (nil counts as older than anything);
//! - **lost acknowledged writes**: keys whose newest acknowledged write the final reads do not
//!   return (an older value, or nil).
//!
//! Wall-clock times of different processes compare because they all run on this one machine.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// What an agent records, and which keys it writes, in the fault mode.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Check {
    /// The operation log to append to.
    pub log: PathBuf,
    /// This node's index among the writers: it writes the keys `k` with
    /// `k % writers == writer`.
    pub writer: u64,
    /// Number of writing nodes.
    pub writers: u64,
}

impl Check {
    /// The key this node writes in place of `k`: the nearest key below `keys` that it owns.
    pub fn owned_key(&self, k: u64, keys: u64) -> u64 {
        let w = self.writers.max(1);
        let mine = k - k % w + self.writer % w;
        if mine < keys {
            mine
        } else {
            mine.saturating_sub(w)
        }
    }
}

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A value of `size` bytes (at least 8) that starts with `stamp`.
pub fn stamped(stamp: u64, size: usize) -> Bytes {
    let mut b = BytesMut::with_capacity(size.max(8));
    b.put_u64(stamp);
    b.resize(size.max(8), 0x42);
    b.freeze()
}

/// The stamp a value starts with (0 for a value too short to hold one).
pub fn stamp_of(v: &[u8]) -> u64 {
    v.get(..8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0)
}

/// An agent's operation log.
#[derive(Debug)]
pub struct OpLog {
    file: Mutex<std::fs::File>,
    failures: AtomicU64,
}

impl OpLog {
    /// Opens (creating or appending to) the log at `path`.
    pub fn open(path: &Path) -> Result<OpLog, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(OpLog {
            file: Mutex::new(file),
            failures: AtomicU64::new(0),
        })
    }

    fn line(&self, line: String) {
        let ok = self
            .file
            .lock()
            .map(|mut f| f.write_all(line.as_bytes()).is_ok())
            .unwrap_or(false);
        if !ok {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A write of key index `key` with `stamp`, acknowledged now.
    pub fn acked(&self, key: u64, stamp: u64) {
        self.line(format!("w {key} {stamp} {}\n", now_us()));
    }

    /// A read of `key` that began at `start_us` and returned `stamp` (`None`: nil).
    pub fn read(&self, key: u64, stamp: Option<u64>, start_us: u64) {
        let s = stamp.map_or_else(|| "-".to_string(), |s| s.to_string());
        self.line(format!("r {key} {s} {start_us} {}\n", now_us()));
    }

    /// A request that began at `start_us` and failed.
    pub fn failed(&self, start_us: u64) {
        self.line(format!("e {start_us} {}\n", now_us()));
    }

    /// Lines that could not be written.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// One read of the operation logs.
#[derive(Clone, Copy, Debug)]
struct Read {
    key: u64,
    stamp: Option<u64>,
    start_us: u64,
    end_us: u64,
}

/// What the logs and the final reads show.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Findings {
    /// Acknowledged writes, pre-load included.
    pub acked_writes: u64,
    /// Acknowledged writes after the pre-load.
    pub acked_writes_in_run: u64,
    /// Reads that answered.
    pub reads: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Reads older than a write acknowledged before they began.
    pub stale_reads: u64,
    /// Stale reads that returned nil.
    pub stale_nil_reads: u64,
    /// Keys whose newest acknowledged write is not what a final read returned.
    pub lost_acked_writes: u64,
    /// Final reads (node × key) older than the key's newest acknowledged write.
    pub wrong_final_reads: u64,
    /// Final reads that failed (not counted as lost).
    pub failed_final_reads: u64,
    /// Log lines that did not parse.
    pub bad_lines: u64,
    /// Requests that completed (answered or failed) from `from_us` on, per second of the
    /// window to the last request.
    pub ops_per_s: f64,
    /// Up to five stale reads, described.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub stale_examples: Vec<String>,
    /// Up to five lost writes, described.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub lost_examples: Vec<String>,
}

/// What a final read of one key returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinalRead {
    /// A value with this stamp.
    Stamp(u64),
    /// Nil.
    Nil,
    /// The read failed.
    Failed,
}

/// The final reads through one node (named), by key index.
pub type NodeReads = (String, Vec<FinalRead>);

/// Reads the operation logs and compares them with the final reads through every node.
/// Requests before `from_us` (the pre-load) count as writes but not in the rates.
pub fn analyze(logs: &[PathBuf], from_us: u64, finals: &[NodeReads]) -> Result<Findings, String> {
    let mut f = Findings::default();
    // Per key: (ack time, stamp) of every acknowledged write.
    let mut acks: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut reads: Vec<Read> = Vec::new();
    let (mut first, mut last) = (u64::MAX, 0u64);
    for path in logs {
        let file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        for line in BufReader::new(file).lines() {
            let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
            let mut it = line.split(' ');
            let tag = it.next().unwrap_or("");
            let nums: Vec<Option<u64>> = it.map(|s| s.parse().ok()).collect();
            match (tag, nums.as_slice()) {
                ("w", [Some(k), Some(s), Some(at)]) => {
                    acks.entry(*k).or_default().push((*at, *s));
                    f.acked_writes += 1;
                    if *at >= from_us {
                        f.acked_writes_in_run += 1;
                        first = first.min(*at);
                        last = last.max(*at);
                    }
                }
                ("r", [Some(k), stamp, Some(start), Some(end)]) => {
                    reads.push(Read {
                        key: *k,
                        stamp: *stamp,
                        start_us: *start,
                        end_us: *end,
                    });
                    first = first.min(*end);
                    last = last.max(*end);
                }
                ("e", [Some(_), Some(end)]) => {
                    f.errors += 1;
                    first = first.min(*end);
                    last = last.max(*end);
                }
                _ => f.bad_lines += 1,
            }
        }
    }
    for v in acks.values_mut() {
        v.sort_unstable();
    }
    f.reads = reads.len() as u64;
    for r in &reads {
        let newest = acks.get(&r.key).and_then(|v| {
            let before = v.partition_point(|&(at, _)| at < r.start_us);
            v[..before].iter().map(|&(_, s)| s).max()
        });
        let Some(want) = newest else { continue };
        if r.stamp.is_none_or(|got| got < want) {
            f.stale_reads += 1;
            if r.stamp.is_none() {
                f.stale_nil_reads += 1;
            }
            if f.stale_examples.len() < 5 {
                f.stale_examples.push(format!(
                    "key {} read {:?} over {} µs at {}, newest acknowledged {want}",
                    r.key,
                    r.stamp,
                    r.end_us.saturating_sub(r.start_us),
                    r.start_us
                ));
            }
        }
    }
    let mut lost = std::collections::BTreeSet::new();
    for (node, values) in finals {
        for (k, got) in values.iter().enumerate() {
            let k = k as u64;
            let Some(want) = acks.get(&k).and_then(|v| v.iter().map(|&(_, s)| s).max()) else {
                continue;
            };
            match *got {
                FinalRead::Failed => f.failed_final_reads += 1,
                FinalRead::Stamp(s) if s >= want => {}
                got => {
                    f.wrong_final_reads += 1;
                    if lost.insert(k) && f.lost_examples.len() < 5 {
                        f.lost_examples.push(format!(
                            "key {k} through {node}: {got:?}, newest acknowledged {want}"
                        ));
                    }
                }
            }
        }
    }
    f.lost_acked_writes = lost.len() as u64;
    let done = f.acked_writes_in_run + f.reads + f.errors;
    if last > first {
        f.ops_per_s = done as f64 / ((last - first) as f64 / 1e6);
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_round_trip() {
        let v = stamped(1_234_567, 1024);
        assert_eq!(v.len(), 1024);
        assert_eq!(stamp_of(&v), 1_234_567);
        assert_eq!(stamp_of(b"short"), 0);
    }

    #[test]
    fn each_node_writes_its_own_keys() {
        for writer in 0..3 {
            let c = Check {
                log: PathBuf::new(),
                writer,
                writers: 3,
            };
            for k in 0..100 {
                let o = c.owned_key(k, 100);
                assert!(o < 100 && o % 3 == writer, "{k} -> {o}");
                assert!(o.abs_diff(k) < 3 || (k >= 97 && o.abs_diff(k) < 6));
            }
        }
    }

    fn log(dir: &Path, name: &str, lines: &[&str]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    }

    #[test]
    fn finds_stale_reads_and_lost_writes() {
        let dir = tempfile::tempdir().unwrap();
        let a = log(
            dir.path(),
            "a",
            &[
                "w 1 100 110",
                "w 1 200 210",
                "w 2 300 310",
                // After the ack of 200: right.
                "r 1 200 220 230",
                // Began before the ack of 200 (overlaps the write): not stale.
                "r 1 100 205 215",
                // Began after it and older: stale.
                "r 1 100 240 250",
                "r 2 - 400 410",
                // A key never written.
                "r 9 - 400 410",
                "e 400 500",
                "garbage",
            ],
        );
        // A killed process's log, and one that was never written.
        let b = log(dir.path(), "b", &["w 3 50 60", "r 3 50 70 80"]);
        use FinalRead::{Failed, Nil, Stamp};
        let finals = vec![
            (
                "n1".to_string(),
                vec![Nil, Stamp(200), Stamp(300), Stamp(50)],
            ),
            ("n2".to_string(), vec![Nil, Stamp(100), Failed, Nil]),
        ];
        let f = analyze(&[a, b, dir.path().join("none")], 0, &finals).unwrap();
        assert_eq!(f.acked_writes, 4);
        assert_eq!(f.reads, 6);
        assert_eq!(f.errors, 1);
        assert_eq!(f.bad_lines, 1);
        assert_eq!((f.stale_reads, f.stale_nil_reads), (2, 1));
        assert_eq!(f.wrong_final_reads, 2);
        assert_eq!(f.failed_final_reads, 1);
        assert_eq!(f.lost_acked_writes, 2);
    }
}
