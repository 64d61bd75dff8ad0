//! `maquis demo`: a local 3-node full-mesh cluster, an echo workload run once with one
//! connection per peer and no affinity, and once with 16 lanes and affinity.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use maquis::admin::percentile;
use maquis::echo::echo_once;
use maquis::{Config, Node, SendOpts};

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
    let configs: [(&'static str, u16, bool); 2] = [
        ("single", 1, false),
        ("parallel+affinity", args.parallelism, true),
    ];
    println!(
        "maquis demo: 3 nodes on 127.0.0.1 (full mesh), {} client actors in a closed loop calling the echo service of the next node, {:.1} s per cell",
        args.actors, args.seconds
    );
    let mut cells = Vec::new();
    for (name, parallelism, affinity) in configs {
        let nodes = match cluster(parallelism, affinity).await {
            Ok(n) => n,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        for &size in &args.sizes {
            eprintln!("  running {name}, payload {} ...", human(size));
            let cell = measure(&nodes, name, size, args.actors, args.seconds).await;
            cells.push(cell);
        }
        for n in &nodes {
            n.shutdown().await;
        }
    }
    print_table(&cells, &args.sizes);
    if cells.iter().any(|c| c.errors > 0) {
        eprintln!("error: some calls failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

async fn cluster(parallelism: u16, affinity: bool) -> Result<Vec<Node>, String> {
    let mut nodes = Vec::new();
    for i in 1..=3 {
        let mut cfg = Config::new(format!("demo{i}"))
            .parallelism(parallelism)
            .affinity(affinity)
            .cookie("maquis-demo");
        cfg.transport.lane_queue_bytes = 32 * 1024 * 1024;
        nodes.push(Node::start(cfg).await.map_err(|e| e.to_string())?);
    }
    for n in &nodes[1..] {
        n.join_wait(nodes[0].addr(), Duration::from_secs(5))
            .await
            .map_err(|e| e.to_string())?;
    }
    // Wait until every node sees every lane to every other node connected.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ready = nodes.iter().all(|a| {
            nodes.iter().filter(|b| b.id() != a.id()).all(|b| {
                let lanes = a.lanes_connected(&b.id().name);
                !lanes.is_empty() && lanes.iter().all(|(_, up, want)| up == want)
            })
        });
        if ready {
            return Ok(nodes);
        }
        if Instant::now() > deadline {
            return Err("the demo cluster did not connect within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn measure(
    nodes: &[Node],
    config: &'static str,
    size: usize,
    actors: usize,
    seconds: f64,
) -> Cell {
    let payload = Bytes::from(vec![0xa5u8; size]);
    let warmup = Duration::from_millis(500);
    let measured = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut waits = Vec::new();
    for i in 0..actors {
        let node = nodes[i % nodes.len()].clone();
        let to = nodes[(i + 1) % nodes.len()].id().name.clone();
        let payload = payload.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        node.clone()
            .spawn_fn(move |_inbox: maquis::Inbox<()>| async move {
                let mut lat = Vec::new();
                let mut errors = 0u64;
                let opts = SendOpts::default();
                loop {
                    let now = Instant::now();
                    if now >= start + warmup + measured {
                        break;
                    }
                    match echo_once(&node, &to, payload.clone(), Duration::from_secs(30), &opts)
                        .await
                    {
                        Ok(rtt) if now >= start + warmup => lat.push(rtt.as_micros() as u64),
                        Ok(_) => {}
                        Err(e) => {
                            errors += 1;
                            tracing::warn!(error = %e, "demo call failed");
                        }
                    }
                }
                let _ = tx.send((lat, errors));
            });
        waits.push(rx);
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for w in waits {
        if let Ok((lat, e)) = w.await {
            all.extend(lat);
            errors += e;
        } else {
            errors += 1;
        }
    }
    all.sort_unstable();
    Cell {
        config,
        size,
        ops_per_s: all.len() as f64 / seconds,
        p50_us: percentile(&all, 50.0),
        p99_us: percentile(&all, 99.0),
        errors,
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
