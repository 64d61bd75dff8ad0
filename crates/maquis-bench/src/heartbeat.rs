//! `maquis-bench heartbeat`: ActOp's Heartbeat benchmark (§6.2, Fig. 11a) for stage sizing.
//!
//! One server node, in a process of its own, hosts `--actors` heartbeat actors; each keeps the
//! last status a client reported and answers with how many it has had. The client node (this
//! process) sends status calls to random actors, an open loop at each of `--rates` requests per
//! second. Configurations, each on a fresh server: `default` (every stage may use every worker
//! thread) and `stages` (the server sizes its receive, execute and send stages by ActOp's
//! queueing model every `--stage-ms`, with the thread cost `--penalty-us`). With `--rounds 2`
//! the order is default, stages, stages, default (the machine's drift falls on both). Writes
//! `results.json` and `report.md` into `--out`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use maquis::{Actor, ActorRef, Config, Context, Node, ReplyTo};
use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::ring_proc::Proc;

/// `maquis-bench heartbeat`.
#[derive(clap::Args, Debug)]
pub struct HeartbeatArgs {
    /// A short run: two rates, a few seconds each.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json and report.md go (with --quick and no --out:
    /// target/bench-quick/heartbeat).
    #[arg(long, default_value = "bench/results/heartbeat")]
    pub out: PathBuf,
    /// Heartbeat actors on the server.
    #[arg(long, default_value_t = 8192)]
    pub actors: u32,
    /// Requests per second, one load after the other (default 8000,16000,24000,32000;
    /// 8000,24000 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub rates: Option<Vec<u64>>,
    /// Seconds of warm-up and of measurement at each rate (default 5, 15; 2, 4 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub seconds: Option<Vec<u64>>,
    /// Configurations: default, stages.
    #[arg(long, value_delimiter = ',', default_value = "default,stages")]
    pub configs: Vec<String>,
    /// Rounds; the order of the configurations reverses every round.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// How often the `stages` server sizes its stages, milliseconds.
    #[arg(long, default_value_t = 500)]
    pub stage_ms: u64,
    /// The model's thread cost (η), microseconds.
    #[arg(long, default_value_t = 100)]
    pub penalty_us: u64,
    /// Port of the server (the client listens on the next one).
    #[arg(long, default_value_t = 18_900)]
    pub port: u16,
}

/// What the server answers to `stats`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ServerStages {
    /// Threads per stage (receive, execute, send), when it sizes them.
    pub threads: Option<[u64; 3]>,
    /// Threads each stage kept busy in the model's last interval, thousandths.
    pub busy_milli: Option<[u64; 3]>,
    /// Resizes so far.
    pub resizes: u64,
}

/// One configuration at one rate, as results.json holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    /// `default` or `stages`.
    pub config: String,
    /// Round (from 0).
    pub round: usize,
    /// Requests per second offered.
    pub rate: u64,
    /// Requests per second answered in the measured window.
    pub ops_per_s: f64,
    /// Latency percentiles of the answered requests, µs.
    pub p50_us: u64,
    /// 95th percentile, µs.
    pub p95_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Mean, µs.
    pub mean_us: f64,
    /// The server process's CPU per answered request, µs.
    pub server_cpu_us: f64,
    /// Requests sent in the measured window.
    pub sent: u64,
    /// Requests not answered (failed or timed out).
    pub lost: u64,
    /// The server's stages at the end of the window.
    pub stages: ServerStages,
}

/// A heartbeat.
#[derive(Debug, Serialize, Deserialize)]
pub struct Beat {
    /// The client's status.
    pub status: u64,
    /// Gets how many beats the actor has had.
    pub reply: ReplyTo<u64>,
}

struct Monitor {
    last: u64,
    beats: u64,
}

impl Actor for Monitor {
    type Msg = Beat;
    async fn handle(&mut self, msg: Beat, _ctx: &mut Context<Beat>) {
        self.last = msg.status;
        self.beats += 1;
        let _ = msg.reply.send(self.beats).await;
    }
}

/// `maquis-bench agent heartbeat-server`.
#[derive(clap::Args, Debug)]
pub struct HeartbeatServerArgs {
    /// Listen address.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Heartbeat actors, registered as `hb0`, `hb1`, ….
    #[arg(long)]
    pub actors: u32,
    /// `services.stage_interval_ms` (0: stages not sized).
    #[arg(long, default_value_t = 0)]
    pub stage_ms: u64,
    /// `services.stage_penalty_us`.
    #[arg(long, default_value_t = 100)]
    pub penalty_us: u64,
}

/// Runs the server until stdin closes: prints `ready`, answers `stats` with a
/// [`ServerStages`] line.
pub async fn server(a: HeartbeatServerArgs) -> Result<(), String> {
    let mut cfg = Config::new("hb-server")
        .listen(a.listen)
        .cookie("heartbeat-bench");
    cfg.services.stage_interval_ms = a.stage_ms;
    cfg.services.stage_penalty_us = a.penalty_us;
    let node = Node::start(cfg).await.map_err(|e| e.to_string())?;
    for i in 0..a.actors {
        let r = node.spawn(Monitor { last: 0, beats: 0 });
        node.register(&format!("hb{i}"), &r)
            .map_err(|e| e.to_string())?;
    }
    println!("ready");
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim() == "stats" {
            let g = node.status().gauges;
            let three = |prefix: &str| -> Option<[u64; 3]> {
                let v =
                    ["receive", "execute", "send"].map(|s| g.get(&format!("{prefix}{s}")).copied());
                Some([v[0]?, v[1]?, v[2]?])
            };
            let s = ServerStages {
                threads: three("stage_threads_"),
                busy_milli: three("stage_busy_milli_"),
                resizes: g.get("stage_resizes").copied().unwrap_or(0),
            };
            println!("{}", serde_json::to_string(&s).map_err(|e| e.to_string())?);
        }
    }
    node.shutdown().await;
    Ok(())
}

/// Runs the benchmark; the cells measured.
pub fn run(a: &HeartbeatArgs) -> Result<Vec<Cell>, String> {
    let rates = a.rates.clone().unwrap_or(if a.quick {
        vec![8000, 24000]
    } else {
        vec![8000, 16000, 24000, 32000]
    });
    let secs = a
        .seconds
        .clone()
        .unwrap_or(if a.quick { vec![2, 4] } else { vec![5, 15] });
    let [warm, measured] = secs[..] else {
        return Err("--seconds takes two numbers: warm-up, measured".into());
    };
    if a.actors == 0 || rates.contains(&0) || measured == 0 || a.rounds == 0 {
        return Err(
            "--actors, --rates, the measured seconds and --rounds must be at least 1".into(),
        );
    }
    for c in &a.configs {
        if !["default", "stages"].contains(&c.as_str()) {
            return Err(format!("unknown configuration {c:?} (default, stages)"));
        }
    }
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let t0 = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut cells = Vec::new();
    for round in 0..a.rounds {
        let mut order = a.configs.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for config in &order {
            eprintln!("heartbeat: round {round}, {config}");
            let got = rt.block_on(one_config(a, config, round, &rates, (warm, measured)))?;
            cells.extend(got);
        }
    }
    drop(rt);
    crate::stats::write_results(&a.out, &cells)?;
    let md = report(
        a,
        &rates,
        (warm, measured),
        &cells,
        t0.elapsed(),
        &load_before,
    );
    std::fs::write(a.out.join("report.md"), md).map_err(|e| e.to_string())?;
    eprintln!("heartbeat: wrote {}", a.out.display());
    Ok(cells)
}

async fn one_config(
    a: &HeartbeatArgs,
    config: &str,
    round: usize,
    rates: &[u64],
    (warm, measured): (u64, u64),
) -> Result<Vec<Cell>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let listen = SocketAddr::from(([127, 0, 0, 1], a.port));
    let mut cmd = std::process::Command::new(exe);
    cmd.env("RUST_LOG", crate::stats::agent_log_filter())
        .args(["agent", "heartbeat-server", "--listen", &listen.to_string()])
        .args(["--actors", &a.actors.to_string()]);
    if config == "stages" {
        cmd.args(["--stage-ms", &a.stage_ms.to_string()])
            .args(["--penalty-us", &a.penalty_us.to_string()]);
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(a.out.join("server.log"))
        .map_err(|e| e.to_string())?;
    let mut server = Proc::start("heartbeat server", cmd, log.into())?;
    server.expect(&["ready"], Duration::from_secs(60))?;
    let client = Node::start(
        Config::new("hb-client")
            .listen(([127, 0, 0, 1], a.port + 1).into())
            .cookie("heartbeat-bench"),
    )
    .await
    .map_err(|e| e.to_string())?;
    let result = async {
        client
            .join_wait(listen, Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        let refs: Vec<ActorRef<Beat>> = (0..a.actors)
            .map(|i| {
                client
                    .remote("hb-server", &format!("hb{i}"))
                    .ok_or_else(|| "the server is not a member".to_string())
            })
            .collect::<Result<_, _>>()?;
        let refs = Arc::new(refs);
        let mut cells = Vec::new();
        for &rate in rates {
            load(&refs, rate, warm).await;
            let cpu0 = crate::stats::cpu_seconds_of(server.pid());
            let (lat, sent) = load(&refs, rate, measured).await;
            let cpu = crate::stats::cpu_seconds_of(server.pid()) - cpu0;
            server.send("stats")?;
            let stages: ServerStages = server.answer(Duration::from_secs(30))?;
            let cell = cell(config, round, rate, measured, lat, sent, cpu, stages);
            eprintln!(
                "  {rate} req/s: {:.0} answered/s, p50/p95/p99 {}/{}/{} µs, server {:.1} µs CPU a request, stages {:?}",
                cell.ops_per_s, cell.p50_us, cell.p95_us, cell.p99_us, cell.server_cpu_us, cell.stages.threads
            );
            cells.push(cell);
        }
        Ok::<_, String>(cells)
    }
    .await;
    client.shutdown().await;
    drop(server);
    result
}

#[allow(clippy::too_many_arguments)]
fn cell(
    config: &str,
    round: usize,
    rate: u64,
    measured: u64,
    mut lat: Vec<u64>,
    sent: u64,
    cpu: f64,
    stages: ServerStages,
) -> Cell {
    lat.sort_unstable();
    let pct = |p: f64| -> u64 {
        if lat.is_empty() {
            return 0;
        }
        lat[((lat.len() - 1) as f64 * p).round() as usize]
    };
    let answered = lat.len() as u64;
    Cell {
        config: config.to_string(),
        round,
        rate,
        ops_per_s: answered as f64 / measured as f64,
        p50_us: pct(0.50),
        p95_us: pct(0.95),
        p99_us: pct(0.99),
        mean_us: lat.iter().sum::<u64>() as f64 / answered.max(1) as f64,
        server_cpu_us: cpu * 1e6 / answered.max(1) as f64,
        sent,
        lost: sent - answered,
        stages,
    }
}

/// An open loop: `rate` calls a second for `secs` seconds, each a task of its own started on
/// schedule, to a random actor; the latencies (µs) of those answered, and how many were sent.
async fn load(refs: &Arc<Vec<ActorRef<Beat>>>, rate: u64, secs: u64) -> (Vec<u64>, u64) {
    let total = rate * secs;
    let gap = Duration::from_secs_f64(1.0 / rate as f64);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + gap.mul_f64(i as f64)).await;
        let refs = refs.clone();
        let to = rand::thread_rng().gen_range(0..refs.len());
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            refs[to]
                .call(|reply| Beat { status: i, reply }, Duration::from_secs(5))
                .await
                .ok()
                .map(|_| t.elapsed().as_micros() as u64)
        }));
    }
    let mut lat = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(Some(us)) = t.await {
            lat.push(us);
        }
    }
    (lat, total)
}

fn report(
    a: &HeartbeatArgs,
    rates: &[u64],
    (warm, measured): (u64, u64),
    cells: &[Cell],
    wall: Duration,
    load_before: &str,
) -> String {
    let mut r = String::new();
    let _ = writeln!(r, "# Heartbeat: stage sizing by ActOp's queueing model\n");
    let _ = writeln!(
        r,
        "One server process (2 worker threads) with {} heartbeat actors; one client node in the \
         driver's process (2 worker threads) sending status calls to random actors, an open loop. \
         `default`: every stage may use every worker thread. `stages`: the server sizes its \
         receive, execute and send stages every {} ms (η = {} µs a thread). {} s warm-up and {} s \
         measured per rate; {} round(s). Wall time {:.0} s; load average before: {}",
        a.actors,
        a.stage_ms,
        a.penalty_us,
        warm,
        measured,
        a.rounds,
        wall.as_secs_f64(),
        load_before.trim()
    );
    let _ = writeln!(
        r,
        "\nCommand: `maquis-bench heartbeat{} --actors {} --rates {} --seconds {warm},{measured} --configs {} --rounds {} --stage-ms {} --penalty-us {}`  ",
        if a.quick { " --quick" } else { "" },
        a.actors,
        rates.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
        a.configs.join(","),
        a.rounds,
        a.stage_ms,
        a.penalty_us
    );
    r.push_str(&crate::stats::setting_lines());
    r.push('\n');
    let _ = writeln!(
        r,
        "| config | round | rate | answered/s | p50 µs | p95 µs | p99 µs | mean µs | server CPU µs/req | lost | threads r/e/s | busy r/e/s |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in cells {
        let three = |v: Option<[u64; 3]>, milli: bool| match v {
            Some([x, y, z]) if milli => format!(
                "{:.2}/{:.2}/{:.2}",
                x as f64 / 1e3,
                y as f64 / 1e3,
                z as f64 / 1e3
            ),
            Some([x, y, z]) => format!("{x}/{y}/{z}"),
            None => "–".into(),
        };
        let _ = writeln!(
            r,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {:.0} | {:.1} | {} | {} | {} |",
            c.config,
            c.round,
            c.rate,
            c.ops_per_s,
            c.p50_us,
            c.p95_us,
            c.p99_us,
            c.mean_us,
            c.server_cpu_us,
            c.lost,
            three(c.stages.threads, false),
            three(c.stages.busy_milli, true)
        );
    }
    let _ = writeln!(
        r,
        "\n## `stages` against `default` (medians over rounds)\n\n| rate | p50 | p99 | mean | server CPU |\n|---|---|---|---|---|"
    );
    for &rate in rates {
        let med = |config: &str, f: &dyn Fn(&Cell) -> f64| -> Option<f64> {
            let mut v: Vec<f64> = cells
                .iter()
                .filter(|c| c.config == config && c.rate == rate)
                .map(f)
                .collect();
            if v.is_empty() {
                return None;
            }
            v.sort_by(|a, b| a.total_cmp(b));
            let mid = v.len() / 2;
            Some(if v.len().is_multiple_of(2) {
                (v[mid - 1] + v[mid]) / 2.0
            } else {
                v[mid]
            })
        };
        let ratio = |f: &dyn Fn(&Cell) -> f64| match (med("stages", f), med("default", f)) {
            (Some(s), Some(d)) if d > 0.0 => format!("{:.2}×", s / d),
            _ => "–".into(),
        };
        let _ = writeln!(
            r,
            "| {rate} | {} | {} | {} | {} |",
            ratio(&|c| c.p50_us as f64),
            ratio(&|c| c.p99_us as f64),
            ratio(&|c| c.mean_us),
            ratio(&|c| c.server_cpu_us)
        );
    }
    let _ = writeln!(
        r,
        "\nA ratio below 1× means `stages` was faster (or cheaper). The server's `busy` columns \
         are the model's λ·s per stage (threads kept busy) in its last interval."
    );
    r.push_str(&crate::plot::section(
        &a.out,
        "plot_heartbeat.py",
        PLOT_PY,
        &[],
    ));
    r
}

/// Fig. 11(a)'s measure: each configuration's p50 and p99 against the load (every round a
/// point, the median a line).
const PLOT_PY: &str = r#"
import json, sys, os, statistics
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
cells = json.load(open(os.path.join(out, "results.json")))
fig, ax = plt.subplots(figsize=(7, 4))
for config in sorted({c["config"] for c in cells}):
    for key, style in (("p50_us", "--"), ("p99_us", "-")):
        rates = sorted({c["rate"] for c in cells if c["config"] == config})
        med = [statistics.median(c[key] for c in cells if c["config"] == config and c["rate"] == r) for r in rates]
        line, = ax.plot(rates, med, style, marker="o", label=f"{config} {key[:3]}")
        pts = [(c["rate"], c[key]) for c in cells if c["config"] == config]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=line.get_color(), s=10, alpha=0.5)
ax.set_yscale("log")
ax.set_xlabel("offered load (requests/s)")
ax.set_ylabel("latency (µs)")
ax.set_title("Heartbeat: stage sizing against the default (cf. Fig. 11a)")
ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(out, "latency_by_load.png"), dpi=120)
print("latency_by_load.png")
"#;
