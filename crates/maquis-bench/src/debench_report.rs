//! report.md and plots for `maquis-bench debench`.

use std::fmt::Write as _;
use std::process::Command;

use crate::debench::{Cell, DebenchArgs, Workload};

/// What the run was, for the report's header.
pub struct Run<'a> {
    /// The options.
    pub args: &'a DebenchArgs,
    /// Cluster sizes.
    pub sizes: &'a [usize],
    /// Systems.
    pub systems: &'a [String],
    /// Seconds per cell.
    pub seconds: u64,
    /// The workloads and the series each belongs to.
    pub grid: &'a [(Workload, Vec<&'static str>)],
    /// Wall time of the whole run.
    pub wall_s: f64,
    /// `/proc/loadavg` when it started.
    pub load_before: String,
    /// The warm-up of each cluster (the grid's first workload), in the order they ran.
    pub warmups: &'a [Cell],
}

fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The kernel's TCP settings, as committed results describe the machine.
pub fn tcp_settings() -> String {
    let read = |k: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/{k}"))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "?".into())
    };
    format!(
        "congestion control {}, tcp_rmem {}, tcp_wmem {}, somaxconn {}",
        read("ipv4/tcp_congestion_control"),
        read("ipv4/tcp_rmem"),
        read("ipv4/tcp_wmem"),
        read("core/somaxconn")
    )
}

fn label(c: &Cell) -> String {
    if c.system == "erlang" {
        "erlang".into()
    } else {
        format!("maquis-{}", c.overlay)
    }
}

fn find<'a>(cells: &'a [Cell], sys: &str, n: usize, wl: &Workload) -> Option<&'a Cell> {
    cells
        .iter()
        .find(|c| label(c) == sys && c.nodes == n && c.workload == *wl)
}

fn describe(wl: &Workload) -> String {
    format!(
        "global {}%, argument {} B, computation {} µs, server calls {}%",
        wl.global_pct, wl.arg_bytes, wl.compute_us, wl.server_pct
    )
}

/// Writes `report.md` (and the plots) into the run's output directory.
pub fn write(run: &Run, cells: &[Cell]) -> Result<(), String> {
    let a = run.args;
    let mut r = String::new();
    let _ = writeln!(r, "# DE-Bench: Maquis against Distributed Erlang\n");
    let mut cmd = format!(
        "target/release/maquis-bench debench --out {}",
        a.out.display()
    );
    if a.quick {
        cmd.push_str(" --quick");
    }
    if let Some(s) = &a.sizes {
        let list: Vec<String> = s.iter().map(|n| n.to_string()).collect();
        let _ = write!(cmd, " --sizes {}", list.join(","));
    }
    if let Some(s) = &a.systems {
        let _ = write!(cmd, " --systems {}", s.join(","));
    }
    if let Some(s) = &a.series {
        let _ = write!(cmd, " --series {}", s.join(","));
    }
    match a.workers {
        Some(w) => {
            let _ = write!(cmd, " --workers {w}");
        }
        None if a.total_workers != 160 => {
            let _ = write!(cmd, " --total-workers {}", a.total_workers);
        }
        None => {}
    }
    if let Some(rate) = a.rate {
        let _ = write!(cmd, " --rate {rate}");
    }
    if a.node_threads != 1 {
        let _ = write!(cmd, " --node-threads {}", a.node_threads);
    }
    if let Some(n) = a.active_size {
        let _ = write!(cmd, " --active-size {n}");
    }
    let _ = writeln!(r, "Command: `{cmd}`  ");
    r.push_str(&crate::stats::setting_lines());
    let _ = writeln!(
        r,
        "Wall time: {:.0} s; load average before the run: {}\n",
        run.wall_s, run.load_before
    );
    let _ = writeln!(r, "## Settings\n");
    let _ = writeln!(
        r,
        "- Clusters of {} nodes on 127.0.0.1, one cluster at a time; systems: {}. Maquis runs its nodes in {} processes (each one tokio runtime of {} worker threads, as each Erlang VM runs one scheduler; the same number of processes at every size), each node probing a link it wrote nothing to every 3.3 s and declaring a peer down after 10 s of silence (on peer-to-peer, a member heartbeat every 5 s, a member timeout of 15 s, a HyParView shuffle every 10 s and an active view of {} neighbours); Distributed Erlang one VM per node (OTP {}, `+S 1:1`, no scheduler busy-waiting, its default net_ticktime: a tick every 15 s, a node down after 60 s), connected in its full mesh. Every workload below runs on the same cluster, one after the other, once every node sees all the others and after a warm-up of {} s (see the end).",
        run.sizes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "),
        run.systems.join(", "),
        a.procs,
        a.node_threads,
        a.active_size
            .unwrap_or(maquis::config::PeerToPeerOptions::default().active_size),
        sh("erl -noshell -eval 'io:format(\"~s\", [erlang:system_info(otp_release)]), halt().' 2>/dev/null"),
        a.warmup
    );
    let _ = writeln!(
        r,
        "- Worker loop (DE-Bench §2.3): {} for {} s. A worker picks a random other node and a command: with the global percentage the sequence register → whereis → unregister of a unique global name (Fig. 4; each step a command), with {}% a local register → whereis → unregister (one command), else a point-to-point command: with the server percentage a call to the target's server actor (`gen_server` in Erlang), else `spawn` or `rpc` (half each). A point-to-point command carries the argument, computes on the target (a fixed number of iterations of the system's own loop: before any cluster started, the benchmark timed that loop with nothing else running, and a computation of Y µs is Y times the iterations it ran per µs, `work_per_us` in the results; not a loop that watches the clock, which burns less CPU than it claims whenever it is preempted) and returns the argument; a spawn is timed until the new actor's node answers (Erlang: until the new process acknowledges).",
        match a.workers {
            Some(w) => format!("every node runs {w} closed-loop workers (the load grows with the cluster, as in the paper)"),
            None => format!(
                "{} closed-loop workers in the whole cluster, shared among its nodes ({}), so that the offered load is the same at every size: on two cores that do not grow with the cluster, more workers would only lengthen the queue for the same cores and hide what the cluster size itself costs",
                a.total_workers,
                run.sizes
                    .iter()
                    .map(|&n| format!("{} per node at {n}", crate::debench::workers_per_node(a, n)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        run.seconds,
        a.local_pct
    );
    if let Some(rate) = a.rate {
        let _ = writeln!(
            r,
            "- Paced (`--rate {rate}`): the workers are not closed-loop; the cluster is offered {rate} commands a second (a global sequence counts as one), each worker starting one every workers ÷ rate seconds if the last has ended by then (missed starts are not made up; Erlang's workers wait with millisecond resolution). Where `ops_per_s` falls short of the offered rate, the system was saturated and its latencies include the wait for a core."
        );
    }
    let _ = writeln!(
        r,
        "- Computation times are scaled down to fit the machine: 10, 100 and 1,000 µs where the paper used 10 µs, 1 ms and 1 s. On 2 cores the total throughput cannot grow with the node count; what matters is throughput per CPU-second, the ratios, and each command's latency against cluster size.");
    let _ = writeln!(
        r,
        "- `ops_per_s`: successful commands over the measurement's wall time, all nodes; `cpu_s`: CPU time of all the system's processes from the start of the measurement until they are back at rest (from `/proc`; work the window started and left unfinished — spawned computations still queued — is the system's cost too; the cost of being at rest, measured for 1 s before each cell, is not counted for the time waited after the window; Erlang's `epmd` is not counted); latencies from logarithmic buckets 2% wide.\n"
    );

    let systems: Vec<String> = run.systems.iter().map(|s| s.to_string()).collect();
    let _ = writeln!(r, "## Throughput\n");
    for (wl, series) in run.grid {
        let _ = writeln!(r, "### {} ({})\n", describe(wl), series.join(", "));
        let mut head = String::from("| nodes |");
        let mut rule = String::from("|---|");
        for s in &systems {
            let _ = write!(head, " {s} ops/s | {s} ops/CPU-s | {s} errors |");
            rule.push_str("---|---|---|");
        }
        if systems.iter().any(|s| s == "erlang") {
            head.push_str(" Maquis ÷ Erlang, ops/CPU-s |");
            rule.push_str("---|");
        }
        let _ = writeln!(r, "{head}\n{rule}");
        for &n in run.sizes {
            let mut row = format!("| {n} |");
            for s in &systems {
                match find(cells, s, n, wl) {
                    Some(c) => {
                        let _ = write!(
                            row,
                            " {:.0} | {:.0} | {} |",
                            c.ops_per_s, c.ops_per_cpu_s, c.errors
                        );
                    }
                    None => row.push_str(" – | – | – |"),
                }
            }
            if systems.iter().any(|s| s == "erlang") {
                let erl = find(cells, "erlang", n, wl).map(|c| c.ops_per_cpu_s);
                let ratios: Vec<String> = systems
                    .iter()
                    .filter(|s| s.starts_with("maquis"))
                    .filter_map(|s| {
                        let m = find(cells, s, n, wl)?.ops_per_cpu_s;
                        let e = erl.filter(|e| *e > 0.0)?;
                        Some(format!("{:.2}×", m / e))
                    })
                    .collect();
                let _ = write!(row, " {} |", ratios.join(" / "));
            }
            let _ = writeln!(r, "{row}");
        }
        let _ = writeln!(r);
    }

    let _ = writeln!(
        r,
        "## Latency of each command against cluster size (p50 / p99, µs)\n"
    );
    for (wl, series) in run.grid {
        let kinds: Vec<&str> = [
            "spawn",
            "rpc",
            "call",
            "register",
            "whereis",
            "unregister",
            "local_register",
        ]
        .into_iter()
        .filter(|k| {
            cells
                .iter()
                .any(|c| c.workload == *wl && c.commands.get(*k).is_some_and(|s| s.count > 0))
        })
        .collect();
        if kinds.is_empty() {
            continue;
        }
        let _ = writeln!(r, "### {} ({})\n", describe(wl), series.join(", "));
        let mut head = String::from("| system | nodes |");
        let mut rule = String::from("|---|---|");
        for k in &kinds {
            let _ = write!(head, " {k} |");
            rule.push_str("---|");
        }
        let _ = writeln!(r, "{head}\n{rule}");
        for s in &systems {
            for &n in run.sizes {
                let Some(c) = find(cells, s, n, wl) else {
                    continue;
                };
                let mut row = format!("| {s} | {n} |");
                for k in &kinds {
                    match c.commands.get(*k) {
                        Some(x) if x.count > 0 => {
                            let _ = write!(row, " {} / {} |", x.p50_us, x.p99_us);
                        }
                        _ => row.push_str(" – |"),
                    }
                }
                let _ = writeln!(r, "{row}");
            }
        }
        let _ = writeln!(r);
    }

    let _ = writeln!(r, "## Targets\n");
    targets(&mut r, run, cells);
    let errors: Vec<String> = cells
        .iter()
        .filter(|c| c.errors > 0)
        .map(|c| {
            let first = c
                .commands
                .iter()
                .find_map(|(k, s)| s.first_error.as_ref().map(|e| format!("{k}: {e}")))
                .unwrap_or_default();
            // What the runtime counted meanwhile: where routed messages died, sends that failed.
            let counted: Vec<String> = c
                .counters
                .iter()
                .filter(|(k, _)| {
                    k.starts_with("routed_") || k.ends_with("_failed") || k.starts_with("control_")
                })
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            format!(
                "- {} at {} nodes, {}: {} errors {first}{}",
                label(c),
                c.nodes,
                describe(&c.workload),
                c.errors,
                if counted.is_empty() {
                    String::new()
                } else {
                    format!(" (counters: {})", counted.join(", "))
                }
            )
        })
        .collect();
    if !errors.is_empty() {
        let _ = writeln!(r, "\n## Errors\n\n{}", errors.join("\n"));
    }
    warmups(&mut r, run);

    r.push_str(&crate::plot::section(&a.out, "plot_debench.py", PLOT, &[]));
    std::fs::write(a.out.join("report.md"), r).map_err(|e| e.to_string())
}

/// What each cluster's warm-up met: the first seconds of load on a cluster that has just
/// formed, counted in no cell.
fn warmups(r: &mut String, run: &Run) {
    if run.warmups.is_empty() {
        return;
    }
    let _ = writeln!(
        r,
        "\n## Warm-up\n\n{} s of the first workload on every new cluster before its first cell, counted in no cell, with the CPU the cluster used at rest just before it (heartbeats, failure detection; cores, over 1 s):\n\n| system | nodes | cores at rest | ops/s | errors | first error |\n|---|---|---|---|---|---|",
        run.args.warmup
    );
    for w in run.warmups {
        let first = w
            .commands
            .iter()
            .find_map(|(k, s)| s.first_error.as_ref().map(|e| format!("{k}: {e}")))
            .unwrap_or_default();
        let _ = writeln!(
            r,
            "| {} | {} | {} | {:.0} | {} | {first} |",
            label(w),
            w.nodes,
            w.rest_cores
                .map_or_else(|| "–".to_string(), |c| format!("{c:.3}")),
            w.ops_per_s,
            w.errors
        );
    }
}

/// The plotting script.
const PLOT: &str = include_str!("../../../bench/plot_debench.py");

/// Whether a workload leaves a runtime room to do twice the commands per CPU-second of a
/// system that did `ops_per_cpu_s`: a computation of `compute_us` µs caps any system at
/// 10⁶ ÷ `compute_us`.
fn room_for_double(ops_per_cpu_s: f64, compute_us: u64) -> bool {
    2.0 * ops_per_cpu_s <= 1e6 / compute_us.max(1) as f64
}

/// The targets, each with what this run measured.
fn targets(r: &mut String, run: &Run, cells: &[Cell]) {
    let largest = run.sizes.iter().copied().max().unwrap_or(0);
    let smallest = run.sizes.iter().copied().min().unwrap_or(0);
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let maquis: Vec<&String> = run
        .systems
        .iter()
        .filter(|s| s.starts_with("maquis"))
        .collect();
    // Global registration p99 at the largest size.
    for s in run.systems {
        let p99 = cells
            .iter()
            .filter(|c| label(c) == *s && c.nodes == largest)
            .filter_map(|c| c.commands.get("register").filter(|x| x.count > 0))
            .map(|x| x.p99_us)
            .max();
        if let Some(p) = p99 {
            let ok = s == "erlang" || p <= 10_000;
            let _ = writeln!(
                r,
                "- Global registration p99 at {largest} nodes, {s}: {:.1} ms{}",
                p as f64 / 1000.0,
                if s == "erlang" {
                    String::new()
                } else {
                    format!(" (target ≤ 10 ms: {})", verdict(ok))
                }
            );
        }
    }
    // 1 % global against 0 % global.
    let at = |g: f64| Workload {
        global_pct: g,
        arg_bytes: 10,
        compute_us: 10,
        server_pct: 0.0,
    };
    for s in &maquis {
        for &n in run.sizes {
            if let (Some(one), Some(zero)) =
                (find(cells, s, n, &at(1.0)), find(cells, s, n, &at(0.0)))
            {
                let ratio = one.ops_per_s / zero.ops_per_s.max(1e-9);
                // A cell with failed commands measured the failures, not the cost of global
                // commands: the ratio is shown but not judged.
                let judged = if one.errors == 0 && zero.errors == 0 {
                    verdict(ratio >= 0.9).to_string()
                } else {
                    format!("not judged, {} and {} errors", one.errors, zero.errors)
                };
                let _ = writeln!(
                    r,
                    "- {s}, {n} nodes: throughput with 1% global commands {ratio:.2}× the 0% throughput (target ≥ 0.9: {judged})"
                );
            }
        }
    }
    // Commands per CPU-second against Erlang.
    for s in &maquis {
        for &n in run.sizes {
            let ratios: Vec<(f64, bool)> = run
                .grid
                .iter()
                .filter_map(|(wl, _)| {
                    let m = find(cells, s, n, wl)?.ops_per_cpu_s;
                    let e = find(cells, "erlang", n, wl)?.ops_per_cpu_s;
                    (e > 0.0).then_some((m / e, room_for_double(e, wl.compute_us)))
                })
                .collect();
            let least = |room_only: bool| {
                ratios
                    .iter()
                    .filter(|(_, room)| *room || !room_only)
                    .map(|(x, _)| *x)
                    .reduce(f64::min)
            };
            if let Some(min) = least(false) {
                let with_room = ratios.iter().filter(|(_, room)| *room).count();
                let room = least(true).map_or_else(
                    || "none".to_string(),
                    |m| format!("{m:.2}× ({})", verdict(m >= 2.0)),
                );
                let _ = writeln!(
                    r,
                    "- {s}, {n} nodes: commands per CPU-second {min:.2}× Distributed Erlang's at the least (over {} workloads; target ≥ 2: {}); over the {with_room} whose computation leaves room for 2× (Erlang below half of 10⁶ ÷ the computation in µs): {room}",
                    ratios.len(),
                    verdict(min >= 2.0)
                );
            }
        }
    }
    // rpc p99 from the smallest to the largest cluster.
    if smallest != largest {
        for s in run.systems {
            for (wl, _) in run.grid {
                let p99 = |n| {
                    find(cells, s, n, wl)
                        .and_then(|c| c.commands.get("rpc"))
                        .filter(|x| x.count > 0)
                        .map(|x| x.p99_us)
                };
                if let (Some(lo), Some(hi)) = (p99(smallest), p99(largest)) {
                    let growth = hi as f64 / lo.max(1) as f64;
                    let _ = writeln!(
                        r,
                        "- {s}, {}: rpc p99 {lo} µs at {smallest} nodes, {hi} µs at {largest} ({growth:.2}×{})",
                        describe(wl),
                        if s.starts_with("maquis") {
                            format!("; target ≤ 2×: {}", verdict(growth <= 2.0))
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::room_for_double;

    #[test]
    fn a_long_computation_leaves_no_room_for_twice_the_commands() {
        // Distributed Erlang's cells of the committed full run.
        assert!(room_for_double(16_152.0, 10), "10 µs: up to 100,000");
        assert!(room_for_double(3_695.0, 100), "100 µs: up to 10,000");
        assert!(!room_for_double(6_402.0, 100));
        assert!(!room_for_double(629.0, 1_000), "1,000 µs: up to 1,000");
        assert!(room_for_double(500.0, 1_000), "exactly half");
    }
}
