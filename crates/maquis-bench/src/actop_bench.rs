//! `maquis-bench actop`: ActOp's Halo Presence (§6.1, Fig. 10–11), scaled to this machine.
//!
//! Games of `--players` players, each game and each player a virtual actor, placed at random
//! over `--nodes` Maquis nodes (in this process, on loopback). A client request asks a random
//! player for its status; the player asks its game (a call from one virtual actor to another:
//! the message ActOp tries to keep on one node) and answers. Every configuration runs on a
//! fresh cluster, one after the other: `random` (placement only), `local` (prefer-local
//! placement), `actop` (random placement, then pairwise partitioning every `--interval-ms`),
//! `actop+stages` (ActOp, and every node sizes its stages by the queueing model). Each one
//! runs a warm-up (ActOp converges there), a paced phase at each of the `--rate` loads
//! (latency percentiles, remote share, CPU per request, whether it kept up), then a
//! saturation phase (`--clients` closed-loop clients: peak throughput). Throughout, `--churn`
//! percent of the games end a minute and are replaced (players leaving, arriving and moving
//! to new games). Writes `results.json`, `report.md` and plots into `--out`.

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
#[derive(clap::Args, Debug, Clone)]
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
    /// Paced loads, requests per second over all nodes, one after the other (each for the
    /// paced phase's seconds; default 2000,10000,20000; 2000,10000 with --quick).
    #[arg(long = "rate", value_delimiter = ',')]
    pub rates: Vec<u64>,
    /// Share of the graph that changes a minute, percent: that share of the games end every
    /// minute; half of each ended game's players leave, as many new ones arrive, and the
    /// eight form a new game (0: no churn).
    #[arg(long, default_value_t = 1.0)]
    pub churn: f64,
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
    /// node sizes its stages by the queueing model every `--interval-ms`). Default: all four;
    /// random,actop with --quick.
    #[arg(long, value_delimiter = ',')]
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
    /// Each paced load (the fields above are the first one's).
    #[serde(default)]
    pub loads: Vec<LoadResult>,
    /// Games ended by churn (each replaced by a new one; 4 of its players by new players).
    #[serde(default)]
    pub games_ended: u64,
    /// Virtual actors per node at the end.
    pub activations: Vec<usize>,
    /// Threads per stage (receive, execute, send) of each node at the end of the paced phase,
    /// when the nodes size their stages.
    #[serde(default)]
    pub stage_threads: Vec<[u64; 3]>,
}

/// One paced load of a configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LoadResult {
    /// Requests per second offered.
    pub rate: u64,
    /// Requests per second answered (answered over the window's wall time: a window whose
    /// requests could not all be answered within it lasts longer).
    pub achieved_per_s: f64,
    /// Share of player → game calls that crossed nodes.
    pub remote_fraction: f64,
    /// Latency percentiles, µs.
    pub p50_us: u64,
    /// 95th percentile, µs.
    pub p95_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// CPU time of the process per request, µs.
    pub cpu_us_per_request: f64,
    /// Requests that failed or got no answer.
    pub lost: u64,
    /// The latency CDF: the latency (µs) at each hundredth of the answered requests, from
    /// the fastest (index 0) to the slowest (index 100).
    #[serde(default)]
    pub cdf_us: Vec<u64>,
}

impl LoadResult {
    /// Whether the configuration kept up: nothing lost, and at least 95 % of the offered rate
    /// answered.
    pub fn sustained(&self) -> bool {
        self.lost == 0 && self.achieved_per_s >= 0.95 * self.rate as f64
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Player {
    /// Join a game (its key), leaving the one it was in.
    Join(String),
    /// Leave the game and the service.
    Leave,
    /// A client asks for the player's status: the player asks its game.
    Status(ReplyTo<u64>),
}

#[derive(Debug, Serialize, Deserialize)]
enum Game {
    /// A player joined.
    Hello,
    /// A player left.
    Bye,
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
                self.leave(ctx).await;
                if let Ok(g) = ctx.node().virtual_ref::<Game>("game", &game) {
                    let g = g.placement(self.placement);
                    let _ = g.send(Game::Hello).await;
                }
                self.game = Some(game);
            }
            Player::Leave => self.leave(ctx).await,
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

impl PlayerActor {
    /// Tells the game it is in, if any, that it left.
    async fn leave(&mut self, ctx: &mut Context<Player>) {
        if let Some(old) = self.game.take() {
            if let Ok(g) = ctx.node().virtual_ref::<Game>("game", &old) {
                let _ = g.send(Game::Bye).await;
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
            Game::Bye => self.players = self.players.saturating_sub(1),
            Game::Status(reply) => {
                let _ = reply.send(self.players).await;
            }
        }
    }
}

/// Runs the benchmark.
pub fn run(a: &ActopArgs) -> Result<Vec<ConfigResult>, String> {
    let mut a = a.clone();
    if a.rates.is_empty() {
        a.rates = if a.quick {
            vec![2000, 10000]
        } else {
            vec![2000, 10000, 20000]
        };
    }
    if a.configs.is_empty() {
        a.configs = if a.quick {
            vec!["random".into(), "actop".into()]
        } else {
            CONFIGS.iter().map(|c| c.to_string()).collect()
        };
    }
    let a = &a;
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
    if a.nodes < 2 || a.players == 0 || games == 0 || a.rates.contains(&0) || a.clients == 0 {
        return Err(
            "--nodes at least 2; --games, --players, every --rate, --clients at least 1".into(),
        );
    }
    if !(0.0..=6000.0).contains(&a.churn) {
        return Err("--churn is a percentage of the games a minute, 0 to 6000".into());
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
    crate::stats::write_results(&a.out, &results)?;
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
    let placement = if config == "local" {
        Placement::Local
    } else {
        Placement::Random
    };
    let roster = std::sync::RwLock::new(Roster::new(games, a.players));
    let first: Vec<(String, String)> = roster
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .games
        .iter()
        .flat_map(|(g, ps)| ps.iter().map(move |p| (p.clone(), g.clone())))
        .collect();
    for (i, (p, g)) in first.into_iter().enumerate() {
        tell(&nodes[i % nodes.len()], &p, placement, Player::Join(g)).await?;
    }
    let sent = Arc::new(AtomicU64::new(0));
    let handled = Arc::new(AtomicU64::new(0));
    let moves0 = count(&nodes, "virtual_migrations");
    let mut since = share(&nodes, (0, 0)).0;
    let mut timeline = Vec::new();
    let mut churn = Churn {
        per_second: games as f64 * a.churn / 100.0 / 60.0,
        due: 0.0,
        ended: 0,
        told: 0,
    };
    // Warm-up at the first rate, then each paced load; the remote share each second, churn
    // each second.
    let mut loads = Vec::new();
    for _ in 0..warm {
        paced_load(&nodes, &roster, a.rates[0], &sent, &handled).await;
        churn.step(&nodes, &roster, placement).await?;
        let (now, s) = share(&nodes, since);
        since = now;
        timeline.push(s);
    }
    let mut stage_threads = Vec::new();
    for &rate in &a.rates {
        let cpu0 = crate::stats::cpu_seconds();
        let (sent0, handled0) = (
            sent.load(Ordering::Relaxed),
            handled.load(Ordering::Relaxed),
        );
        let started = Instant::now();
        let mut lat = Vec::new();
        let mut shares = Vec::new();
        for _ in 0..paced {
            lat.extend(paced_load(&nodes, &roster, rate, &sent, &handled).await);
            churn.step(&nodes, &roster, placement).await?;
            let (now, s) = share(&nodes, since);
            since = now;
            timeline.push(s);
            shares.push(s);
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu = crate::stats::cpu_seconds() - cpu0;
        let window_sent = sent.load(Ordering::Relaxed) - sent0;
        let window_handled = handled.load(Ordering::Relaxed) - handled0;
        lat.sort_unstable();
        let pct = |p: f64| -> u64 {
            if lat.is_empty() {
                return 0;
            }
            lat[((lat.len() - 1) as f64 * p).round() as usize]
        };
        let load = LoadResult {
            rate,
            achieved_per_s: window_handled as f64 / wall.max(1e-9),
            remote_fraction: shares.iter().sum::<f64>() / shares.len().max(1) as f64,
            p50_us: pct(0.50),
            p95_us: pct(0.95),
            p99_us: pct(0.99),
            cpu_us_per_request: cpu * 1e6 / window_sent.max(1) as f64,
            lost: window_sent - window_handled,
            cdf_us: if lat.is_empty() {
                Vec::new()
            } else {
                (0..=100).map(|c| pct(c as f64 / 100.0)).collect()
            },
        };
        eprintln!(
            "  {rate} req/s: {:.0} answered/s, remote share {:.3}, p50/p95/p99 {}/{}/{} µs, {:.1} µs CPU a request",
            load.achieved_per_s, load.remote_fraction, load.p50_us, load.p95_us, load.p99_us, load.cpu_us_per_request
        );
        loads.push(load);
        if stage_threads.is_empty() {
            stage_threads = nodes
                .iter()
                .filter_map(|n| {
                    let g = n.status().gauges;
                    let t = ["receive", "execute", "send"]
                        .map(|s| g.get(&format!("stage_threads_{s}")).copied());
                    Some([t[0]?, t[1]?, t[2]?])
                })
                .collect();
        }
    }
    let moves = count(&nodes, "virtual_migrations") - moves0;
    let measured = warm + paced * a.rates.len() as u64;
    // Saturation: closed-loop clients.
    let players = roster
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .players
        .clone();
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
    let (sent, handled) = (
        sent.load(Ordering::Relaxed),
        handled.load(Ordering::Relaxed),
    );
    let first = loads[0].clone();
    Ok(ConfigResult {
        config: config.to_string(),
        remote_fraction: first.remote_fraction,
        p50_us: first.p50_us,
        p95_us: first.p95_us,
        p99_us: first.p99_us,
        peak_ops_per_s: peak,
        cpu_us_per_request: first.cpu_us_per_request,
        migrations_per_min: moves as f64 * 60.0 / measured.max(1) as f64,
        sent,
        handled,
        lost: sent - handled,
        timeline,
        loads,
        games_ended: churn.ended,
        activations,
        stage_threads,
    })
}

/// The games and the players in them, as the clients and the churn see them.
struct Roster {
    /// Games being played: the game's key and its players' keys.
    games: Vec<(String, Vec<String>)>,
    /// The players in a game (the clients ask about these).
    players: Vec<String>,
    next_game: u32,
    next_player: u32,
}

impl Roster {
    fn new(games: u32, per_game: u32) -> Self {
        let mut r = Roster {
            games: Vec::with_capacity(games as usize),
            players: Vec::with_capacity((games * per_game) as usize),
            next_game: 0,
            next_player: 0,
        };
        for _ in 0..games {
            let ps: Vec<String> = (0..per_game).map(|_| r.new_player()).collect();
            let g = r.new_game();
            r.players.extend(ps.iter().cloned());
            r.games.push((g, ps));
        }
        r
    }

    fn new_game(&mut self) -> String {
        self.next_game += 1;
        format!("g{}", self.next_game - 1)
    }

    fn new_player(&mut self) -> String {
        self.next_player += 1;
        format!("p{}", self.next_player - 1)
    }

    /// Ends a random game: half its players leave (returned first), as many new ones arrive,
    /// and the stayers with the newcomers form a new game (returned with its players).
    fn end_one(&mut self) -> (Vec<String>, String, Vec<String>) {
        let i = rand::thread_rng().gen_range(0..self.games.len());
        let (_, mut ps) = self.games.swap_remove(i);
        let leaving: Vec<String> = ps.drain(..ps.len() / 2).collect();
        self.players.retain(|p| !leaving.contains(p));
        for _ in 0..leaving.len() {
            let p = self.new_player();
            self.players.push(p.clone());
            ps.push(p);
        }
        let g = self.new_game();
        self.games.push((g.clone(), ps.clone()));
        (leaving, g, ps)
    }
}

/// The churn: games due to end, and those ended.
struct Churn {
    per_second: f64,
    due: f64,
    ended: u64,
    told: u64,
}

impl Churn {
    /// One second's churn: the games due end, their players leave or join a new game.
    async fn step(
        &mut self,
        nodes: &[Node],
        roster: &std::sync::RwLock<Roster>,
        placement: Placement,
    ) -> Result<(), String> {
        self.due += self.per_second;
        while self.due >= 1.0 {
            self.due -= 1.0;
            let (leaving, game, players) =
                roster.write().unwrap_or_else(|e| e.into_inner()).end_one();
            self.ended += 1;
            for p in leaving {
                let node = &nodes[self.told as usize % nodes.len()];
                self.told += 1;
                tell(node, &p, placement, Player::Leave).await?;
            }
            for p in players {
                let node = &nodes[self.told as usize % nodes.len()];
                self.told += 1;
                tell(node, &p, placement, Player::Join(game.clone())).await?;
            }
        }
        Ok(())
    }
}

/// Sends `msg` to `player` from `node`, placing it by `placement` if it is not active.
async fn tell(node: &Node, player: &str, placement: Placement, msg: Player) -> Result<(), String> {
    node.virtual_ref::<Player>("player", player)
        .map_err(|e| e.to_string())?
        .placement(placement)
        .send(msg)
        .await
        .map_err(|e| e.to_string())
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
    roster: &std::sync::RwLock<Roster>,
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
        let p = {
            let r = roster.read().unwrap_or_else(|e| e.into_inner());
            r.players[rand::thread_rng().gen_range(0..r.players.len())].clone()
        };
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

fn rates_list(rates: &[u64]) -> String {
    rates
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",")
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
        "Command: `maquis-bench actop{} --nodes {} --games {games} --players {} --rate {} --churn {} --clients {} --seconds {warm},{paced},{sat} --interval-ms {} --configs {}`  ",
        if a.quick { " --quick" } else { "" },
        a.nodes,
        a.players,
        rates_list(&a.rates),
        a.churn,
        a.clients,
        a.interval_ms,
        a.configs.join(",")
    );
    r.push_str(&crate::stats::setting_lines());
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
        "- Each configuration on a fresh cluster: {warm} s warm-up at the first rate, then {paced} s at each of {} requests/s (open loop: each request a task started on schedule; a second whose requests are not all answered within it lasts longer, so the answered rate shows whether the configuration kept up), then {sat} s with {} closed-loop clients (peak throughput). Churn: {} % of the games end a minute (from the warm-up on); half of an ended game's players leave, as many new players arrive, and the eight form a new game (new virtual actors, placed as the configuration places). `actop`: an exchange every {} ms, 512 candidates, imbalance 10 % of a node's share; `actop+stages`: the same, and every node sizes its receive, execute and send stages by the queueing model at the same interval (all nodes share the process's 2 worker threads, so a node's stage of 2 threads is no limit at all). The table below is the first rate's; the next one has every rate.\n",
        rates_list(&a.rates), a.clients, a.churn, a.interval_ms
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
    let _ = writeln!(
        r,
        "\n## Every load\n\n| config | rate | answered/s | kept up | remote share | p50 µs | p95 µs | p99 µs | CPU µs/req | lost |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in results {
        for l in &c.loads {
            let _ = writeln!(
                r,
                "| {} | {} | {:.0} | {} | {:.3} | {} | {} | {} | {:.1} | {} |",
                c.config,
                l.rate,
                l.achieved_per_s,
                if l.sustained() { "yes" } else { "no" },
                l.remote_fraction,
                l.p50_us,
                l.p95_us,
                l.p99_us,
                l.cpu_us_per_request,
                l.lost
            );
        }
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
        // The highest load random kept up with, and ActOp at the same load.
        let top = rand
            .loads
            .iter()
            .filter(|l| l.sustained())
            .max_by_key(|l| l.rate);
        match top.and_then(|t| Some((t, act.loads.iter().find(|l| l.rate == t.rate)?))) {
            Some((rl, al)) => {
                let drop = 1.0 - al.p99_us as f64 / rl.p99_us.max(1) as f64;
                let _ = writeln!(
                    r,
                    "- p99 ≥ 50 % lower than random at the highest load random sustains ({} requests/s): {:.0} % lower ({} → {} µs; {}).",
                    rl.rate,
                    drop * 100.0,
                    rl.p99_us,
                    al.p99_us,
                    if drop >= 0.5 { "met" } else { "missed" }
                );
            }
            None => {
                let _ = writeln!(
                    r,
                    "- p99 at the highest load random sustains: random kept up with none of the rates; not measured."
                );
            }
        }
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
    r.push_str(&crate::plot::section(&a.out, "plot_actop.py", PLOT_PY, &[]));
    std::fs::write(a.out.join("report.md"), r).map_err(|e| e.to_string())
}

/// Fig. 10(a), (d) and (e) from results.json: the remote share over time, and p99 latency
/// and CPU per request against the offered load, per configuration.
const PLOT_PY: &str = r#"
import json, sys, os
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
cells = json.load(open(os.path.join(out, "results.json")))
fig, ax = plt.subplots(figsize=(7, 4))
for c in cells:
    ax.plot(range(1, len(c["timeline"]) + 1), c["timeline"], label=c["config"])
ax.set_xlabel("seconds since the warm-up began")
ax.set_ylabel("remote share of player-game calls")
ax.set_ylim(0, 1)
ax.legend()
ax.set_title("Remote messages over time (cf. Fig. 10a)")
fig.tight_layout()
fig.savefig(os.path.join(out, "remote_share.png"), dpi=120)
print("remote_share.png")
loads = {l["rate"] for c in cells for l in c.get("loads", [])}
if loads:
    top = max(loads)
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in cells:
        for l in c.get("loads", []):
            if l["rate"] == top and l.get("cdf_us"):
                ax.plot(l["cdf_us"], [i / 100 for i in range(len(l["cdf_us"]))], label=c["config"])
    ax.set_xscale("log")
    ax.set_xlabel("request latency (µs)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"Latency CDF at {top} requests/s (cf. Fig. 10b)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "latency_cdf.png"), dpi=120)
    print("latency_cdf.png")
for key, label, name, title in [
    ("p99_us", "p99 latency (µs)", "p99_by_load.png", "p99 latency by load (cf. Fig. 10d)"),
    ("cpu_us_per_request", "CPU µs per request", "cpu_by_load.png", "CPU per request by load (cf. Fig. 10e)"),
]:
    fig, ax = plt.subplots(figsize=(7, 4))
    for c in cells:
        loads = c.get("loads", [])
        if loads:
            ax.plot([l["rate"] for l in loads], [l[key] for l in loads], marker="o", label=c["config"])
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel(label)
    if key == "p99_us":
        ax.set_yscale("log")
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=120)
    print(name)
"#;
