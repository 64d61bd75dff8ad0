//! `maquis-bench adcounter`: PARTISAN's advertisement counter (§6.3, Fig. 9) at 32 to 1,024
//! nodes, client-server and peer-to-peer.
//!
//! Node 0 — the client-server overlay's server, the peer-to-peer overlay's contact — runs in a
//! process of its own (its memory is measured there); the other nodes run in this process on
//! one runtime, each with a replica of `maquis-adcounter`, and count `--increments`
//! impressions each, spread over `--ads` ads. The cell ends when every replica, node 0's
//! included, holds the exact total. Bytes are the nodes' `bytes_sent` counters (all of a
//! node's traffic: membership, heartbeats and the replicas' states), from just before the
//! first increment to convergence. Writes `results.json`, `report.md` and a plot into `--out`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use maquis::config::{ClientServerOptions, PeerToPeerOptions};
use maquis::overlay::Role;
use maquis::{ActorRef, Config, Node};
use maquis_adcounter::{AdMsg, Settings};
use serde::{Deserialize, Serialize};

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
    /// How often a replica sends a changed state to its neighbours, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub sync_ms: u64,
    /// Seconds a cell may take to form its cluster, and again to converge.
    #[arg(long, default_value_t = 300)]
    pub timeout_s: u64,
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
    /// Why the cell failed (its numbers are then zero), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `maquis-bench agent adcounter-node`.
#[derive(clap::Args, Debug)]
pub struct AdcounterNodeArgs {
    /// Listen address.
    #[arg(long)]
    pub listen: SocketAddr,
    /// client-server (this node is the server) or peer-to-peer.
    #[arg(long)]
    pub overlay: String,
    /// The replica's sync interval, milliseconds.
    #[arg(long)]
    pub sync_ms: u64,
}

/// What node 0's process answers to `stats`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NodeStats {
    /// The node's `bytes_sent`.
    pub bytes_sent: u64,
    /// Its replica's total.
    pub total: u64,
    /// Members it sees.
    pub members: usize,
    /// The process's peak resident memory, KiB.
    pub hwm_kib: u64,
}

fn node_config(
    name: &str,
    listen: SocketAddr,
    overlay: &str,
    server: bool,
) -> Result<Config, String> {
    let mut cfg = Config::new(name).listen(listen).cookie("adcounter-bench");
    cfg = match overlay {
        "client-server" => cfg.overlay(ClientServerOptions {
            role: if server { Role::Server } else { Role::Client },
            servers_per_client: 1,
            ..ClientServerOptions::default()
        }),
        "peer-to-peer" => cfg.overlay(PeerToPeerOptions {
            shuffle_period_ms: 10_000,
            ..PeerToPeerOptions::default()
        }),
        other => {
            return Err(format!(
                "unknown overlay {other:?} (client-server, peer-to-peer)"
            ))
        }
    };
    // Many nodes on two cores: heartbeats as DE-Bench's nodes have them.
    cfg.transport.heartbeat_timeout_ms = 10_000;
    cfg.transport.heartbeat_interval_ms = 10_000 / 3;
    cfg.broadcast.member_timeout_ms = 15_000;
    cfg.broadcast.member_heartbeat_ms = 15_000 / 3;
    Ok(cfg)
}

fn settings(sync_ms: u64) -> Settings {
    Settings {
        limit: u64::MAX,
        max_ads: 1024,
        sync_every: Duration::from_millis(sync_ms),
    }
}

const T: Duration = Duration::from_secs(30);

async fn read(r: &ActorRef<AdMsg>) -> Result<u64, String> {
    r.call(AdMsg::Read, T)
        .await
        .map(|s| s.total)
        .map_err(|e| e.to_string())
}

/// Node 0: runs until stdin closes; answers `stats` with a [`NodeStats`] line.
pub async fn node(a: AdcounterNodeArgs) -> Result<(), String> {
    crate::debench_agent::raise_fd_limit();
    let cfg = node_config("ad0", a.listen, &a.overlay, true)?;
    let node = Node::start(cfg).await.map_err(|e| e.to_string())?;
    let replica = maquis_adcounter::start(&node, settings(a.sync_ms)).map_err(|e| e.to_string())?;
    println!("ready");
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim() == "stats" {
            let s = NodeStats {
                bytes_sent: node.status().counters["bytes_sent"],
                total: read(&replica).await.unwrap_or(0),
                members: node.members().len(),
                hwm_kib: crate::stats::proc_status_kib("VmHWM:"),
            };
            println!("{}", serde_json::to_string(&s).map_err(|e| e.to_string())?);
        }
    }
    node.shutdown().await;
    Ok(())
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
    if a.sizes.iter().any(|&n| n < 2) || a.increments == 0 || a.ads == 0 || a.sync_ms == 0 {
        return Err("--sizes at least 2; --increments, --ads, --sync-ms at least 1".into());
    }
    if a.sizes
        .iter()
        .any(|&n| a.base_port as usize + n > u16::MAX as usize)
    {
        return Err("--base-port plus the largest size passes the last port".into());
    }
    for o in &a.overlays {
        node_config("check", SocketAddr::from(([127, 0, 0, 1], 0)), o, false)?;
    }
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    crate::debench_agent::raise_fd_limit();
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let t0 = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
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
            let c = match rt.block_on(cell(a, overlay, n)) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("  failed: {e}");
                    cells.push(failed(overlay, n, a.increments, e));
                    write(&cells)?;
                    break;
                }
            };
            eprintln!(
                "  formed in {:.1} s; converged {} ms after the last increment; {} bytes a node ({} the busiest); node 0 peak {} KiB; {} of {} counted",
                c.form_s, c.converge_ms, c.bytes_per_node, c.bytes_busiest, c.peak_rss_kib, c.final_count, c.increments
            );
            cells.push(c);
            write(&cells)?;
        }
    }
    drop(rt);
    write(&cells)?;
    eprintln!("adcounter: wrote {}", a.out.display());
    Ok(cells)
}

/// The record of a cell that failed with `error`.
fn failed(overlay: &str, n: usize, increments: u64, error: String) -> Cell {
    Cell {
        overlay: overlay.to_string(),
        nodes: n,
        bytes_total: 0,
        bytes_per_node: 0,
        bytes_busiest: 0,
        converge_ms: 0,
        peak_rss_kib: 0,
        increments: (n as u64).saturating_sub(1) * increments,
        final_count: 0,
        form_s: 0.0,
        error: Some(error),
    }
}

async fn cell(a: &AdcounterArgs, overlay: &str, n: usize) -> Result<Cell, String> {
    let addr = |i: usize| SocketAddr::from(([127, 0, 0, 1], a.base_port + i as u16));
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(exe);
    cmd.env("RUST_LOG", crate::stats::agent_log_filter())
        .args(["agent", "adcounter-node", "--listen", &addr(0).to_string()])
        .args(["--overlay", overlay, "--sync-ms", &a.sync_ms.to_string()]);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(a.out.join("node0.log"))
        .map_err(|e| e.to_string())?;
    let mut zero = Proc::start("node 0", cmd, log.into())?;
    zero.expect(&["ready"], Duration::from_secs(60))?;
    let started = Instant::now();
    let mut nodes: Vec<Node> = Vec::with_capacity(n - 1);
    let result = async {
        for i in 1..n {
            let cfg = node_config(&format!("ad{i}"), addr(i), overlay, false)?;
            let node = Node::start(cfg).await.map_err(|e| e.to_string())?;
            node.join_wait(addr(0), Duration::from_secs(a.timeout_s))
                .await
                .map_err(|e| format!("ad{i} cannot join: {e}"))?;
            nodes.push(node);
        }
        let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
        while nodes.iter().any(|m| m.members().len() < n) {
            if Instant::now() > deadline {
                return Err(format!(
                    "the cluster of {n} did not form within {} s",
                    a.timeout_s
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let form_s = started.elapsed().as_secs_f64();
        let replicas: Vec<ActorRef<AdMsg>> = nodes
            .iter()
            .map(|m| maquis_adcounter::start(m, settings(a.sync_ms)).map_err(|e| e.to_string()))
            .collect::<Result<_, _>>()?;
        let sent = |nodes: &[Node]| -> Vec<u64> {
            nodes
                .iter()
                .map(|m| m.status().counters["bytes_sent"])
                .collect()
        };
        let stats = |zero: &mut Proc| -> Result<NodeStats, String> {
            zero.send("stats")?;
            zero.answer(Duration::from_secs(30))
        };
        let before = sent(&nodes);
        let zero_before = stats(&mut zero)?.bytes_sent;
        for (i, r) in replicas.iter().enumerate() {
            for k in 0..a.increments {
                let ad = format!("ad{}", (i as u64 + k) % a.ads as u64);
                r.call(|reply| AdMsg::Impression { ad, reply }, T)
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("not counted: {e}"))?;
            }
        }
        let last = Instant::now();
        let want = (n as u64 - 1) * a.increments;
        let deadline = last + Duration::from_secs(a.timeout_s);
        let zero_stats = loop {
            let mut done = true;
            for r in &replicas {
                if read(r).await? != want {
                    done = false;
                    break;
                }
            }
            if done {
                let z = stats(&mut zero)?;
                if z.total == want {
                    break z;
                }
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{overlay}, {n} nodes: no convergence within {} s",
                    a.timeout_s
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let converge_ms = last.elapsed().as_millis() as u64;
        let after = sent(&nodes);
        let mut per: Vec<u64> = before
            .iter()
            .zip(&after)
            .map(|(b, a)| a.saturating_sub(*b))
            .collect();
        per.push(zero_stats.bytes_sent.saturating_sub(zero_before));
        let bytes_total: u64 = per.iter().sum();
        let mut finals = Vec::new();
        for r in &replicas {
            finals.push(read(r).await?);
        }
        finals.push(zero_stats.total);
        let final_count = *finals.iter().min().unwrap_or(&0);
        if finals.iter().any(|f| *f != final_count) {
            return Err(format!("replicas disagree at the end: {finals:?}"));
        }
        Ok(Cell {
            overlay: overlay.to_string(),
            nodes: n,
            bytes_total,
            bytes_per_node: bytes_total / n as u64,
            bytes_busiest: per.iter().copied().max().unwrap_or(0),
            converge_ms,
            peak_rss_kib: zero_stats.hwm_kib,
            increments: want,
            final_count,
            form_s,
            error: None,
        })
    }
    .await;
    for m in nodes {
        m.shutdown().await;
    }
    drop(zero);
    result
}

fn report(a: &AdcounterArgs, cells: &[Cell], wall: Duration, load_before: &str) -> String {
    let mut r = String::new();
    let _ = writeln!(r, "# Advertisement counter (PARTISAN §6.3, Fig. 9)\n");
    let sizes: Vec<String> = a.sizes.iter().map(usize::to_string).collect();
    let _ = writeln!(
        r,
        "Command: `maquis-bench adcounter{} --sizes {} --overlays {} --increments {} --ads {} --sync-ms {}`  ",
        if a.quick { " --quick" } else { "" },
        sizes.join(","),
        a.overlays.join(","),
        a.increments,
        a.ads,
        a.sync_ms
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
        "Node 0 (the client-server server; the peer-to-peer contact) in a process of its own, the other nodes in the benchmark's process on one runtime of 2 worker threads, on loopback. Every node but node 0 counts {} impressions over {} ads in its replica; replicas send a changed state to their overlay neighbours every {} ms. Bytes: every node's `bytes_sent` (all its traffic) from the first increment to convergence. Memory: node 0's process peak RSS.\n",
        a.increments, a.ads, a.sync_ms
    );
    let _ = writeln!(
        r,
        "| overlay | nodes | formed s | converge ms | bytes total | bytes per node | busiest node bytes | node 0 peak RSS KiB | increments | final count |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in cells {
        if let Some(e) = &c.error {
            let _ = writeln!(
                r,
                "| {} | {} | failed: {} | | | | | | {} | |",
                c.overlay,
                c.nodes,
                e.replace('|', "/"),
                c.increments
            );
            continue;
        }
        let _ = writeln!(
            r,
            "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {}{} |",
            c.overlay,
            c.nodes,
            c.form_s,
            c.converge_ms,
            c.bytes_total,
            c.bytes_per_node,
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
        if let Some(f) = cells
            .iter()
            .find(|c| c.overlay == overlay && c.error.is_some())
        {
            let _ = writeln!(
                r,
                "- {overlay}: the cell of {} nodes failed (see the table); larger sizes were not run.",
                f.nodes
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
            if top.nodes >= 1024 {
                ""
            } else {
                " (the target is 1,024 nodes: not run here)"
            }
        );
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

/// Fig. 9: bytes per node (and the busiest node's) against the cluster size, per overlay.
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
