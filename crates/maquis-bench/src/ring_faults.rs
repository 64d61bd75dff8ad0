//! The fault mode of `maquis-bench kvs` (`--faults`): crash-restarts under the KVS workload,
//! counting acknowledged writes lost and stale reads.
//!
//! At each RTT and configuration, once per storage backend (in memory, and durable in a fresh
//! directory), a fresh three-node cluster gets the 1 KiB key space written and then runs the
//! KVS workload (16 actors per node, the grid's key distribution and read/write mix) while each
//! node in turn, n3, n2, then n1, is killed with SIGKILL, left dead for [`DOWN`], started again
//! (the in-memory node empty, the durable one on its directory), and given time until the ring
//! has converged and no vnode anywhere is recovering; then the restarted node takes up its load
//! again and the next victim waits [`PHASE`]. At the end every key is read through every node.
//! What counts as stale or lost is [`crate::ring_check`]'s definition; the numbers come from
//! the operation logs of every process, the killed ones included.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::ring_agent::{self, Converged, NodeRun, Preloaded, RunSpec, Verified, Workload};
use crate::ring_bench::{Plan, Setup, Storage};
use crate::ring_check::{self, Check, FinalRead, Findings};
use crate::ring_proc::Proc;

/// The storage backends a fault cell runs with.
pub const BACKENDS: [&str; 2] = ["memory", "durable"];
/// Load before the first kill, and after each restarted node has recovered.
pub const PHASE: Duration = Duration::from_secs(3);
/// How long a killed node stays dead.
pub const DOWN: Duration = Duration::from_secs(3);
/// Closed-loop actors per node.
pub const ACTORS: usize = 16;
/// Value bytes.
pub const SIZE: usize = 1024;
/// The kill order (host indices: n3, n2, n1).
const VICTIMS: [usize; 3] = [2, 1, 0];

/// One crash-restart of one node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Victim {
    /// `n3`, `n2`, `n1`.
    pub node: String,
    /// Seconds from the start of the load to the kill.
    pub killed_at_s: f64,
    /// Seconds from the restart until the node had joined and answered `ready`.
    pub rejoined_s: f64,
    /// Seconds from the restart until the ring had converged with no vnode recovering.
    pub recovered_s: f64,
}

/// One fault cell, as written to `faults.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FaultCell {
    /// Emulated round-trip time.
    pub rtt_ms: u64,
    /// `single` or `partisan`.
    pub config: String,
    /// `memory` or `durable`.
    pub backend: String,
    /// Closed-loop actors per live node.
    pub actors: usize,
    /// Value bytes.
    pub payload_bytes: usize,
    /// Keys of the workload.
    pub keys: u64,
    /// Simulated storage delay, ms (0 with the durable backend: its own I/O is the delay).
    pub storage_delay_ms: u64,
    /// Seconds of load, from its start to the final `stop`.
    pub seconds: f64,
    /// The crash-restarts.
    pub victims: Vec<Victim>,
    /// What the logs and the final reads show.
    pub findings: Findings,
    /// The first failed request or check, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub first_error: Option<String>,
}

impl FaultCell {
    /// Whether the store kept what it acknowledged and answered no read stale.
    pub fn clean(&self) -> bool {
        self.findings.lost_acked_writes == 0 && self.findings.stale_reads == 0
    }
}

/// Runs one fault cell on `setup`'s hosts.
pub(crate) fn cell(
    setup: &Setup,
    config: &str,
    rtt: u64,
    backend: &str,
    seq: usize,
) -> Result<FaultCell, String> {
    let plan = setup.plan;
    let dir = tempfile::Builder::new()
        .prefix("maquis-kvs-faults-")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let data = dir.path().join("data");
    let storage = Storage {
        data: (backend == "durable").then_some(data.as_path()),
        delay_ms: if backend == "durable" {
            0
        } else {
            plan.storage_delay_ms
        },
    };
    let keys = plan.kvs_keys(SIZE);
    let mut logs: Vec<PathBuf> = Vec::new();
    let mut check = |i: usize| {
        let log = dir
            .path()
            .join(format!("n{}.{}.log", i + 1, logs.len() + 1));
        logs.push(log.clone());
        Check {
            log,
            writer: i as u64,
            writers: 3,
        }
    };
    let (nodes, _) = setup.cluster(config, storage)?;
    let mut nodes: Vec<Option<Proc>> = nodes.into_iter().map(Some).collect();

    // The key space, a third from each node, every acknowledgement logged.
    for (i, p) in nodes.iter_mut().enumerate() {
        let n = 3;
        live(p)?.command(&ring_agent::Command::Preload {
            from: keys * i as u64 / n,
            to: keys * (i as u64 + 1) / n,
            size: SIZE,
            concurrency: 16,
            check: Some(check(i)),
        })?;
    }
    for p in nodes.iter_mut() {
        let r: Preloaded = live(p)?.answer(Duration::from_secs(1800))?;
        if r.errors > 0 {
            return Err(format!(
                "pre-load: {} writes failed: {}",
                r.errors,
                r.first_error.unwrap_or_default()
            ));
        }
    }

    let (mean, stddev) = Plan::key_distribution(keys);
    let spec = |check: Check| RunSpec {
        workload: Workload::Kvs,
        actors: ACTORS,
        size: SIZE,
        warmup_s: 0.0,
        seconds: 3600.0,
        keys,
        mean,
        stddev,
        reads_per_write: plan.reads_per_write,
        seed: seq as u64 * 7919,
        until_stop: true,
        check: Some(check),
    };
    let from_us = ring_check::now_us();
    let start = Instant::now();
    for (i, p) in nodes.iter_mut().enumerate() {
        live(p)?.command(&ring_agent::Command::Run(spec(check(i))))?;
    }
    let mut victims = Vec::new();
    std::thread::sleep(PHASE);
    for v in VICTIMS {
        let killed_at_s = start.elapsed().as_secs_f64();
        // Dropping the process kills it with SIGKILL.
        drop(nodes[v].take());
        eprintln!(
            "rtt {rtt} ms, {config}, {backend}: killed n{} at {killed_at_s:.1} s",
            v + 1
        );
        std::thread::sleep(DOWN);
        let restarted = Instant::now();
        let contact = (0..3).find(|&j| j != v && nodes[j].is_some());
        let mut p = setup.node(v, config, contact, storage)?;
        let rejoined_s = restarted.elapsed().as_secs_f64();
        p.command(&ring_agent::Command::Converge {
            nodes: 3,
            timeout_s: 600.0,
            recovered: true,
        })?;
        let _: Converged = p.answer(Duration::from_secs(660))?;
        let recovered_s = restarted.elapsed().as_secs_f64();
        eprintln!(
            "rtt {rtt} ms, {config}, {backend}: n{} back, joined in {rejoined_s:.1} s, converged and recovered in {recovered_s:.1} s",
            v + 1
        );
        p.command(&ring_agent::Command::Run(spec(check(v))))?;
        nodes[v] = Some(p);
        victims.push(Victim {
            node: format!("n{}", v + 1),
            killed_at_s,
            rejoined_s,
            recovered_s,
        });
        std::thread::sleep(PHASE);
    }
    for p in nodes.iter_mut() {
        live(p)?.command(&ring_agent::Command::Stop)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut first_error = None;
    let limit = Duration::from_secs(plan.request_timeout_s + 60);
    for p in nodes.iter_mut() {
        let r: NodeRun = live(p)?.answer(limit)?;
        if r.log_failures > 0 {
            return Err(format!(
                "{} operation-log lines could not be written",
                r.log_failures
            ));
        }
        if first_error.is_none() {
            first_error = r.first_error;
        }
    }

    // Every key through every node.
    let mut finals = Vec::new();
    for (i, p) in nodes.iter_mut().enumerate() {
        let p = live(p)?;
        p.command(&ring_agent::Command::Verify {
            keys,
            concurrency: 32,
        })?;
        let r: Verified = p.answer(Duration::from_secs(1800))?;
        if first_error.is_none() {
            first_error = r.first_error;
        }
        let failed: std::collections::HashSet<u64> = r.failed.into_iter().collect();
        let stamps = r
            .stamps
            .into_iter()
            .enumerate()
            .map(|(k, s)| match s {
                _ if failed.contains(&(k as u64)) => FinalRead::Failed,
                Some(s) => FinalRead::Stamp(s),
                None => FinalRead::Nil,
            })
            .collect();
        finals.push((format!("n{}", i + 1), stamps));
    }
    let findings = ring_check::analyze(&logs, from_us, &finals)?;
    for p in nodes.into_iter().flatten() {
        p.stop(Duration::from_secs(10));
    }
    Ok(FaultCell {
        rtt_ms: rtt,
        config: config.to_string(),
        backend: backend.to_string(),
        actors: ACTORS,
        payload_bytes: SIZE,
        keys,
        storage_delay_ms: storage.delay_ms,
        seconds,
        victims,
        findings,
        first_error,
    })
}

/// The report's "Faults" section.
pub(crate) fn report(r: &mut String, cells: &[FaultCell]) {
    use std::fmt::Write;
    let _ = writeln!(
        r,
        "## Faults: kill -9 and restart under load
"
    );
    let _ = writeln!(
        r,
        "Per RTT, configuration and storage backend, a fresh cluster: the {} key space written \
         with {} values, then the KVS workload ({ACTORS} actors per live node, the same key \
         distribution and read/write mix as above) while n3, n2 and n1 in turn are killed with \
         SIGKILL, left dead for {} s, and started again (`memory`: empty; `durable`: on its \
         directory, redb with its write-ahead log); each restarted node takes up its load once \
         the ring has converged and no vnode of any node is recovering, and the next kill \
         follows {} s later. The `durable` cells simulate no storage delay (the disk is the \
         delay). Afterwards every key is read through every node.\n",
        cells.first().map_or(0, |c| c.keys),
        crate::ring_bench::human(SIZE),
        DOWN.as_secs(),
        PHASE.as_secs()
    );
    let _ = writeln!(
        r,
        "Every value carries the time its write began, each key is written from one node only, \
         one write at a time, and every process logs each acknowledged write and each read \
         (killed processes included). A read is **stale** when it returns an older value (or \
         nil) than the newest write of its key acknowledged before the read began; a key's \
         acknowledged write is **lost** when a final read through some node returns an older \
         value or nil. Errors are requests that failed or timed out (a node coordinating \
         requests is killed with them in flight; a killed node's own load is not retried).\n"
    );
    let _ = writeln!(
        r,
        "| RTT | config | backend | seconds | ops/s | writes acked | reads | errors | stale reads (nil) | acked writes lost | final reads wrong / failed | n3, n2, n1 back and recovered after |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in cells {
        let f = &c.findings;
        let _ = writeln!(
            r,
            "| {} ms | {} | {} | {:.0} | {:.0} | {} | {} | {} | {} ({}) | {} | {} / {} | {} |",
            c.rtt_ms,
            c.config,
            c.backend,
            c.seconds,
            f.ops_per_s,
            f.acked_writes,
            f.reads,
            f.errors,
            f.stale_reads,
            f.stale_nil_reads,
            f.lost_acked_writes,
            f.wrong_final_reads,
            f.failed_final_reads,
            c.victims
                .iter()
                .map(|v| format!("{:.1} s", v.recovered_s))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(r);
    for c in cells.iter().filter(|c| !c.clean()) {
        let f = &c.findings;
        let _ = writeln!(
            r,
            "- {} ms, {}, {}: stale {:?}; lost {:?}",
            c.rtt_ms, c.config, c.backend, f.stale_examples, f.lost_examples
        );
    }
    if cells.iter().any(|c| c.findings.bad_lines > 0) {
        let _ = writeln!(
            r,
            "\n(Some operation-log lines did not parse; see faults.json.)"
        );
    }
    let _ = writeln!(r);
}

fn live(p: &mut Option<Proc>) -> Result<&mut Proc, String> {
    p.as_mut()
        .ok_or_else(|| "a node is not running".to_string())
}
