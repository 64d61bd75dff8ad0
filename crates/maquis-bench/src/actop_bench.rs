//! `maquis-bench actop`: ActOp's Halo Presence (§6.1, Fig. 10–11), scaled to this machine.
//!
//! Games of `--players` players, each game and each player a virtual actor, placed at random
//! over `--nodes` Maquis nodes (in this process, on loopback). A client request asks a random
//! player for its status; the player asks its game (a call from one virtual actor to another:
//! the message ActOp tries to keep on one node) and answers. Every configuration runs on a
//! fresh cluster, one after the other: `random` (placement only), `local` (prefer-local
//! placement), `actop` (random placement, then pairwise partitioning every `--interval-ms`). Each one runs a warm-up (ActOp converges there), a
//! paced phase at `--rate` requests per second (latency percentiles, remote share, CPU per
//! request), then a saturation phase (`--clients` closed-loop clients: peak throughput).
//! Writes `results.json` and `report.md` into `--out`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use maquis::virtual_actors::Placement;
use maquis::{Actor, Config, Context, Node, ReplyTo};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// `maquis-bench actop`.
#[derive(clap::Args, Debug)]
pub struct ActopArgs {
    /// A short run: fewer games and seconds.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json and report.md go (with --quick and no --out: target/bench-quick/actop).
    #[arg(long, default_value = "bench/results/actop")]
    pub out: PathBuf,
    /// Nodes (in this process).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Games (default 1,000; 500 with --quick).
    #[arg(long)]
    pub games: Option<u32>,
    /// Players per game.
    #[arg(long, default_value_t = 8)]
    pub players: u32,
    /// Paced requests per second, all nodes together.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Closed-loop clients of the saturation phase.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Seconds of warm-up, of the paced phase, and of the saturation phase (default 60, 10,
    /// 10; 30, 5, 5 with --quick). ActOp converges during the warm-up.
    #[arg(long, value_delimiter = ',')]
    pub seconds: Option<Vec<u64>>,
    /// ActOp's exchange interval, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// Configurations: random, local (prefer-local: a player on the node that sends it its
    /// game, a game on the node of its first player), actop, actop+stages (ActOp, and each
    /// node sizes its stages by the queueing model every `--interval-ms`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "random,local,actop,actop+stages"
    )]
    pub configs: Vec<String>,
    /// First port (node i listens on 127.0.0.1:port+i).
    #[arg(long, default_value_t = 18_500)]
    pub base_port: u16,
}

/// The configurations `--configs` may name.
const CONFIGS: [&str; 4] = ["random", "local", "actop", "actop+stages"];

/// One configuration's measurement, as results.json holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigResult {
    /// `random`, `local` or `actop`.
    pub config: String,
    /// Share of player → game calls that crossed nodes in the paced phase.
    pub remote_fraction: f64,
    /// Latency of a request in the paced phase, µs.
    pub p50_us: u64,
    /// 95th percentile, µs.
    pub p95_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// Requests per second answered in the saturation phase.
    pub peak_ops_per_s: f64,
    /// CPU time of the process per request in the paced phase, µs.
    pub cpu_us_per_request: f64,
    /// Actors moved per minute over the warm-up and the paced phase.
    pub migrations_per_min: f64,
    /// Requests sent, in both measured phases.
    pub sent: u64,
    /// Requests answered.
    pub handled: u64,
    /// Requests that failed or got no answer.
    pub lost: u64,
    /// Remote share of player → game calls per second, from the start of the warm-up.
    pub timeline: Vec<f64>,
    /// Virtual actors per node at the end.
    pub activations: Vec<usize>,
    /// Threads per stage (receive, execute, send) of each node at the end of the paced phase,
    /// when the nodes size their stages.
    #[serde(default)]
    pub stage_threads: Vec<[u64; 3]>,
}

#[derive(Debug, Serialize, Deserialize)]
enum Player {
    /// Join a game (its key).
    Join(String),
    /// A client asks for the player's status: the player asks its game.
    Status(ReplyTo<u64>),
}

#[derive(Debug, Serialize, Deserialize)]
enum Game {
    /// A player joined.
    Hello,
    /// How many players have joined.
    Status(ReplyTo<u64>),
}

struct PlayerActor {
    game: Option<String>,
    /// Where its game goes if it has no activation yet.
    placement: Placement,
}

impl Actor for PlayerActor {
    type Msg = Player;
    async fn handle(&mut self, msg: Player, ctx: &mut Context<Player>) {
        match msg {
            Player::Join(game) => {
                if let Ok(g) = ctx.node().virtual_ref::<Game>("game", &game) {
                    let g = g.placement(self.placement);
                    let _ = g.send(Game::Hello).await;
                }
                self.game = Some(game);
            }
            Player::Status(reply) => {
                let Some(game) = &self.game else {
                    let _ = reply.send(0).await;
                    return;
                };
                let Ok(g) = ctx.node().virtual_ref::<Game>("game", game) else {
                    return;
                };
                if let Ok(n) = g.call(Game::Status, Duration::from_secs(5)).await {
                    let _ = reply.send(n).await;
                }
            }
        }
    }
}

struct GameActor {
    players: u64,
}

impl Actor for GameActor {
    type Msg = Game;
    async fn handle(&mut self, msg: Game, _ctx: &mut Context<Game>) {
        match msg {
            Game::Hello => self.players += 1,
            Game::Status(reply) => {
                let _ = reply.send(self.players).await;
            }
        }
    }
}

/// Runs the benchmark.
pub fn run(a: &ActopArgs) -> Result<Vec<ConfigResult>, String> {
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let games = a.games.unwrap_or(if a.quick { 500 } else { 1000 });
    let secs = a.seconds.clone().unwrap_or(if a.quick {
        vec![30, 5, 5]
    } else {
        vec![60, 10, 10]
    });
    let [warm, paced, sat] = secs[..] else {
        return Err("--seconds takes three numbers: warm-up, paced, saturation".into());
    };
    if a.nodes < 2 || a.players == 0 || games == 0 || a.rate == 0 || a.clients == 0 {
        return Err("--nodes at least 2; --games, --players, --rate, --clients at least 1".into());
    }
    for c in &a.configs {
        if !CONFIGS.contains(&c.as_str()) {
            return Err(format!(
                "unknown configuration {c:?} ({})",
                CONFIGS.join(", ")
            ));
        }
    }
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let t0 = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut results = Vec::new();
    for (i, config) in a.configs.iter().enumerate() {
        eprintln!(
            "actop: {config}: {} nodes, {games} games of {} players",
            a.nodes, a.players
        );
        let port = a.base_port + (i * a.nodes) as u16;
        let r = rt.block_on(one(a, config, games, port, (warm, paced, sat)))?;
        eprintln!(
            "  remote share {:.3}, p50/p95/p99 {}/{}/{} µs, peak {:.0} req/s, {:.1} µs CPU a request, {:.0} moves/min",
            r.remote_fraction, r.p50_us, r.p95_us, r.p99_us, r.peak_ops_per_s, r.cpu_us_per_request, r.migrations_per_min
        );
        results.push(r);
    }
    drop(rt);
    let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
    std::fs::write(a.out.join("results.json"), json).map_err(|e| e.to_string())?;
    report(
        a,
        games,
        (warm, paced, sat),
        &results,
        t0.elapsed(),
        &load_before,
    )?;
    eprintln!("actop: wrote {}", a.out.display());
    Ok(results)
}

fn count(nodes: &[Node], k: &str) -> u64 {
    nodes.iter().map(|n| n.counters().snapshot()[k]).sum()
}

/// The remote share of player → game calls since `(local, remote)`.
fn share(nodes: &[Node], since: (u64, u64)) -> ((u64, u64), f64) {
    let now = (
        count(nodes, "virtual_sent_local"),
        count(nodes, "virtual_sent_remote"),
    );
    let (l, r) = (now.0 - since.0, now.1 - since.1);
    (now, r as f64 / (l + r).max(1) as f64)
}

async fn one(
    a: &ActopArgs,
    config: &str,
    games: u32,
    port: u16,
    (warm, paced, sat): (u64, u64, u64),
) -> Result<ConfigResult, String> {
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..a.nodes {
        let mut cfg = Config::new(format!("halo{i}"))
            .listen(([127, 0, 0, 1], port + i as u16).into())
            .cookie("actop-bench");
        cfg.services.virtual_idle_ms = 0;
        if config.starts_with("actop") {
            cfg.services.actop_interval_ms = a.interval_ms;
            cfg.services.actop_candidates = 512;
            cfg.services.actop_imbalance =
                ((games * (a.players + 1)) as usize / a.nodes / 10).max(4);
        }
        if config == "actop+stages" {
            cfg.services.stage_interval_ms = a.interval_ms;
        }
        let node = Node::start(cfg).await.map_err(|e| e.to_string())?;
        if let Some(first) = nodes.first() {
            node.join_wait(first.addr(), Duration::from_secs(10))
                .await
                .map_err(|e| e.to_string())?;
        }
        let placement = if config == "local" {
            Placement::Local
        } else {
            Placement::Random
        };
        node.register_virtual("player", move |_key: &str| PlayerActor {
            game: None,
            placement,
        })
        .map_err(|e| e.to_string())?;
        node.register_virtual("game", |_key: &str| GameActor { players: 0 })
            .map_err(|e| e.to_string())?;
        nodes.push(node);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while nodes.iter().any(|n| n.members().len() < a.nodes) {
        if Instant::now() > deadline {
            return Err("the cluster did not form in 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Players join their games; everything is placed at random.
    let players: Vec<String> = (0..games * a.players).map(|p| format!("p{p}")).collect();
    for (i, p) in players.iter().enumerate() {
        let node = &nodes[i % nodes.len()];
        let r = node
            .virtual_ref::<Player>("player", p)
            .map_err(|e| e.to_string())?
            .placement(if config == "local" {
                Placement::Local
            } else {
                Placement::Random
            });
        r.send(Player::Join(format!("g{}", i as u32 / a.players)))
            .await
            .map_err(|e| e.to_string())?;
    }
    let sent = Arc::new(AtomicU64::new(0));
    let handled = Arc::new(AtomicU64::new(0));
    let moves0 = count(&nodes, "virtual_migrations");
    let mut since = share(&nodes, (0, 0)).0;
    let mut timeline = Vec::new();
    // Warm-up, then the paced phase: paced load, the remote share each second; latencies,
    // CPU and requests counted from the paced phase on.
    let (mut cpu0, mut sent0) = (0.0, 0);
    let mut lat = Vec::new();
    for second in 0..warm + paced {
        if second == warm {
            cpu0 = crate::stats::cpu_seconds();
            sent0 = sent.load(Ordering::Relaxed);
        }
        let got = paced_load(&nodes, &players, a.rate, &sent, &handled).await;
        if second >= warm {
            lat.extend(got);
        }
        let (now, s) = share(&nodes, since);
        since = now;
        timeline.push(s);
    }
    let cpu = crate::stats::cpu_seconds() - cpu0;
    let stage_threads = nodes
        .iter()
        .filter_map(|n| {
            let g = n.status().gauges;
            let t = ["receive", "execute", "send"]
                .map(|s| g.get(&format!("stage_threads_{s}")).copied());
            Some([t[0]?, t[1]?, t[2]?])
        })
        .collect();
    let paced_sent = sent.load(Ordering::Relaxed) - sent0;
    let remote_fraction = timeline[warm as usize..].iter().sum::<f64>() / paced.max(1) as f64;
    let moves = count(&nodes, "virtual_migrations") - moves0;
    // Saturation: closed-loop clients.
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(sat);
    let mut tasks = Vec::new();
    for c in 0..a.clients {
        let node = nodes[c % nodes.len()].clone();
        let players = players.clone();
        let (done, sent, handled) = (done.clone(), sent.clone(), handled.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let p = &players[rand::thread_rng().gen_range(0..players.len())];
                if ask(&node, p, &sent, &handled).await.is_some() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let peak = done.load(Ordering::Relaxed) as f64 / sat.max(1) as f64;
    let activations = nodes.iter().map(|n| n.activations()).collect();
    for n in &nodes {
        n.shutdown().await;
    }
    lat.sort_unstable();
    let pct = |p: f64| -> u64 {
        if lat.is_empty() {
            return 0;
        }
        lat[((lat.len() - 1) as f64 * p).round() as usize]
    };
    let (sent, handled) = (
        sent.load(Ordering::Relaxed),
        handled.load(Ordering::Relaxed),
    );
    Ok(ConfigResult {
        config: config.to_string(),
        remote_fraction,
        p50_us: pct(0.50),
        p95_us: pct(0.95),
        p99_us: pct(0.99),
        peak_ops_per_s: peak,
        cpu_us_per_request: cpu * 1e6 / paced_sent.max(1) as f64,
        migrations_per_min: moves as f64 * 60.0 / (warm + paced).max(1) as f64,
        sent,
        handled,
        lost: sent - handled,
        timeline,
        activations,
        stage_threads,
    })
}

/// Asks `player` for its status from `node`, counting the request and its answer; the
/// latency in µs if it was answered.
async fn ask(node: &Node, player: &str, sent: &AtomicU64, handled: &AtomicU64) -> Option<u64> {
    let r = node.virtual_ref::<Player>("player", player).ok()?;
    sent.fetch_add(1, Ordering::Relaxed);
    let t = Instant::now();
    r.call(Player::Status, Duration::from_secs(5)).await.ok()?;
    handled.fetch_add(1, Ordering::Relaxed);
    Some(t.elapsed().as_micros() as u64)
}

/// Requests at `rate` per second for a second, spread over the nodes; the latencies (µs) of
/// those answered. Each request is a task of its own started on schedule (an open loop).
async fn paced_load(
    nodes: &[Node],
    players: &[String],
    rate: u64,
    sent: &Arc<AtomicU64>,
    handled: &Arc<AtomicU64>,
) -> Vec<u64> {
    let gap = Duration::from_secs(1) / rate.max(1) as u32;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(rate as usize);
    for i in 0..rate {
        tokio::time::sleep_until(start + gap * i as u32).await;
        let node = nodes[i as usize % nodes.len()].clone();
        let p = players[rand::thread_rng().gen_range(0..players.len())].clone();
        let (sent, handled) = (sent.clone(), handled.clone());
        tasks.push(tokio::spawn(async move {
            ask(&node, &p, &sent, &handled).await
        }));
    }
    let mut lat = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(Some(us)) = t.await {
            lat.push(us);
        }
    }
    lat
}

fn report(
    a: &ActopArgs,
    games: u32,
    (warm, paced, sat): (u64, u64, u64),
    results: &[ConfigResult],
    wall: Duration,
    load_before: &str,
) -> Result<(), String> {
    let mut r = String::new();
    let _ = writeln!(r, "# ActOp: Halo Presence (Fig. 10–11), scaled down\n");
    let _ = writeln!(
        r,
        "Command: `maquis-bench actop{} --nodes {} --games {games} --players {} --rate {} --clients {} --seconds {warm},{paced},{sat} --interval-ms {} --configs {}`  ",
        if a.quick { " --quick" } else { "" },
        a.nodes,
        a.players,
        a.rate,
        a.clients,
        a.interval_ms,
        a.configs.join(",")
    );
    let _ = writeln!(r, "Machine: {}  ", crate::micro_report::machine());
    let _ = writeln!(r, "TCP: {}  ", crate::debench_report::tcp_settings());
    let _ = writeln!(r, "Commit: {}  ", crate::micro_report::build_commit());
    let _ = writeln!(
        r,
        "Wall time: {:.0} s; load average before the run: {}\n",
        wall.as_secs_f64(),
        load_before.trim()
    );
    let _ = writeln!(r, "## Settings\n");
    let _ = writeln!(
        r,
        "- {} Maquis nodes in one process (one tokio runtime of 2 worker threads), full mesh on 127.0.0.1. {games} games of {} players: {} virtual actors, placed by the first message to each: at random (the Orleans baseline; `random`, `actop`), or on the sender's node (`local`: a player on the node that sends it its game, spread round robin; a game on the node of its first player). A request asks a random player for its status; the player calls its game and answers. The paper's cluster had 10+ servers and 100,000s of players; this is the shape of its experiment at the size of two cores.",
        a.nodes,
        a.players,
        games * (a.players + 1)
    );
    let _ = writeln!(
        r,
        "- Each configuration on a fresh cluster: {warm} s warm-up and {paced} s at {} requests/s (open loop: each request a task started on schedule), then {sat} s with {} closed-loop clients (peak throughput). `actop`: an exchange every {} ms, 512 candidates, imbalance 10 % of a node's share; `actop+stages`: the same, and every node sizes its receive, execute and send stages by the queueing model at the same interval (all nodes share the process's 2 worker threads, so a node's stage of 2 threads is no limit at all). Not simulated: players moving between games and arriving or leaving (the paper's 1 % of the graph a minute).\n",
        a.rate, a.clients, a.interval_ms
    );
    let _ = writeln!(r, "## Results\n");
    let _ = writeln!(
        r,
        "| config | remote share | p50 µs | p95 µs | p99 µs | peak req/s | CPU µs/req | moves/min | sent | handled | lost | actors per node | stage threads r/e/s per node |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in results {
        let _ = writeln!(
            r,
            "| {} | {:.3} | {} | {} | {} | {:.0} | {:.1} | {:.0} | {} | {} | {} | {:?} | {} |",
            c.config,
            c.remote_fraction,
            c.p50_us,
            c.p95_us,
            c.p99_us,
            c.peak_ops_per_s,
            c.cpu_us_per_request,
            c.migrations_per_min,
            c.sent,
            c.handled,
            c.lost,
            c.activations,
            if c.stage_threads.is_empty() {
                "–".to_string()
            } else {
                c.stage_threads
                    .iter()
                    .map(|[x, y, z]| format!("{x}/{y}/{z}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    let by = |name: &str| results.iter().find(|c| c.config == name);
    if let (Some(rand), Some(act)) = (by("random"), by("actop")) {
        let _ = writeln!(r, "\n## Targets\n");
        let _ = writeln!(
            r,
            "- Remote share at steady state ≤ 0.20 with ActOp: {:.3} ({}); random {:.3} (expected about (N−1)/N = {:.2}).",
            act.remote_fraction,
            if act.remote_fraction <= 0.2 { "met" } else { "missed" },
            rand.remote_fraction,
            (a.nodes - 1) as f64 / a.nodes as f64
        );
        let drop = 1.0 - act.p99_us as f64 / rand.p99_us.max(1) as f64;
        let _ = writeln!(
            r,
            "- p99 ≥ 50 % lower than random at the paced load: {:.0} % lower ({} → {} µs; {}). The paced load is a fixed rate, not yet the highest load random sustains.",
            drop * 100.0,
            rand.p99_us,
            act.p99_us,
            if drop >= 0.5 { "met" } else { "missed" }
        );
        let gain = act.peak_ops_per_s / rand.peak_ops_per_s.max(1.0);
        let _ = writeln!(
            r,
            "- Peak throughput ≥ 1.5× random: {gain:.2}× ({})",
            if gain >= 1.5 { "met" } else { "missed" }
        );
        let _ = writeln!(
            r,
            "- Nothing lost: {} of {} requests unanswered with ActOp, {} of {} with random placement.",
            act.lost, act.sent, rand.lost, rand.sent
        );
        if let Some(staged) = by("actop+stages") {
            let _ = writeln!(
                r,
                "- ActOp with stage sizing, against ActOp alone: p50 {} → {} µs, p99 {} → {} µs, peak {:.2}×, CPU {:.1} → {:.1} µs a request.",
                act.p50_us,
                staged.p50_us,
                act.p99_us,
                staged.p99_us,
                staged.peak_ops_per_s / act.peak_ops_per_s.max(1.0),
                act.cpu_us_per_request,
                staged.cpu_us_per_request
            );
        }
        if let Some(local) = by("local") {
            let _ = writeln!(
                r,
                "- Prefer-local placement, for comparison: remote share {:.3}, p99 {} µs, peak {:.2}× random, {} of {} lost.",
                local.remote_fraction,
                local.p99_us,
                local.peak_ops_per_s / rand.peak_ops_per_s.max(1.0),
                local.lost,
                local.sent
            );
        }
    }
    let _ = writeln!(
        r,
        "\n## Remote share over time (per second, warm-up first)\n"
    );
    for c in results {
        let line: Vec<String> = c.timeline.iter().map(|s| format!("{s:.2}")).collect();
        let _ = writeln!(r, "- {}: {}", c.config, line.join(" "));
    }
    std::fs::write(a.out.join("report.md"), r).map_err(|e| e.to_string())
}
