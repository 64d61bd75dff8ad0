//! `maquis-bench local`: messaging between actors on one node, against actix, ractor and kameo
//! and a bare tokio bounded channel (the floor) in the same run.
//!
//! Every cell (system × workload × run) runs in a process of its own
//! ([`crate::local_cell`], started as `agent local-cell`), so each has a fresh heap and its own
//! resident memory; runs go round the systems in a rotating order, and the report takes each
//! cell's median over the runs. Writes `results.json` (every run of every cell), `report.md` and
//! `local.png` into `--out`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::local_cell::{CellOutcome, System, Workload};

/// `maquis-bench local`.
#[derive(clap::Args, Debug)]
pub struct LocalArgs {
    /// A short run: one run of each cell, fewer messages and actors.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json, report.md and the plot go (with --quick and no --out: target/bench-quick/local).
    #[arg(long, default_value = "bench/results/local")]
    pub out: PathBuf,
    /// Runs of each cell (the report takes the median); default 3, 1 with --quick.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Messages per one-way cell; default 2,000,000 (400,000 with --quick).
    #[arg(long)]
    pub messages: Option<u64>,
    /// Calls per calls cell; default 500,000 (100,000 with --quick).
    #[arg(long)]
    pub calls: Option<u64>,
    /// Senders in `many-to-one` and callers in `calls`.
    #[arg(long, default_value_t = 8)]
    pub senders: usize,
    /// Actors spawned in the `idle` cell; default 100,000 (20,000 with --quick).
    #[arg(long)]
    pub actors: Option<usize>,
    /// Worker threads of each tokio runtime (actix and `maquis-1t` run on one thread).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Systems to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub systems: Option<Vec<System>>,
    /// Workloads to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub workloads: Option<Vec<Workload>>,
}

/// One run of one cell, as results.json holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    /// `tokio`, `maquis`, `actix`, `ractor` or `kameo`.
    pub system: System,
    /// `one-to-one`, `many-to-one`, `calls` or `idle`.
    pub workload: Workload,
    /// Which run (0-based).
    pub run: usize,
    /// Senders (callers) of the cell.
    pub senders: usize,
    /// Messages or calls completed.
    pub messages: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Messages (calls) per second.
    pub msgs_per_s: f64,
    /// CPU time of the cell's process over the measured part, per message, nanoseconds.
    pub cpu_ns_per_msg: f64,
    /// Latencies recorded.
    pub samples: u64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile latency, microseconds.
    pub p99_us: f64,
    /// `idle`: actors spawned.
    pub actors: usize,
    /// `idle`: resident memory per idle actor, bytes.
    pub bytes_per_actor: f64,
}

const CELL_LIMIT: Duration = Duration::from_secs(600);

fn run_cell(
    a: &LocalArgs,
    system: System,
    workload: Workload,
    n: u64,
    actors: usize,
) -> Result<CellOutcome, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let child = Command::new(exe)
        .args([
            "agent",
            "local-cell",
            "--system",
            system.name(),
            "--workload",
            workload.name(),
        ])
        .args([
            "--messages",
            &n.to_string(),
            "--senders",
            &a.senders.to_string(),
        ])
        .args([
            "--actors",
            &actors.to_string(),
            "--workers",
            &a.workers.to_string(),
        ])
        .env("RUST_LOG", crate::stats::agent_log_filter())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(CELL_LIMIT) {
        Ok(out) => out.map_err(|e| e.to_string())?,
        Err(_) => {
            // SAFETY: kill has no memory-safety preconditions; pid is our child's.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            return Err(format!(
                "{} {}: no result in {} s (killed)",
                system.name(),
                workload.name(),
                CELL_LIMIT.as_secs()
            ));
        }
    };
    if !out.status.success() {
        return Err(format!(
            "{} {}: {}",
            system.name(),
            workload.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line)
        .map_err(|e| format!("{} {}: {e}: {line}", system.name(), workload.name()))
}

/// Runs the benchmark and writes its results, report and plot.
pub fn run(a: &LocalArgs) -> Result<Vec<Cell>, String> {
    let runs = a.runs.unwrap_or(if a.quick { 1 } else { 3 }).max(1);
    let messages = a
        .messages
        .unwrap_or(if a.quick { 400_000 } else { 2_000_000 });
    let n_calls = a.calls.unwrap_or(if a.quick { 100_000 } else { 500_000 });
    let actors = a.actors.unwrap_or(if a.quick { 20_000 } else { 100_000 });
    if messages == 0 || n_calls == 0 || actors == 0 || a.senders == 0 || a.workers == 0 {
        return Err(
            "--messages, --calls, --actors, --senders and --workers must be at least 1".into(),
        );
    }
    let systems = a.systems.clone().unwrap_or_else(|| {
        vec![
            System::Tokio,
            System::Maquis,
            System::Maquis1t,
            System::Actix,
            System::Ractor,
            System::Kameo,
        ]
    });
    let workloads = a.workloads.clone().unwrap_or_else(|| {
        vec![
            Workload::OneToOne,
            Workload::ManyToOne,
            Workload::Calls,
            Workload::Idle,
        ]
    });
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let started = Instant::now();
    let mut cells = Vec::new();
    for run in 0..runs {
        for &w in &workloads {
            // A rotating order, so that no system always runs first or last.
            for i in 0..systems.len() {
                let s = systems[(i + run) % systems.len()];
                let n = match w {
                    Workload::Calls => n_calls,
                    Workload::Idle => 0,
                    _ => messages,
                };
                let o = run_cell(a, s, w, n, actors)?;
                let senders = if w == Workload::OneToOne {
                    1
                } else {
                    a.senders
                };
                let cell = Cell {
                    system: s,
                    workload: w,
                    run,
                    senders: if w == Workload::Idle { 0 } else { senders },
                    messages: o.messages,
                    seconds: o.seconds,
                    msgs_per_s: if o.seconds > 0.0 {
                        o.messages as f64 / o.seconds
                    } else {
                        0.0
                    },
                    cpu_ns_per_msg: if o.messages > 0 {
                        o.cpu_s * 1e9 / o.messages as f64
                    } else {
                        0.0
                    },
                    samples: o.samples,
                    p50_us: o.p50_ns as f64 / 1000.0,
                    p99_us: o.p99_ns as f64 / 1000.0,
                    actors: if w == Workload::Idle { actors } else { 0 },
                    bytes_per_actor: o.bytes_per_actor,
                };
                eprintln!(
                    "local: run {run} {:>11} {:>7}: {}",
                    w.name(),
                    s.name(),
                    if w == Workload::Idle {
                        format!("{:.0} B per idle actor", cell.bytes_per_actor)
                    } else {
                        format!(
                            "{:.0} msgs/s, {:.0} ns CPU/msg, p50 {:.1} us, p99 {:.1} us",
                            cell.msgs_per_s, cell.cpu_ns_per_msg, cell.p50_us, cell.p99_us
                        )
                    }
                );
                cells.push(cell);
            }
        }
    }
    let json = serde_json::to_string_pretty(&cells).map_err(|e| e.to_string())?;
    std::fs::write(a.out.join("results.json"), json).map_err(|e| e.to_string())?;
    let ctx = Context {
        runs,
        messages,
        n_calls,
        actors,
        load_before: load_before.trim().to_string(),
        wall_s: started.elapsed().as_secs_f64(),
    };
    write_report(a, &ctx, &cells, &systems, &workloads)?;
    Ok(cells)
}

struct Context {
    runs: usize,
    messages: u64,
    n_calls: u64,
    actors: usize,
    load_before: String,
    wall_s: f64,
}

/// The run of a cell with the median value of `key` (the lower middle for an even count).
fn median(cells: &[Cell], s: System, w: Workload, key: fn(&Cell) -> f64) -> Option<&Cell> {
    let mut runs: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.system == s && c.workload == w)
        .collect();
    runs.sort_by(|x, y| key(x).total_cmp(&key(y)));
    runs.get(runs.len().saturating_sub(1) / 2).copied()
}

fn rate(c: &Cell) -> f64 {
    c.msgs_per_s
}

fn memory(c: &Cell) -> f64 {
    c.bytes_per_actor
}

fn write_report(
    a: &LocalArgs,
    ctx: &Context,
    cells: &[Cell],
    systems: &[System],
    workloads: &[Workload],
) -> Result<(), String> {
    let mut r = String::new();
    let _ = writeln!(
        r,
        "# Local messaging: Maquis against actix, ractor, kameo and a bare tokio channel\n"
    );
    let mut cmd = format!(
        "target/release/maquis-bench local --out {}",
        a.out.display()
    );
    if a.quick {
        cmd.push_str(" --quick");
    }
    let _ = writeln!(
        r,
        "Command: `{cmd}` (runs {}, {} messages per one-way cell, {} calls, {} senders, {} idle actors, {} tokio workers).\n",
        ctx.runs, ctx.messages, ctx.n_calls, a.senders, ctx.actors, a.workers
    );
    let _ = writeln!(
        r,
        "Machine: {}; load average before: {}.",
        crate::micro_report::machine(),
        ctx.load_before
    );
    let commit = crate::micro_report::build_commit();
    let _ = writeln!(r, "Commit: {commit}. Wall time: {:.0} s.\n", ctx.wall_s);
    let _ = writeln!(
        r,
        "Each cell ran in a fresh process; the tables show the median run of each cell (by \
         messages/s, or by memory for idle actors), with that run's CPU and latency. One-way cells: \
         every 64th message carries its send time and the receiver records its latency — with a \
         bounded mailbox that full, the latency is the time it waited in the mailbox. actix runs on \
         its own single-threaded system and its `do_send` does not wait for room (`maquis-1t` is \
         Maquis on a single-threaded tokio runtime, for that comparison); ractor's \
         mailboxes are unbounded (`cast` never waits); kameo's and Maquis's are bounded (64 and \
         1,024) and senders wait for room; the tokio floor is a bounded channel of 1,024 read by a \
         task. Calls: a Maquis call always has a deadline (60 s here: a slot in the node's table of deadlines per call); \
         ractor's, kameo's and actix's calls run without one, as the floor's do. The idle figure \
         is the growth of resident memory per actor spawned, started and sent one message, with \
         one ref to each held.\n"
    );
    for &w in workloads {
        if w == Workload::Idle {
            continue;
        }
        let floor = median(cells, System::Tokio, w, rate).map(|c| c.msgs_per_s);
        let _ = writeln!(r, "## {}\n", w.name());
        let _ = writeln!(
            r,
            "| system | msgs/s | × tokio floor | CPU ns/msg | p50 µs | p99 µs |"
        );
        let _ = writeln!(r, "|---|---|---|---|---|---|");
        for &s in systems {
            if let Some(c) = median(cells, s, w, rate) {
                let x = floor.map_or("–".into(), |f| format!("{:.2}×", c.msgs_per_s / f));
                let _ = writeln!(
                    r,
                    "| {} | {:.0} | {x} | {:.0} | {:.1} | {:.1} |",
                    s.name(),
                    c.msgs_per_s,
                    c.cpu_ns_per_msg,
                    c.p50_us,
                    c.p99_us
                );
            }
        }
        let _ = writeln!(r);
    }
    if workloads.contains(&Workload::Idle) {
        let _ = writeln!(
            r,
            "## idle actors\n\n| system | bytes per idle actor |\n|---|---|"
        );
        for &s in systems {
            if let Some(c) = median(cells, s, Workload::Idle, memory) {
                let _ = writeln!(r, "| {} | {:.0} |", s.name(), c.bytes_per_actor);
            }
        }
        let _ = writeln!(r);
    }
    let _ = writeln!(r, "## Targets\n");
    for line in targets(cells) {
        let _ = writeln!(r, "- {line}");
    }
    r.push_str(&crate::plot::section(&a.out, "plot_local.py", PLOT_PY, &[]));
    std::fs::write(a.out.join("report.md"), r).map_err(|e| e.to_string())
}

/// The targets the runtime is held to, each read from the medians: met or not, and by how much.
pub fn targets(cells: &[Cell]) -> Vec<String> {
    let mut out = Vec::new();
    let peers = [System::Actix, System::Ractor, System::Kameo];
    for w in [Workload::OneToOne, Workload::ManyToOne] {
        let (Some(m), Some(f)) = (
            median(cells, System::Maquis, w, rate),
            median(cells, System::Tokio, w, rate),
        ) else {
            continue;
        };
        let x = m.msgs_per_s / f.msgs_per_s;
        let best = peers
            .iter()
            .filter_map(|&p| median(cells, p, w, rate).map(|c| (p, c.msgs_per_s)))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let mut line = format!(
            "{}: Maquis {:.2}× the tokio floor (target ≥ 0.60×: {})",
            w.name(),
            x,
            if x >= 0.6 { "met" } else { "not met" }
        );
        if let Some((p, v)) = best {
            let y = m.msgs_per_s / v;
            line.push_str(&format!(
                "; {y:.2}× the fastest peer, {} (target above every peer: {})",
                p.name(),
                if y > 1.0 { "met" } else { "not met" }
            ));
            if let Some(one) = median(cells, System::Maquis1t, w, rate) {
                line.push_str(&format!(
                    "; on one thread (`maquis-1t`) {:.2}× {}",
                    one.msgs_per_s / v,
                    p.name()
                ));
            }
        }
        out.push(line);
    }
    if let (Some(m), Some(p)) = (
        median(cells, System::Maquis, Workload::Calls, rate),
        median(cells, System::Ractor, Workload::Calls, rate),
    ) {
        let y = m.msgs_per_s / p.msgs_per_s;
        out.push(format!(
            "calls: Maquis {y:.2}× ractor's calls/s (target above ractor: {})",
            if y > 1.0 { "met" } else { "not met" }
        ));
    }
    if let Some(m) = median(cells, System::Maquis, Workload::Idle, memory) {
        out.push(format!(
            "idle: a Maquis actor {:.0} bytes (target ≤ 1,024: {})",
            m.bytes_per_actor,
            if m.bytes_per_actor <= 1024.0 {
                "met"
            } else {
                "not met"
            }
        ));
    }
    out
}

const PLOT_PY: &str = include_str!("../../../bench/plot_local.py");
