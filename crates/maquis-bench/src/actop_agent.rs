//! `maquis-bench agent halo-node`: one server of the Halo Presence benchmark, a Maquis node in
//! a process of its own. It hosts players and games (virtual actors), and runs its share of
//! the clients: the driver sends it commands as JSON lines on stdin and reads one JSON answer
//! line per command on stdout.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use maquis::virtual_actors::Placement;
use maquis::{Actor, Config, Context, Node, ReplyTo};
use serde::{Deserialize, Serialize};

/// How long a client waits for a player's answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Players named in one command at most (a second's share of the clients' requests, or the
/// whole roster for the saturation phase).
pub const MAX_NAMES: usize = 1 << 20;

/// Players a game keeps track of at most (a game has `--players` of them; a join beyond is
/// not tracked, and that player gets no updates).
const MAX_PLAYERS_PER_GAME: usize = 64;

#[derive(Debug, Serialize, Deserialize)]
enum Player {
    /// Join a game (its key), leaving the one it was in.
    Join(String),
    /// Leave the game and the service.
    Leave,
    /// A client asks for the player's status: the player calls its game.
    Status(ReplyTo<u64>),
    /// The game's news (its players' count): the player answers with an [`Game::Ack`].
    Update(u64),
}

#[derive(Debug, Serialize, Deserialize)]
enum Game {
    /// A player (its key) joined.
    Hello(String),
    /// A player left.
    Bye(String),
    /// A player asks for the game's status: the game sends every player an update and
    /// answers with how many players it has.
    Status(ReplyTo<u64>),
    /// A player got an update.
    Ack,
}

struct PlayerActor {
    key: String,
    game: Option<String>,
    /// The players' count in its game's last update.
    last: u64,
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
                    let _ = g.send(Game::Hello(self.key.clone())).await;
                }
                self.game = Some(game);
            }
            Player::Leave => self.leave(ctx).await,
            Player::Status(reply) => {
                let Some(game) = &self.game else {
                    // Out of a game: the last news it had.
                    let _ = reply.send(self.last).await;
                    return;
                };
                let Ok(g) = ctx.node().virtual_ref::<Game>("game", game) else {
                    return;
                };
                if let Ok(n) = g.call(Game::Status, CALL_TIMEOUT).await {
                    let _ = reply.send(n).await;
                }
            }
            Player::Update(n) => {
                self.last = n;
                if let Some(game) = &self.game {
                    if let Ok(g) = ctx.node().virtual_ref::<Game>("game", game) {
                        let _ = g.send(Game::Ack).await;
                    }
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
                let _ = g.send(Game::Bye(self.key.clone())).await;
            }
        }
    }
}

struct GameActor {
    players: std::collections::BTreeSet<String>,
}

impl Actor for GameActor {
    type Msg = Game;
    async fn handle(&mut self, msg: Game, ctx: &mut Context<Game>) {
        match msg {
            Game::Hello(p) => {
                if self.players.len() < MAX_PLAYERS_PER_GAME {
                    self.players.insert(p);
                }
            }
            Game::Bye(p) => {
                self.players.remove(&p);
            }
            Game::Status(reply) => {
                // Halo Presence: the game sends its news to its players (one-way: the asking
                // player waits for this answer, and reads its update after it), then answers.
                let n = self.players.len() as u64;
                for p in &self.players {
                    if let Ok(r) = ctx.node().virtual_ref::<Player>("player", p) {
                        let _ = r.send(Player::Update(n)).await;
                    }
                }
                let _ = reply.send(n).await;
            }
            // The answer's cost is the point (the paper's 18 messages a request).
            Game::Ack => {}
        }
    }
}

/// `maquis-bench agent halo-node`.
#[derive(clap::Args, Debug)]
pub struct HaloNodeArgs {
    /// This node's index (its name is `halo<index>`).
    #[arg(long)]
    pub index: usize,
    /// Listen address.
    #[arg(long)]
    pub listen: SocketAddr,
    /// A member to join (none for the first node).
    #[arg(long)]
    pub join: Option<SocketAddr>,
    /// Nodes in the cluster: `ready` is printed once this node sees them all.
    #[arg(long)]
    pub nodes: usize,
    /// `random`, `local`, `actop` or `actop+stages`.
    #[arg(long)]
    pub config: String,
    /// ActOp's exchange interval and the stage controller's, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    /// ActOp's imbalance bound, activations.
    #[arg(long, default_value_t = 64)]
    pub imbalance: usize,
}

/// A command from the driver.
#[derive(Debug, Serialize, Deserialize)]
pub enum Command {
    /// Tell players to join a game (`Some`) or leave (`None`), in order.
    Tell(Vec<(String, Option<String>)>),
    /// One second of open-loop requests: each named player asked once, the requests spread
    /// evenly over the second, each a task of its own started on schedule.
    Paced(Vec<String>),
    /// Closed-loop clients for `secs` seconds, each asking a random one of `players`.
    Closed {
        /// Clients.
        clients: usize,
        /// Seconds.
        secs: u64,
        /// The players they ask about.
        players: Vec<String>,
    },
    /// The node's counters.
    Stats,
}

/// The answer to a command.
#[derive(Debug, Serialize, Deserialize)]
pub enum Answer {
    /// The players were told: how many.
    Told {
        /// Players told.
        players: usize,
    },
    /// Latencies (µs) of the answered requests, and how many were sent.
    Paced {
        /// One per answered request.
        lat_us: Vec<u64>,
        /// Requests sent.
        sent: u64,
    },
    /// Requests sent and answered by the closed-loop clients.
    Closed {
        /// Requests sent.
        sent: u64,
        /// Requests answered.
        handled: u64,
    },
    /// The node's counters.
    Stats(NodeStats),
}

/// What the driver reads from a node.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeStats {
    /// Player → game messages that stayed on a node.
    pub sent_local: u64,
    /// Player → game messages that crossed nodes.
    pub sent_remote: u64,
    /// Actors moved away from this node.
    pub migrations: u64,
    /// Actors moved to this node whose hand-over ended here (the cluster's sum equals that
    /// of `migrations` when no move is under way).
    pub arrivals: u64,
    /// Messages to virtual actors this node refused (a call among them fails; a tell is lost).
    pub refused: u64,
    /// Virtual actors active here.
    pub activations: usize,
    /// Threads of the receive, execute and send stages, when sized.
    pub stage_threads: Option<[u64; 3]>,
}

/// The placement a configuration gives new activations.
pub fn placement(config: &str) -> Placement {
    if config == "local" {
        Placement::Local
    } else {
        Placement::Random
    }
}

/// Runs the node until stdin closes: prints `ready` once the cluster has formed, then answers
/// each command line.
pub async fn node(a: HaloNodeArgs) -> Result<(), String> {
    if !crate::actop_bench::CONFIGS.contains(&a.config.as_str()) {
        return Err(format!("unknown configuration {:?}", a.config));
    }
    let mut cfg = Config::new(format!("halo{}", a.index))
        .listen(a.listen)
        .cookie("actop-bench");
    cfg.services.virtual_idle_ms = 0;
    if a.config.starts_with("actop") {
        cfg.services.actop_interval_ms = a.interval_ms;
        cfg.services.actop_candidates = 512;
        cfg.services.actop_imbalance = a.imbalance;
    }
    if a.config == "actop+stages" {
        cfg.services.stage_interval_ms = a.interval_ms;
    }
    let node = Node::start(cfg).await.map_err(|e| e.to_string())?;
    let placement = placement(&a.config);
    node.register_virtual("player", move |key: &str| PlayerActor {
        key: key.to_string(),
        game: None,
        last: 0,
        placement,
    })
    .map_err(|e| e.to_string())?;
    node.register_virtual("game", |_key: &str| GameActor {
        players: std::collections::BTreeSet::new(),
    })
    .map_err(|e| e.to_string())?;
    println!("started");
    if let Some(seed) = a.join {
        node.join_wait(seed, Duration::from_secs(20))
            .await
            .map_err(|e| e.to_string())?;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while node.members().len() < a.nodes {
        if Instant::now() > deadline {
            return Err(format!("halo{}: the cluster did not form in 30 s", a.index));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("ready");
    let mut lines =
        tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = match serde_json::from_str::<Command>(&line) {
            Ok(cmd) => run(&node, placement, cmd).await,
            Err(e) => Err(format!("bad command: {e}")),
        };
        match answer {
            Ok(a) => println!("{}", serde_json::to_string(&a).map_err(|e| e.to_string())?),
            Err(e) => println!("error {e}"),
        }
    }
    node.shutdown().await;
    Ok(())
}

async fn run(node: &Node, placement: Placement, cmd: Command) -> Result<Answer, String> {
    match cmd {
        Command::Tell(told) => {
            let players = told.len();
            for (p, game) in told {
                let msg = match game {
                    Some(g) => Player::Join(g),
                    None => Player::Leave,
                };
                node.virtual_ref::<Player>("player", &p)
                    .map_err(|e| e.to_string())?
                    .placement(placement)
                    .send(msg)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Ok(Answer::Told { players })
        }
        Command::Paced(players) => {
            if players.len() > MAX_NAMES {
                return Err(format!("more than {MAX_NAMES} players in a second"));
            }
            let gap = Duration::from_secs(1) / players.len().max(1) as u32;
            let start = tokio::time::Instant::now();
            let sent = players.len() as u64;
            let mut tasks = Vec::with_capacity(players.len());
            for (i, p) in players.into_iter().enumerate() {
                tokio::time::sleep_until(start + gap * i as u32).await;
                let node = node.clone();
                tasks.push(tokio::spawn(async move { ask(&node, &p).await }));
            }
            // The second lasts a second even when the last request is answered sooner.
            tokio::time::sleep_until(start + Duration::from_secs(1)).await;
            let mut lat_us = Vec::with_capacity(tasks.len());
            for t in tasks {
                if let Ok(Some(us)) = t.await {
                    lat_us.push(us);
                }
            }
            Ok(Answer::Paced { lat_us, sent })
        }
        Command::Closed {
            clients,
            secs,
            players,
        } => {
            if players.is_empty() || players.len() > MAX_NAMES {
                return Err(format!("1 to {MAX_NAMES} players"));
            }
            let players = Arc::new(players);
            let sent = Arc::new(AtomicU64::new(0));
            let handled = Arc::new(AtomicU64::new(0));
            let stop = Instant::now() + Duration::from_secs(secs);
            let mut tasks = Vec::new();
            for _ in 0..clients {
                let (node, players) = (node.clone(), players.clone());
                let (sent, handled) = (sent.clone(), handled.clone());
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < stop {
                        let i = rand::Rng::gen_range(&mut rand::thread_rng(), 0..players.len());
                        sent.fetch_add(1, Ordering::Relaxed);
                        if ask(&node, &players[i]).await.is_some() {
                            handled.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            Ok(Answer::Closed {
                sent: sent.load(Ordering::Relaxed),
                handled: handled.load(Ordering::Relaxed),
            })
        }
        Command::Stats => {
            // Not one atomic reading: a move may start or end between the two, which the
            // driver sees in its next reading.
            let activations = node.activations();
            let c = node.counters().snapshot();
            let g = node.status().gauges;
            let t = ["receive", "execute", "send"]
                .map(|s| g.get(&format!("stage_threads_{s}")).copied());
            Ok(Answer::Stats(NodeStats {
                sent_local: c["virtual_sent_local"],
                sent_remote: c["virtual_sent_remote"],
                migrations: c["virtual_migrations"],
                arrivals: c["virtual_arrivals"],
                refused: c["virtual_refused"],
                activations,
                stage_threads: (|| Some([t[0]?, t[1]?, t[2]?]))(),
            }))
        }
    }
}

/// Asks `player` for its status; the latency in µs if it was answered.
async fn ask(node: &Node, player: &str) -> Option<u64> {
    let r = node.virtual_ref::<Player>("player", player).ok()?;
    let t = Instant::now();
    r.call(Player::Status, CALL_TIMEOUT).await.ok()?;
    Some(t.elapsed().as_micros() as u64)
}
