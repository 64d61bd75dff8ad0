//! report.md and plots for `maquis-bench micro`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use maquis_netem::NetemStats;

use crate::micro::{split_one_thread, split_tls, Cell, MicroArgs};

/// The commit this binary was built from (`git describe --always --dirty` at build time).
pub fn build_commit() -> &'static str {
    env!("MAQUIS_BENCH_COMMIT")
}

/// The machine, as every committed result must describe it.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cores} cores ({cpu}), {mem} memory, Linux {}",
        kernel.trim()
    )
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "–".into()
    }
}

fn human(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else if size >= 1024 {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

fn find<'a>(
    cells: &'a [Cell],
    rtt: u64,
    size: usize,
    actors: usize,
    config: &str,
) -> Option<&'a Cell> {
    find_in(cells, "grid", rtt, size, actors, config)
}

fn find_in<'a>(
    cells: &'a [Cell],
    series: &str,
    rtt: u64,
    size: usize,
    actors: usize,
    config: &str,
) -> Option<&'a Cell> {
    cells.iter().find(|c| {
        c.series == series
            && c.rtt_ms == rtt
            && c.payload_bytes == size
            && c.actors == actors
            && c.config == config
    })
}

/// Writes report.md (and the plots, when Python's matplotlib is available) into `out`.
pub fn write(
    out: &Path,
    cells: &[Cell],
    netem: &[(u64, NetemStats)],
    args: &MicroArgs,
    took: Duration,
) -> Result<(), String> {
    let mut r = String::new();
    let grid: Vec<&Cell> = cells.iter().filter(|c| c.series == "grid").collect();
    let mut rtts: Vec<u64> = grid.iter().map(|c| c.rtt_ms).collect();
    rtts.dedup();
    rtts.sort_unstable();
    rtts.dedup();
    let mut sizes: Vec<usize> = grid.iter().map(|c| c.payload_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut actors: Vec<usize> = grid.iter().map(|c| c.actors).collect();
    actors.sort_unstable();
    actors.dedup();
    let mut configs: Vec<String> = Vec::new();
    for c in cells {
        if !configs.contains(&c.config) {
            configs.push(c.config.clone());
        }
    }
    let cmdline: Vec<String> = std::env::args().collect();
    let _ = writeln!(r, "# Micro-benchmarks (PARTISAN Fig. 1–4)\n");
    let _ = writeln!(r, "Command: `{}`  ", cmdline.join(" "));
    let _ = writeln!(r, "Machine: {}  ", machine());
    let _ = writeln!(r, "Commit: {}  ", build_commit());
    let _ = writeln!(r, "Wall time: {:.0} s  ", took.as_secs_f64());
    let _ = writeln!(
        r,
        "Workload: N actors on host A each send a message of S bytes to a partner actor on host B and wait for {} before the next (closed loop); at most {} messages per actor and {} s per cell (a cell stops at whichever comes first; `messages` in results.json says how many were done). Two network namespaces joined by the userspace link emulator (`maquis netem`).\n",
        if args.echo { "the payload to come back (echo)" } else { "a small acknowledgement" },
        args.messages.map(|m| m.to_string()).unwrap_or_else(|| if args.quick { "2000".into() } else { "10000".into() }),
        args.cell_seconds.unwrap_or(if args.quick { 3.0 } else { 10.0 })
    );
    let _ = writeln!(
        r,
        "Besides this closed loop (`grid`), a `stream` cell sends one-way messages and counts what is delivered, and a `mixed` cell measures small calls alone and then beside bulk transfers; their sections below say how.\n"
    );
    let _ = writeln!(r, "Configurations: `erlang` Distributed Erlang (one connection); `single` Maquis, one connection per peer, no affinity; `parallel` 16 lanes, round robin; `affinity` 16 lanes, actor i sends with partition key i (lane i mod 16, replies on the same lane); `raw-tcp` plain TCP over 16 connections, no runtime, each message one vectored write of its head and payload{}.\n",
        if configs.iter().any(|c| split_tls(c).1) {
            "; `<configuration>-tls` the same Maquis configuration with TLS on every lane (`transport.tls`: TLS 1.3, rustls with ring and its default cipher suites, mutual authentication with certificates of one CA made for the run)"
        } else {
            ""
        });
    if configs.iter().any(|c| split_one_thread(c).1) {
        let _ = writeln!(r, "`<configuration>-1t`: the same configuration with each of its processes on one thread: a Maquis or raw-TCP agent's tokio runtime with one worker (`TOKIO_WORKER_THREADS=1`; two otherwise, one a core), an Erlang VM with one scheduler (`+S 1:1`; two otherwise).\n");
    }
    let _ = writeln!(r, "## Link emulator\n");
    let _ = writeln!(r, "| RTT | packets | Gbit/s (active) | lateness p50 | p99 | max | warnings |\n|---|---|---|---|---|---|---|");
    for (rtt, s) in netem {
        let _ = writeln!(
            r,
            "| {rtt} ms | {} | {:.2} | {:.0} µs | {:.0} µs | {:.0} µs | {} |",
            s.total.packets,
            s.total.gbit_per_s,
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
    if let Some((_, s)) = netem.first() {
        let _ = writeln!(
            r,
            "\nTCP settings in the hosts: {}\n",
            s.sysctls
                .iter()
                .map(|(k, v)| format!("`{k} = {v}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for &rtt in &rtts {
        for &size in &sizes {
            let _ = writeln!(r, "## RTT {rtt} ms, payload {}\n", human(size));
            let _ = write!(r, "| actors |");
            for c in &configs {
                let _ = write!(r, " {c} ops/s | p50 ms | p99 ms |");
            }
            let _ = write!(r, " affinity/erlang | affinity/raw-tcp |\n|---|");
            for _ in &configs {
                let _ = write!(r, "---|---|---|");
            }
            let _ = writeln!(r, "---|---|");
            for &n in &actors {
                let _ = write!(r, "| {n} |");
                for c in &configs {
                    match find(cells, rtt, size, n, c) {
                        Some(x) => {
                            let _ = write!(
                                r,
                                " {:.1} | {:.2} | {:.2} |",
                                x.ops_per_s,
                                x.p50_us as f64 / 1e3,
                                x.p99_us as f64 / 1e3
                            );
                        }
                        None => {
                            let _ = write!(r, " – | – | – |");
                        }
                    }
                }
                let aff = find(cells, rtt, size, n, "affinity")
                    .map(|c| c.ops_per_s)
                    .unwrap_or(0.0);
                let erl = find(cells, rtt, size, n, "erlang")
                    .map(|c| c.ops_per_s)
                    .unwrap_or(0.0);
                let raw = find(cells, rtt, size, n, "raw-tcp")
                    .map(|c| c.ops_per_s)
                    .unwrap_or(0.0);
                let _ = writeln!(r, " {} | {} |", ratio(aff, erl), ratio(aff, raw));
            }
            let _ = writeln!(r);
        }
    }
    if !grid.is_empty() {
        let _ = writeln!(r, "## CPU time per round trip (both processes, µs)\n");
        let _ = writeln!(
            r,
            "User and system time of the client's and the server's process, from /proc, for every configuration alike (the Erlang VMs without busy-waiting schedulers).\n"
        );
        let _ = write!(r, "| RTT | payload | actors |");
        for c in &configs {
            let _ = write!(r, " {c} |");
        }
        let _ = write!(r, "\n|---|---|---|");
        for _ in &configs {
            let _ = write!(r, "---|");
        }
        let _ = writeln!(r);
        for &rtt in &rtts {
            for &size in &sizes {
                for &n in &actors {
                    let _ = write!(r, "| {rtt} ms | {} | {n} |", human(size));
                    for c in &configs {
                        match find(cells, rtt, size, n, c) {
                            Some(x) => {
                                let _ = write!(r, " {:.0} |", x.cpu_us_per_msg);
                            }
                            None => {
                                let _ = write!(r, " – |");
                            }
                        }
                    }
                    let _ = writeln!(r);
                }
            }
        }
    }
    tls_section(&mut r, cells, &configs, &rtts, &sizes, &actors);
    stream_section(&mut r, cells, &configs);
    mixed_section(&mut r, cells, &configs);
    lanes_section(&mut r, cells);
    let sweep: Vec<&Cell> = cells.iter().filter(|c| c.series == "sweep").collect();
    if !sweep.is_empty() {
        let _ = writeln!(
            r,
            "\n## Connections per peer (Fig. 2): affinity, 128 actors, 512 KiB, 1 ms\n"
        );
        let _ = writeln!(
            r,
            "| connections | ops/s | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|"
        );
        for c in sweep {
            let _ = writeln!(
                r,
                "| {} | {:.1} | {:.2} | {:.2} | {:.2} |",
                c.parallelism,
                c.ops_per_s,
                c.p50_us as f64 / 1e3,
                c.p99_us as f64 / 1e3,
                c.max_us as f64 / 1e3
            );
        }
    }
    let _ = writeln!(r, "\n## Targets\n");
    let check = at_least;
    for size in [512 * 1024, 8 * 1024 * 1024] {
        if let (Some(a), Some(raw), Some(erl)) = (
            find(cells, 20, size, 128, "affinity"),
            find(cells, 20, size, 128, "raw-tcp"),
            find(cells, 20, size, 128, "erlang"),
        ) {
            let line = check(
                format!("20 ms, {}, 128 actors: affinity / raw-tcp", human(size)),
                a.ops_per_s / raw.ops_per_s,
                0.8,
            );
            let _ = writeln!(r, "{line}");
            let line = check(
                format!("20 ms, {}, 128 actors: affinity / erlang", human(size)),
                a.ops_per_s / erl.ops_per_s,
                5.0,
            );
            let _ = writeln!(r, "{line}");
        }
    }
    for &n in &actors {
        if let (Some(a), Some(erl)) = (
            find(cells, 1, 1024, n, "affinity"),
            find(cells, 1, 1024, n, "erlang"),
        ) {
            let want = if n == 16 { 2.0 } else { 1.0 };
            let line = check(
                format!("1 ms, 1 KiB, {n} actors: affinity / erlang"),
                a.ops_per_s / erl.ops_per_s,
                want,
            );
            let _ = writeln!(r, "{line}");
            // A closed loop of n actors over a 1 ms round trip completes at most n per ms.
            let ceiling = n as f64 * 1000.0;
            if want * erl.ops_per_s > ceiling {
                let _ = writeln!(
                    r,
                    "  - unreachable here: {want}× erlang is {:.0}/s, above the closed-loop \
                     ceiling of {n} actors / 1 ms = {ceiling:.0}/s",
                    want * erl.ops_per_s
                );
            }
        }
    }
    data_path_targets(&mut r, cells, &actors);
    for (rtt, size, n, bulk) in mixed_keys(cells) {
        for config in ["single", "affinity"] {
            if let Some(x) = find_mixed(cells, rtt, size, n, bulk, config) {
                if let Some(m) = &x.mixed {
                    let got = x.p99_us as f64 / m.alone_p99_us.max(1) as f64;
                    let verdict = if got <= 2.0 {
                        "met".to_string()
                    } else {
                        format!("missed: {:.1}× the bound", got / 2.0)
                    };
                    let _ = writeln!(
                        r,
                        "- mixed, {rtt} ms, {n} × {} calls beside {} × {}, {config}: calls' p99 with / without the transfers {got:.2} (target ≤ 2) — {verdict}",
                        human(size),
                        m.bulk_actors,
                        human(m.bulk_payload_bytes)
                    );
                }
            }
        }
    }
    match plot(out) {
        Ok(files) => {
            let _ = writeln!(r, "\n## Plots\n");
            for f in files {
                let _ = writeln!(r, "![{f}]({f})");
            }
        }
        Err(e) => {
            let _ = writeln!(r, "\n(Plots not drawn: {e})");
            eprintln!("plots not drawn: {e}");
        }
    }
    std::fs::write(out.join("report.md"), r).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out.join("report.md").display());
    Ok(())
}

/// A target's line for a ratio that must be at least `want`.
fn at_least(what: String, got: f64, want: f64) -> String {
    let verdict = if got >= want {
        "met".to_string()
    } else {
        format!("missed by {:.0}%", (1.0 - got / want) * 100.0)
    };
    format!("- {what}: {got:.2} (target ≥ {want}) — {verdict}")
}

/// A target's line for a ratio that must be at most `want`.
fn at_most(what: String, got: f64, want: f64) -> String {
    let verdict = if got <= want {
        "met".to_string()
    } else {
        format!("missed: {:.2}× the bound", got / want)
    };
    format!("- {what}: {got:.2} (target ≤ {want}) — {verdict}")
}

/// The Maquis configurations with affinity and the Distributed Erlang ones a target compares.
const AFFINITY: [&str; 2] = ["affinity", "affinity-1t"];
const ERLANG: [&str; 2] = ["erlang", "erlang-1t"];

/// The data path's targets, for each variant of `affinity` that ran (on its usual runtime and
/// on one thread) against each variant of Distributed Erlang and raw TCP that ran.
fn data_path_targets(r: &mut String, cells: &[Cell], actors: &[usize]) {
    let pairs = |others: &'static [&'static str]| {
        AFFINITY
            .iter()
            .flat_map(move |a| others.iter().map(move |o| (*a, *o)))
    };
    for (aff, erl) in pairs(&ERLANG) {
        for &n in actors.iter().filter(|&&n| [1, 16, 128].contains(&n)) {
            if let (Some(a), Some(e)) = (find(cells, 1, 1024, n, aff), find(cells, 1, 1024, n, erl))
            {
                let line = at_most(
                    format!("1 ms, 1 KiB, {n} actors: CPU per round trip, {aff} / {erl}"),
                    a.cpu_us_per_msg / e.cpu_us_per_msg.max(f64::MIN_POSITIVE),
                    1.0,
                );
                let _ = writeln!(r, "{line}");
                if n == 128 {
                    let line = at_least(
                        format!("1 ms, 1 KiB, 128 actors: ops/s, {aff} / {erl}"),
                        a.ops_per_s / e.ops_per_s,
                        2.0,
                    );
                    let _ = writeln!(r, "{line}");
                }
            }
        }
        for (rtt, size, n) in keys(cells, "stream") {
            let get = |c: &str| find_in(cells, "stream", rtt, size, n, c).map(|x| x.ops_per_s);
            if let (Some(a), Some(e)) = (get(aff), get(erl)) {
                let line = at_least(
                    format!(
                        "stream, {rtt} ms, {}, {n} actors: messages/s, {aff} / {erl}",
                        human(size)
                    ),
                    a / e,
                    3.0,
                );
                let _ = writeln!(r, "{line}");
            }
        }
    }
    for (aff, raw) in pairs(&["raw-tcp", "raw-tcp-1t"]) {
        for rtt in [20, 100] {
            for size in [512 * 1024, 8 * 1024 * 1024] {
                for &n in actors.iter().filter(|&&n| (16..=128).contains(&n)) {
                    let (Some(a), Some(t)) = (
                        find(cells, rtt, size, n, aff),
                        find(cells, rtt, size, n, raw),
                    ) else {
                        continue;
                    };
                    let cell = format!("{rtt} ms, {}, {n} actors", human(size));
                    let line = at_least(
                        format!("{cell}: ops/s, {aff} / {raw}"),
                        a.ops_per_s / t.ops_per_s,
                        0.9,
                    );
                    let _ = writeln!(r, "{line}");
                    let line = at_most(
                        format!("{cell}: CPU per round trip, {aff} / {raw}"),
                        a.cpu_us_per_msg / t.cpu_us_per_msg.max(f64::MIN_POSITIVE),
                        1.3,
                    );
                    let _ = writeln!(r, "{line}");
                }
            }
        }
    }
    for aff in AFFINITY {
        for size in [512 * 1024, 8 * 1024 * 1024] {
            for &n in actors.iter().filter(|&&n| (16..=128).contains(&n)) {
                let single = aff.replace("affinity", "single");
                if let (Some(a), Some(s)) = (
                    find(cells, 100, size, n, aff),
                    find(cells, 100, size, n, &single),
                ) {
                    let line = at_least(
                        format!(
                            "100 ms, {}, {n} actors: ops/s, {aff} / {single}",
                            human(size)
                        ),
                        a.ops_per_s / s.ops_per_s,
                        15.0,
                    );
                    let _ = writeln!(r, "{line}");
                }
            }
        }
    }
}

/// The cost of TLS: for each Maquis configuration that ran with and without it, the CPU per
/// message of both, summed up per payload size (mean over the RTTs and actor counts where both
/// ran), then cell by cell.
fn tls_section(
    r: &mut String,
    cells: &[Cell],
    configs: &[String],
    rtts: &[u64],
    sizes: &[usize],
    actors: &[usize],
) {
    let pairs: Vec<(&str, &str)> = configs
        .iter()
        .filter_map(|c| {
            let (base, tls) = split_tls(c);
            (tls && configs.iter().any(|p| p == base)).then_some((base, c.as_str()))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(r, "\n## TLS: CPU per message\n");
    let _ = writeln!(
        r,
        "CPU time of both processes per message (one round trip: the message and its reply), in µs, with plain TCP lanes and with TLS on every lane. Per payload size, the mean over the cells (RTT × actors) where both ran:\n"
    );
    for &size in sizes {
        for &(plain, tls) in &pairs {
            let both: Vec<(f64, f64)> = rtts
                .iter()
                .flat_map(|&rtt| actors.iter().map(move |&n| (rtt, n)))
                .filter_map(|(rtt, n)| {
                    let p = find(cells, rtt, size, n, plain)?;
                    let t = find(cells, rtt, size, n, tls)?;
                    (p.messages > 0 && t.messages > 0)
                        .then_some((p.cpu_us_per_msg, t.cpu_us_per_msg))
                })
                .collect();
            if both.is_empty() {
                continue;
            }
            let n = both.len() as f64;
            let p = both.iter().map(|b| b.0).sum::<f64>() / n;
            let t = both.iter().map(|b| b.1).sum::<f64>() / n;
            let _ = writeln!(
                r,
                "- CPU per message, {}, {plain}: plaintext {p:.1} µs, TLS {t:.1} µs ({:+.1} µs, {} of plaintext; {} cells)",
                human(size),
                t - p,
                ratio(t, p),
                both.len()
            );
        }
    }
    let _ = writeln!(
        r,
        "\n| RTT | payload | actors | configuration | plaintext µs | TLS µs | TLS − plaintext | plaintext ops/s | TLS ops/s |\n|---|---|---|---|---|---|---|---|---|"
    );
    for &rtt in rtts {
        for &size in sizes {
            for &n in actors {
                for &(plain, tls) in &pairs {
                    if let (Some(p), Some(t)) = (
                        find(cells, rtt, size, n, plain),
                        find(cells, rtt, size, n, tls),
                    ) {
                        let _ = writeln!(
                            r,
                            "| {rtt} ms | {} | {n} | {plain} | {:.1} | {:.1} | {:+.1} | {:.1} | {:.1} |",
                            human(size),
                            p.cpu_us_per_msg,
                            t.cpu_us_per_msg,
                            t.cpu_us_per_msg - p.cpu_us_per_msg,
                            p.ops_per_s,
                            t.ops_per_s
                        );
                    }
                }
            }
        }
    }
}

/// The (RTT, payload, actors) of a series' cells, in the order they ran.
fn keys(cells: &[Cell], series: &str) -> Vec<(u64, usize, usize)> {
    let mut keys = Vec::new();
    for c in cells.iter().filter(|c| c.series == series) {
        let k = (c.rtt_ms, c.payload_bytes, c.actors);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

/// One-way streams: messages delivered per second and CPU per message, per configuration.
fn stream_section(r: &mut String, cells: &[Cell], configs: &[String]) {
    let keys = keys(cells, "stream");
    if keys.is_empty() {
        return;
    }
    let _ = writeln!(r, "\n## One-way stream: messages delivered per second\n");
    let _ = writeln!(
        r,
        "Each actor sends to its partner as fast as the sender is let (Maquis: `send` waits while the lane's queue is full; Erlang: `!` suspends the sender while the connection's buffer is busy; raw TCP: one write per message); the partners' counts, asked when the measured window starts and again once everything sent has arrived, give what was delivered. CPU µs per message delivered, both processes.\n"
    );
    let _ = write!(r, "| RTT | payload | actors |");
    for c in configs {
        let _ = write!(r, " {c} msgs/s | CPU µs |");
    }
    let _ = write!(r, " affinity/erlang |\n|---|---|---|");
    for _ in configs {
        let _ = write!(r, "---|---|");
    }
    let _ = writeln!(r, "---|");
    for (rtt, size, n) in keys {
        let _ = write!(r, "| {rtt} ms | {} | {n} |", human(size));
        for c in configs {
            match find_in(cells, "stream", rtt, size, n, c) {
                Some(x) => {
                    let lost = if x.errors > 0 {
                        format!(" ({} not delivered)", x.errors)
                    } else {
                        String::new()
                    };
                    let _ = write!(r, " {:.0}{lost} | {:.1} |", x.ops_per_s, x.cpu_us_per_msg);
                }
                None => {
                    let _ = write!(r, " – | – |");
                }
            }
        }
        let get = |c: &str| {
            find_in(cells, "stream", rtt, size, n, c)
                .map(|x| x.ops_per_s)
                .unwrap_or(0.0)
        };
        let _ = writeln!(r, " {} |", ratio(get("affinity"), get("erlang")));
    }
}

/// The (RTT, payload, callers, bulk actors) of the mixed cells, in the order they ran.
fn mixed_keys(cells: &[Cell]) -> Vec<(u64, usize, usize, usize)> {
    let mut keys = Vec::new();
    for c in cells.iter().filter(|c| c.series == "mixed") {
        let bulk = c.mixed.as_ref().map_or(0, |m| m.bulk_actors);
        let k = (c.rtt_ms, c.payload_bytes, c.actors, bulk);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys
}

fn find_mixed<'a>(
    cells: &'a [Cell],
    rtt: u64,
    size: usize,
    actors: usize,
    bulk: usize,
    config: &str,
) -> Option<&'a Cell> {
    cells.iter().find(|c| {
        c.series == "mixed"
            && c.rtt_ms == rtt
            && c.payload_bytes == size
            && c.actors == actors
            && c.config == config
            && c.mixed.as_ref().is_some_and(|m| m.bulk_actors == bulk)
    })
}

/// Small calls beside bulk transfers: the calls' latency alone and with the transfers.
fn mixed_section(r: &mut String, cells: &[Cell], configs: &[String]) {
    let keys = mixed_keys(cells);
    let Some(m) = cells.iter().find_map(|c| c.mixed.as_ref()) else {
        return;
    };
    let _ = writeln!(
        r,
        "\n## Mixed: small calls beside bulk transfers of {}\n",
        human(m.bulk_payload_bytes)
    );
    let _ = writeln!(
        r,
        "The callers' closed loop measured alone, then again while B more actors run closed-loop transfers of {} between the same two nodes (their own partners; with affinity their own partition keys). The last columns are the transfers' while the calls were measured.\n",
        human(m.bulk_payload_bytes)
    );
    let _ = writeln!(
        r,
        "| RTT | calls | B | configuration | alone ops/s | alone p50 ms | alone p99 ms | with transfers ops/s | p50 ms | p99 ms | p99 with / alone | transfers ops/s | transfers p99 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (rtt, size, n, bulk) in keys {
        for c in configs {
            let Some(x) = find_mixed(cells, rtt, size, n, bulk, c) else {
                continue;
            };
            let Some(m) = &x.mixed else { continue };
            let _ = writeln!(
                r,
                "| {rtt} ms | {n} × {} | {bulk} | {c} | {:.0} | {:.2} | {:.2} | {:.0} | {:.2} | {:.2} | {} | {:.1} | {:.1} |",
                human(size),
                m.alone_ops_per_s,
                m.alone_p50_us as f64 / 1e3,
                m.alone_p99_us as f64 / 1e3,
                x.ops_per_s,
                x.p50_us as f64 / 1e3,
                x.p99_us as f64 / 1e3,
                ratio(x.p99_us as f64, m.alone_p99_us as f64),
                m.bulk_ops_per_s,
                m.bulk_p99_us as f64 / 1e3
            );
        }
    }
}

/// What the Maquis clients' lanes carried, cell by cell, in the order the cells ran.
fn lanes_section(r: &mut String, cells: &[Cell]) {
    let with: Vec<&Cell> = cells.iter().filter(|c| c.lanes.is_some()).collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(r, "\n## Lanes the Maquis clients used\n");
    let _ = writeln!(
        r,
        "Of the client's `default` channel to the server, sampled every {} ms while the cell measured: how many lanes took small messages (the channel's width) and how many took striped messages' parts (its spread), mean and most at once. A channel that does not stripe (`single`, `parallel`, `keyed`) has every lane take small messages and none parts.\n",
        crate::stats::LANE_SAMPLE.as_millis()
    );
    let _ = writeln!(
        r,
        "| series | RTT | payload | actors | configuration | small lanes, mean (most) | striped lanes, mean (most) | samples |\n|---|---|---|---|---|---|---|---|"
    );
    for c in with {
        let Some(l) = &c.lanes else { continue };
        let _ = writeln!(
            r,
            "| {} | {} ms | {} | {} | {} | {:.1} ({}) | {:.1} ({}) | {} |",
            c.series,
            c.rtt_ms,
            human(c.payload_bytes),
            c.actors,
            c.config,
            l.small_mean,
            l.small_max,
            l.striped_mean,
            l.striped_max,
            l.samples
        );
    }
}

/// The plotting script, built into the binary.
const PLOT_PY: &str = include_str!("../../../bench/plot_micro.py");

/// Draws the PNG plots with Python's matplotlib (installed with pip when missing).
fn plot(out: &Path) -> Result<Vec<String>, String> {
    crate::plot::run(out, "plot_micro.py", PLOT_PY, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(config: &str, size: usize, actors: usize, cpu: f64) -> Cell {
        Cell {
            rtt_ms: 1,
            payload_bytes: size,
            actors,
            config: config.into(),
            parallelism: 16,
            echo: false,
            ops_per_s: 1000.0,
            p50_us: 1000,
            p99_us: 2000,
            max_us: 3000,
            messages: 100,
            errors: 0,
            seconds: 3.0,
            cpu_us_per_msg: cpu,
            series: "grid".into(),
            mixed: None,
            lanes: None,
        }
    }

    #[test]
    fn stream_and_mixed_cells_get_their_sections() {
        let mut stream = cell("affinity", 1024, 16, 2.5);
        stream.series = "stream".into();
        stream.ops_per_s = 600_000.0;
        let mut erl = cell("erlang", 1024, 16, 7.5);
        erl.series = "stream".into();
        erl.ops_per_s = 200_000.0;
        let mut mixed = cell("affinity", 1024, 16, 20.0);
        mixed.series = "mixed".into();
        mixed.p99_us = 3_000;
        mixed.mixed = Some(crate::micro::Mixed {
            alone_ops_per_s: 14_000.0,
            alone_p50_us: 1_100,
            alone_p99_us: 1_200,
            bulk_actors: 1,
            bulk_payload_bytes: 8 << 20,
            bulk_ops_per_s: 190.0,
            bulk_p99_us: 9_000,
        });
        let cells = vec![stream, erl, mixed];
        let configs: Vec<String> = ["erlang", "affinity"].map(String::from).to_vec();
        let mut r = String::new();
        stream_section(&mut r, &cells, &configs);
        assert!(
            r.contains("| 1 ms | 1 KiB | 16 | 200000 | 7.5 | 600000 | 2.5 | 3.00× |"),
            "{r}"
        );
        let mut r = String::new();
        mixed_section(&mut r, &cells, &configs);
        assert!(r.contains("bulk transfers of 8 MiB"), "{r}");
        assert!(
            r.contains("| 1 ms | 16 × 1 KiB | 1 | affinity | 14000 | 1.10 | 1.20 | 1000 | 1.00 | 3.00 | 2.50× | 190.0 | 9.0 |"),
            "{r}"
        );
        assert!(!r.contains("| erlang |"), "no erlang mixed cell ran: {r}");
        let mut none = String::new();
        stream_section(&mut none, &cells[2..], &configs);
        mixed_section(&mut none, &cells[..2], &configs);
        assert!(none.is_empty(), "{none}");
    }

    #[test]
    fn the_lanes_section_lists_the_cells_that_sampled_their_lanes() {
        let mut striped = cell("affinity", 524_288, 16, 300.0);
        striped.rtt_ms = 20;
        striped.lanes = Some(crate::stats::LaneUse {
            samples: 200,
            small_mean: 2.5,
            small_max: 4,
            striped_mean: 9.75,
            striped_max: 15,
        });
        let cells = vec![cell("raw-tcp", 524_288, 16, 200.0), striped];
        let mut r = String::new();
        lanes_section(&mut r, &cells);
        assert!(
            r.contains("| grid | 20 ms | 512 KiB | 16 | affinity | 2.5 (4) | 9.8 (15) | 200 |"),
            "{r}"
        );
        assert!(!r.contains("raw-tcp"), "a baseline has no lanes: {r}");
        let mut none = String::new();
        lanes_section(&mut none, &cells[..1]);
        assert!(none.is_empty(), "{none}");
    }

    #[test]
    fn the_tls_section_sets_tls_beside_plaintext() {
        let cells = vec![
            cell("affinity", 1024, 16, 10.0),
            cell("affinity-tls", 1024, 16, 14.0),
            cell("affinity", 1024, 128, 12.0),
            cell("affinity-tls", 1024, 128, 16.0),
            cell("single", 1024, 16, 9.0),
        ];
        let configs: Vec<String> = ["single", "affinity", "affinity-tls"]
            .map(String::from)
            .to_vec();
        let mut r = String::new();
        tls_section(&mut r, &cells, &configs, &[1], &[1024], &[16, 128]);
        assert!(
            r.contains(
                "- CPU per message, 1 KiB, affinity: plaintext 11.0 µs, TLS 15.0 µs (+4.0 µs, \
                 1.36× of plaintext; 2 cells)"
            ),
            "{r}"
        );
        assert!(
            r.contains("| 1 ms | 1 KiB | 128 | affinity | 12.0 | 16.0 | +4.0 |"),
            "{r}"
        );
        assert!(!r.contains("single"), "no TLS twin ran: {r}");
        let mut none = String::new();
        tls_section(
            &mut none,
            &cells,
            &["affinity".to_string()],
            &[1],
            &[1024],
            &[16],
        );
        assert!(none.is_empty());
    }
}
