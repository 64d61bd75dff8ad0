//! `maquis-bench actop`: ActOp's Halo Presence (§6.1, Fig. 10–11), scaled to this machine.
//!
//! Games of `--players` players, each game and each player a virtual actor, placed at random
//! over `--nodes` Maquis nodes (each a process of its own, `maquis-bench agent halo-node`, on
//! loopback; each node also runs its share of the clients). A client request asks a random
//! player for its status; the player calls its game, which sends an update to each of its
//! players (each answers the game with an acknowledgement) and answers the player: as in the
//! paper, 18 messages between virtual actors a request, the messages ActOp tries to keep on
//! one node. Every configuration runs on a
//! fresh cluster, one after the other: `random` (placement only), `local` (prefer-local
//! placement), `actop` (random placement, then pairwise partitioning every `--interval-ms`),
//! `actop+stages` (ActOp, and every node sizes its stages by the queueing model). Each one
//! runs a warm-up (ActOp converges there), a paced phase at each of the `--rate` loads
//! (latency percentiles, remote share, CPU per request, whether it kept up), then a
//! saturation phase (`--clients` closed-loop clients: peak throughput). Throughout, `--churn`
//! percent of the games end a minute and are replaced (players leaving, arriving and moving
//! to new games). Writes `results.json`, `report.md` and plots into `--out`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::actop_agent::{Answer, Command, NodeStats};
use crate::ring_proc::Proc;

/// `maquis-bench actop`.
#[derive(clap::Args, Debug, Clone)]
pub struct ActopArgs {
    /// A short run: fewer games and seconds.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json and report.md go (with --quick and no --out: target/bench-quick/actop).
    #[arg(long, default_value = "bench/results/actop")]
    pub out: PathBuf,
    /// Nodes (each a process of its own).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Games (default 1,000; 500 with --quick).
    #[arg(long)]
    pub games: Option<u32>,
    /// Players per game.
    #[arg(long, default_value_t = 8)]
    pub players: u32,
    /// Paced loads, requests per second over all nodes, one after the other (each for the
    /// paced phase's seconds; default 1000,2000,4000,6000; 1000,4000 with --quick).
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
    /// Seconds of warm-up, of the paced phase, and of the saturation phase (default 120, 10,
    /// 10; 30, 5, 5 with --quick). ActOp converges during the warm-up (9,000 actors on 4
    /// nodes take about 90 s from random placement).
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
pub const CONFIGS: [&str; 4] = ["random", "local", "actop", "actop+stages"];

/// One configuration's measurement, as results.json holds it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfigResult {
    /// `random`, `local` or `actop`.
    pub config: String,
    /// Share of the messages between virtual actors (player ↔ game) that crossed nodes in the
    /// paced phase.
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
    /// Actors moved per minute in the paced phase (at steady state; `moves_timeline` has the
    /// warm-up's too).
    pub migrations_per_min: f64,
    /// Requests sent, in both measured phases.
    pub sent: u64,
    /// Requests answered.
    pub handled: u64,
    /// Requests that failed or got no answer.
    pub lost: u64,
    /// Remote share of the messages between virtual actors per second, from the start of
    /// the warm-up.
    pub timeline: Vec<f64>,
    /// Actors moved in each second, from the start of the warm-up.
    #[serde(default)]
    pub moves_timeline: Vec<u64>,
    /// Each paced load (the fields above are the first one's).
    #[serde(default)]
    pub loads: Vec<LoadResult>,
    /// Games ended by churn (each replaced by a new one; 4 of its players by new players).
    #[serde(default)]
    pub games_ended: u64,
    /// Virtual actors per node at the end.
    pub activations: Vec<usize>,
    /// Messages to virtual actors the nodes refused over the whole run (tells among them —
    /// the churn's joins and leaves — are lost).
    #[serde(default)]
    pub refused: u64,
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
    /// Share of the messages between virtual actors that crossed nodes.
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

/// Runs the benchmark.
pub fn run(a: &ActopArgs) -> Result<Vec<ConfigResult>, String> {
    let mut a = a.clone();
    if a.rates.is_empty() {
        a.rates = if a.quick {
            vec![1000, 4000]
        } else {
            vec![1000, 2000, 4000, 6000]
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
        vec![120, 10, 10]
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
    if a.base_port as usize + a.configs.len() * a.nodes > u16::MAX as usize {
        return Err(
            "--base-port plus a port per node and configuration passes the last port".into(),
        );
    }
    let mut results = Vec::new();
    for (i, config) in a.configs.iter().enumerate() {
        eprintln!(
            "actop: {config}: {} nodes, {games} games of {} players",
            a.nodes, a.players
        );
        let port = a.base_port + (i * a.nodes) as u16;
        let r = one(a, config, games, port, (warm, paced, sat))?;
        eprintln!(
            "  remote share {:.3}, p50/p95/p99 {}/{}/{} µs, peak {:.0} req/s, {:.1} µs CPU a request, {:.0} moves/min",
            r.remote_fraction, r.p50_us, r.p95_us, r.p99_us, r.peak_ops_per_s, r.cpu_us_per_request, r.migrations_per_min
        );
        results.push(r);
    }
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

/// The node processes of one configuration.
struct Cluster {
    procs: Vec<Proc>,
}

/// How long a command may take to answer (a paced second that falls behind lasts longer; a
/// request times out after 5 s).
const ANSWER_LIMIT: Duration = Duration::from_secs(120);
/// How long the final reading waits for moves under way to end.
const SETTLE_FOR: Duration = Duration::from_secs(10);

impl Cluster {
    /// Starts `a.nodes` node processes on ports `port`, `port + 1`, …, and waits until each
    /// sees them all.
    fn start(a: &ActopArgs, config: &str, games: u32, port: u16) -> Result<Cluster, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(a.out.join("agents.log"))
            .map_err(|e| e.to_string())?;
        let addr = |i: usize| SocketAddr::from(([127, 0, 0, 1], port + i as u16));
        let imbalance = ((games * (a.players + 1)) as usize / a.nodes / 10).max(4);
        let mut procs = Vec::with_capacity(a.nodes);
        for i in 0..a.nodes {
            let mut cmd = std::process::Command::new(&exe);
            cmd.env("RUST_LOG", crate::stats::agent_log_filter())
                .args(["agent", "halo-node", "--index", &i.to_string()])
                .args(["--listen", &addr(i).to_string()])
                .args(["--nodes", &a.nodes.to_string(), "--config", config])
                .args(["--interval-ms", &a.interval_ms.to_string()])
                .args(["--imbalance", &imbalance.to_string()]);
            if i > 0 {
                cmd.args(["--join", &addr(0).to_string()]);
            }
            let what = format!("halo{i}");
            let mut p = Proc::start(
                &what,
                cmd,
                log.try_clone().map_err(|e| e.to_string())?.into(),
            )?;
            p.expect(&["started"], Duration::from_secs(60))?;
            procs.push(p);
        }
        for p in &mut procs {
            p.expect(&["ready"], Duration::from_secs(60))?;
        }
        Ok(Cluster { procs })
    }

    /// Sends each node its command, then waits for every answer.
    fn all(&mut self, cmds: Vec<Command>) -> Result<Vec<Answer>, String> {
        for (p, c) in self.procs.iter_mut().zip(cmds) {
            p.command(&c)?;
        }
        self.procs
            .iter_mut()
            .map(|p| p.answer(ANSWER_LIMIT))
            .collect()
    }

    fn stats(&mut self) -> Result<Vec<NodeStats>, String> {
        let n = self.procs.len();
        self.all((0..n).map(|_| Command::Stats).collect())?
            .into_iter()
            .map(|a| match a {
                Answer::Stats(s) => Ok(s),
                other => Err(format!("expected stats, got {other:?}")),
            })
            .collect()
    }

    /// The nodes' counters when no move is under way (every actor moved away has arrived) and
    /// two readings in a row agree on every node's activations and moves (a move that starts
    /// or ends while one node is read changes the next reading), read again until so, for up
    /// to [`SETTLE_FOR`]: activations counted once each. The last reading, with a warning, if
    /// moves never stopped.
    fn settled(&mut self) -> Result<Vec<NodeStats>, String> {
        let deadline = Instant::now() + SETTLE_FOR;
        let mut last = Vec::new();
        loop {
            let stats = self.stats()?;
            let moved: u64 = stats.iter().map(|s| s.migrations).sum();
            let arrived: u64 = stats.iter().map(|s| s.arrivals).sum();
            let now: Vec<_> = stats
                .iter()
                .map(|s| (s.activations, s.migrations, s.arrivals))
                .collect();
            if moved == arrived && now == last {
                return Ok(stats);
            }
            last = now;
            if Instant::now() >= deadline {
                tracing::warn!(
                    moved,
                    arrived,
                    "moves still under way: activations read anyway"
                );
                return Ok(stats);
            }
            // Another process's state: nothing to await but another reading.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The CPU seconds of the node processes so far.
    fn cpu(&self) -> f64 {
        self.procs
            .iter()
            .map(|p| crate::stats::cpu_seconds_of(p.pid()))
            .sum()
    }

    /// Tells players, `(player, game)` (`None`: leave), spreading them round robin from
    /// node `*next` on.
    fn tell(&mut self, told: Vec<(String, Option<String>)>, next: &mut u64) -> Result<(), String> {
        let n = self.procs.len();
        let mut per: Vec<Vec<_>> = vec![Vec::new(); n];
        for t in told {
            per[*next as usize % n].push(t);
            *next += 1;
        }
        let want: Vec<usize> = per.iter().map(Vec::len).collect();
        let got = self.all(per.into_iter().map(Command::Tell).collect())?;
        for (a, want) in got.into_iter().zip(want) {
            if !matches!(a, Answer::Told { players } if players == want) {
                return Err(format!("expected {want} players told, got {a:?}"));
            }
        }
        Ok(())
    }

    /// One second of requests at `rate`, spread round robin over the nodes, each about a
    /// random player; the latencies (µs) of those answered, and how many were sent.
    fn paced(&mut self, roster: &Roster, rate: u64) -> Result<(Vec<u64>, u64), String> {
        let n = self.procs.len();
        let mut per: Vec<Vec<String>> = vec![Vec::new(); n];
        let mut rng = rand::thread_rng();
        for i in 0..rate as usize {
            let p = &roster.players[rng.gen_range(0..roster.players.len())];
            per[i % n].push(p.clone());
        }
        let (mut lat, mut sent) = (Vec::with_capacity(rate as usize), 0);
        for a in self.all(per.into_iter().map(Command::Paced).collect())? {
            match a {
                Answer::Paced { lat_us, sent: s } => {
                    lat.extend(lat_us);
                    sent += s;
                }
                other => return Err(format!("expected paced, got {other:?}")),
            }
        }
        Ok((lat, sent))
    }

    fn shutdown(self) {
        for p in self.procs {
            p.stop(Duration::from_secs(10));
        }
    }
}

/// The remote share of the messages between virtual actors since `(local, remote)`.
fn share(stats: &[NodeStats], since: (u64, u64)) -> ((u64, u64), f64) {
    let now = (
        stats.iter().map(|s| s.sent_local).sum::<u64>(),
        stats.iter().map(|s| s.sent_remote).sum::<u64>(),
    );
    let (l, r) = (now.0 - since.0, now.1 - since.1);
    (now, r as f64 / (l + r).max(1) as f64)
}

fn one(
    a: &ActopArgs,
    config: &str,
    games: u32,
    port: u16,
    secs: (u64, u64, u64),
) -> Result<ConfigResult, String> {
    let cluster = Cluster::start(a, config, games, port)?;
    let mut run = Run {
        cluster,
        roster: Roster::new(games, a.players),
        told: 0,
        churn: Churn {
            per_second: games as f64 * a.churn / 100.0 / 60.0,
            due: 0.0,
            ended: 0,
        },
        since: (0, 0),
        timeline: Vec::new(),
        moves: 0,
        moves_timeline: Vec::new(),
        sent: 0,
        handled: 0,
    };
    let r = measure(a, &mut run, secs);
    run.cluster.shutdown();
    r.map(|mut r| {
        r.config = config.to_string();
        r
    })
}

/// A configuration's run: its cluster, the roster, the churn and the counts so far.
struct Run {
    cluster: Cluster,
    roster: Roster,
    /// Players told so far (the next tell goes to node `told % nodes`).
    told: u64,
    churn: Churn,
    /// Player → game calls (local, remote) counted so far.
    since: (u64, u64),
    /// The remote share of each second.
    timeline: Vec<f64>,
    /// Actors moved so far, and in each second.
    moves: u64,
    moves_timeline: Vec<u64>,
    /// Requests sent and answered so far.
    sent: u64,
    handled: u64,
}

impl Run {
    /// One second at `rate`, then that second's churn and remote share: the latencies of the
    /// answered requests, how many were sent, and the share.
    fn second(&mut self, rate: u64) -> Result<(Vec<u64>, u64, f64), String> {
        let (lat, sent) = self.cluster.paced(&self.roster, rate)?;
        self.sent += sent;
        self.handled += lat.len() as u64;
        let told = self.churn.step(&mut self.roster);
        self.cluster.tell(told, &mut self.told)?;
        let stats = self.cluster.stats()?;
        let (now, s) = share(&stats, self.since);
        self.since = now;
        self.timeline.push(s);
        let moves = stats.iter().map(|s| s.migrations).sum::<u64>();
        self.moves_timeline.push(moves - self.moves);
        self.moves = moves;
        Ok((lat, sent, s))
    }
}

fn measure(
    a: &ActopArgs,
    run: &mut Run,
    (warm, paced, sat): (u64, u64, u64),
) -> Result<ConfigResult, String> {
    // Players join their games, placed as the configuration places them.
    let first: Vec<(String, Option<String>)> = run
        .roster
        .games
        .iter()
        .flat_map(|(g, ps)| ps.iter().map(move |p| (p.clone(), Some(g.clone()))))
        .collect();
    run.cluster.tell(first, &mut run.told)?;
    let stats0 = run.cluster.stats()?;
    run.moves = stats0.iter().map(|s| s.migrations).sum();
    run.since = share(&stats0, (0, 0)).0;
    // Warm-up at the first rate, then each paced load.
    for _ in 0..warm {
        run.second(a.rates[0])?;
    }
    let mut loads = Vec::new();
    let mut stage_threads = Vec::new();
    for &rate in &a.rates {
        let cpu0 = run.cluster.cpu();
        let started = Instant::now();
        let mut lat = Vec::new();
        let mut shares = Vec::new();
        let mut window_sent = 0;
        for _ in 0..paced {
            let (l, s, share) = run.second(rate)?;
            window_sent += s;
            lat.extend(l);
            shares.push(share);
        }
        let wall = started.elapsed().as_secs_f64();
        let cpu = run.cluster.cpu() - cpu0;
        let window_handled = lat.len() as u64;
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
            stage_threads = run
                .cluster
                .stats()?
                .iter()
                .filter_map(|s| s.stage_threads)
                .collect();
        }
    }
    let paced_moves: u64 = run.moves_timeline[warm as usize..].iter().sum();
    let measured = paced * a.rates.len() as u64;
    // Saturation: closed-loop clients, spread over the nodes.
    let n = run.cluster.procs.len();
    let cmds = (0..n)
        .map(|i| Command::Closed {
            clients: a.clients / n + usize::from(i < a.clients % n),
            secs: sat,
            players: run.roster.players.clone(),
        })
        .collect();
    let mut done = 0;
    for ans in run.cluster.all(cmds)? {
        match ans {
            Answer::Closed { sent, handled } => {
                run.sent += sent;
                run.handled += handled;
                done += handled;
            }
            other => return Err(format!("expected closed, got {other:?}")),
        }
    }
    let peak = done as f64 / sat.max(1) as f64;
    let end = run.cluster.settled()?;
    let activations = end.iter().map(|s| s.activations).collect();
    let refused = end.iter().map(|s| s.refused).sum();
    let first = loads[0].clone();
    Ok(ConfigResult {
        config: String::new(),
        remote_fraction: first.remote_fraction,
        p50_us: first.p50_us,
        p95_us: first.p95_us,
        p99_us: first.p99_us,
        peak_ops_per_s: peak,
        cpu_us_per_request: first.cpu_us_per_request,
        migrations_per_min: paced_moves as f64 * 60.0 / measured.max(1) as f64,
        sent: run.sent,
        handled: run.handled,
        lost: run.sent - run.handled,
        timeline: run.timeline.clone(),
        moves_timeline: run.moves_timeline.clone(),
        loads,
        games_ended: run.churn.ended,
        activations,
        refused,
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
}

impl Churn {
    /// One second's churn: the games due end; what their players are told (leave, or join
    /// the new game).
    fn step(&mut self, roster: &mut Roster) -> Vec<(String, Option<String>)> {
        let mut told = Vec::new();
        self.due += self.per_second;
        while self.due >= 1.0 {
            self.due -= 1.0;
            let (leaving, game, players) = roster.end_one();
            self.ended += 1;
            told.extend(leaving.into_iter().map(|p| (p, None)));
            told.extend(players.into_iter().map(|p| (p, Some(game.clone()))));
        }
        told
    }
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
        "- {} Maquis nodes, each a process of its own (`maquis-bench agent halo-node`, a tokio runtime of as many worker threads as cores), full mesh on 127.0.0.1; all share this machine's cores. {games} games of {} players: {} virtual actors, placed by the first message to each: at random (the Orleans baseline; `random`, `actop`), or on the sender's node (`local`: a player on the node that sends it its game, spread round robin; a game on the node of its first player). The clients run inside the node processes (the driver hands each node its share of every second's requests, round robin, each about a random player): a request asks a player for its status; the player calls its game, which sends each of its players an update (each answers with an acknowledgement) and answers the player: 18 messages between virtual actors a request, as in the paper's Halo Presence. CPU per request is the node processes' CPU time (clients included) over the requests sent. The paper's cluster had 10+ servers and 100,000s of players; this is the shape of its experiment at the size of two cores.",
        a.nodes,
        a.players,
        games * (a.players + 1)
    );
    let _ = writeln!(
        r,
        "- Each configuration on a fresh cluster: {warm} s warm-up at the first rate, then {paced} s at each of {} requests/s (open loop: each request a task started on schedule; a second whose requests are not all answered within it lasts longer, so the answered rate shows whether the configuration kept up), then {sat} s with {} closed-loop clients (peak throughput). Churn: {} % of the games end a minute (from the warm-up on); half of an ended game's players leave, as many new players arrive, and the eight form a new game (new virtual actors, placed as the configuration places). `actop`: an exchange every {} ms, 512 candidates, imbalance 10 % of a node's share; `actop+stages`: the same, and every node sizes its receive, execute and send stages by the queueing model at the same interval (the node processes share the machine's 2 cores). The table below is the first rate's (moves/min: over all the paced seconds); the next one has every rate.\n",
        rates_list(&a.rates), a.clients, a.churn, a.interval_ms
    );
    let _ = writeln!(r, "## Results\n");
    let _ = writeln!(
        r,
        "| config | remote share | p50 µs | p95 µs | p99 µs | peak req/s | CPU µs/req | moves/min | sent | handled | lost | refused | actors per node | stage threads r/e/s per node |"
    );
    let _ = writeln!(
        r,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in results {
        let _ = writeln!(
            r,
            "| {} | {:.3} | {} | {} | {} | {:.0} | {:.1} | {:.0} | {} | {} | {} | {} | {:?} | {} |",
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
            c.refused,
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
    let _ = writeln!(
        r,
        "\n## Moves per minute over time (each 10 s, warm-up first)\n"
    );
    for c in results {
        let line: Vec<String> = c
            .moves_timeline
            .chunks(10)
            .map(|w| {
                format!(
                    "{:.0}",
                    w.iter().sum::<u64>() as f64 * 60.0 / w.len() as f64
                )
            })
            .collect();
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
ax.set_ylabel("remote share of actor-to-actor messages")
ax.set_ylim(0, 1)
ax.legend()
ax.set_title("Remote messages over time (cf. Fig. 10a)")
fig.tight_layout()
fig.savefig(os.path.join(out, "remote_share.png"), dpi=120)
print("remote_share.png")
fig, ax = plt.subplots(figsize=(7, 4))
for c in cells:
    m = c.get("moves_timeline", [])
    w = [m[i:i + 10] for i in range(0, len(m), 10)]
    ax.plot([10 * (i + 1) for i in range(len(w))], [sum(x) * 60 / len(x) for x in w], label=c["config"])
ax.set_xlabel("seconds since the warm-up began")
ax.set_ylabel("actors moved per minute (10 s windows)")
ax.legend()
ax.set_title("Migrations over time (cf. Fig. 10c)")
fig.tight_layout()
fig.savefig(os.path.join(out, "moves.png"), dpi=120)
print("moves.png")
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
