//! report.md and plots for `maquis-bench echo` and `maquis-bench kvs`.

use std::fmt::Write as _;
use std::path::Path;

use crate::micro_report::machine;
use crate::ring_agent::{Workload, PARTISAN, PARTISAN_PARALLELISM, SINGLE};
use crate::ring_bench::{human, lanes_summary, Cell, Outcome, Plan};
use crate::ring_redis::{fmt_opt, single_meaning, REDIS_ARGS, STORAGE_DELAY_MS};

fn find<'a>(
    cells: &'a [Cell],
    rtt: u64,
    size: usize,
    actors: usize,
    config: &str,
) -> Option<&'a Cell> {
    cells.iter().find(|c| {
        c.rtt_ms == rtt && c.payload_bytes == size && c.actors == actors && c.config == config
    })
}

/// The `partisan`/`single` throughput ratio a cell must reach (the strictest that applies).
fn target(workload: Workload, rtt: u64, size: usize) -> f64 {
    if workload == Workload::Echo && rtt == 20 && size == 8 * 1024 * 1024 {
        10.0
    } else if size <= 1024 {
        0.95
    } else {
        1.0
    }
}

/// partisan/single, when both were measured: `None` if either is missing or not valid;
/// infinite if only `single` completed nothing.
fn ratio(p: &Cell, s: &Cell) -> Option<f64> {
    if !p.valid() || !s.valid() {
        None
    } else if s.ops_per_s > 0.0 {
        Some(p.ops_per_s / s.ops_per_s)
    } else if p.ops_per_s > 0.0 {
        Some(f64::INFINITY)
    } else {
        None
    }
}

fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(x) if x.is_infinite() => "∞".into(),
        Some(x) => format!("{x:.2}×"),
        None => "–".into(),
    }
}

fn verdict(r: Option<f64>, want: f64) -> String {
    match r {
        Some(x) if x >= want => "met".into(),
        Some(x) => format!("missed by {:.0}%", (1.0 - x / want) * 100.0),
        None => "no data".into(),
    }
}

fn sorted<T: Ord + Copy>(it: impl Iterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = it.collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1e3)
}

/// Writes report.md (and the plots, when Python's matplotlib is available) into `out`.
pub fn write(out: &Path, o: &Outcome) -> Result<(), String> {
    let plan = &o.plan;
    let cells = &o.cells;
    let mut r = String::new();
    let (title, figs) = match plan.workload {
        Workload::Echo => ("Ring echo service", "Fig. 5–6"),
        Workload::Kvs => ("Ring key-value store", "Fig. 7–8"),
    };
    let cmdline: Vec<String> = std::env::args().collect();
    let _ = writeln!(r, "# {title} (PARTISAN {figs}, §6.2)\n");
    let _ = writeln!(r, "Command: `{}`  ", cmdline.join(" "));
    let _ = writeln!(r, "Machine: {}  ", machine());
    let _ = writeln!(r, "Commit: {}  ", crate::micro_report::build_commit());
    let _ = writeln!(r, "Wall time: {:.0} s\n", o.took.as_secs_f64());
    if let Some(e) = &o.stopped {
        let _ = writeln!(r, "**The run stopped early:** {e}\n");
    }
    for f in &o.failures {
        let _ = writeln!(
            r,
            "**A configuration failed part-way** (its remaining cells at that RTT are missing): {f}\n"
        );
    }
    settings(&mut r, plan);
    configurations(&mut r, o);
    link(&mut r, o);
    if plan.workload == Workload::Kvs && !o.preloads.is_empty() {
        let _ = writeln!(r, "## Pre-load\n");
        let _ = writeln!(
            r,
            "Before each value size, its key space is written once (a third of the keys from each node, 16 writes in flight per node).\n"
        );
        let _ = writeln!(
            r,
            "| RTT | config | value | keys written | seconds | failed |\n|---|---|---|---|---|---|"
        );
        for p in &o.preloads {
            let _ = writeln!(
                r,
                "| {} ms | {} | {} | {} | {:.1} | {} |",
                p.rtt_ms,
                p.config,
                human(p.size),
                p.keys,
                p.seconds,
                p.errors
            );
        }
        let _ = writeln!(r);
    }
    let rtts = sorted(cells.iter().map(|c| c.rtt_ms));
    let sizes = sorted(cells.iter().map(|c| c.payload_bytes));
    let actors = sorted(cells.iter().map(|c| c.actors));
    let both =
        plan.configs.iter().any(|c| c == SINGLE) && plan.configs.iter().any(|c| c == PARTISAN);
    let _ = writeln!(r, "## Results\n");
    let _ = writeln!(
        r,
        "ops/s: requests completed per second by the three nodes together; p50/p99: request latency over all nodes; `actors`: per node (three times as many in all). CPU: user + system time of the three ring processes per request.\n"
    );
    for &rtt in &rtts {
        for &size in &sizes {
            let want = target(plan.workload, rtt, size);
            let _ = writeln!(r, "### RTT {rtt} ms, payload {}\n", human(size));
            let _ = write!(r, "| actors |");
            for c in &plan.configs {
                let _ = write!(r, " {c} ops/s | p50 ms | p99 ms | CPU µs/op | errors |");
            }
            if both {
                let _ = write!(r, " partisan/single | target | verdict |");
            }
            let _ = write!(r, "\n|---|");
            for _ in &plan.configs {
                let _ = write!(r, "---|---|---|---|---|");
            }
            if both {
                let _ = write!(r, "---|---|---|");
            }
            let _ = writeln!(r);
            for &n in &actors {
                let _ = write!(r, "| {n} |");
                for c in &plan.configs {
                    match find(cells, rtt, size, n, c) {
                        Some(x) => {
                            let _ = write!(
                                r,
                                " {:.1}{} | {} | {} | {:.0} | {} |",
                                x.ops_per_s,
                                if x.valid() { "" } else { " †" },
                                ms(x.p50_us),
                                ms(x.p99_us),
                                x.cpu_us_per_op,
                                x.errors
                            );
                        }
                        None => {
                            let _ = write!(r, " – | – | – | – | – |");
                        }
                    }
                }
                if both {
                    let pair = match (
                        find(cells, rtt, size, n, PARTISAN),
                        find(cells, rtt, size, n, SINGLE),
                    ) {
                        (Some(p), Some(s)) => Some((p, s)),
                        _ => None,
                    };
                    let rt = pair.and_then(|(p, s)| ratio(p, s));
                    let v = match pair {
                        Some((p, s)) if !p.valid() || !s.valid() => "not judged (†)".to_string(),
                        _ => verdict(rt, want),
                    };
                    let _ = write!(r, " {} | ≥ {want}× | {v} |", fmt_ratio(rt));
                }
                let _ = writeln!(r);
            }
            for c in cells
                .iter()
                .filter(|c| c.rtt_ms == rtt && c.payload_bytes == size && !c.valid())
            {
                let _ = writeln!(
                    r,
                    "\n† {} with {} actors: not a valid measurement, membership changed during the cell ({}): a node that is declared down has its requests served by fallback vnodes on the caller's side, so the numbers do not describe the three-node ring.",
                    c.config,
                    c.actors,
                    c.membership.join(", ")
                );
            }
            if plan.workload == Workload::Kvs {
                let kv: Vec<String> = cells
                    .iter()
                    .filter(|c| c.rtt_ms == rtt && c.payload_bytes == size)
                    .map(|c| {
                        format!(
                            "{} {}: {} gets, {} puts, {} gets without a value of this size",
                            c.config, c.actors, c.reads, c.writes, c.misses
                        )
                    })
                    .collect();
                let _ = writeln!(
                    r,
                    "\nKey space {} keys. Requests: {}.",
                    plan.kvs_keys(size),
                    kv.join("; ")
                );
            }
            let _ = writeln!(r);
        }
    }
    if both {
        targets(&mut r, plan, cells, &rtts, &sizes, &actors);
    }
    redis(&mut r, o);
    if plan.faults {
        crate::ring_faults::report(&mut r, &o.faults);
    }
    match plot(out, plan.workload) {
        Ok(files) => {
            let _ = writeln!(r, "## Plots\n");
            for f in files {
                let _ = writeln!(r, "![{f}]({f})");
            }
        }
        Err(e) => {
            let _ = writeln!(r, "(Plots not drawn: {e})");
            eprintln!("plots not drawn: {e}");
        }
    }
    std::fs::write(out.join("report.md"), r).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out.join("report.md").display());
    Ok(())
}

fn settings(r: &mut String, plan: &Plan) {
    let _ = writeln!(r, "## Settings\n");
    let _ = writeln!(
        r,
        "- Cluster: three `maquis-ring` nodes (`n1`, `n2`, `n3`), one in each of three emulated hosts; `n2` and `n3` join `n1` (full-mesh overlay). The ring has {} partitions (vnodes), N = 3 replicas, R = W = 2. Each configuration gets a fresh cluster, and measuring starts only once the ring has converged (every partition on its final owner, no handoff running, all nodes on the same ring).",
        plan.partitions
    );
    let _ = writeln!(
        r,
        "- Load: every node runs the given number of closed-loop actors (each sends a request, waits for its answer, sends the next), the three nodes at once, so requests come from all nodes. RTT, payload size and actor count form the grid: RTT {} ms; payloads {}; actors per node {}.",
        plan.rtts.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "),
        plan.sizes.iter().map(|&s| human(s)).collect::<Vec<_>>().join(", "),
        plan.actors.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
    );
    match plan.workload {
        Workload::Echo => {
            let _ = writeln!(
                r,
                "- Echo (§6.2.3): a request is `RingNode::echo(payload)`: the payload goes to the vnode owning a key drawn uniformly from {} keys and comes back in the reply. With three nodes, about a third of the requests find the vnode on their own node and cross no network.",
                plan.partitions.max(1024)
            );
        }
        Workload::Kvs => {
            let _ = writeln!(
                r,
                "- KVS (§6.2.4): each request is a put with probability 1/{} and a get otherwise ({}:1 reads to writes); gets and puts are quorum requests to the key's three replicas (answered after 2); every vnode read or write waits {} ms (simulated storage). Values have the payload size. Keys `key:000000`, `key:000001`, … are drawn from a normal distribution with mean (K − 1)/2 and standard deviation K/6 over K keys (draws outside 0..K are drawn again), so about 68% of requests go to the middle third of the keys.",
                plan.reads_per_write + 1,
                plan.reads_per_write,
                plan.storage_delay_ms
            );
            let per: Vec<String> = plan
                .sizes
                .iter()
                .map(|&s| {
                    let k = plan.kvs_keys(s);
                    let (m, sd) = Plan::key_distribution(k);
                    format!("{}: K = {k} (mean {m:.1}, stddev {sd:.1})", human(s))
                })
                .collect();
            let _ = writeln!(
                r,
                "- Key space: {} keys as in the paper, except where the three replicas of every key would exceed {} MiB of values on this one machine (all three hosts share its memory): then K = {} MiB / (3 × value size). {}. Before measuring a value size, all K keys are written with values of that size.",
                plan.keys,
                plan.memory_mib,
                plan.memory_mib,
                per.join("; ")
            );
        }
    }
    let _ = writeln!(
        r,
        "- Duration: {} s of warm-up, then {} s measured per cell{} (the paper ran 120 s per cell). A request counts if it completes inside the measured window; ops/s is that count over the window, summed over the nodes; p50/p99/max are the latencies of those requests (p50/p99 from a log-linear histogram, under 1% error). No request starts after the window; the ones in flight then finish before the next cell starts, uncounted.",
        plan.warmup,
        plan.seconds,
        if plan.quick { " (`--quick`: the reduced grid)" } else { "" }
    );
    let _ = writeln!(
        r,
        "- Request deadline: {} s (a request not answered by then counts as an error).",
        plan.request_timeout_s
    );
    let _ = writeln!(
        r,
        "- Network: the userspace link emulator (`maquis netem`): three hosts in network namespaces; every packet between two hosts is delayed by RTT/2, so any two hosts see the RTT given; no rate limit and no loss.\n"
    );
}

fn configurations(r: &mut String, o: &Outcome) {
    let _ = writeln!(r, "## Configurations\n");
    let _ = writeln!(
        r,
        "- `{SINGLE}`: the node runs with parallelism 1, affinity off and no named channels, so the ring's `vnode`, `gossip` and `handoff` traffic (requests, replies, ring gossip, handoff) all travels on the `default` channel: **one TCP connection per peer for all ring traffic**, as with Distributed Erlang. The runtime keeps its own one-lane `membership` connection per peer for heartbeats and membership gossip; no ring message uses it."
    );
    let _ = writeln!(
        r,
        "- `{PARTISAN}`: parallelism {PARTISAN_PARALLELISM}, affinity on, and the ring's named channels: `vnode` with {PARTISAN_PARALLELISM} connections per peer (a request goes on the lane of its partition, so one partition's traffic stays in order and partitions spread over the lanes), `gossip` and `handoff` with one connection each, `default` with {PARTISAN_PARALLELISM} (plus `membership`).\n"
    );
    if !o.clusters.is_empty() {
        let _ = writeln!(
            r,
            "Connections seen by `n1` to one peer once the ring converged (channel connected/configured):\n"
        );
        let _ = writeln!(
            r,
            "| RTT | config | converged after | ring version | partitions on n1 | lanes |\n|---|---|---|---|---|---|"
        );
        for c in &o.clusters {
            let _ = writeln!(
                r,
                "| {} ms | {} | {:.1} s | {} | {} | {} |",
                c.rtt_ms,
                c.config,
                c.converged.seconds,
                c.converged.ring_version,
                c.converged.owned,
                lanes_summary(&c.converged.lanes)
            );
        }
        let _ = writeln!(r);
    }
}

fn link(r: &mut String, o: &Outcome) {
    if o.netem.is_empty() {
        return;
    }
    let _ = writeln!(r, "## Link emulator\n");
    let _ = writeln!(
        r,
        "| RTT | packets | Gbit/s (active) | dropped (queue full) | lateness p50 | p99 | max | warnings |\n|---|---|---|---|---|---|---|---|"
    );
    for (rtt, s) in &o.netem {
        let _ = writeln!(
            r,
            "| {rtt} ms | {} | {:.2} | {} | {:.0} µs | {:.0} µs | {:.0} µs | {} |",
            s.total.packets,
            s.total.gbit_per_s,
            s.total.dropped_queue_full,
            s.lateness.p50_us,
            s.lateness.p99_us,
            s.lateness.max_us,
            if s.warnings.is_empty() {
                "none".to_string()
            } else {
                s.warnings.join("; ")
            }
        );
    }
    let mut tcp: Vec<String> = o
        .netem
        .first()
        .map(|(_, s)| {
            s.sysctls
                .iter()
                .map(|(k, v)| format!("`{k} = {v}`"))
                .collect()
        })
        .unwrap_or_default();
    tcp.extend(o.host_sysctls.iter().map(|(k, v)| format!("`{k} = {v}`")));
    let _ = writeln!(r, "\nTCP settings in the hosts: {}.", tcp.join(", "));
    if o.plan.sysctls.is_empty() {
        let _ = writeln!(r, "These are the kernel's values (no `--sysctl` given).");
    } else {
        let _ = writeln!(
            r,
            "Set by this run (`--sysctl`): {}.",
            o.plan
                .sysctls
                .iter()
                .map(|(k, v)| format!("`{k} = {v}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if o.host_sysctls
        .iter()
        .any(|(k, v)| k == "net.ipv4.tcp_slow_start_after_idle" && v == "1")
    {
        let _ = writeln!(
            r,
            "\nWith `tcp_slow_start_after_idle = 1`, Linux shrinks a connection's congestion window back to its initial size after the connection has been idle for a retransmission timeout. With {PARTISAN_PARALLELISM} lanes per peer, each lane carries a sixteenth of the traffic, so with large payloads and few requests per second a lane is often idle that long and starts its next message in slow start; `single`'s one connection is rarely idle. `--sysctl net.ipv4.tcp_slow_start_after_idle=0` turns that off."
        );
    }
    let _ = writeln!(r);
}

fn targets(
    r: &mut String,
    plan: &Plan,
    cells: &[Cell],
    rtts: &[u64],
    sizes: &[usize],
    actors: &[usize],
) {
    let _ = writeln!(r, "## Targets\n");
    let _ = writeln!(
        r,
        "Throughput ratio `partisan`/`single` per cell: `partisan` ≥ `single` at every point (≥ 1×); at 1 KiB, where the paper reports parity (0.95×–1.00×), ≥ 0.95× counts as met{}.\n",
        if plan.workload == Workload::Echo {
            "; echo at 20 ms RTT with 8 MiB: ≥ 10× (the paper: 38× at 128 actors)"
        } else {
            ""
        }
    );
    // A rule gives a cell's threshold, or None where the target does not apply.
    type Rule = fn(Workload, u64, usize) -> Option<f64>;
    let rules: [(String, Rule); 3] = [
        (
            "`partisan` ≥ `single` at every point (≥ 0.95× at 1 KiB)".to_string(),
            |_, _, size| Some(if size <= 1024 { 0.95 } else { 1.0 }),
        ),
        (
            "echo at 20 ms RTT with 8 MiB: ≥ 10×".to_string(),
            |w, rtt, size| {
                (w == Workload::Echo && rtt == 20 && size == 8 * 1024 * 1024).then_some(10.0)
            },
        ),
        (
            "strict reading, ≥ 1× at 1 KiB too".to_string(),
            |_, _, size| (size <= 1024).then_some(1.0),
        ),
    ];
    let mut groups: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
    let mut unjudged: Vec<String> = Vec::new();
    for (name, rule) in &rules {
        let (mut met, mut missed) = (Vec::new(), Vec::new());
        for &rtt in rtts {
            for &size in sizes {
                let Some(want) = rule(plan.workload, rtt, size) else {
                    continue;
                };
                for &n in actors {
                    let (Some(p), Some(s)) = (
                        find(cells, rtt, size, n, PARTISAN),
                        find(cells, rtt, size, n, SINGLE),
                    ) else {
                        continue;
                    };
                    let rt = ratio(p, s);
                    let what = format!("{rtt} ms/{}/{n} actors {}", human(size), fmt_ratio(rt));
                    if !p.valid() || !s.valid() {
                        unjudged.push(format!("{rtt} ms/{}/{n} actors", human(size)));
                        continue;
                    }
                    if rt.is_some_and(|x| x >= want) {
                        met.push(what);
                    } else {
                        missed.push(what);
                    }
                }
            }
        }
        if met.len() + missed.len() > 0 {
            groups.push((name.clone(), met, missed));
        }
    }
    for (name, met, missed) in &groups {
        let total = met.len() + missed.len();
        let _ = writeln!(
            r,
            "- {name}: {} ({} of {total} points met){}",
            if missed.is_empty() {
                "**met**"
            } else {
                "**missed**"
            },
            met.len(),
            if missed.is_empty() {
                String::new()
            } else {
                format!(" (missed: {})", missed.join(", "))
            }
        );
    }
    unjudged.sort();
    unjudged.dedup();
    if !unjudged.is_empty() {
        let _ = writeln!(
            r,
            "- Not judged (a node was declared down during the cell, †): {}",
            unjudged.join(", ")
        );
    }
    let errs: Vec<String> = cells
        .iter()
        .filter(|c| c.errors > 0)
        .map(|c| {
            format!(
                "{} {} ms/{}/{} actors: {} ({})",
                c.config,
                c.rtt_ms,
                human(c.payload_bytes),
                c.actors,
                c.errors,
                c.first_error.as_deref().unwrap_or("?")
            )
        })
        .collect();
    if errs.is_empty() {
        let _ = writeln!(r, "- No request failed.\n");
    } else {
        let _ = writeln!(r, "- Cells with failed requests: {}\n", errs.join("; "));
    }
}

fn redis(r: &mut String, o: &Outcome) {
    let red = &o.redis;
    if !red.wanted {
        return;
    }
    let _ = writeln!(r, "## redis-benchmark against `ring serve --resp`\n");
    let _ = writeln!(
        r,
        "Three ring nodes with the Redis front, one per emulated host ({} partitions, storage delay {} ms: `ring serve`'s default), per RTT and configuration, after the ring converged; `redis-benchmark -h <host> -p <port> {}` ran on each host against its own node, the three at once (50 connections each, redis-benchmark's default). Without `-r`, redis-benchmark uses one key (`key:__rand_int__`), so every request goes to the same partition and its three vnodes, which serve requests one at a time: this measures quorum requests through one partition, not the parallelism across partitions.{}\n",
        o.plan.partitions,
        STORAGE_DELAY_MS,
        REDIS_ARGS.join(" "),
        red.version
            .as_deref()
            .map(|v| format!(" Version: `{v}`."))
            .unwrap_or_default()
    );
    if let Some(s) = &red.server {
        let _ = writeln!(r, "`single` here: {}.\n", single_meaning(s));
    }
    for n in &red.notes {
        let _ = writeln!(r, "- {n}");
    }
    if !red.notes.is_empty() {
        let _ = writeln!(r);
    }
    if red.rows.is_empty() {
        let _ = writeln!(r, "No results.\n");
        return;
    }
    let _ = writeln!(
        r,
        "| RTT | config | node | SET req/s | SET p50 ms | GET req/s | GET p50 ms | note |\n|---|---|---|---|---|---|---|---|"
    );
    let mut keys: Vec<(u64, String)> = Vec::new();
    for row in &red.rows {
        let _ = writeln!(
            r,
            "| {} ms | {} | {} | {} | {} | {} | {} | {} |",
            row.rtt_ms,
            row.config,
            row.node,
            fmt_opt(row.set_rps, 0),
            fmt_opt(row.set_p50_ms, 3),
            fmt_opt(row.get_rps, 0),
            fmt_opt(row.get_p50_ms, 3),
            row.error.as_deref().unwrap_or("")
        );
        if !keys.contains(&(row.rtt_ms, row.config.clone())) {
            keys.push((row.rtt_ms, row.config.clone()));
        }
    }
    for (rtt, config) in keys {
        let rows: Vec<_> = red
            .rows
            .iter()
            .filter(|x| x.rtt_ms == rtt && x.config == config)
            .collect();
        let set: f64 = rows.iter().filter_map(|x| x.set_rps).sum();
        let get: f64 = rows.iter().filter_map(|x| x.get_rps).sum();
        let _ = writeln!(
            r,
            "| {rtt} ms | {config} | **all three** | {set:.0} | | {get:.0} | | |"
        );
    }
    let _ = writeln!(r);
}

/// The plotting script, built into the binary.
const PLOT_PY: &str = include_str!("../../../bench/plot_ring.py");

/// Draws the PNG plots with Python's matplotlib (installed with pip when missing).
fn plot(out: &Path, workload: Workload) -> Result<Vec<String>, String> {
    crate::plot::run(out, "plot_ring.py", PLOT_PY, &[workload.name()])
}
