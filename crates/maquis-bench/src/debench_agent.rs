//! The Maquis side of `maquis-bench debench`: several nodes in one process, each with its
//! server actor, its spawnable kind and its RPC function, and the DE-Bench worker loop.
//!
//! The protocol with the driver is the Erlang side's (`bench/erlang/debench.erl`): `ready` once
//! every node of this process sees the whole cluster; then, for each line `go W G L S X Y
//! SECONDS PACE ITERS` (percentages in hundredths; Y, the computation in microseconds, is
//! carried out as ITERS iterations of [`burn`], see [`calibrate`]), W workers per node run for SECONDS and the process
//! prints one line `result {json}` for all its nodes; `quit` or the end of stdin stops it.
//! With PACE > 0 a worker starts a command (or a global sequence) every PACE microseconds
//! instead of as soon as the last one ended, without catching up on starts it missed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use maquis::config::PeerToPeerOptions;
use maquis::{ActorRef, Config, Inbox, Node, ReplyTo};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

use crate::debench_hist::{KindStats, NodeResult};

/// The server actor's local name on every node.
const SERVER: &str = "debench_srv";
/// The kind and the function the workers spawn and call.
const WORK: &str = "debench";
/// How long a command may take before it counts as an error.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Options of one process of nodes.
#[derive(Args, Debug)]
pub struct DebenchNodesArgs {
    /// Index of this process's first node (nodes are `db1` … `dbN`).
    #[arg(long)]
    pub first: usize,
    /// How many nodes this process runs.
    #[arg(long)]
    pub count: usize,
    /// Nodes in the cluster.
    #[arg(long)]
    pub total: usize,
    /// Node i listens on 127.0.0.1:(base_port + i); every node joins through node 1.
    #[arg(long)]
    pub base_port: u16,
    /// `full-mesh` or `peer-to-peer`.
    #[arg(long, default_value = "full-mesh")]
    pub overlay: String,
    /// The cluster's cookie.
    #[arg(long, default_value = "debench")]
    pub cookie: String,
    /// HyParView's active view on `peer-to-peer` (default the runtime's).
    #[arg(long)]
    pub active_size: Option<usize>,
}

/// A point-to-point command's argument: the data and the computation on the target.
#[derive(Debug, Serialize, Deserialize)]
struct Work {
    data: Bytes,
    /// Iterations of [`burn`].
    iters: u64,
}

/// A call to a node's server actor.
#[derive(Debug, Serialize, Deserialize)]
struct SrvReq {
    work: Work,
    reply: ReplyTo<Bytes>,
}

/// Iterations of [`burn`] per microsecond on this machine: the best of several timed runs (a
/// run that was preempted or shared its core is slower, never faster). The driver calls it
/// once, before any cluster starts, and asks the nodes for a computation of Y µs as Y times
/// this many iterations.
///
/// DE-Bench's computation is a fixed amount of arithmetic, not a wait on the clock: a loop that
/// watches the clock burns less CPU than it claims whenever its thread is preempted (a hundred
/// nodes share two cores), and the BEAM preempts its own processes after a few thousand
/// reductions, so clock-watching loops would measure the schedulers, not the systems. The
/// Erlang side calibrates its own loop the same way (`bench/erlang/debench.erl`).
pub(crate) fn calibrate() -> f64 {
    const CHUNK: u64 = 50_000;
    let best = (0..50)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(burn(CHUNK));
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::from_micros(1))
        .max(Duration::from_nanos(1));
    CHUNK as f64 / (best.as_nanos() as f64 / 1000.0)
}

/// `n` dependent multiply-adds that the compiler can neither fold nor skip.
fn burn(n: u64) -> u64 {
    let mut acc = 1u64;
    for _ in 0..n {
        acc = std::hint::black_box(acc.wrapping_mul(31).wrapping_add(7));
    }
    acc
}

fn addr(base: u16, i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], base + i as u16))
}

async fn start_node(args: &DebenchNodesArgs, i: usize) -> Result<Node, String> {
    let mut cfg = Config::new(format!("db{i}"))
        .listen(addr(args.base_port, i))
        .cookie(&args.cookie);
    match args.overlay.as_str() {
        "full-mesh" => {}
        // A shuffle's reply opens a connection to the node that started it: at the default
        // period (1 s) 100 idle nodes open about 100 connections a second, a tenth of the two
        // cores (0.27 → 0.17 of them at rest with one every 10 s, measured).
        "peer-to-peer" => {
            let default = PeerToPeerOptions::default();
            cfg = cfg.overlay(PeerToPeerOptions {
                shuffle_period_ms: 10_000,
                active_size: args.active_size.unwrap_or(default.active_size),
                ..default
            })
        }
        other => return Err(format!("unknown overlay {other:?}")),
    }
    // Many nodes share two cores: give heartbeats room before a busy node is declared down,
    // and send three per timeout rather than twenty or fifteen. With the defaults (a link
    // probe every 500 ms, a member heartbeat every second) 100 idle nodes spend a third of the
    // two cores on the full mesh (14,700 probes and acknowledgements a second), and 0.6 of
    // them on peer-to-peer (every member's heartbeat crosses the whole overlay). Distributed
    // Erlang, for comparison, ticks every 15 s and declares a node down after 60 s.
    cfg.transport.heartbeat_timeout_ms = 10_000;
    cfg.transport.heartbeat_interval_ms = 10_000 / 3;
    cfg.broadcast.member_timeout_ms = 15_000;
    cfg.broadcast.member_heartbeat_ms = 15_000 / 3;
    let node = Node::start(cfg).await.map_err(|e| e.to_string())?;
    node.register_kind(WORK, move |node: &Node, w: Work| {
        node.spawn_fn(move |_inbox: Inbox<()>| async move {
            burn(w.iters);
            drop(w.data);
        })
    });
    node.register_fn(WORK, move |w: Work| async move {
        burn(w.iters);
        w.data
    });
    let server = node.spawn_fn(move |mut inbox: Inbox<SrvReq>| async move {
        while let Some(r) = inbox.recv().await {
            burn(r.work.iters);
            let _ = r.reply.send(r.work.data).await;
        }
    });
    node.register(SERVER, &server).map_err(|e| e.to_string())?;
    if i != 1 {
        node.join_wait(addr(args.base_port, 1), Duration::from_secs(120))
            .await
            .map_err(|e| format!("db{i} cannot join: {e}"))?;
    }
    Ok(node)
}

/// Runs the process until `quit` or the end of stdin.
pub async fn debench_nodes(args: DebenchNodesArgs) -> Result<(), String> {
    raise_fd_limit();
    let mut nodes = Vec::new();
    for i in args.first..args.first + args.count {
        nodes.push(start_node(&args, i).await?);
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while nodes.iter().any(|n| n.members().len() < args.total) {
        if Instant::now() > deadline {
            return Err("the cluster did not form within 300 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("ready");
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(rest) = line.strip_prefix("go ") else {
            break;
        };
        let go = Go::parse(rest)?;
        let result = measure(&nodes, args.total, &go).await;
        println!(
            "result {}",
            serde_json::to_string(&result).map_err(|e| e.to_string())?
        );
    }
    for n in &nodes {
        n.shutdown().await;
    }
    Ok(())
}

/// One measurement's parameters (percentages as fractions of 100).
#[derive(Clone, Copy, Debug)]
struct Go {
    workers: usize,
    global_pct: f64,
    local_pct: f64,
    server_pct: f64,
    arg_bytes: usize,
    /// The computation, iterations of [`burn`].
    iters: u64,
    seconds: u64,
    /// Microseconds between a worker's starts; 0: each start right after the last end.
    pace_us: u64,
}

impl Go {
    fn parse(s: &str) -> Result<Go, String> {
        let v: Vec<u64> = s
            .split_whitespace()
            .map(|t| {
                t.parse::<u64>()
                    .map_err(|e| format!("bad go line {s:?}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        let [w, g, l, sv, x, _y, secs, pace, iters] = v[..] else {
            return Err(format!("bad go line {s:?}: 9 numbers expected"));
        };
        Ok(Go {
            workers: w as usize,
            global_pct: g as f64 / 100.0,
            local_pct: l as f64 / 100.0,
            server_pct: sv as f64 / 100.0,
            arg_bytes: x as usize,
            iters,
            seconds: secs,
            pace_us: pace,
        })
    }
}

/// The runtime's counters of all `nodes`, added up.
fn counters(nodes: &[Node]) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for n in nodes {
        for (k, v) in n.counters().snapshot() {
            *sum.entry(k).or_insert(0) += v;
        }
    }
    sum
}

async fn measure(nodes: &[Node], total: usize, go: &Go) -> NodeResult {
    let before = counters(nodes);
    let cpu0 = crate::stats::cpu_seconds();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(go.seconds);
    let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
    let mut started = 0;
    for node in nodes {
        let me: usize = node.id().name[2..].parse().unwrap_or(0);
        for w in 0..go.workers {
            let tx = tx.clone();
            let node2 = node.clone();
            let go = *go;
            node.spawn_fn(move |inbox: Inbox<()>| async move {
                let myself = inbox.myself();
                let stats = worker(&node2, myself, me, w, total, &go, until).await;
                let _ = tx.send(stats).await;
            });
            started += 1;
        }
    }
    drop(tx);
    let mut all: BTreeMap<String, KindStats> = BTreeMap::new();
    for _ in 0..started {
        let Some(stats) = rx.recv().await else { break };
        for (k, s) in stats {
            all.entry(k.to_string()).or_default().merge(&s);
        }
    }
    let rose = counters(nodes)
        .into_iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(&k).copied().unwrap_or(0));
            (d > 0).then_some((k, d))
        })
        .collect();
    NodeResult {
        seconds: t0.elapsed().as_secs_f64(),
        cpu_s: crate::stats::cpu_seconds() - cpu0,
        commands: all,
        counters: rose,
    }
}

/// DE-Bench's worker: until `until`, a random other node and a command from the mix.
async fn worker(
    node: &Node,
    myself: ActorRef<()>,
    me: usize,
    w: usize,
    total: usize,
    go: &Go,
    until: Instant,
) -> BTreeMap<&'static str, KindStats> {
    // Keyed by the kinds' static names and aimed at names made once: the loop allocates
    // nothing of its own per command (the Erlang worker's keys and targets are atoms).
    let mut st: BTreeMap<&'static str, KindStats> = BTreeMap::new();
    let names: Vec<String> = (0..=total).map(|j| format!("db{j}")).collect();
    let data = Bytes::from(vec![0x42u8; go.arg_bytes]);
    let mut seq = 0u64;
    let pace = Duration::from_micros(go.pace_us);
    // Paced workers start at random points of their first interval, not all at once.
    let mut next = tokio::time::Instant::now() + pace.mul_f64(rand::thread_rng().gen::<f64>());
    while Instant::now() < until {
        if !pace.is_zero() {
            tokio::time::sleep_until(next).await;
            next = (next + pace).max(tokio::time::Instant::now());
            if Instant::now() >= until {
                break;
            }
        }
        let (target, r, server, spawn) = {
            let mut rng = rand::thread_rng();
            let mut j = rng.gen_range(1..total);
            if j >= me {
                j += 1;
            }
            (
                names[j].as_str(),
                rng.gen::<f64>() * 100.0,
                rng.gen::<f64>() * 100.0 < go.server_pct,
                rng.gen::<bool>(),
            )
        };
        let work = || Work {
            data: data.clone(),
            iters: go.iters,
        };
        if r < go.global_pct {
            seq += 1;
            let name = format!("db{me}-w{w}-{seq}");
            let ok = timed(&mut st, "register", node.register_global(&name, &myself)).await;
            if ok {
                timed(&mut st, "whereis", async {
                    match node.whereis_global::<()>(&name).await {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err("not found".to_string()),
                        Err(e) => Err(e.to_string()),
                    }
                })
                .await;
                timed(&mut st, "unregister", async {
                    node.unregister_global(&name)
                        .await
                        .then_some(())
                        .ok_or("not held")
                })
                .await;
            }
        } else if r < go.global_pct + go.local_pct {
            let name = format!("debench_w{w}");
            timed(&mut st, "local_register", async {
                node.register(&name, &myself).map_err(|e| e.to_string())?;
                node.whereis::<()>(&name).ok_or("not found")?;
                node.unregister(&name).then_some(()).ok_or("not held")?;
                Ok::<(), String>(())
            })
            .await;
        } else if server {
            timed(&mut st, "call", async {
                let srv: ActorRef<SrvReq> = node.remote(target, SERVER).ok_or("no target")?;
                srv.call(
                    |reply| SrvReq {
                        work: work(),
                        reply,
                    },
                    TIMEOUT,
                )
                .await
                .map_err(|e| e.to_string())
            })
            .await;
        } else if spawn {
            timed(
                &mut st,
                "spawn",
                node.spawn_remote::<Work, ()>(target, WORK, &work(), TIMEOUT),
            )
            .await;
        } else {
            timed(
                &mut st,
                "rpc",
                node.rpc::<Work, Bytes>(target, WORK, &work(), TIMEOUT),
            )
            .await;
        }
    }
    st
}

/// Runs a command, counting its latency under `kind` (or an error); whether it succeeded.
async fn timed<T, E: std::fmt::Display>(
    st: &mut BTreeMap<&'static str, KindStats>,
    kind: &'static str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> bool {
    let t0 = Instant::now();
    let r = f.await;
    let us = t0.elapsed().as_micros() as u64;
    let s = st.entry(kind).or_default();
    match r {
        Ok(_) => {
            s.record(us);
            true
        }
        Err(e) => {
            s.error(&e.to_string());
            false
        }
    }
}

/// Open files a benchmark process asks for when it may raise its hard limit.
const FD_WANTED: libc::rlim_t = 262_144;

/// A hundred nodes in full mesh hold thousands of sockets: lift the soft limit to the hard one,
/// and the hard one to [`FD_WANTED`] when the process may.
pub(crate) fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            // A privileged process may raise the hard limit too (a cluster of hundreds of
            // nodes on one machine holds tens of thousands of sockets); otherwise the soft
            // limit goes up to the hard one.
            let want = libc::rlimit {
                rlim_cur: FD_WANTED.max(lim.rlim_max),
                rlim_max: FD_WANTED.max(lim.rlim_max),
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) != 0 && lim.rlim_cur < lim.rlim_max {
                lim.rlim_cur = lim.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
            }
        }
    }
}
