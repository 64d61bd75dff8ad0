//! `maquis-bench adcounter`: PARTISAN's advertisement counter (§6.3, Fig. 9) at 32 to 1,024
//! nodes, client-server and peer-to-peer.
//!
//! The nodes run in host processes (`agent adcounter-host`), each a runtime of one worker
//! thread: node 0 — the client-server overlay's server, the peer-to-peer overlay's contact —
//! alone in the first (its memory is measured there), the others `--nodes-per-proc` to a
//! process (a process may hold only so many sockets, and one runtime so many nodes before
//! their timers starve). Every node but node 0 runs a replica of `maquis-adcounter` and counts
//! `--increments` impressions, spread over `--ads` ads. The cell ends when every replica, node
//! 0's included, holds the exact total; each host reports the wall-clock instant its replicas
//! got there, so the time to convergence is measured where it happens, not by polling from
//! here. Bytes are the nodes' `bytes_sent` counters (all of a node's traffic: membership,
//! heartbeats and the replicas' states), from just before the first increment to
//! convergence. Writes `results.json`, `report.md` and a plot into `--out`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::adcounter_host::{node_config, HostAnswer, HostCmd};
use crate::ring_proc::Proc;

/// `maquis-bench adcounter`.
#[derive(clap::Args, Debug, Clone)]
pub struct AdcounterArgs {
    /// A short run: 32 and 128 nodes.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json and report.md go (with --quick and no --out:
    /// target/bench-quick/adcounter).
    #[arg(long, default_value = "bench/results/adcounter")]
    pub out: PathBuf,
    /// Cluster sizes (default 32,64,128,256,512,1024; 32,128 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<usize>,
    /// Overlays: client-server, peer-to-peer.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "client-server,peer-to-peer"
    )]
    pub overlays: Vec<String>,
    /// Impressions each node but node 0 counts.
    #[arg(long, default_value_t = 10)]
    pub increments: u64,
    /// Ads the impressions are spread over.
    #[arg(long, default_value_t = 4)]
    pub ads: usize,
    /// How often a replica sends a changed state to its neighbours, milliseconds (PARTISAN's
    /// run: 5,000). Default: 5 ms per node, at least 1,000 (a state holds a count per node
    /// and the host processes hold a fixed number of nodes, so a host's work in merges grows
    /// with the cluster unless the interval does; at 1,024 nodes and 1,000 ms the replicas
    /// fell behind the states and an impression waited minutes for its turn).
    #[arg(long)]
    pub sync_ms: Option<u64>,
    /// Every this many sync intervals a replica sends its state again to a neighbour it sent
    /// nothing meanwhile, changed or not (repairs a state lost on the way, with a connection
    /// that closed under it); 0: never.
    #[arg(long, default_value_t = 4)]
    pub resend_every: u32,
    /// Replicas send a neighbour their whole state every time (Lasp's state synchronisation,
    /// as PARTISAN measured it), not only what changed since the state it last had.
    #[arg(long)]
    pub whole_states: bool,
    /// Seconds a cell may take to form its cluster, and again to converge.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
    /// Peer-to-peer: member heartbeats the whole cluster sends a second (each node's period
    /// is the cluster size over this, at least 5 s).
    #[arg(long, default_value_t = 25)]
    pub heartbeats_per_s: u64,
    /// Nodes a host process holds (node 0 has one of its own).
    #[arg(long, default_value_t = 128)]
    pub nodes_per_proc: usize,
    /// First port (node i listens on 127.0.0.1:port+i).
    #[arg(long, default_value_t = 21_000)]
    pub base_port: u16,
}

/// One cell, as results.json holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    /// `client-server` or `peer-to-peer`.
    pub overlay: String,
    /// Nodes, node 0 included.
    pub nodes: usize,
    /// Bytes all nodes sent from the first increment to convergence.
    pub bytes_total: u64,
    /// `bytes_total` over the nodes.
    pub bytes_per_node: u64,
    /// Bytes of the node that sent the most.
    pub bytes_busiest: u64,
    /// The replicas' states alone (their encoded size, summed over every send), over the
    /// nodes: the part of `bytes_per_node` that is the application's synchronisation.
    #[serde(default)]
    pub state_bytes_per_node: u64,
    /// Milliseconds from the last increment to every replica holding the total.
    pub converge_ms: u64,
    /// Peak resident memory of node 0's process (the server; the peer-to-peer contact), KiB.
    pub peak_rss_kib: u64,
    /// Impressions counted.
    pub increments: u64,
    /// The total every replica held at the end (equal on all of them).
    pub final_count: u64,
    /// Seconds the cluster took to form.
    pub form_s: f64,
    /// How often a replica sent a changed state, milliseconds.
    #[serde(default)]
    pub sync_ms: u64,
    /// Whether replicas sent their neighbours what changed (`true`) or their whole state.
    #[serde(default)]
    pub deltas: bool,
    /// Why the cell failed (its numbers are then zero), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Runs the benchmark; the cells measured.
pub fn run(a: &AdcounterArgs) -> Result<Vec<Cell>, String> {
    let mut a = a.clone();
    if a.sizes.is_empty() {
        a.sizes = if a.quick {
            vec![32, 128]
        } else {
            vec![32, 64, 128, 256, 512, 1024]
        };
    }
    let a = &a;
    if a.sizes.iter().any(|&n| n < 2)
        || a.increments == 0
        || a.ads == 0
        || a.sync_ms == Some(0)
        || a.nodes_per_proc == 0
        || a.heartbeats_per_s == 0
    {
        return Err(
            "--sizes at least 2; --increments, --ads, --sync-ms, --nodes-per-proc, --heartbeats-per-s at least 1"
                .into(),
        );
    }
    if a.sizes
        .iter()
        .any(|&n| a.base_port as usize + n > u16::MAX as usize)
    {
        return Err("--base-port plus the largest size passes the last port".into());
    }
    for o in &a.overlays {
        node_config(0, 2, a.base_port, o, a.heartbeats_per_s)?;
    }
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let t0 = Instant::now();
    let mut cells = Vec::new();
    // results.json and report.md are written again after every cell, so a run stopped in a
    // long cell keeps the cells before it; a failed cell is recorded and the overlay's larger
    // sizes are skipped (they would fail the same way, slower).
    let write = |cells: &[Cell]| -> Result<(), String> {
        crate::stats::write_results(&a.out, &cells)?;
        let md = report(a, cells, t0.elapsed(), &load_before);
        std::fs::write(a.out.join("report.md"), md).map_err(|e| e.to_string())
    };
    for overlay in &a.overlays {
        for &n in &a.sizes {
            eprintln!("adcounter: {overlay}, {n} nodes");
            let c = match cell(a, overlay, n) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("  failed: {e}");
                    cells.push(failed(a, overlay, n, e));
                    write(&cells)?;
                    break;
                }
            };
            eprintln!(
                "  formed in {:.1} s; converged {} ms after the last increment; {} bytes a node ({} of them states; {} the busiest); node 0 peak {} KiB; {} of {} counted",
                c.form_s, c.converge_ms, c.bytes_per_node, c.state_bytes_per_node, c.bytes_busiest, c.peak_rss_kib, c.final_count, c.increments
            );
            cells.push(c);
            write(&cells)?;
        }
    }
    write(&cells)?;
    eprintln!("adcounter: wrote {}", a.out.display());
    Ok(cells)
}

/// The sync interval of a cell of `n` nodes: `--sync-ms`, or 5 ms a node and at least 1 s.
fn sync_ms(a: &AdcounterArgs, n: usize) -> u64 {
    a.sync_ms.unwrap_or((5 * n as u64).max(1_000))
}

/// The record of a cell that failed with `error`.
fn failed(a: &AdcounterArgs, overlay: &str, n: usize, error: String) -> Cell {
    Cell {
        overlay: overlay.to_string(),
        nodes: n,
        bytes_total: 0,
        bytes_per_node: 0,
        bytes_busiest: 0,
        state_bytes_per_node: 0,
        converge_ms: 0,
        peak_rss_kib: 0,
        increments: (n as u64).saturating_sub(1) * a.increments,
        final_count: 0,
        form_s: 0.0,
        sync_ms: sync_ms(a, n),
        deltas: !a.whole_states,
        error: Some(error),
    }
}

/// How often the driver asks whether the cluster formed.
const FORM_POLL: Duration = Duration::from_millis(500);
/// How often a cluster that is still forming reports its progress.
const FORM_REPORT: Duration = Duration::from_secs(30);

/// The counters that tell why a cluster is slow to form (lost protocol frames, peers
/// declared down and why, refused handshakes, heartbeats ignored or announcements dropped), summed
/// over every node: those above zero.
const FORMING_COUNTERS: [&str; 16] = [
    "peers_down",
    "members_accused",
    "members_declared_down",
    "accusations_refuted",
    "links_silent",
    "dials_refused",
    "dials_inconclusive",
    "control_drops",
    "control_no_peer",
    "handshakes_refused",
    "unsent_dropped",
    "routed_no_route",
    "broadcast_route_moves",
    "broadcast_strangers_ignored",
    "broadcast_lazy_dropped",
    "broadcast_missing_dropped",
];

fn forming_counters(hosts: &mut [Host], limit: Duration) -> Result<String, String> {
    let mut sum: BTreeMap<String, u64> = BTreeMap::new();
    for x in ask_all(hosts, &HostCmd::Counters, limit)? {
        for (k, v) in x.counters {
            *sum.entry(k).or_default() += v;
        }
    }
    let shown: Vec<String> = FORMING_COUNTERS
        .iter()
        .filter_map(|k| sum.get(*k).filter(|v| **v > 0).map(|v| format!("{k} {v}")))
        .collect();
    Ok(if shown.is_empty() {
        "no frame lost, no peer down".to_string()
    } else {
        shown.join(", ")
    })
}

/// One host process and its nodes' indices.
struct Host {
    proc: Proc,
    first: usize,
}

impl Host {
    fn ask(&mut self, cmd: &HostCmd, limit: Duration) -> Result<HostAnswer, String> {
        self.proc.command(cmd)?;
        self.proc.answer(limit)
    }
}

/// Sends `cmd` to every host, then collects their answers (the hosts work at once).
fn ask_all(hosts: &mut [Host], cmd: &HostCmd, limit: Duration) -> Result<Vec<HostAnswer>, String> {
    for h in hosts.iter_mut() {
        h.proc.command(cmd)?;
    }
    hosts.iter_mut().map(|h| h.proc.answer(limit)).collect()
}

/// The hosts of a cell of `n` nodes: node 0 alone, then `per_proc` nodes a process.
fn hosts(a: &AdcounterArgs, overlay: &str, n: usize) -> Result<Vec<Host>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut ranges = vec![(0, 1)];
    let mut first = 1;
    while first < n {
        let count = a.nodes_per_proc.min(n - first);
        ranges.push((first, count));
        first += count;
    }
    let mut hosts = Vec::with_capacity(ranges.len());
    for (first, count) in ranges {
        let mut cmd = std::process::Command::new(&exe);
        cmd.env("RUST_LOG", crate::stats::agent_log_filter())
            .env("TOKIO_WORKER_THREADS", "1")
            .args(["agent", "adcounter-host", "--first", &first.to_string()])
            .args(["--count", &count.to_string()])
            .args([
                "--base-port",
                &a.base_port.to_string(),
                "--overlay",
                overlay,
            ])
            .args([
                "--sync-ms",
                &sync_ms(a, n).to_string(),
                "--nodes",
                &n.to_string(),
            ])
            .args(["--heartbeats-per-s", &a.heartbeats_per_s.to_string()])
            .args(["--resend-every", &a.resend_every.to_string()]);
        if a.whole_states {
            cmd.arg("--whole-states");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(a.out.join("hosts.log"))
            .map_err(|e| e.to_string())?;
        let what = format!("host of nodes {first}..{}", first + count);
        let mut proc = Proc::start(&what, cmd, log.into())?;
        proc.expect(&["ready"], Duration::from_secs(60))?;
        hosts.push(Host { proc, first });
    }
    Ok(hosts)
}

fn cell(a: &AdcounterArgs, overlay: &str, n: usize) -> Result<Cell, String> {
    let mut hosts = hosts(a, overlay, n)?;
    let result = measure(a, overlay, n, &mut hosts);
    for h in hosts {
        h.proc.stop(Duration::from_secs(10));
    }
    result
}

fn measure(a: &AdcounterArgs, overlay: &str, n: usize, hosts: &mut [Host]) -> Result<Cell, String> {
    let limit = Duration::from_secs(a.timeout_s + 30);
    let started = Instant::now();
    // One node after another, as a cluster grows: node 0 first, then each host's nodes.
    for h in hosts.iter_mut() {
        h.ask(
            &HostCmd::Join {
                timeout_s: a.timeout_s,
            },
            limit * 4,
        )
        .map_err(|e| format!("host of node {}: {e}", h.first))?;
    }
    eprintln!(
        "  {n} nodes joined in {:.1} s; waiting for every node to see them all",
        started.elapsed().as_secs_f64()
    );
    let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
    let mut next_report = Instant::now() + FORM_REPORT;
    loop {
        let mut seen: Vec<usize> = ask_all(hosts, &HostCmd::Members, limit)?
            .into_iter()
            .flat_map(|x| x.members)
            .collect();
        seen.sort_unstable();
        if seen.first().is_some_and(|&fewest| fewest >= n) {
            break;
        }
        let at = |q: usize| {
            let i = (seen.len() * q / 100).min(seen.len().saturating_sub(1));
            seen.get(i).copied().unwrap_or(0)
        };
        let spread = format!("fewest {}, median {}, most {}", at(0), at(50), at(100));
        if Instant::now() > deadline {
            let short = seen.iter().filter(|&&m| m < n).count();
            return Err(format!(
                "the cluster of {n} did not form within {} s: {short} nodes see fewer than {n} members ({spread}; {})",
                a.timeout_s,
                forming_counters(hosts, limit)?
            ));
        }
        if Instant::now() > next_report {
            next_report += FORM_REPORT;
            eprintln!(
                "  {:.0} s: members seen: {spread}; {}",
                started.elapsed().as_secs_f64(),
                forming_counters(hosts, limit)?
            );
        }
        std::thread::sleep(FORM_POLL);
    }
    let form_s = started.elapsed().as_secs_f64();
    eprintln!("  formed in {form_s:.1} s; counting");
    ask_all(hosts, &HostCmd::Start, limit)?;
    let sent = |hosts: &mut [Host]| -> Result<Vec<u64>, String> {
        Ok(ask_all(hosts, &HostCmd::Sent, limit)?
            .into_iter()
            .flat_map(|x| x.bytes)
            .collect())
    };
    let before = sent(hosts)?;
    let count = HostCmd::Count {
        increments: a.increments,
        ads: a.ads,
    };
    let last = ask_all(hosts, &count, limit)?
        .iter()
        .map(|x| x.at_ms)
        .max()
        .unwrap_or(0);
    let want = (n as u64 - 1) * a.increments;
    eprintln!("  counted {want}; waiting for every replica to hold it");
    let wait = HostCmd::Await {
        want,
        timeout_s: a.timeout_s,
    };
    let converged = ask_all(hosts, &wait, limit)
        .map_err(|e| format!("{overlay}, {n} nodes: no convergence: {e}"))?
        .iter()
        .map(|x| x.at_ms)
        .max()
        .unwrap_or(0);
    let after = sent(hosts)?;
    if before.len() != n || after.len() != n {
        return Err(format!(
            "the hosts reported {} and {} nodes' bytes, not {n}",
            before.len(),
            after.len()
        ));
    }
    let per: Vec<u64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.saturating_sub(*b))
        .collect();
    let bytes_total: u64 = per.iter().sum();
    let totals = ask_all(hosts, &HostCmd::Totals, limit)?;
    let state_bytes: u64 = totals.iter().flat_map(|x| &x.state_bytes).sum();
    let finals: Vec<u64> = totals.into_iter().flat_map(|x| x.totals).collect();
    let final_count = finals.iter().copied().min().unwrap_or(0);
    if finals.len() != n || finals.iter().any(|f| *f != final_count) {
        return Err(format!("replicas disagree at the end: {finals:?}"));
    }
    let peak_rss_kib = hosts[0].ask(&HostCmd::Memory, limit)?.hwm_kib;
    Ok(Cell {
        overlay: overlay.to_string(),
        nodes: n,
        bytes_total,
        bytes_per_node: bytes_total / n as u64,
        bytes_busiest: per.iter().copied().max().unwrap_or(0),
        state_bytes_per_node: state_bytes / n as u64,
        converge_ms: converged.saturating_sub(last),
        peak_rss_kib,
        increments: want,
        final_count,
        form_s,
        sync_ms: sync_ms(a, n),
        deltas: !a.whole_states,
        error: None,
    })
}

fn report(a: &AdcounterArgs, cells: &[Cell], wall: Duration, load_before: &str) -> String {
    let mut r = String::new();
    let _ = writeln!(r, "# Advertisement counter (PARTISAN §6.3, Fig. 9)\n");
    let sizes: Vec<String> = a.sizes.iter().map(usize::to_string).collect();
    let _ = writeln!(
        r,
        "Command: `maquis-bench adcounter{} --sizes {} --overlays {} --increments {} --ads {}{}{} --resend-every {} --nodes-per-proc {} --heartbeats-per-s {}`  ",
        if a.quick { " --quick" } else { "" },
        sizes.join(","),
        a.overlays.join(","),
        a.increments,
        a.ads,
        a.sync_ms.map(|s| format!(" --sync-ms {s}")).unwrap_or_default(),
        if a.whole_states { " --whole-states" } else { "" },
        a.resend_every,
        a.nodes_per_proc,
        a.heartbeats_per_s
    );
    r.push_str(&crate::stats::setting_lines());
    let _ = writeln!(
        r,
        "Wall time: {:.0} s; load average before: {}\n",
        wall.as_secs_f64(),
        load_before.trim()
    );
    let _ = writeln!(
        r,
        "Node 0 (the client-server server; the peer-to-peer contact) in a process of its own, the other nodes {} to a host process, each process a runtime of one worker thread, on loopback. Every node but node 0 counts {} impressions over {} ads in its replica; replicas send a changed state to their overlay neighbours every {} (the table's sync column) — {} — and every {} such intervals send the whole state again to a neighbour they sent nothing meanwhile (0: never). Bytes: every node's `bytes_sent` (all its traffic: membership, heartbeats, states) from the first increment to convergence; state bytes: the replicas' states alone (their encoded size, every send). Convergence: the latest instant a replica's total last changed, once all hold the total, less the instant the last host finished counting. Memory: node 0's process peak RSS. Connection heartbeats every 10 s (a connection is lost after 30 s of silence); peer-to-peer member heartbeats: the cluster sends {} a second (a node's period is the cluster size over that, at least 5 s; a member times out after three periods, and an accused member is suspected for one).\n",
        a.nodes_per_proc,
        a.increments,
        a.ads,
        match a.sync_ms {
            Some(s) => format!("{s} ms"),
            None => "5 ms per node of the cluster, at least 1,000 ms".to_string(),
        },
        if a.whole_states {
            "the whole state every time (`--whole-states`, as PARTISAN measured Lasp)"
        } else {
            "what changed since the state a neighbour last had, the whole state to a neighbour new to the view"
        },
        a.resend_every,
        a.heartbeats_per_s
    );
    let _ = writeln!(
        r,
        "| overlay | nodes | sync ms | formed s | converge ms | bytes total | bytes per node | state bytes per node | busiest node bytes | node 0 peak RSS KiB | increments | final count |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in cells {
        if let Some(e) = &c.error {
            let _ = writeln!(
                r,
                "| {} | {} | {} | failed: {} | | | | | | | {} | |",
                c.overlay,
                c.nodes,
                c.sync_ms,
                e.replace('|', "/"),
                c.increments
            );
            continue;
        }
        let _ = writeln!(
            r,
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {}{} |",
            c.overlay,
            c.nodes,
            c.sync_ms,
            c.form_s,
            c.converge_ms,
            c.bytes_total,
            c.bytes_per_node,
            c.state_bytes_per_node,
            c.bytes_busiest,
            c.peak_rss_kib,
            c.increments,
            c.final_count,
            if c.final_count == c.increments {
                ""
            } else {
                " (wrong)"
            }
        );
    }
    let _ = writeln!(r, "\n## Targets\n");
    for overlay in ["client-server", "peer-to-peer"] {
        let mine: Vec<&Cell> = cells
            .iter()
            .filter(|c| c.overlay == overlay && c.error.is_none())
            .collect();
        let failed = cells
            .iter()
            .find(|c| c.overlay == overlay && c.error.is_some());
        if let Some(f) = failed {
            let larger = a.sizes.iter().any(|&n| n > f.nodes);
            let _ = writeln!(
                r,
                "- {overlay}: the cell of {} nodes failed (see the table){}.",
                f.nodes,
                if larger {
                    "; larger sizes were not run"
                } else {
                    ""
                }
            );
        }
        let Some(top) = mine.iter().max_by_key(|c| c.nodes) else {
            continue;
        };
        let _ = writeln!(
            r,
            "- {overlay}: the largest cell, {} nodes, {} with {} of {} counted{}.",
            top.nodes,
            if top.final_count == top.increments {
                "completed"
            } else {
                "did not complete"
            },
            top.final_count,
            top.increments,
            match (top.nodes >= 1024, failed) {
                (true, _) => "",
                (false, Some(_)) => " (the target is 1,024 nodes)",
                (false, None) => " (the target is 1,024 nodes: not run here)",
            }
        );
        if overlay == "client-server" {
            let clients = top.nodes - 1;
            let bound_kib = server_bound_kib(clients);
            let _ = writeln!(
                r,
                "- client-server server memory at {} clients: peak {:.1} MiB against the bound of docs/client-server-memory.md, {:.1} MiB (the server alone {IDLE_SERVER_KIB} KiB + {PER_CLIENT_KIB} KiB a client + `transport.node_queue_bytes`): {}.",
                clients,
                top.peak_rss_kib as f64 / 1024.0,
                bound_kib / 1024.0,
                if (top.peak_rss_kib as f64) <= bound_kib {
                    "within"
                } else {
                    "beyond it"
                }
            );
        }
        if overlay == "peer-to-peer" {
            if let (Some(lo), Some(hi)) = (
                mine.iter().min_by_key(|c| c.nodes),
                mine.iter().max_by_key(|c| c.nodes),
            ) {
                let _ = writeln!(
                    r,
                    "- peer-to-peer bytes per node from {} to {} nodes: {} → {} ({:.2}×; roughly flat is the target).",
                    lo.nodes,
                    hi.nodes,
                    lo.bytes_per_node,
                    hi.bytes_per_node,
                    hi.bytes_per_node as f64 / lo.bytes_per_node.max(1) as f64
                );
            }
        }
    }
    r.push_str(&crate::plot::section(
        &a.out,
        "plot_adcounter.py",
        PLOT_PY,
        &[],
    ));
    r
}

/// A client-server server's resident memory alone, KiB, and what each client adds, KiB: as
/// `maquis-bench clients` measured them (docs/client-server-memory.md, its committed run).
const IDLE_SERVER_KIB: u64 = 7_972;
const PER_CLIENT_KIB: f64 = 120.7;

/// The bound docs/client-server-memory.md gives a server with `clients` clients, KiB.
fn server_bound_kib(clients: usize) -> f64 {
    let queues = maquis::Config::new("x").transport.node_queue_bytes as f64 / 1024.0;
    IDLE_SERVER_KIB as f64 + clients as f64 * PER_CLIENT_KIB + queues
}

/// Fig. 9: bytes per node (the busiest node's, and the replicas' states alone) against the
/// cluster size, per overlay.
const PLOT_PY: &str = r#"
import json, sys, os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
cells = json.load(open(os.path.join(out, "results.json")))
fig, ax = plt.subplots(figsize=(7, 4))
for overlay in sorted({c["overlay"] for c in cells}):
    mine = sorted((c for c in cells if c["overlay"] == overlay), key=lambda c: c["nodes"])
    xs = [c["nodes"] for c in mine]
    ax.plot(xs, [c["bytes_per_node"] for c in mine], marker="o", label=f"{overlay}: per node")
    ax.plot(xs, [c["bytes_busiest"] for c in mine], marker="x", linestyle="--", label=f"{overlay}: busiest node")
    ax.plot(xs, [c.get("state_bytes_per_node", 0) for c in mine], marker=".", linestyle=":", label=f"{overlay}: states per node")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("nodes")
ax.set_ylabel("bytes sent, first increment to convergence")
ax.set_title("Advertisement counter (cf. PARTISAN Fig. 9)")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(out, "bytes.png"), dpi=120)
print("bytes.png")
"#;
