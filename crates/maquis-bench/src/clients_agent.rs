//! The processes of `maquis-bench clients`: one client-server overlay server, and swarms of client
//! nodes (many nodes in one process) that push their state to the server, as the clients of
//! PARTISAN's advertisement counter (Fig. 9) do.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use maquis::config::ClientServerOptions;
use maquis::overlay::Role;
use maquis::{ActorRef, Config, Inbox, Node};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;
use tokio::sync::watch;

/// The name of the actor that takes client states, on the server and on every client.
pub const SINK: &str = "sink";
/// The server's node name.
pub const SERVER: &str = "server";

/// One client's state (its counter), pushed every period.
#[derive(Debug, Serialize, Deserialize)]
pub struct StateMsg {
    /// The client's index.
    pub from: u32,
    /// The state's bytes.
    #[serde(with = "maquis::payload::shared")]
    pub state: Bytes,
}

/// Options of the server process.
#[derive(Args, Debug)]
pub struct CsServerArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Time the sink takes per state (a merge into a large state, say), in microseconds.
    #[arg(long, default_value_t = 1000)]
    pub merge_us: u64,
    /// The node-wide bound on outbound queues (`node_queue_bytes`), MiB.
    #[arg(long, default_value_t = 512)]
    pub node_queue_mib: usize,
    /// How often the server sends changed records to its neighbours, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub sync_ms: u64,
}

/// Options of a swarm of clients.
#[derive(Args, Debug)]
pub struct CsClientsArgs {
    /// The server's address.
    #[arg(long)]
    pub server: SocketAddr,
    /// Index of the first client (names are `c0000`, `c0001`, …).
    #[arg(long)]
    pub first: usize,
    /// How many client nodes this process runs.
    #[arg(long)]
    pub count: usize,
    /// Bytes of state each client pushes per period.
    #[arg(long, default_value_t = 16 * 1024)]
    pub state_bytes: usize,
    /// The push period, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub period_ms: u64,
    /// Every period a client also sends its state to one other client (relayed by the
    /// server) out of `relay_total` clients in all; 0: no relay.
    #[arg(long, default_value_t = 0)]
    pub relay_total: usize,
}

/// What the server reports on `stats`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ServerStats {
    /// Resident memory, KiB.
    pub rss_kib: u64,
    /// Peak resident memory so far, KiB.
    pub hwm_kib: u64,
    /// Members the server sees (itself included).
    pub members: usize,
    /// Neighbours: attached clients (and other servers).
    pub neighbors: usize,
    /// States the sink has merged.
    pub merged: u64,
    /// Bytes queued on all outbound lanes together.
    pub queued_bytes: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// The runtime's counters.
    pub counters: std::collections::BTreeMap<String, u64>,
}

/// What a swarm reports on `stats`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SwarmStats {
    /// States delivered into the server's lanes.
    pub sent: u64,
    /// States relayed to another client that the runtime took.
    pub relayed: u64,
    /// Sends that failed (with the first error).
    pub errors: u64,
    /// The first error.
    pub first_error: Option<String>,
    /// States that arrived at this swarm's clients from other clients.
    pub received: u64,
    /// The longest a send waited for room, milliseconds.
    pub max_wait_ms: u64,
    /// Resident memory of the swarm process, KiB.
    pub rss_kib: u64,
    /// The fewest members any of this swarm's clients sees (itself included).
    pub min_members: usize,
}

fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// Runs the server until stdin closes: prints `ready <addr>`, then answers `stats` with a
/// [`ServerStats`] line.
pub async fn server(args: CsServerArgs) -> Result<(), String> {
    let mut cfg = Config::new(SERVER)
        .listen(args.listen)
        .overlay(ClientServerOptions {
            role: Role::Server,
            sync_interval_ms: args.sync_ms,
            ..ClientServerOptions::default()
        });
    cfg.transport.node_queue_bytes = args.node_queue_mib << 20;
    let node = Node::start(cfg).await.map_err(|e| e.to_string())?;
    let merged = Arc::new(AtomicU64::new(0));
    let count = merged.clone();
    let merge = Duration::from_micros(args.merge_us);
    let sink = node.spawn_fn(move |mut inbox: Inbox<StateMsg>| async move {
        while let Some(m) = inbox.recv().await {
            // The merge's cost: the sink is slower than the clients push, as PARTISAN's
            // server was, so the backlog is the runtime's to bound.
            tokio::time::sleep(merge).await;
            drop(m);
            count.fetch_add(1, Ordering::Relaxed);
        }
    });
    node.register(SINK, &sink).map_err(|e| e.to_string())?;
    println!("ready {}", node.addr());
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim() == "who" {
            println!("{}", who(&node));
        }
        if line.trim() == "stats" {
            let status = node.status();
            let s = ServerStats {
                rss_kib: crate::stats::proc_status_kib("VmRSS:"),
                hwm_kib: crate::stats::proc_status_kib("VmHWM:"),
                members: node.members().len(),
                neighbors: node.neighbors().len(),
                merged: merged.load(Ordering::Relaxed),
                queued_bytes: status.gauges.get("queued_bytes").copied().unwrap_or(0),
                fds: open_fds(),
                counters: status.counters,
            };
            println!("{}", serde_json::to_string(&s).map_err(|e| e.to_string())?);
        }
    }
    node.shutdown().await;
    Ok(())
}

/// A node's view, for diagnosing a client that does not converge: its members and
/// neighbours (names), its lanes, and its counters, as one JSON line.
fn who(node: &Node) -> String {
    let status = node.status();
    let lanes: Vec<String> = status
        .peers
        .iter()
        .map(|p| {
            let up = p.lanes.iter().filter(|l| l.connected).count();
            format!("{} {}/{} up={}", p.name, up, p.lanes.len(), p.up)
        })
        .collect();
    serde_json::json!({
        "name": node.id().name,
        "members": node.members().into_iter().map(|m| m.name).collect::<Vec<_>>(),
        "neighbors": node.neighbors().into_iter().map(|m| m.name).collect::<Vec<_>>(),
        "peers": lanes,
        "counters": status.counters,
    })
    .to_string()
}

#[derive(Default)]
struct Tally {
    sent: AtomicU64,
    relayed: AtomicU64,
    errors: AtomicU64,
    received: AtomicU64,
    max_wait_ms: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

impl Tally {
    fn error(&self, e: impl std::fmt::Display) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
        first.get_or_insert_with(|| e.to_string());
    }
}

/// Runs `count` client nodes: each joins the server (one after another; `joined <n>` every 64
/// and `ready` at the end). On `load` every client pushes its state every period until
/// `quiet`; `stats` answers with a [`SwarmStats`] line. Exits when stdin closes.
pub async fn clients(args: CsClientsArgs) -> Result<(), String> {
    let tally = Arc::new(Tally::default());
    let mut nodes = Vec::with_capacity(args.count);
    for i in args.first..args.first + args.count {
        let cfg = Config::new(format!("c{i:04}"))
            .listen(SocketAddr::from(([127, 0, 0, 1], 0)))
            .overlay(ClientServerOptions {
                role: Role::Client,
                ..ClientServerOptions::default()
            });
        let node = Node::start(cfg).await.map_err(|e| e.to_string())?;
        node.join_wait(args.server, Duration::from_secs(30))
            .await
            .map_err(|e| format!("client {i}: {e}"))?;
        let t = tally.clone();
        let sink = node.spawn_fn(move |mut inbox: Inbox<StateMsg>| async move {
            while inbox.recv().await.is_some() {
                t.received.fetch_add(1, Ordering::Relaxed);
            }
        });
        node.register(SINK, &sink).map_err(|e| e.to_string())?;
        nodes.push((i, node));
        if nodes.len() % 64 == 0 {
            println!("joined {}", nodes.len());
        }
    }
    println!("ready");
    let (load_tx, load_rx) = watch::channel(false);
    for (i, node) in &nodes {
        spawn_pusher(*i, node.clone(), &args, load_rx.clone(), tally.clone());
    }
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match line.trim() {
            "load" => {
                let _ = load_tx.send(true);
            }
            "quiet" => {
                let _ = load_tx.send(false);
            }
            who_cmd if who_cmd.starts_with("who ") => {
                let name = who_cmd["who ".len()..].trim();
                match nodes.iter().find(|(_, n)| *n.id().name == *name) {
                    Some((_, n)) => println!("{}", who(n)),
                    None => println!("{{}}"),
                }
            }
            "stats" => {
                let s = SwarmStats {
                    sent: tally.sent.load(Ordering::Relaxed),
                    relayed: tally.relayed.load(Ordering::Relaxed),
                    errors: tally.errors.load(Ordering::Relaxed),
                    first_error: tally
                        .first_error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone(),
                    received: tally.received.load(Ordering::Relaxed),
                    max_wait_ms: tally.max_wait_ms.load(Ordering::Relaxed),
                    rss_kib: crate::stats::proc_status_kib("VmRSS:"),
                    min_members: nodes
                        .iter()
                        .map(|(_, n)| n.members().len())
                        .min()
                        .unwrap_or(0),
                };
                println!("{}", serde_json::to_string(&s).map_err(|e| e.to_string())?);
            }
            _ => {}
        }
    }
    let _ = load_tx.send(false);
    for (_, n) in &nodes {
        n.shutdown().await;
    }
    Ok(())
}

/// One client's pushes: while the load is on, its state to the server's sink every period
/// (and to another client's sink when relaying); a send waits while the lanes are full.
fn spawn_pusher(
    i: usize,
    node: Node,
    args: &CsClientsArgs,
    mut load: watch::Receiver<bool>,
    tally: Arc<Tally>,
) {
    let period = Duration::from_millis(args.period_ms.max(1));
    let state = Bytes::from(vec![i as u8; args.state_bytes]);
    let relay_total = args.relay_total;
    tokio::spawn(async move {
        let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
        let mut server: Option<ActorRef<StateMsg>> = None;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if !*load.borrow() {
                if load.changed().await.is_err() {
                    return;
                }
                continue;
            }
            tick.tick().await;
            if !*load.borrow() {
                continue;
            }
            if server.is_none() {
                server = node.remote(SERVER, SINK);
            }
            let Some(server) = &server else {
                tally.error(format!("c{i:04}: the server is not a member"));
                continue;
            };
            let msg = || StateMsg {
                from: i as u32,
                state: state.clone(),
            };
            let t = Instant::now();
            match server.send(msg()).await {
                Ok(()) => tally.sent.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    tally.error(e);
                    continue;
                }
            };
            if relay_total > 1 {
                let mut j = rng.gen_range(0..relay_total - 1);
                if j >= i {
                    j += 1;
                }
                match node.remote::<StateMsg>(&format!("c{j:04}"), SINK) {
                    Some(to) => match to.send(msg()).await {
                        Ok(()) => {
                            tally.relayed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => tally.error(e),
                    },
                    None => tally.error(format!("c{j:04} is not a member of c{i:04}")),
                }
            }
            let waited = t.elapsed().as_millis() as u64;
            tally.max_wait_ms.fetch_max(waited, Ordering::Relaxed);
        }
    });
}
