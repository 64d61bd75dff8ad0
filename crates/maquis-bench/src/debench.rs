//! `maquis-bench debench`: DE-Bench ("Investigating the Scalability Limits of Distributed
//! Erlang", Fig. 5–13) on Maquis and on Distributed Erlang in the same invocation.
//!
//! For each system and cluster size the driver starts a cluster on loopback — Maquis: processes
//! `--procs` processes, the nodes spread evenly over them ([`crate::debench_agent`]); Erlang:
//! one VM per node
//! (`bench/erlang/debench.erl`, one scheduler each, no busy-waiting) — waits until every node
//! sees all the others, then runs each workload of the grid on that cluster: every node runs
//! closed-loop workers for `--seconds` (`--total-workers` shared among the nodes, or
//! `--workers` per node), and every process reports its commands'
//! counts and latency buckets. The driver measures the CPU time of every process of the system
//! over the measurement from `/proc`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::debench_hist::{KindStats, NodeResult};
use crate::ring_proc::Proc;

/// Options of `maquis-bench debench`.
#[derive(Args, Debug, Clone)]
pub struct DebenchArgs {
    /// The small grid: 10 and 40 nodes, 0 % and 1 % global commands, Maquis on the full mesh
    /// and Distributed Erlang, 5 s per cell.
    #[arg(long)]
    pub quick: bool,
    /// Cluster sizes (default 10,20,40,70,100; quick 10,40).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Systems: maquis-full-mesh, maquis-peer-to-peer, erlang (default all three; quick
    /// maquis-full-mesh,erlang).
    #[arg(long, value_delimiter = ',')]
    pub systems: Option<Vec<String>>,
    /// Series of the paper to run: global (Fig. 5–6), data (Fig. 7), compute (Fig. 8), server
    /// (Fig. 11–13) (default all; quick: global at 0 and 1 %).
    #[arg(long, value_delimiter = ',')]
    pub series: Option<Vec<String>>,
    /// Seconds measured per cell (default 10; quick 5).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Seconds of load run on every new cluster before its first cell, not counted in any
    /// cell (the report says what it met): a peer-to-peer overlay still reshapes its views and
    /// broadcast trees for a few seconds after every node sees all the others.
    #[arg(long, default_value_t = 5)]
    pub warmup: u64,
    /// Closed-loop workers in the whole cluster, shared among the nodes (at least one each):
    /// the offered load stays the same at every cluster size, so that on a machine whose cores
    /// do not grow with the cluster a command's latency shows what the cluster size costs, not
    /// a longer queue for the same cores.
    #[arg(long, default_value_t = 160)]
    pub total_workers: usize,
    /// Closed-loop workers per node instead (the paper's setting: the load grows with the
    /// cluster).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Paced workers instead of closed-loop ones: the whole cluster starts this many commands
    /// (a global sequence counts as one) per second, every worker one every
    /// `workers ÷ rate` seconds whenever the last has ended by then. Below the cluster's
    /// capacity a command's latency is then its own, not its wait for a core.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Processes the Maquis nodes are spread over (the same number at every size, so that the
    /// operating system's scheduling of processes on the cores does not change with the
    /// cluster size; one per core by default), each a tokio runtime of `--node-threads`
    /// workers.
    #[arg(long, default_value_t = 2)]
    pub procs: usize,
    /// Local registrations, percent of all commands.
    #[arg(long, default_value_t = 0.1)]
    pub local_pct: f64,
    /// Tokio worker threads of each Maquis node process (one, as each Erlang VM runs one
    /// scheduler: with a worker per core in each of two processes, twice as many workers as
    /// cores woke and stole from each other).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub node_threads: u16,
    /// Neighbours of each node on the peer-to-peer overlay (HyParView's active view; default
    /// the runtime's, 5): more neighbours, fewer hops for a routed command.
    #[arg(long)]
    pub active_size: Option<usize>,
    /// Maquis node i listens on 127.0.0.1:(base_port + i).
    #[arg(long, default_value_t = 17_000)]
    pub base_port: u16,
    /// Output directory (with --quick and no --out: target/bench-quick/debench).
    #[arg(long, default_value = "bench/results/debench")]
    pub out: PathBuf,
}

/// One workload of the grid.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Global command sequences, percent of commands.
    pub global_pct: f64,
    /// Bytes of argument of point-to-point commands.
    pub arg_bytes: usize,
    /// Microseconds of computation on the target.
    pub compute_us: u64,
    /// Server calls, percent of point-to-point commands.
    pub server_pct: f64,
}

/// One command kind's summary in a cell.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CommandSummary {
    /// Successes.
    pub count: u64,
    /// Failures.
    pub errors: u64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
    /// The first failure (Maquis only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// One measured cell.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    /// `maquis` or `erlang`.
    pub system: String,
    /// `full-mesh` or `peer-to-peer` (Distributed Erlang: its full mesh).
    pub overlay: String,
    /// Nodes in the cluster.
    pub nodes: usize,
    /// The workload.
    #[serde(flatten)]
    pub workload: Workload,
    /// Local registrations, percent of commands.
    pub local_pct: f64,
    /// Workers per node (the cluster's total is this × `nodes`).
    pub workers: usize,
    /// With `--rate`: the commands per second offered to the cluster (a worker starts one
    /// every `workers × nodes ÷ offered_per_s` seconds); absent for closed-loop workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_per_s: Option<f64>,
    /// Processes the system ran in.
    pub processes: usize,
    /// Successful commands per second, all nodes together.
    pub ops_per_s: f64,
    /// The same per node.
    pub ops_per_s_per_node: f64,
    /// Wall time of the measurement (the slowest process's), seconds.
    pub seconds: f64,
    /// CPU time of all the system's processes over the measurement, seconds.
    pub cpu_s: f64,
    /// Successful commands per CPU-second.
    pub ops_per_cpu_s: f64,
    /// Failed commands.
    pub errors: u64,
    /// Per command kind.
    pub commands: BTreeMap<String, CommandSummary>,
    /// What the runtime's counters rose by over the measurement, all nodes (Maquis only).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub counters: BTreeMap<String, u64>,
    /// The computation's calibration: iterations of the system's own loop per microsecond,
    /// measured once by the driver before any cluster started (a computation of `compute_us`
    /// runs `compute_us` × this many; absent in results from before the computation was
    /// calibrated, when it was a loop that watched the clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_per_us: Option<f64>,
    /// The system's CPU use at rest just before the measurement (heartbeats, failure
    /// detection and the like), in cores, over one second; absent in older results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rest_cores: Option<f64>,
}

/// The grid of workloads of the selected series.
pub fn workloads(args: &DebenchArgs) -> Vec<(Workload, Vec<&'static str>)> {
    let w = |g, x, y, s| Workload {
        global_pct: g,
        arg_bytes: x,
        compute_us: y,
        server_pct: s,
    };
    let mut series: Vec<(&'static str, Vec<Workload>)> = vec![
        (
            "global",
            [0.0, 0.01, 0.1, 1.0]
                .iter()
                .map(|g| w(*g, 10, 10, 0.0))
                .collect(),
        ),
        (
            "data",
            [10, 100, 1000, 10_000]
                .iter()
                .map(|x| w(0.0, *x, 10, 0.0))
                .collect(),
        ),
        (
            "compute",
            [10, 100, 1000]
                .iter()
                .map(|y| w(0.0, 10, *y, 0.0))
                .collect(),
        ),
        (
            "server",
            [1.0, 50.0, 100.0]
                .iter()
                .map(|s| w(0.0, 10, 1, *s))
                .collect(),
        ),
    ];
    if args.quick {
        series = vec![("global", vec![w(0.0, 10, 10, 0.0), w(1.0, 10, 10, 0.0)])];
    }
    if let Some(only) = &args.series {
        series.retain(|(name, _)| only.iter().any(|o| o == name));
    }
    let mut out: Vec<(Workload, Vec<&'static str>)> = Vec::new();
    for (name, ws) in series {
        for wl in ws {
            match out.iter_mut().find(|(o, _)| *o == wl) {
                Some((_, names)) => names.push(name),
                None => out.push((wl, vec![name])),
            }
        }
    }
    out
}

/// Runs the benchmark: every system × size × workload; writes `results.json`, `report.md`
/// and the plots into `--out`.
pub fn run(args: &DebenchArgs) -> Result<Vec<Cell>, String> {
    let sizes = args.sizes.clone().unwrap_or(if args.quick {
        vec![10, 40]
    } else {
        vec![10, 20, 40, 70, 100]
    });
    let systems = args.systems.clone().unwrap_or(if args.quick {
        vec!["maquis-full-mesh".into(), "erlang".into()]
    } else {
        vec![
            "maquis-full-mesh".into(),
            "maquis-peer-to-peer".into(),
            "erlang".into(),
        ]
    });
    let seconds = args.seconds.unwrap_or(if args.quick { 5 } else { 10 });
    let grid = workloads(args);
    if grid.is_empty() || sizes.iter().any(|&n| n < 2) {
        return Err("nothing to run: choose a known series, and sizes of 2 nodes or more".into());
    }
    if args.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err("--rate: commands per second, a positive number".into());
    }
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let log_path = args.out.join("agents.log");
    let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
    // The Erlang nodes start an `epmd` if none runs; one started here is stopped at the end.
    let epmd_before = epmd_running();
    // Built in a temporary directory, removed when the run ends.
    let erlang_build = if systems.iter().any(|s| s == "erlang") {
        Some(crate::erlang::prepare("debench.erl", DEBENCH_ERL)?)
    } else {
        None
    };
    let erlang_dir = erlang_build.as_ref().map(|d| d.path().to_path_buf());
    let started = Instant::now();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut cells = Vec::new();
    let mut warmups = Vec::new();
    for system in &systems {
        let work_per_us = calibrate(system, erlang_dir.as_deref())?;
        eprintln!(
            "debench: {system}: the computation's loop runs {work_per_us:.0} iterations per µs"
        );
        for &n in &sizes {
            eprintln!("debench: {system}, {n} nodes: starting the cluster ...");
            let t = Instant::now();
            let mut cluster =
                Cluster::start(args, system, n, erlang_dir.as_deref(), &log, work_per_us)?;
            eprintln!("  formed in {:.1} s", t.elapsed().as_secs_f64());
            if args.warmup > 0 {
                if let Some((wl, _)) = grid.first() {
                    let w = cluster.measure(args, wl, args.warmup)?;
                    eprintln!(
                        "  warm-up: {:.0} ops/s, {} errors (not counted)",
                        w.ops_per_s, w.errors
                    );
                    warmups.push(w);
                }
            }
            for (wl, _) in &grid {
                let cell = cluster.measure(args, wl, seconds)?;
                eprintln!(
                    "  global {}% arg {} B compute {} µs server {}%: {:.0} ops/s, {:.0} ops/CPU-s, {} errors, {:.3} cores at rest before",
                    wl.global_pct,
                    wl.arg_bytes,
                    wl.compute_us,
                    wl.server_pct,
                    cell.ops_per_s,
                    cell.ops_per_cpu_s,
                    cell.errors,
                    cell.rest_cores.unwrap_or(0.0)
                );
                cells.push(cell);
            }
            cluster.stop();
        }
    }
    if erlang_dir.is_some() && !epmd_before {
        let _ = Command::new("epmd")
            .arg("-kill")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let json = serde_json::to_string_pretty(&cells).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("results.json"), json).map_err(|e| e.to_string())?;
    let run = crate::debench_report::Run {
        args,
        sizes: &sizes,
        systems: &systems,
        seconds,
        grid: &grid,
        wall_s: started.elapsed().as_secs_f64(),
        load_before: load_before.trim().to_string(),
        warmups: &warmups,
    };
    crate::debench_report::write(&run, &cells)?;
    Ok(cells)
}

/// Whether an Erlang port mapper daemon answers on this host.
fn epmd_running() -> bool {
    Command::new("epmd")
        .arg("-names")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Workers each node runs: `--workers`, or `--total-workers` shared among `nodes` (rounded,
/// at least one).
pub fn workers_per_node(args: &DebenchArgs, nodes: usize) -> usize {
    args.workers.unwrap_or_else(|| {
        ((args.total_workers as f64 / nodes.max(1) as f64).round() as usize).max(1)
    })
}

/// The Erlang program, built into the binary.
const DEBENCH_ERL: &str = include_str!("../../../bench/erlang/debench.erl");

/// The iterations per microsecond of `system`'s computation loop, on this machine with nothing
/// else of the benchmark running: Maquis's in this process (the agents run the same code),
/// Distributed Erlang's in a VM of its own started as the nodes are.
fn calibrate(system: &str, erlang_dir: Option<&std::path::Path>) -> Result<f64, String> {
    if system != "erlang" {
        return Ok(crate::debench_agent::calibrate());
    }
    let dir = erlang_dir.ok_or("erlang was not prepared")?;
    let out = Command::new("erl")
        .args(["-noshell", "+S", "1:1", "+SDcpu", "1:1", "+SDio", "1"])
        .args(crate::erlang::NO_BUSY_WAIT)
        .arg("-pa")
        .arg(dir)
        .args([
            "-eval",
            "io:format(\"~f~n\", [debench:calibrate()]), halt().",
        ])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("erl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or_else(|| format!("the Erlang calibration printed {text:?}"))
}

/// A running cluster of one system.
struct Cluster {
    system: String,
    overlay: String,
    nodes: usize,
    procs: Vec<Proc>,
    /// The system's computation loop, iterations per microsecond.
    work_per_us: f64,
}

impl Cluster {
    fn start(
        args: &DebenchArgs,
        system: &str,
        n: usize,
        erlang_dir: Option<&std::path::Path>,
        log: &std::fs::File,
        work_per_us: f64,
    ) -> Result<Cluster, String> {
        let stderr = || log.try_clone().map(Stdio::from).map_err(|e| e.to_string());
        let mut procs = Vec::new();
        let overlay = match system {
            "erlang" => {
                let dir = erlang_dir.ok_or("erlang was not prepared")?;
                for i in 1..=n {
                    let mut c = Command::new("erl");
                    c.args(["-noshell", "-name", &format!("db{i}@127.0.0.1")])
                        .args(["-setcookie", "debench"])
                        // One scheduler per VM, and none spinning while idle: a hundred VMs
                        // share two cores.
                        .args(["+S", "1:1", "+SDcpu", "1:1", "+SDio", "1"])
                        .args(crate::erlang::NO_BUSY_WAIT)
                        .arg("-pa")
                        .arg(dir)
                        .args(["-eval", &format!("debench:run({i}, {n})")]);
                    procs.push(Proc::start(&format!("erlang db{i}"), c, stderr()?)?);
                }
                "full-mesh".to_string()
            }
            s => {
                let overlay = s
                    .strip_prefix("maquis-")
                    .filter(|o| *o == "full-mesh" || *o == "peer-to-peer")
                    .ok_or_else(|| format!("unknown system {s:?}"))?;
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let per = n.div_ceil(args.procs.clamp(1, n));
                let mut first = 1;
                while first <= n {
                    let count = per.min(n + 1 - first);
                    let mut c = Command::new(&exe);
                    // One tokio worker per process by default (1.16–1.24× the commands per
                    // CPU-second of one per core, paced global series, 10 and 100 nodes).
                    c.env("RUST_LOG", crate::stats::agent_log_filter())
                        .env("TOKIO_WORKER_THREADS", args.node_threads.to_string())
                        .args(["agent", "debench-nodes"])
                        .args(["--first", &first.to_string()])
                        .args(["--count", &count.to_string()])
                        .args(["--total", &n.to_string()])
                        .args(["--base-port", &args.base_port.to_string()])
                        .args(["--overlay", overlay]);
                    if let Some(n) = args.active_size {
                        c.args(["--active-size", &n.to_string()]);
                    }
                    procs.push(Proc::start(&format!("maquis db{first}.."), c, stderr()?)?);
                    first += count;
                }
                overlay.to_string()
            }
        };
        let limit = Duration::from_secs(120 + 3 * n as u64);
        for p in &mut procs {
            p.expect(&["ready"], limit)?;
        }
        Ok(Cluster {
            system: if system == "erlang" {
                "erlang".into()
            } else {
                "maquis".into()
            },
            overlay,
            nodes: n,
            procs,
            work_per_us,
        })
    }

    fn cpu(&self) -> f64 {
        self.procs
            .iter()
            .map(|p| crate::stats::cpu_seconds_of(p.pid()))
            .sum()
    }

    /// The system's CPU use at rest (heartbeats and the like), in cores, over one second.
    fn idle_rate(&self) -> f64 {
        let c0 = self.cpu();
        std::thread::sleep(Duration::from_secs(1));
        self.cpu() - c0
    }

    /// The CPU seconds of the system's processes once they are back at rest (their use falls
    /// to within a tenth of a core of `idle`), less what being at rest cost while waiting for
    /// that: sampled every 200 ms, at most 120 s.
    fn cpu_until_idle(&self, idle: f64) -> f64 {
        let step = Duration::from_millis(200);
        let start = Instant::now();
        let mut last = self.cpu();
        while start.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(step);
            let now = self.cpu();
            let rate = (now - last) / step.as_secs_f64();
            last = now;
            if rate <= idle + 0.1 {
                break;
            }
        }
        last - idle * start.elapsed().as_secs_f64()
    }

    fn measure(&mut self, args: &DebenchArgs, wl: &Workload, seconds: u64) -> Result<Cell, String> {
        let hundredths = |pct: f64| (pct * 100.0).round() as u64;
        let workers = workers_per_node(args, self.nodes);
        let pace_us = match args.rate {
            Some(rate) => ((workers * self.nodes) as f64 / rate * 1e6)
                .round()
                .max(1.0) as u64,
            None => 0,
        };
        let go = format!(
            "go {} {} {} {} {} {} {} {} {}",
            workers,
            hundredths(wl.global_pct),
            hundredths(args.local_pct),
            hundredths(wl.server_pct),
            wl.arg_bytes,
            wl.compute_us,
            seconds,
            pace_us,
            (wl.compute_us as f64 * self.work_per_us).round() as u64
        );
        let idle = self.idle_rate();
        let cpu0 = self.cpu();
        for p in &mut self.procs {
            p.send(&go)?;
        }
        let mut results = Vec::new();
        // Erlang's global commands may block far beyond the window (DE-Bench: 20 s at 100
        // nodes): the measurement ends when the last worker's last command does.
        let limit = Duration::from_secs(seconds + 600);
        for p in &mut self.procs {
            let line = p.expect(&["result "], limit)?;
            let r: NodeResult = serde_json::from_str(&line["result ".len()..])
                .map_err(|e| format!("bad result line: {e}: {line}"))?;
            results.push(r);
        }
        // Work the window started but did not finish (a spawned process computes after it
        // acknowledged: the Erlang scheduler runs the acknowledgements first and leaves the
        // computations queued) is still the system's cost: count the CPU until it is idle.
        let cpu_s = self.cpu_until_idle(idle) - cpu0;
        let seconds = results
            .iter()
            .map(|r| r.seconds)
            .fold(0.0f64, f64::max)
            .max(1e-9);
        let mut all: BTreeMap<String, KindStats> = BTreeMap::new();
        for r in &results {
            for (k, s) in &r.commands {
                all.entry(k.clone()).or_default().merge(s);
            }
        }
        let mut counters: BTreeMap<String, u64> = BTreeMap::new();
        for r in &results {
            for (k, v) in &r.counters {
                *counters.entry(k.clone()).or_insert(0) += v;
            }
        }
        let ops: u64 = all.values().map(|s| s.count).sum();
        let errors = all.values().map(|s| s.errors).sum();
        let commands = all
            .iter()
            .map(|(k, s)| {
                (
                    k.clone(),
                    CommandSummary {
                        count: s.count,
                        errors: s.errors,
                        p50_us: s.percentile(50.0),
                        p99_us: s.percentile(99.0),
                        first_error: s.first_error.clone(),
                    },
                )
            })
            .collect();
        let ops_per_s = ops as f64 / seconds;
        Ok(Cell {
            system: self.system.clone(),
            overlay: self.overlay.clone(),
            nodes: self.nodes,
            workload: *wl,
            local_pct: args.local_pct,
            workers,
            offered_per_s: args.rate,
            processes: self.procs.len(),
            ops_per_s,
            ops_per_s_per_node: ops_per_s / self.nodes as f64,
            seconds,
            cpu_s,
            ops_per_cpu_s: if cpu_s > 0.0 { ops as f64 / cpu_s } else { 0.0 },
            errors,
            commands,
            counters,
            work_per_us: Some(self.work_per_us),
            rest_cores: Some(idle),
        })
    }

    fn stop(self) {
        let mut procs = self.procs;
        for p in &mut procs {
            let _ = p.send("quit");
        }
        for p in procs {
            p.stop(Duration::from_secs(20));
        }
    }
}
