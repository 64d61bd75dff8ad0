//! `report.md` and the plots of `maquis-bench ycsb`.

use std::fmt::Write as _;

use crate::ycsb_bench::{Cell, Tools, YcsbArgs};

/// psaDB's workload A average read and update latency in the paper (Table 1), µs.
pub const PAPER_A_AVG_US: f64 = 750.0;

/// The paper's Table 1 (average µs, 95th and 99th percentile ms), for the report.
const PAPER: &[(&str, &str, u64, u64, u64)] = &[
    ("a", "READ", 748, 1, 2),
    ("a", "UPDATE", 725, 1, 1),
    ("b", "READ", 738, 1, 2),
    ("b", "UPDATE", 713, 1, 1),
    ("c", "READ", 760, 1, 2),
    ("d", "READ", 731, 1, 2),
    ("d", "INSERT", 1055, 2, 2),
    ("e", "SCAN", 24969, 32, 36),
    ("e", "INSERT", 10857, 16, 19),
];

/// The cell of `system` on `workload` at `threads` (the fault run: any).
fn find<'a>(cells: &'a [Cell], system: &str, workload: &str, threads: u32) -> Option<&'a Cell> {
    cells.iter().find(|c| {
        c.system == system
            && c.workload == workload
            && (c.threads == threads || workload == "fault")
    })
}

/// Writes `report.md` (and the plots) into `a.out`.
pub fn write(
    a: &YcsbArgs,
    cells: &[Cell],
    tools: &Tools,
    notes: &[String],
    records: u64,
    seconds: u64,
    load_before: &str,
) -> Result<(), String> {
    let mut r = String::new();
    let _ = writeln!(
        r,
        "# YCSB against psaDB, the ring store and Redis (psaDB Table 1)\n"
    );
    let _ = writeln!(
        r,
        "Command: `cargo run --release -p maquis-bench -- ycsb{}{}`  ",
        if a.quick { " --quick" } else { "" },
        if a.systems.len() < 3 {
            format!(" --systems {}", a.systems.join(","))
        } else {
            String::new()
        }
    );
    r.push_str(&crate::stats::setting_lines());
    let _ = writeln!(
        r,
        "Load average before: {}  \nJava: {}  \nRedis: {}  \nYCSB: site.ycsb:core 0.17.0 (Maven Central), binding `bench/ycsb` (Jedis 8.0.2)\n",
        load_before.trim(),
        tools.java,
        tools.redis
    );
    let _ = writeln!(
        r,
        "Everything on loopback on this machine; each psaDB and ring node runs {} tokio worker thread. {records} records of 10 fields × {} bytes loaded into each system, then workloads {} for {seconds} s each at {} YCSB client threads (spread over the system's nodes; the loads and the fault run at the most). psaDB: 3 processes, each with a member of each of 3 groups (3 groups × 3 members), a write acknowledged once all three members hold it; ring: 3 processes, 64 partitions, N = 3 replicas, R = W = 2 quorums (the ring keeps strings: a record's field `f` is key `k/f`); redis: one `redis-server` without persistence (scans over a sorted set of the keys, as YCSB's own Redis binding does). The workload files in `bench/ycsb/workloads` hold YCSB's documented parameters for A–E.\n",
        crate::ycsb_bench::NODE_WORKER_THREADS,
        a.field_length,
        a.workloads_shown(),
        a.threads
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" and ")
    );
    for n in notes {
        let _ = writeln!(r, "- {n}");
    }
    if !notes.is_empty() {
        r.push('\n');
    }
    let systems: Vec<&str> = ["psadb", "ring", "redis"]
        .into_iter()
        .filter(|s| cells.iter().any(|c| c.system == *s))
        .collect();
    let workloads: Vec<&str> = ["load", "a", "b", "c", "d", "e"]
        .into_iter()
        .filter(|w| cells.iter().any(|c| c.workload == *w))
        .collect();
    let least = a.threads.iter().copied().min().unwrap_or(1);
    let most = a.threads.iter().copied().max().unwrap_or(1);
    let mut counts = a.threads.clone();
    counts.sort_unstable();
    counts.dedup();
    for &t in &counts {
        let _ = writeln!(
            r,
            "## {}latency per operation, {t} client thread{}\n",
            if t == least { "Table 1: " } else { "" },
            if t == 1 { "" } else { "s" }
        );
        latency_table(&mut r, cells, &systems, &workloads, t);
    }
    let _ = writeln!(r, "\n## Throughput, {most} client threads\n");
    throughput_table(&mut r, cells, &systems, &workloads, most);
    fault_section(&mut r, cells);
    targets(&mut r, cells, &workloads, &counts, least, most);
    r.push_str(&crate::plot::section(
        &a.out,
        "plot_ycsb.py",
        PLOT_PY,
        &[&least.to_string(), &most.to_string()],
    ));
    std::fs::write(a.out.join("report.md"), r).map_err(|e| format!("{}: {e}", a.out.display()))
}

fn latency_table(r: &mut String, cells: &[Cell], systems: &[&str], workloads: &[&str], t: u32) {
    let _ = writeln!(
        r,
        "| workload | operation | system | operations | avg µs | p95 µs | p99 µs | errors | paper's psaDB avg µs / p95 ms / p99 ms |\n|---|---|---|---|---|---|---|---|---|"
    );
    for w in workloads {
        let ops: std::collections::BTreeSet<&String> = cells
            .iter()
            .filter(|c| c.workload == *w)
            .flat_map(|c| c.ops.keys())
            .collect();
        for op in ops {
            for s in systems {
                let Some(o) = find(cells, s, w, t).and_then(|c| c.ops.get(op)) else {
                    continue;
                };
                let paper = PAPER
                    .iter()
                    .find(|p| p.0 == *w && p.1 == op && *s == "psadb")
                    .map(|p| format!("{} / {} / {}", p.2, p.3, p.4))
                    .unwrap_or_default();
                let _ = writeln!(
                    r,
                    "| {} | {op} | {s} | {} | {:.0} | {:.0} | {:.0} | {} | {paper} |",
                    w.to_uppercase(),
                    o.ok + o.errors,
                    o.avg_us,
                    o.p95_us,
                    o.p99_us,
                    o.errors
                );
            }
        }
    }
    r.push('\n');
}

fn throughput_table(r: &mut String, cells: &[Cell], systems: &[&str], workloads: &[&str], t: u32) {
    let mut head = String::from("| workload |");
    let mut rule = String::from("|---|");
    for s in systems {
        let _ = write!(head, " {s} ops/s | {s} server CPU µs/op |");
        rule.push_str("---|---|");
    }
    if systems.contains(&"psadb") && systems.contains(&"redis") {
        head.push_str(" redis / psadb |");
        rule.push_str("---|");
    }
    let _ = writeln!(r, "{head}\n{rule}");
    for w in workloads {
        let mut line = format!("| {} |", w.to_uppercase());
        for s in systems {
            match find(cells, s, w, t) {
                Some(c) => {
                    let ops = c.ops_per_s * c.seconds;
                    let _ = write!(
                        line,
                        " {:.0} | {:.0} |",
                        c.ops_per_s,
                        if ops > 0.0 {
                            c.server_cpu_s * 1e6 / ops
                        } else {
                            0.0
                        }
                    );
                }
                None => line.push_str(" – | – |"),
            }
        }
        if systems.contains(&"psadb") && systems.contains(&"redis") {
            match (find(cells, "psadb", w, t), find(cells, "redis", w, t)) {
                (Some(p), Some(x)) if p.ops_per_s > 0.0 => {
                    let _ = write!(line, " {:.2}× |", x.ops_per_s / p.ops_per_s);
                }
                _ => line.push_str(" – |"),
            }
        }
        let _ = writeln!(r, "{line}");
    }
}

fn fault_section(r: &mut String, cells: &[Cell]) {
    if let Some(f) = find(cells, "psadb", "fault", 0) {
        let _ = writeln!(r, "\n## Fault run: a node killed -9 during the load\n");
        let _ = writeln!(
            r,
            "{} records loaded through nodes 0 and 1 with `dataintegrity=true`; node 2 killed with SIGKILL at YCSB's first status line past a third done (see above). Inserts acknowledged: {}; failed: {}; acknowledged inserts not readable afterwards (any of the 10 fields missing or not YCSB's value), through node 0 and, once node 2 was started again and ready ({:.1} s later: its new members caught up from the others' snapshots), through node 2: **{}** ({} of them through node 2). Throughput {:.0} ops/s (paced to {} ops/s); insert avg {:.0} µs, p99 {:.0} µs, slowest {:.0} µs (the wait for the group to notice the death).",
            f.records,
            f.acked_writes.unwrap_or(0),
            f.errors,
            f.restart_s.unwrap_or(f64::NAN),
            f.lost_acked_writes.unwrap_or(0),
            f.lost_after_restart.unwrap_or(0),
            f.ops_per_s,
            crate::ycsb_bench::fault_pace(f.records),
            f.ops.get("INSERT").map_or(0.0, |o| o.avg_us),
            f.ops.get("INSERT").map_or(0.0, |o| o.p99_us),
            f.ops.get("INSERT").map_or(0.0, |o| o.max_us)
        );
    }
}

fn targets(
    r: &mut String,
    cells: &[Cell],
    workloads: &[&str],
    counts: &[u32],
    least: u32,
    most: u32,
) {
    let _ = writeln!(r, "\n## Targets\n");
    match find(cells, "psadb", "a", least) {
        Some(c) => {
            for op in ["READ", "UPDATE"] {
                let avg = c.ops.get(op).map_or(f64::NAN, |o| o.avg_us);
                let _ = writeln!(
                    r,
                    "- psaDB workload A average {op} at {least} client thread{}: {avg:.0} µs (target ≤ {PAPER_A_AVG_US:.0} µs): {}.",
                    if least == 1 { "" } else { "s" },
                    if avg <= PAPER_A_AVG_US { "met" } else { "not met" }
                );
            }
        }
        None => {
            let _ = writeln!(r, "- psaDB workload A: not run.");
        }
    }
    match find(cells, "psadb", "fault", 0) {
        Some(f) => {
            let lost = f.lost_acked_writes.unwrap_or(u64::MAX);
            let _ = writeln!(
                r,
                "- Acknowledged writes lost under the kill: {lost} of {} (target 0): {}.",
                f.acked_writes.unwrap_or(0),
                if lost == 0 { "met" } else { "not met" }
            );
        }
        None => {
            let _ = writeln!(r, "- Fault run: not run.");
        }
    }
    let ratio = |w: &str, t: u32| {
        let p = find(cells, "psadb", w, t)?;
        let x = find(cells, "redis", w, t)?;
        Some((
            x.ops_per_s,
            p.ops_per_s,
            x.ops_per_s / p.ops_per_s.max(f64::MIN_POSITIVE),
        ))
    };
    for w in workloads {
        if let Some((redis, psadb, at_most)) = ratio(w, most) {
            // At the other counts (the loads run at the most only: nothing to show for them).
            let fewer: Vec<String> = counts
                .iter()
                .filter(|&&t| t != most)
                .filter_map(|&t| ratio(w, t).map(|(_, _, q)| format!("{q:.2}× at {t}")))
                .collect();
            let _ = writeln!(
                r,
                "- Throughput {} at {most} client threads: redis {redis:.0} ops/s, psaDB {psadb:.0} ops/s with three replicas: {at_most:.2}× (target ≤ 3×): {}{}.",
                if *w == "load" { "of the load".to_string() } else { format!("on workload {}", w.to_uppercase()) },
                if at_most <= 3.0 { "met" } else { "not met" },
                if fewer.is_empty() { String::new() } else { format!(" (Redis ÷ psaDB {})", fewer.join(", ")) }
            );
        }
    }
}

impl YcsbArgs {
    fn workloads_shown(&self) -> String {
        if self.workloads.is_empty() {
            if self.quick { "A" } else { "A–E" }.to_string()
        } else {
            self.workloads
                .iter()
                .map(|w| w.to_uppercase())
                .collect::<Vec<_>>()
                .join(", ")
        }
    }
}

/// Average latency per operation and system, one panel per workload; and throughput.
const PLOT_PY: &str = r#"
import json, sys, os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
least, most = int(sys.argv[2]), int(sys.argv[3])
every = json.load(open(os.path.join(out, "results.json")))
fixed = ("load", "fault")
cells = [c for c in every if c["workload"] in fixed or c["threads"] == least]
systems = [s for s in ["psadb", "ring", "redis"] if any(c["system"] == s for c in cells)]
workloads = [w for w in ["a", "b", "c", "d", "e"] if any(c["workload"] == w for c in cells)]
colors = {"psadb": "tab:blue", "ring": "tab:orange", "redis": "tab:gray"}
if workloads:
    fig, axes = plt.subplots(1, len(workloads), figsize=(3.2 * len(workloads), 3.6), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        ops = sorted({op for c in cells if c["workload"] == w for op in c["ops"]})
        width = 0.8 / max(len(systems), 1)
        for i, s in enumerate(systems):
            cell = next((c for c in cells if c["system"] == s and c["workload"] == w), None)
            if cell is None:
                continue
            xs = [j + i * width for j in range(len(ops))]
            avg = [cell["ops"].get(op, {}).get("avg_us", 0) / 1000 for op in ops]
            p99 = [cell["ops"].get(op, {}).get("p99_us", 0) / 1000 for op in ops]
            ax.bar(xs, avg, width, color=colors[s], label=s)
            ax.scatter(xs, p99, marker="_", color="black", s=80, zorder=3)
        ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(ops))])
        ax.set_xticklabels([op.lower() for op in ops])
        ax.set_title("workload " + w.upper())
        ax.set_yscale("log")
        ax.set_ylabel("ms (bar: average, dash: p99)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("latency, %d client thread%s" % (least, "" if least == 1 else "s"))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ycsb_latency.png"), dpi=110)
    print("ycsb_latency.png")
cells = [c for c in every if c["workload"] in fixed or c["threads"] == most]
names = [w for w in ["load", "a", "b", "c", "d", "e", "fault"] if any(c["workload"] == w for c in cells)]
fig, ax = plt.subplots(figsize=(7, 3.6))
width = 0.8 / max(len(systems), 1)
for i, s in enumerate(systems):
    xs, ys = [], []
    for j, w in enumerate(names):
        cell = next((c for c in cells if c["system"] == s and c["workload"] == w), None)
        if cell is not None:
            xs.append(j + i * width)
            ys.append(cell["ops_per_s"])
    ax.bar(xs, ys, width, color=colors[s], label=s)
ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(names))])
ax.set_xticklabels(names)
ax.set_ylabel("operations per second, %d client threads" % most)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(os.path.join(out, "ycsb_throughput.png"), dpi=110)
print("ycsb_throughput.png")
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(system: &str, workload: &str, threads: u32, ops_per_s: f64) -> Cell {
        Cell {
            system: system.into(),
            workload: workload.into(),
            threads,
            ops_per_s,
            ..Default::default()
        }
    }

    #[test]
    fn throughput_is_judged_at_the_most_threads_and_shown_at_the_others() {
        let cells = [
            cell("psadb", "a", 8, 10_000.0),
            cell("redis", "a", 8, 36_400.0),
            cell("psadb", "a", 32, 20_000.0),
            cell("redis", "a", 32, 58_000.0),
            cell("psadb", "load", 32, 5_000.0),
            cell("redis", "load", 32, 20_000.0),
        ];
        let mut r = String::new();
        targets(&mut r, &cells, &["load", "a"], &[1, 8, 32], 1, 32);
        assert!(
            r.contains("on workload A at 32 client threads: redis 58000 ops/s, psaDB 20000 ops/s with three replicas: 2.90× (target ≤ 3×): met (Redis ÷ psaDB 3.64× at 8)."),
            "{r}"
        );
        assert!(
            r.contains("of the load at 32 client threads: redis 20000 ops/s, psaDB 5000 ops/s with three replicas: 4.00× (target ≤ 3×): not met."),
            "{r}"
        );
    }
}
