//! Manual throughput check: bulk TCP from host 1 to host 2 over the wire.
//!
//! ```text
//! cargo run --release --example tcp_throughput -- --rtt 20ms --conns 16 --secs 8
//! ```
//!
//! Prints the receiver's goodput (total, and after a warm-up second) and
//! the wire's own report (rates, lateness, sysctls).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use maquis_netem::{parse_duration, Netem, NetemConfig, Rate};

#[derive(Debug, Parser)]
struct Args {
    /// Round-trip time (delay = rtt / 2).
    #[arg(long, value_parser = parse_duration, default_value = "20ms")]
    rtt: Duration,
    /// Parallel TCP connections.
    #[arg(long, default_value_t = 1)]
    conns: usize,
    /// Seconds to send.
    #[arg(long, default_value_t = 8)]
    secs: u64,
    /// Optional rate limit.
    #[arg(long)]
    rate: Option<Rate>,
    /// Disable TUN offloads.
    #[arg(long)]
    no_offload: bool,
    /// Disable real-time priority.
    #[arg(long)]
    no_realtime: bool,
    /// Sysctls to set in the hosts, KEY=VALUE.
    #[arg(long)]
    sysctl: Vec<String>,
    /// Namespace prefix.
    #[arg(long, default_value = "tput")]
    prefix: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    let sysctls = args
        .sysctl
        .iter()
        .filter_map(|s| s.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let net = Netem::up(NetemConfig {
        hosts: 2,
        delay: args.rtt / 2,
        rate: args.rate,
        prefix: args.prefix.clone(),
        offload: !args.no_offload,
        realtime: !args.no_realtime,
        sysctls,
        ..Default::default()
    })?;
    let addr: SocketAddr = SocketAddr::new(net.hosts()[1].addr.into(), 5201);

    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let listener = net.run_in_host(1, move || TcpListener::bind(addr))??;
    let conns = args.conns;
    let (rx, dn) = (received.clone(), done.clone());
    let acceptor = std::thread::spawn(move || {
        let mut readers = Vec::new();
        for _ in 0..conns {
            let Ok((mut s, _)) = listener.accept() else {
                break;
            };
            // The wire goes away before the FINs arrive: do not block forever.
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let (rx, dn) = (rx.clone(), dn.clone());
            readers.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 18];
                while !dn.load(Ordering::Relaxed) {
                    match s.read(&mut buf) {
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            rx.fetch_add(n as u64, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        for r in readers {
            let _ = r.join();
        }
    });

    let mut senders = Vec::new();
    for _ in 0..conns {
        let stream = net.run_in_host(0, move || TcpStream::connect(addr))??;
        let dn = done.clone();
        senders.push(std::thread::spawn(move || {
            let mut s = stream;
            let buf = vec![0x5au8; 1 << 18];
            while !dn.load(Ordering::Relaxed) {
                if s.write_all(&buf).is_err() {
                    break;
                }
            }
        }));
    }
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut warm = None;
    while start.elapsed() < Duration::from_secs(args.secs) {
        std::thread::sleep(Duration::from_millis(500));
        let b = received.load(Ordering::Relaxed);
        samples.push((start.elapsed(), b));
        if warm.is_none() && start.elapsed() >= Duration::from_secs(2) {
            warm = Some((start.elapsed(), b));
            net.reset_stats();
        }
    }
    let end = (start.elapsed(), received.load(Ordering::Relaxed));
    let stats = net.stats();
    let cpu = thread_cpu();
    done.store(true, Ordering::Relaxed);
    for s in senders {
        let _ = s.join();
    }
    drop(net.shutdown()?);
    let _ = acceptor.join();

    let gbit = |bytes: u64, d: Duration| bytes as f64 * 8.0 / d.as_secs_f64() / 1e9;
    println!(
        "conns {} rtt {:?}: total {:.2} Gbit/s over {:.1}s",
        conns,
        args.rtt,
        gbit(end.1, end.0),
        end.0.as_secs_f64()
    );
    if let Some((t0, b0)) = warm {
        println!(
            "  after 2s warm-up: {:.2} Gbit/s",
            gbit(end.1 - b0, end.0 - t0)
        );
    }
    let per: Vec<String> = samples
        .windows(2)
        .map(|w| format!("{:.1}", gbit(w[1].1 - w[0].1, w[1].0 - w[0].0)))
        .collect();
    println!("  per 0.5s: {}", per.join(" "));
    print!("{}", stats.report());
    println!("  CPU seconds by thread: {cpu}");
    Ok(())
}

/// CPU seconds used so far by this process's threads, grouped by name.
fn thread_cpu() -> String {
    let mut by_name = std::collections::BTreeMap::<String, f64>::new();
    let tick = 100.0; // USER_HZ
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue;
            };
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let name = stat[open + 1..close].to_string();
            let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
            let ticks = fields
                .get(11)
                .and_then(|u| u.parse::<f64>().ok())
                .unwrap_or(0.0)
                + fields
                    .get(12)
                    .and_then(|s| s.parse::<f64>().ok())
                    .unwrap_or(0.0);
            let key = if name.starts_with("netem") {
                name
            } else {
                "app".into()
            };
            *by_name.entry(key.clone()).or_default() += ticks / tick;
            // schedstat: time on CPU, time runnable but waiting, slices.
            if key.starts_with("netem") {
                if let Ok(ss) = std::fs::read_to_string(t.path().join("schedstat")) {
                    let wait = ss.split(' ').nth(1).and_then(|w| w.parse::<f64>().ok());
                    *by_name.entry(format!("{key}-runq-wait")).or_default() +=
                        wait.unwrap_or(0.0) / 1e9;
                }
            }
        }
    }
    by_name
        .iter()
        .map(|(k, v)| format!("{k}={v:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}
