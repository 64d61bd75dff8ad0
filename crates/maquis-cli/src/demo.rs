//! `maquis demo`: a local 3-node full-mesh cluster, an echo workload run once with one
//! connection per peer and no affinity, and once with 16 lanes and affinity; then small calls
//! beside bulk transfers between two nodes, sharing one connection and on channels of their own.
//!
//! With `--wan` (root and `/dev/net/tun`), every node runs in a network namespace of its own,
//! on a tokio runtime of its own, and the namespaces are joined by the link emulator
//! (`maquis-netem`) with `--rtt-ms` round trips; the client actors run on the demo's own runtime
//! and reach the nodes through their handles.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use maquis::admin::percentile;
use maquis::echo::echo_once;
use maquis::{Config, Node, SendOpts};
use maquis_netem::{Netem, NetemConfig};

/// Options of `maquis demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Concurrent client actors (spread over the three nodes, closed loop).
    #[arg(long, default_value_t = 64)]
    actors: usize,
    /// Payload sizes in bytes, comma separated.
    #[arg(long, default_value = "1024,524288", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Measured seconds per cell (after a short warm-up).
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Lanes per peer in the parallel configuration.
    #[arg(long, default_value_t = 16)]
    parallelism: u16,
    /// Bytes of each bulk transfer in the isolation case (0 skips the case).
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    bulk_size: usize,
    /// Runs each node in a network namespace of its own, joined by the link emulator with
    /// `--rtt-ms` round trips (needs root and /dev/net/tun).
    #[arg(long)]
    wan: bool,
    /// The emulated round trip with `--wan`, in milliseconds.
    #[arg(long, default_value_t = 20)]
    rtt_ms: u64,
}

/// Turns each configuration takes per payload size, each of `seconds / ROUNDS`.
const ROUNDS: usize = 2;

/// The isolation case: small calls between two nodes while bulk transfers run between them.
const SMALL_CALLERS: usize = 8;
const SMALL_SIZE: usize = 1024;
const BULK_CALLERS: usize = 2;
/// The bulk channel's lanes in the configuration with channels of their own.
const BULK_LANES: u16 = 4;

/// A closed-loop load: `actors` callers echoing `size` bytes with `opts`, each from node
/// `i % n` to node `(i + 1) % n` of the `n` nodes it runs on.
struct Load {
    size: usize,
    actors: usize,
    opts: SendOpts,
}

/// One measured cell.
struct Cell {
    config: &'static str,
    size: usize,
    ops_per_s: f64,
    p50_us: u64,
    p99_us: u64,
    errors: u64,
}

pub async fn run(args: DemoArgs) -> ExitCode {
    if args.actors == 0 || args.sizes.is_empty() || args.seconds.is_nan() || args.seconds <= 0.0 {
        eprintln!("error: --actors, --sizes and --seconds must be positive");
        return ExitCode::from(2);
    }
    if args.wan && (args.rtt_ms == 0 || args.rtt_ms > 10_000) {
        eprintln!("error: --rtt-ms must be between 1 and 10000");
        return ExitCode::from(2);
    }
    let net = if args.wan {
        let config = NetemConfig {
            hosts: 3,
            delay: Duration::from_micros(args.rtt_ms * 500),
            // Apart from any other emulated network on the machine (a stale one of this
            // prefix is deleted first).
            prefix: format!("mqd{}", std::process::id() % 100_000),
            network: std::net::Ipv4Addr::new(10, 79, 0, 0),
            ..Default::default()
        };
        match tokio::task::spawn_blocking(move || Netem::up(config)).await {
            Ok(Ok(net)) => Some(net),
            Ok(Err(e)) => {
                eprintln!("error: --wan needs the link emulator: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("error: --wan: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let net = net.as_ref();
    let place = match net {
        Some(_) => format!(
            "in 3 network namespaces, {} ms round trips between them",
            args.rtt_ms
        ),
        None => "on 127.0.0.1".to_string(),
    };
    let configs: [(&'static str, u16, bool); 2] = [
        ("single", 1, false),
        ("parallel+affinity", args.parallelism, true),
    ];
    println!(
        "maquis demo: 3 nodes {place} (full mesh), {} client actors in a closed loop calling the echo service of the next node, {:.1} s per cell in {ROUNDS} rounds, the configurations taking turns",
        args.actors, args.seconds
    );
    // Both clusters run from the start and take turns, so that a change in the machine's load
    // during the demo falls on both alike.
    let mut clusters: Vec<(&'static str, Cluster)> = Vec::new();
    for (k, (name, parallelism, affinity)) in configs.into_iter().enumerate() {
        let config = move |i: usize| {
            Config::new(format!("demo{}", 3 * k + i))
                .parallelism(parallelism)
                .affinity(affinity)
        };
        match Cluster::start(3, config, net, 7100 + k as u16).await {
            Ok(c) => clusters.push((name, c)),
            Err(e) => {
                eprintln!("error: {e}");
                for (_, c) in clusters {
                    c.stop().await;
                }
                return ExitCode::FAILURE;
            }
        }
    }
    let mut cells = Vec::new();
    for &size in &args.sizes {
        eprintln!("  running payload {} ...", human(size));
        let mut stats: Vec<Stats> = vec![(Vec::new(), 0); clusters.len()];
        for _ in 0..ROUNDS {
            for ((_, cluster), (lat, errors)) in clusters.iter().zip(stats.iter_mut()) {
                let load = Load {
                    size,
                    actors: args.actors,
                    opts: SendOpts::default(),
                };
                let [(l, e)] = measure(&cluster.nodes, [load], args.seconds / ROUNDS as f64).await;
                lat.extend(l);
                *errors += e;
            }
        }
        for ((name, _), s) in clusters.iter().zip(stats) {
            cells.push(Cell::of(name, size, s, args.seconds));
        }
    }
    for (_, c) in clusters {
        c.stop().await;
    }
    print_table(&cells, &args.sizes);
    let mut failed = cells.iter().any(|c| c.errors > 0);
    if args.bulk_size > 0 {
        match isolation(&args, net).await {
            Ok(iso) => {
                print_isolation(&iso, args.bulk_size);
                failed |= iso.iter().any(|c| c.small.errors > 0 || c.bulk.errors > 0);
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if failed {
        eprintln!("error: some calls failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// One configuration of the isolation case: the small calls' and the bulk transfers' results.
struct Isolated {
    config: &'static str,
    small: Cell,
    bulk: Cell,
}

/// Two nodes; small calls from the first to the second while bulk transfers run the same way:
/// once all on one connection per peer, once with the bulk transfers on a channel of their own.
async fn isolation(args: &DemoArgs, net: Option<&Netem>) -> Result<Vec<Isolated>, String> {
    println!(
        "\nisolation: 2 nodes, {SMALL_CALLERS} actors calling with {} beside {BULK_CALLERS} actors calling with {}, {:.1} s per cell",
        human(SMALL_SIZE),
        human(args.bulk_size),
        args.seconds
    );
    let mut out = Vec::new();
    for (config, own_channel) in [("one channel", false), ("own channels", true)] {
        eprintln!("  running {config} ...");
        let cluster = Cluster::start(
            2,
            |i| {
                let c = Config::new(format!("iso{i}")).parallelism(1);
                if own_channel {
                    c.channel("bulk", Some(BULK_LANES))
                } else {
                    c
                }
            },
            net,
            7100,
        )
        .await?;
        let nodes = &cluster.nodes;
        let bulk_opts = if own_channel {
            SendOpts::on("bulk")
        } else {
            SendOpts::default()
        };
        // Both loads run from node 0 to node 1 only: their actors sit on node 0 (the ring
        // of two nodes would send every other actor's calls the other way).
        let from = &nodes[..1];
        let small = Load {
            size: SMALL_SIZE,
            actors: SMALL_CALLERS,
            opts: SendOpts::default(),
        };
        let bulk = Load {
            size: args.bulk_size,
            actors: BULK_CALLERS,
            opts: bulk_opts,
        };
        let [s, b] = measure_from(from, &nodes[1], [small, bulk], args.seconds).await;
        out.push(Isolated {
            config,
            small: Cell::of(config, SMALL_SIZE, s, args.seconds),
            bulk: Cell::of(config, args.bulk_size, b, args.seconds),
        });
        cluster.stop().await;
    }
    Ok(out)
}

/// The demo's nodes, and with `--wan` the threads that run them in their namespaces.
struct Cluster {
    nodes: Vec<Node>,
    hosted: Vec<Hosted>,
}

/// A node running in a namespace: its thread runs the node's runtime until told to stop.
struct Hosted {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), maquis_netem::NetemError>>,
}

impl Cluster {
    /// Starts `n` nodes with `config(i)` (a shared cookie and room for large payloads added),
    /// on 127.0.0.1, or each in host `i` of `net` on `port`; joins them, and waits until every node has
    /// the others among its members and every lane between them is connected.
    async fn start(
        n: usize,
        config: impl Fn(usize) -> Config,
        net: Option<&Netem>,
        port: u16,
    ) -> Result<Cluster, String> {
        let mut cluster = Cluster {
            nodes: Vec::new(),
            hosted: Vec::new(),
        };
        for i in 1..=n {
            let mut cfg = config(i).cookie("maquis-demo");
            cfg.transport.lane_queue_bytes = 32 * 1024 * 1024;
            // On loopback every node dials from the same address: up to 16 lanes from each of
            // two peers at once, beside the other cluster's handshakes.
            cfg.transport.max_pending_handshakes_per_source = cfg.transport.max_pending_handshakes;
            let started = match net {
                None => Node::start(cfg).await.map_err(|e| e.to_string()),
                Some(net) => {
                    let host = net.hosts().get(i - 1).ok_or("too few hosts")?;
                    cfg.node.listen = std::net::SocketAddr::new(host.addr.into(), port);
                    cluster.start_hosted(net, i - 1, cfg).await
                }
            };
            match started {
                Ok(node) => cluster.nodes.push(node),
                Err(e) => {
                    cluster.stop().await;
                    return Err(e);
                }
            }
        }
        if let Err(e) = cluster.join().await {
            cluster.stop().await;
            return Err(e);
        }
        Ok(cluster)
    }

    /// Starts a node in host `index` of `net`, on a runtime of its own in a thread of that
    /// namespace.
    async fn start_hosted(
        &mut self,
        net: &Netem,
        index: usize,
        cfg: Config,
    ) -> Result<Node, String> {
        let (node_tx, node_rx) = tokio::sync::oneshot::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = net
            .spawn_in_host(index, move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = node_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    match Node::start(cfg).await {
                        Ok(node) => {
                            let _ = node_tx.send(Ok(node.clone()));
                            let _ = stop_rx.await;
                            node.shutdown().await;
                        }
                        Err(e) => {
                            let _ = node_tx.send(Err(e.to_string()));
                        }
                    }
                });
            })
            .map_err(|e| e.to_string())?;
        self.hosted.push(Hosted { stop, thread });
        match node_rx.await {
            Ok(r) => r,
            Err(_) => Err("a node's thread ended before it started".into()),
        }
    }

    /// Stops every node: a local one here, a hosted one by its thread.
    async fn stop(self) {
        if self.hosted.is_empty() {
            for n in &self.nodes {
                n.shutdown().await;
            }
        }
        for h in self.hosted {
            let _ = h.stop.send(());
            let _ = tokio::task::spawn_blocking(move || h.thread.join()).await;
        }
    }

    async fn join(&self) -> Result<(), String> {
        let nodes = &self.nodes;
        for n in &nodes[1..] {
            n.join_wait(nodes[0].addr(), Duration::from_secs(5))
                .await
                .map_err(|e| e.to_string())?;
        }
        // Wait until every node has every other among its members (the control loop has taken
        // it in) and sees every lane to it connected.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ready = nodes.iter().all(|a| {
                nodes.iter().filter(|b| b.id() != a.id()).all(|b| {
                    let name = &b.id().name;
                    let lanes = a.lanes_connected(name);
                    a.member(name).is_some()
                        && !lanes.is_empty()
                        && lanes.iter().all(|(_, up, want)| up == want)
                })
            });
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("the demo cluster did not connect within 10 s".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What the callers of one load measured: latencies (µs) and failed calls.
type Stats = (Vec<u64>, u64);

/// Runs the loads together on a ring of `nodes` (each actor calls the next node), for a
/// warm-up and then `seconds`.
async fn measure<const L: usize>(nodes: &[Node], loads: [Load; L], seconds: f64) -> [Stats; L] {
    run_loads(loads, seconds, |i| {
        let from = nodes[i % nodes.len()].clone();
        let to = nodes[(i + 1) % nodes.len()].id().name.clone();
        (from, to.to_string())
    })
    .await
}

/// Runs the loads together from the nodes `from` (round robin) to node `to`.
async fn measure_from<const L: usize>(
    from: &[Node],
    to: &Node,
    loads: [Load; L],
    seconds: f64,
) -> [Stats; L] {
    let to = to.id().name.clone();
    run_loads(loads, seconds, |i| {
        (from[i % from.len()].clone(), to.to_string())
    })
    .await
}

async fn run_loads<const L: usize>(
    loads: [Load; L],
    seconds: f64,
    pair: impl Fn(usize) -> (Node, String),
) -> [Stats; L] {
    let warmup = Duration::from_millis(500);
    let measured = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut waits: [Vec<tokio::sync::oneshot::Receiver<Stats>>; L] =
        std::array::from_fn(|_| Vec::new());
    for (load, waits) in loads.iter().zip(waits.iter_mut()) {
        let payload = Bytes::from(vec![0xa5u8; load.size]);
        for i in 0..load.actors {
            let (node, to) = pair(i);
            let payload = payload.clone();
            let opts = load.opts.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            node.clone()
                .spawn_fn(move |_inbox: maquis::Inbox<()>| async move {
                    let mut lat = Vec::new();
                    let mut errors = 0u64;
                    loop {
                        let now = Instant::now();
                        if now >= start + warmup + measured {
                            break;
                        }
                        let call =
                            echo_once(&node, &to, payload.clone(), Duration::from_secs(30), &opts);
                        match call.await {
                            Ok(rtt) if now >= start + warmup => lat.push(rtt.as_micros() as u64),
                            Ok(_) => {}
                            Err(e) => {
                                errors += 1;
                                // The first failure of each caller is enough to say what
                                // went wrong; a caller that fails at once lets the others run.
                                if errors == 1 {
                                    tracing::warn!(error = %e, "demo call failed");
                                }
                                tokio::task::yield_now().await;
                            }
                        }
                    }
                    let _ = tx.send((lat, errors));
                });
            waits.push(rx);
        }
    }
    let mut out: [Stats; L] = std::array::from_fn(|_| (Vec::new(), 0));
    for (waits, (all, errors)) in waits.into_iter().zip(out.iter_mut()) {
        for w in waits {
            match w.await {
                Ok((lat, e)) => {
                    all.extend(lat);
                    *errors += e;
                }
                Err(_) => *errors += 1,
            }
        }
    }
    out
}

impl Cell {
    fn of(config: &'static str, size: usize, (mut lat, errors): Stats, seconds: f64) -> Cell {
        lat.sort_unstable();
        Cell {
            config,
            size,
            ops_per_s: lat.len() as f64 / seconds,
            p50_us: percentile(&lat, 50.0),
            p99_us: percentile(&lat, 99.0),
            errors,
        }
    }
}

fn human(size: usize) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{} MiB", size >> 20)
    } else if size >= 1024 && size.is_multiple_of(1024) {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

fn print_table(cells: &[Cell], sizes: &[usize]) {
    println!();
    println!(
        "{:<9} {:<18} {:>10} {:>10} {:>10}",
        "payload", "config", "ops/s", "p50 ms", "p99 ms"
    );
    for &size in sizes {
        let row: Vec<&Cell> = cells.iter().filter(|c| c.size == size).collect();
        for c in &row {
            println!(
                "{:<9} {:<18} {:>10.0} {:>10.3} {:>10.3}",
                human(c.size),
                c.config,
                c.ops_per_s,
                c.p50_us as f64 / 1000.0,
                c.p99_us as f64 / 1000.0
            );
        }
        if let [a, b] = row.as_slice() {
            let ratio = |x: f64, y: f64| if y > 0.0 { x / y } else { f64::NAN };
            println!(
                "{:<9} {:<18} {:>9.2}x {:>9.2}x {:>9.2}x",
                "",
                "ratio (2nd/1st)",
                ratio(b.ops_per_s, a.ops_per_s),
                ratio(b.p50_us as f64, a.p50_us as f64),
                ratio(b.p99_us as f64, a.p99_us as f64)
            );
        }
    }
}

fn print_isolation(cells: &[Isolated], bulk_size: usize) {
    println!();
    println!(
        "{:<14} {:>12} {:>12} {:>12} {:>14}",
        "config",
        format!("{} p50 ms", human(SMALL_SIZE)),
        format!("{} p99 ms", human(SMALL_SIZE)),
        format!("{} ops/s", human(SMALL_SIZE)),
        format!("{} ops/s", human(bulk_size))
    );
    for c in cells {
        println!(
            "{:<14} {:>12.3} {:>12.3} {:>12.0} {:>14.1}",
            c.config,
            c.small.p50_us as f64 / 1000.0,
            c.small.p99_us as f64 / 1000.0,
            c.small.ops_per_s,
            c.bulk.ops_per_s
        );
    }
    if let [a, b] = cells {
        let ratio = |x: u64, y: u64| if y > 0 { x as f64 / y as f64 } else { f64::NAN };
        println!(
            "{:<14} {:>11.2}x {:>11.2}x   (one channel / own channels: how much lower the small calls' latency is with channels of their own)",
            "ratio",
            ratio(a.small.p50_us, b.small.p50_us),
            ratio(a.small.p99_us, b.small.p99_us)
        );
    }
}
