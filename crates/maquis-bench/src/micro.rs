//! `maquis-bench micro`: PARTISAN's microbenchmarks (Fig. 1–4) over an emulated link, against
//! Distributed Erlang and raw TCP measured in the same run.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use maquis_netem::{Netem, NetemConfig};
use serde::{Deserialize, Serialize};

use crate::ring_proc::{run_json, Proc};
use crate::stats::RunResult;

/// Options of `maquis-bench micro`.
#[derive(Args, Debug, Clone)]
pub struct MicroArgs {
    /// A reduced grid that runs in a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json, report.md and the plots go.
    #[arg(long, default_value = "bench/results/micro")]
    pub out: PathBuf,
    /// Round-trip times in ms (default 1,20).
    #[arg(long, value_delimiter = ',')]
    pub rtt: Option<Vec<u64>>,
    /// Actor counts (default 1,16,32,64,128; quick 16,128).
    #[arg(long, value_delimiter = ',')]
    pub actors: Option<Vec<usize>>,
    /// Payload sizes in bytes (default 1024,524288,8388608; quick 1024,524288).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Configurations (default erlang,single,parallel,affinity,raw-tcp).
    #[arg(long, value_delimiter = ',')]
    pub configs: Option<Vec<String>>,
    /// The reply carries the payload back (else a small acknowledgement).
    #[arg(long)]
    pub echo: bool,
    /// Messages per actor at most (the paper: 10,000); a cell also stops at its time budget.
    #[arg(long)]
    pub messages: Option<u64>,
    /// Time budget per cell in seconds (default 10; quick 3).
    #[arg(long)]
    pub cell_seconds: Option<f64>,
    /// Skip the connection-count sweep (Fig. 2).
    #[arg(long)]
    pub no_sweep: bool,
    /// Also run each Maquis configuration with TLS on every lane (`single-tls`,
    /// `parallel-tls`, `affinity-tls`; certificates made for the run in OUT/tls), and report
    /// the CPU per message of both.
    #[arg(long)]
    pub tls: bool,
}

/// One measured cell, as written to results.json.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    /// Emulated round-trip time.
    pub rtt_ms: u64,
    /// Payload bytes per message.
    pub payload_bytes: usize,
    /// Concurrent actors.
    pub actors: usize,
    /// erlang, single, parallel, affinity or raw-tcp; a Maquis configuration with `-tls` runs
    /// with TLS on every lane.
    pub config: String,
    /// Connections per peer (lanes of the default channel; raw-tcp: sockets).
    pub parallelism: u16,
    /// Whether replies carried the payload.
    pub echo: bool,
    /// Completed round trips per second.
    pub ops_per_s: f64,
    /// Latency percentiles, microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest.
    pub max_us: u64,
    /// Round trips completed.
    pub messages: u64,
    /// Round trips that failed.
    pub errors: u64,
    /// Measured wall time, seconds.
    pub seconds: f64,
    /// CPU time of both processes per round trip, microseconds.
    pub cpu_us_per_msg: f64,
    /// Which figure the cell belongs to: `grid` or `sweep`.
    pub series: String,
}

const SERVER_PORT: u16 = 9400;
/// Unmeasured seconds at the start of every cell (connections warm up, TCP windows open).
pub const WARMUP_S: f64 = 1.0;
const COOKIE: &str = "maquis-bench-micro";
const ALL_CONFIGS: [&str; 5] = ["erlang", "single", "parallel", "affinity", "raw-tcp"];
/// The configurations that run Maquis nodes (each also exists as `<name>-tls`).
const MAQUIS_CONFIGS: [&str; 3] = ["single", "parallel", "affinity"];
/// The suffix of a configuration with TLS on every lane.
pub const TLS_SUFFIX: &str = "-tls";

/// A configuration's name without `-tls`, and whether it had it.
pub fn split_tls(config: &str) -> (&str, bool) {
    match config.strip_suffix(TLS_SUFFIX) {
        Some(base) if MAQUIS_CONFIGS.contains(&base) => (base, true),
        _ => (config, false),
    }
}

struct Plan {
    rtts: Vec<u64>,
    actors: Vec<usize>,
    sizes: Vec<usize>,
    configs: Vec<String>,
    messages: u64,
    cell_seconds: f64,
    sweep: Vec<u16>,
}

fn plan(a: &MicroArgs) -> Result<Plan, String> {
    let q = a.quick;
    let p = Plan {
        rtts: a.rtt.clone().unwrap_or(vec![1, 20]),
        actors: a.actors.clone().unwrap_or(if q {
            vec![16, 128]
        } else {
            vec![1, 16, 32, 64, 128]
        }),
        sizes: a.sizes.clone().unwrap_or(if q {
            vec![1024, 512 * 1024]
        } else {
            vec![1024, 512 * 1024, 8 * 1024 * 1024]
        }),
        configs: with_tls_twins(
            a.configs
                .clone()
                .unwrap_or(ALL_CONFIGS.iter().map(|s| s.to_string()).collect()),
            a.tls,
        ),
        messages: a.messages.unwrap_or(if q { 2_000 } else { 10_000 }),
        cell_seconds: a.cell_seconds.unwrap_or(if q { 3.0 } else { 10.0 }),
        sweep: if a.no_sweep {
            vec![]
        } else if q {
            vec![1, 16, 128]
        } else {
            vec![1, 2, 4, 8, 16, 32, 64, 128]
        },
    };
    if let Some(bad) = p
        .configs
        .iter()
        .find(|c| !ALL_CONFIGS.contains(&split_tls(c).0))
    {
        return Err(format!(
            "unknown configuration {bad:?} (known: {}, and {}-tls for the Maquis ones)",
            ALL_CONFIGS.join(","),
            MAQUIS_CONFIGS.join("-tls,")
        ));
    }
    if p.rtts.iter().any(|&r| r == 0 || r > 1000) || p.actors.iter().any(|&n| n == 0 || n > 1024) {
        return Err("--rtt must be 1..1000 ms and --actors 1..1024".into());
    }
    if p.sizes.iter().any(|&s| s > 16 * 1024 * 1024)
        || p.cell_seconds.is_nan()
        || p.cell_seconds <= 0.0
    {
        return Err("--sizes must be at most 16 MiB and --cell-seconds positive".into());
    }
    Ok(p)
}

/// `configs`, with `--tls` each Maquis configuration followed by its TLS twin (unless listed).
fn with_tls_twins(configs: Vec<String>, tls: bool) -> Vec<String> {
    if !tls {
        return configs;
    }
    let mut out = Vec::new();
    for c in &configs {
        out.push(c.clone());
        let twin = format!("{c}{TLS_SUFFIX}");
        if MAQUIS_CONFIGS.contains(&c.as_str()) && !configs.contains(&twin) {
            out.push(twin);
        }
    }
    out
}

/// Runs the benchmark; returns the cells measured.
pub fn run(args: &MicroArgs) -> Result<Vec<Cell>, String> {
    let plan = plan(args)?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let erlang_dir = if plan.configs.iter().any(|c| c == "erlang") {
        Some(crate::erlang::prepare(
            &args.out,
            "micro.erl",
            crate::erlang::MICRO_ERL,
        )?)
    } else {
        None
    };
    let tls_dir = if plan.configs.iter().any(|c| split_tls(c).1) {
        Some(crate::certs::write(
            &args.out.join("tls"),
            &["bench-server", "bench-client"],
        )?)
    } else {
        None
    };
    let log_path = args.out.join("agents.log");
    let log = File::create(&log_path).map_err(|e| e.to_string())?;
    let mut cells = Vec::new();
    let mut netem_reports = Vec::new();
    let total = plan.rtts.len() * plan.configs.len() * plan.actors.len() * plan.sizes.len()
        + if plan.rtts.contains(&1) {
            plan.sweep.len()
        } else {
            0
        };
    let mut done = 0;
    let started = Instant::now();
    for &rtt in &plan.rtts {
        let net = Netem::up(NetemConfig {
            hosts: 2,
            delay: Duration::from_micros(rtt * 500),
            prefix: "mqbench".into(),
            ..Default::default()
        })
        .map_err(|e| format!("link emulator: {e}"))?;
        let server_addr = format!("{}:{SERVER_PORT}", net.hosts()[1].addr);
        let client_ip = net.hosts()[0].addr.to_string();
        for config in &plan.configs {
            let setup = Setup {
                net: &net,
                exe: &exe,
                server_addr: &server_addr,
                client_ip: &client_ip,
                log: &log,
                erlang_dir: erlang_dir.as_deref(),
                tls_dir: tls_dir.as_deref(),
            };
            let parallelism = match split_tls(config).0 {
                "single" | "erlang" => 1,
                _ => 16,
            };
            let mut server = setup.server(config, parallelism)?;
            for &size in &plan.sizes {
                for &actors in &plan.actors {
                    done += 1;
                    let cell = setup.cell(
                        &mut server,
                        config,
                        parallelism,
                        rtt,
                        size,
                        actors,
                        args.echo,
                        &plan,
                        "grid",
                    )?;
                    progress(done, total, started, &cell);
                    cells.push(cell);
                    write_results(&args.out, &cells)?;
                }
            }
            server.stop(Duration::from_secs(10));
        }
        if rtt == 1 && !plan.sweep.is_empty() {
            let setup = Setup {
                net: &net,
                exe: &exe,
                server_addr: &server_addr,
                client_ip: &client_ip,
                log: &log,
                erlang_dir: None,
                tls_dir: None,
            };
            for &p in &plan.sweep {
                let mut server = setup.server("affinity", p)?;
                done += 1;
                let cell = setup.cell(
                    &mut server,
                    "affinity",
                    p,
                    rtt,
                    512 * 1024,
                    128,
                    args.echo,
                    &plan,
                    "sweep",
                )?;
                progress(done, total, started, &cell);
                cells.push(cell);
                write_results(&args.out, &cells)?;
                server.stop(Duration::from_secs(10));
            }
        }
        if erlang_dir.is_some() {
            for h in 0..2 {
                let _ = net
                    .command(h, "epmd")
                    .arg("-kill")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let stats = net
            .shutdown()
            .map_err(|e| format!("link emulator teardown: {e}"))?;
        netem_reports.push((rtt, stats));
    }
    crate::micro_report::write(&args.out, &cells, &netem_reports, args, started.elapsed())?;
    Ok(cells)
}

fn progress(done: usize, total: usize, started: Instant, c: &Cell) {
    eprintln!(
        "[{done:>3}/{total}] {:>5.0}s  rtt {:>2} ms  {:<8} p={:<3} actors {:>3}  payload {:>8}  {:>9.1} ops/s  p50 {:>8.2} ms  p99 {:>8.2} ms{}",
        started.elapsed().as_secs_f64(),
        c.rtt_ms,
        c.config,
        c.parallelism,
        c.actors,
        c.payload_bytes,
        c.ops_per_s,
        c.p50_us as f64 / 1e3,
        c.p99_us as f64 / 1e3,
        if c.errors > 0 { format!("  ({} errors)", c.errors) } else { String::new() }
    );
}

fn write_results(out: &Path, cells: &[Cell]) -> Result<(), String> {
    let json = serde_json::to_string_pretty(cells).map_err(|e| e.to_string())?;
    std::fs::write(out.join("results.json"), json).map_err(|e| e.to_string())
}

struct Setup<'a> {
    net: &'a Netem,
    exe: &'a Path,
    server_addr: &'a str,
    client_ip: &'a str,
    log: &'a File,
    erlang_dir: Option<&'a Path>,
    tls_dir: Option<&'a Path>,
}

impl Setup<'_> {
    fn log(&self) -> Stdio {
        self.log
            .try_clone()
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    }

    fn agent_cmd(&self, host: usize) -> Command {
        let mut c = self.net.command(host, self.exe);
        c.env("RUST_LOG", crate::stats::agent_log_filter());
        c
    }

    /// The options of a Maquis agent that follow from `config`: affinity, and TLS for a
    /// `-tls` configuration.
    fn maquis_opts(&self, c: &mut Command, config: &str) -> Result<(), String> {
        let (base, tls) = split_tls(config);
        c.args(["--affinity", if base == "affinity" { "on" } else { "off" }]);
        if tls {
            let dir = self.tls_dir.ok_or("no certificates were made for TLS")?;
            c.arg("--tls-dir").arg(dir);
        }
        Ok(())
    }

    /// An Erlang VM on `host` named `name`, with the benchmark's module on its path, whose
    /// next argument is the expression it evaluates.
    fn erl(&self, host: usize, name: &str) -> Result<Command, String> {
        let dir = self.erlang_dir.ok_or("erlang was not prepared")?;
        let mut c = self.net.command(host, "erl");
        c.args(crate::erlang::NO_BUSY_WAIT)
            .args(["-noshell", "-name", name, "-setcookie", COOKIE])
            .arg("-pa")
            .arg(dir)
            .arg("-eval");
        Ok(c)
    }

    fn server(&self, config: &str, parallelism: u16) -> Result<Proc, String> {
        let cmd = match config {
            "erlang" => {
                let mut c = self.erl(1, &format!("mqs@{}", self.server_host()))?;
                c.arg(format!(
                    "micro:server(128, {})",
                    crate::stats::clock_ticks()
                ));
                c
            }
            "raw-tcp" => {
                let mut c = self.agent_cmd(1);
                c.args(["agent", "raw-server", "--listen", self.server_addr]);
                c
            }
            _ => {
                let mut c = self.agent_cmd(1);
                c.args(["agent", "micro-server", "--listen", self.server_addr])
                    .args(["--parallelism", &parallelism.to_string()])
                    .args(["--cookie", COOKIE, "--actors", "128"]);
                self.maquis_opts(&mut c, config)?;
                c
            }
        };
        let mut a = Proc::start(&format!("{config} server"), cmd, self.log())?;
        a.expect(&["ready"], Duration::from_secs(30))?;
        Ok(a)
    }

    fn server_host(&self) -> &str {
        self.server_addr.split(':').next().unwrap_or("")
    }

    #[allow(clippy::too_many_arguments)]
    fn cell(
        &self,
        server: &mut Proc,
        config: &str,
        parallelism: u16,
        rtt: u64,
        size: usize,
        actors: usize,
        echo: bool,
        plan: &Plan,
        series: &str,
    ) -> Result<Cell, String> {
        let limit = plan.cell_seconds;
        let messages = plan.messages.to_string();
        let cmd = match config {
            "erlang" => {
                let mut c = self.erl(0, &format!("mqc@{}", self.client_ip))?;
                c.arg(format!(
                    "micro:client('mqs@{}', {actors}, {size}, {messages}, {echo}, {}, {}, {})",
                    self.server_host(),
                    (limit * 1000.0) as u64,
                    (WARMUP_S * 1000.0) as u64,
                    crate::stats::clock_ticks()
                ));
                c
            }
            "raw-tcp" => {
                let mut c = self.agent_cmd(0);
                c.args(["agent", "raw-client", "--server", self.server_addr])
                    .args([
                        "--conns",
                        &parallelism.to_string(),
                        "--actors",
                        &actors.to_string(),
                    ])
                    .args(["--size", &size.to_string(), "--messages", &messages])
                    .args([
                        "--limit-s",
                        &limit.to_string(),
                        "--warmup-s",
                        &WARMUP_S.to_string(),
                    ]);
                if echo {
                    c.arg("--echo");
                }
                c
            }
            _ => {
                let mut c = self.agent_cmd(0);
                c.args([
                    "agent",
                    "micro-client",
                    "--listen",
                    &format!("{}:0", self.client_ip),
                ])
                .args(["--server", self.server_addr, "--cookie", COOKIE])
                .args(["--parallelism", &parallelism.to_string()])
                .args(["--actors", &actors.to_string(), "--size", &size.to_string()])
                .args(["--messages", &messages, "--limit-s", &limit.to_string()])
                .args(["--warmup-s", &WARMUP_S.to_string()]);
                if echo {
                    c.arg("--echo");
                }
                self.maquis_opts(&mut c, config)?;
                c
            }
        };
        let cpu_before = server.cpu()?;
        // The server's CPU during the warm-up counts too: a small overestimate, the same for all.
        // The cell's own limit plus time for start-up and the last round trips in flight.
        let wall = Duration::from_secs_f64(limit * 2.0 + 60.0);
        let line = run_json(&format!("{config} client"), cmd, self.log(), wall)?;
        let server_cpu = server.cpu()? - cpu_before;
        let r: RunResult =
            serde_json::from_str(&line).map_err(|e| format!("{config} client: {e}: {line}"))?;
        Ok(Cell {
            rtt_ms: rtt,
            payload_bytes: size,
            actors,
            config: config.to_string(),
            parallelism,
            echo,
            ops_per_s: r.ops_per_s,
            p50_us: r.p50_us,
            p99_us: r.p99_us,
            max_us: r.max_us,
            messages: r.messages,
            errors: r.errors,
            seconds: r.seconds,
            cpu_us_per_msg: if r.messages > 0 {
                (r.cpu_s + server_cpu) * 1e6 / r.messages as f64
            } else {
                0.0
            },
            series: series.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        micro: MicroArgs,
    }

    fn plan_of(args: &[&str]) -> Result<Plan, String> {
        let cli = Cli::try_parse_from(std::iter::once("micro").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        plan(&cli.micro)
    }

    #[test]
    fn tls_adds_a_twin_of_each_maquis_configuration() {
        let p = plan_of(&["--tls"]).unwrap();
        assert_eq!(
            p.configs,
            [
                "erlang",
                "single",
                "single-tls",
                "parallel",
                "parallel-tls",
                "affinity",
                "affinity-tls",
                "raw-tcp"
            ]
        );
        let p = plan_of(&["--tls", "--configs", "affinity,raw-tcp"]).unwrap();
        assert_eq!(p.configs, ["affinity", "affinity-tls", "raw-tcp"]);
        let p = plan_of(&["--configs", "affinity-tls"]).unwrap();
        assert_eq!(p.configs, ["affinity-tls"]);
        assert!(plan_of(&["--configs", "raw-tcp-tls"]).is_err());
        assert!(plan_of(&["--configs", "erlang-tls"]).is_err());
        assert_eq!(split_tls("affinity-tls"), ("affinity", true));
        assert_eq!(split_tls("raw-tcp"), ("raw-tcp", false));
    }
}
