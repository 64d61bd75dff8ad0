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
use crate::stats::{LaneUse, Mode, RunResult};
use clap::ValueEnum;

/// Options of `maquis-bench micro`.
#[derive(Args, Debug, Clone)]
pub struct MicroArgs {
    /// A reduced grid that runs in a few minutes.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json, report.md and the plots go (with --quick and no --out: target/bench-quick/micro).
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
    /// Workloads (default rtt,stream,mixed): `rtt` the closed-loop grid, `stream` one-way
    /// messages, `mixed` closed-loop calls measured alone and beside bulk transfers.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub modes: Option<Vec<Mode>>,
    /// Actor counts of `stream` (default 1,16; quick 16); its sizes are `--sizes` (quick: the
    /// smallest).
    #[arg(long, value_delimiter = ',')]
    pub stream_actors: Option<Vec<usize>>,
    /// Calling actors of `mixed` (default 16); their payload is the smallest of `--sizes`.
    #[arg(long, value_delimiter = ',')]
    pub mixed_actors: Option<Vec<usize>>,
    /// Actors running bulk transfers in `mixed`, one cell per count (default 1,4: one
    /// transfer at a time, and four at once).
    #[arg(long, value_delimiter = ',')]
    pub bulk_actors: Option<Vec<usize>>,
    /// Payload bytes of the bulk transfers in `mixed`.
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    pub bulk_size: usize,
    /// The Maquis nodes' `transport.part_bytes` (else the default).
    #[arg(long)]
    pub part_bytes: Option<usize>,
    /// The Maquis nodes' `transport.unsent_bytes` (else the default).
    #[arg(long)]
    pub unsent_bytes: Option<usize>,
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
    /// Which workload and figure the cell belongs to: `grid` (closed loop), `sweep`
    /// (connections per peer, closed loop), `stream` (one-way: `ops_per_s` are messages
    /// delivered per second, `messages` those delivered, `errors` those sent but not delivered,
    /// no latencies, CPU per message) or `mixed` (the closed-loop calls beside bulk transfers;
    /// see `mixed`).
    pub series: String,
    /// `mixed` only: the calls alone and the bulk transfers beside them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed: Option<Mixed>,
    /// Maquis only: how many lanes of the client's `default` channel took small messages and
    /// striped messages' parts while it measured (the channel's width and spread, sampled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<LaneUse>,
}

/// What a `mixed` cell measured besides its calls (the cell's `ops_per_s`, `p50_us`, `p99_us`
/// are the calls' while the bulk transfers ran; its CPU per message is over the whole cell, both
/// phases, per round trip of either kind).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Mixed {
    /// The calls' round trips per second without bulk transfers.
    pub alone_ops_per_s: f64,
    /// Their median latency then, µs.
    pub alone_p50_us: u64,
    /// Their 99th percentile then, µs.
    pub alone_p99_us: u64,
    /// Actors running bulk transfers (closed loop, partners of their own).
    pub bulk_actors: usize,
    /// Payload bytes of a bulk transfer.
    pub bulk_payload_bytes: usize,
    /// Bulk round trips per second while the calls were measured.
    pub bulk_ops_per_s: f64,
    /// Their 99th percentile latency, µs.
    pub bulk_p99_us: u64,
}

const SERVER_PORT: u16 = 9400;
/// Partner actors a server hosts (p0 …): the callers' and the bulk transfers' together.
pub const PARTNERS: usize = 1024;
/// Unmeasured seconds at the start of every cell (connections warm up, TCP windows open).
pub const WARMUP_S: f64 = 1.0;
const COOKIE: &str = "maquis-bench-micro";
const ALL_CONFIGS: [&str; 6] = [
    "erlang", "single", "parallel", "affinity", "keyed", "raw-tcp",
];
/// The configurations that run Maquis nodes (each also exists as `<name>-tls`). `keyed` is
/// `affinity` without striping: every frame on the lane its key picks, as PARTISAN does.
const MAQUIS_CONFIGS: [&str; 4] = ["single", "parallel", "affinity", "keyed"];
/// The suffix of a configuration with TLS on every lane.
pub const TLS_SUFFIX: &str = "-tls";

/// The suffix of a configuration whose processes run on one thread: a Maquis agent's tokio
/// runtime with one worker (`TOKIO_WORKER_THREADS=1`), an Erlang VM with one scheduler
/// (`+S 1:1`), the raw-TCP agent's runtime with one worker.
pub const ONE_THREAD_SUFFIX: &str = "-1t";

/// A configuration's name without `-tls`, and whether it had it.
pub fn split_tls(config: &str) -> (&str, bool) {
    match config.strip_suffix(TLS_SUFFIX) {
        Some(base) if MAQUIS_CONFIGS.contains(&base) => (base, true),
        _ => (config, false),
    }
}

/// A configuration's name without `-1t`, and whether it had it.
pub fn split_one_thread(config: &str) -> (&str, bool) {
    match config.strip_suffix(ONE_THREAD_SUFFIX) {
        Some(rest) if ALL_CONFIGS.contains(&split_tls(rest).0) => (rest, true),
        _ => (config, false),
    }
}

/// A configuration's base name (`erlang`, `single`, …, `raw-tcp`), without `-tls` or `-1t`,
/// and whether it had `-tls`.
fn base_and_tls(config: &str) -> (&str, bool) {
    split_tls(split_one_thread(config).0)
}

/// A configuration's base name (`erlang`, `single`, …, `raw-tcp`), without `-tls` or `-1t`.
pub fn base_of(config: &str) -> &str {
    base_and_tls(config).0
}

struct Plan {
    rtts: Vec<u64>,
    actors: Vec<usize>,
    sizes: Vec<usize>,
    configs: Vec<String>,
    messages: u64,
    cell_seconds: f64,
    sweep: Vec<u16>,
    modes: Vec<Mode>,
    stream_actors: Vec<usize>,
    stream_sizes: Vec<usize>,
    mixed_actors: Vec<usize>,
    bulk_actors: Vec<usize>,
    bulk_size: usize,
}

/// One cell's workload.
struct Job {
    mode: Mode,
    size: usize,
    actors: usize,
    series: &'static str,
    /// `mixed`: the bulk transfers' actors.
    bulk: usize,
}

fn plan(a: &MicroArgs) -> Result<Plan, String> {
    let q = a.quick;
    let sizes = a.sizes.clone().unwrap_or(if q {
        vec![1024, 512 * 1024]
    } else {
        vec![1024, 512 * 1024, 8 * 1024 * 1024]
    });
    let smallest = sizes.iter().copied().min().unwrap_or(1024);
    let p = Plan {
        rtts: a.rtt.clone().unwrap_or(vec![1, 20]),
        actors: a.actors.clone().unwrap_or(if q {
            vec![16, 128]
        } else {
            vec![1, 16, 32, 64, 128]
        }),
        stream_sizes: if q { vec![smallest] } else { sizes.clone() },
        sizes,
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
        modes: a
            .modes
            .clone()
            .unwrap_or(vec![Mode::Rtt, Mode::Stream, Mode::Mixed]),
        stream_actors: a
            .stream_actors
            .clone()
            .unwrap_or(if q { vec![16] } else { vec![1, 16] }),
        mixed_actors: a.mixed_actors.clone().unwrap_or(vec![16]),
        bulk_actors: a.bulk_actors.clone().unwrap_or(vec![1, 4]),
        bulk_size: a.bulk_size,
    };
    if let Some(bad) = p
        .configs
        .iter()
        .find(|c| !ALL_CONFIGS.contains(&base_of(c)))
    {
        return Err(format!(
            "unknown configuration {bad:?} (known: {}; {}-tls for the Maquis ones; any of them \
             followed by {ONE_THREAD_SUFFIX} to run its processes on one thread)",
            ALL_CONFIGS.join(","),
            MAQUIS_CONFIGS.join("-tls,")
        ));
    }
    let callers = p
        .actors
        .iter()
        .chain(&p.stream_actors)
        .chain(&p.mixed_actors);
    if p.rtts.iter().any(|&r| r == 0 || r > 1000)
        || callers.clone().any(|&n| n == 0)
        || callers.clone().any(|&n| n > PARTNERS)
    {
        return Err(format!(
            "--rtt must be 1..1000 ms and every actor count 1..{PARTNERS}"
        ));
    }
    if p.modes.contains(&Mode::Mixed)
        && (p.bulk_actors.is_empty()
            || p.bulk_actors.contains(&0)
            || p.mixed_actors
                .iter()
                .any(|&n| n + p.bulk_actors.iter().copied().max().unwrap_or(0) > PARTNERS))
    {
        return Err(format!(
            "--bulk-actors must be positive, and with the callers of --mixed-actors at most {PARTNERS}"
        ));
    }
    if p.sizes.is_empty() || p.modes.is_empty() {
        return Err("--sizes and --modes must not be empty".into());
    }
    if p.sizes
        .iter()
        .chain([&p.bulk_size])
        .any(|&s| s > 16 * 1024 * 1024)
        || p.cell_seconds.is_nan()
        || p.cell_seconds <= 0.0
    {
        return Err(
            "--sizes and --bulk-size must be at most 16 MiB and --cell-seconds positive".into(),
        );
    }
    Ok(p)
}

impl Plan {
    /// The cells each configuration runs at each RTT, in order: the closed-loop grid, the
    /// streams, the mixed cells.
    fn jobs(&self) -> Vec<Job> {
        let mut jobs = Vec::new();
        let cross = |mode, sizes: &[usize], actors: &[usize], series, jobs: &mut Vec<Job>| {
            let bulks = if mode == Mode::Mixed {
                &self.bulk_actors[..]
            } else {
                &[0]
            };
            for &size in sizes {
                for &actors in actors {
                    for &bulk in bulks {
                        jobs.push(Job {
                            mode,
                            size,
                            actors,
                            series,
                            bulk,
                        });
                    }
                }
            }
        };
        for &mode in &self.modes {
            match mode {
                Mode::Rtt => cross(mode, &self.sizes, &self.actors, "grid", &mut jobs),
                Mode::Stream => cross(
                    mode,
                    &self.stream_sizes,
                    &self.stream_actors,
                    "stream",
                    &mut jobs,
                ),
                Mode::Mixed => {
                    let smallest = self.sizes.iter().copied().min().unwrap_or(1024);
                    cross(mode, &[smallest], &self.mixed_actors, "mixed", &mut jobs)
                }
            }
        }
        jobs
    }
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
    // The Erlang build and the certificates live in temporary directories (removed when the
    // run ends), not among the results.
    let erlang_build = if plan.configs.iter().any(|c| base_of(c) == "erlang") {
        Some(crate::erlang::prepare(
            "micro.erl",
            crate::erlang::MICRO_ERL,
        )?)
    } else {
        None
    };
    let erlang_dir = erlang_build.as_ref().map(|d| d.path().to_path_buf());
    let tls_build = if plan.configs.iter().any(|c| base_and_tls(c).1) {
        Some(
            tempfile::Builder::new()
                .prefix("maquis-bench-tls-")
                .tempdir()
                .map_err(|e| format!("a directory for the certificates: {e}"))?,
        )
    } else {
        None
    };
    let tls_dir = tls_build
        .as_ref()
        .map(|d| crate::certs::write(d.path(), &["bench-server", "bench-client"]))
        .transpose()?;
    let log_path = args.out.join("agents.log");
    let log = File::create(&log_path).map_err(|e| e.to_string())?;
    let mut cells = Vec::new();
    let mut netem_reports = Vec::new();
    let jobs = plan.jobs();
    let sweep: &[u16] = if plan.modes.contains(&Mode::Rtt) {
        &plan.sweep
    } else {
        &[]
    };
    let total = plan.rtts.len() * plan.configs.len() * jobs.len()
        + if plan.rtts.contains(&1) {
            sweep.len()
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
                part_bytes: args.part_bytes,
                unsent_bytes: args.unsent_bytes,
            };
            let parallelism = match base_of(config) {
                "single" | "erlang" => 1,
                _ => 16,
            };
            let mut server = setup.server(config, parallelism)?;
            for job in &jobs {
                done += 1;
                let cell =
                    setup.cell(&mut server, config, parallelism, rtt, job, args.echo, &plan)?;
                progress(done, total, started, &cell);
                cells.push(cell);
                write_results(&args.out, &cells)?;
            }
            server.stop(Duration::from_secs(10));
        }
        if rtt == 1 && !sweep.is_empty() {
            let setup = Setup {
                net: &net,
                exe: &exe,
                server_addr: &server_addr,
                client_ip: &client_ip,
                log: &log,
                erlang_dir: None,
                tls_dir: None,
                part_bytes: args.part_bytes,
                unsent_bytes: args.unsent_bytes,
            };
            for &p in sweep {
                let mut server = setup.server("affinity", p)?;
                done += 1;
                let job = Job {
                    mode: Mode::Rtt,
                    size: 512 * 1024,
                    actors: 128,
                    series: "sweep",
                    bulk: 0,
                };
                let cell = setup.cell(&mut server, "affinity", p, rtt, &job, args.echo, &plan)?;
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
    let measured = match (&c.mixed, c.series.as_str()) {
        (_, "stream") => format!("{:>9.1} msgs/s delivered", c.ops_per_s),
        (Some(m), _) => format!(
            "{:>9.1} ops/s  p99 {:>8.2} ms (alone {:.2} ms)  bulk {:.1} ops/s",
            c.ops_per_s,
            c.p99_us as f64 / 1e3,
            m.alone_p99_us as f64 / 1e3,
            m.bulk_ops_per_s
        ),
        (None, _) => format!(
            "{:>9.1} ops/s  p50 {:>8.2} ms  p99 {:>8.2} ms",
            c.ops_per_s,
            c.p50_us as f64 / 1e3,
            c.p99_us as f64 / 1e3
        ),
    };
    eprintln!(
        "[{done:>3}/{total}] {:>5.0}s  {:<6} rtt {:>2} ms  {:<8} p={:<3} actors {:>3}  payload {:>8}  {measured}{}",
        started.elapsed().as_secs_f64(),
        c.series,
        c.rtt_ms,
        c.config,
        c.parallelism,
        c.actors,
        c.payload_bytes,
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
    part_bytes: Option<usize>,
    unsent_bytes: Option<usize>,
}

impl Setup<'_> {
    fn log(&self) -> Stdio {
        self.log
            .try_clone()
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    }

    /// An agent of this binary on `host`, on one worker thread for a `-1t` `config`.
    fn agent_cmd(&self, host: usize, config: &str) -> Command {
        let mut c = self.net.command(host, self.exe);
        c.env("RUST_LOG", crate::stats::agent_log_filter());
        if split_one_thread(config).1 {
            c.env("TOKIO_WORKER_THREADS", "1");
        }
        c
    }

    /// The options of a Maquis agent that follow from `config`: affinity, and TLS for a
    /// `-tls` configuration.
    fn maquis_opts(&self, c: &mut Command, config: &str) -> Result<(), String> {
        let (base, tls) = base_and_tls(config);
        let affinity = matches!(base, "affinity" | "keyed");
        c.args(["--affinity", if affinity { "on" } else { "off" }]);
        if base == "keyed" {
            c.args(["--stripe-bytes", "0"]);
        }
        if let Some(p) = self.part_bytes {
            c.args(["--part-bytes", &p.to_string()]);
        }
        if let Some(u) = self.unsent_bytes {
            c.args(["--unsent-bytes", &u.to_string()]);
        }
        if tls {
            let dir = self.tls_dir.ok_or("no certificates were made for TLS")?;
            c.arg("--tls-dir").arg(dir);
        }
        Ok(())
    }

    /// An Erlang VM on `host` named `name`, with the benchmark's module on its path, whose
    /// next argument is the expression it evaluates; one scheduler for a `-1t` `config`.
    fn erl(&self, host: usize, name: &str, config: &str) -> Result<Command, String> {
        let dir = self.erlang_dir.ok_or("erlang was not prepared")?;
        let mut c = self.net.command(host, "erl");
        if split_one_thread(config).1 {
            c.args(["+S", "1:1"]);
        }
        c.args(crate::erlang::NO_BUSY_WAIT)
            .args(["-noshell", "-name", name, "-setcookie", COOKIE])
            .arg("-pa")
            .arg(dir)
            .arg("-eval");
        Ok(c)
    }

    fn server(&self, config: &str, parallelism: u16) -> Result<Proc, String> {
        let cmd = match base_of(config) {
            "erlang" => {
                let mut c = self.erl(1, &format!("mqs@{}", self.server_host()), config)?;
                c.arg(format!(
                    "micro:server({PARTNERS}, {})",
                    crate::stats::clock_ticks()
                ));
                c
            }
            "raw-tcp" => {
                let mut c = self.agent_cmd(1, config);
                c.args(["agent", "raw-server", "--listen", self.server_addr]);
                c
            }
            _ => {
                let mut c = self.agent_cmd(1, config);
                c.args(["agent", "micro-server", "--listen", self.server_addr])
                    .args(["--parallelism", &parallelism.to_string()])
                    .args(["--cookie", COOKIE, "--actors", &PARTNERS.to_string()]);
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
        job: &Job,
        echo: bool,
        plan: &Plan,
    ) -> Result<Cell, String> {
        let limit = plan.cell_seconds;
        let messages = plan.messages.to_string();
        let (size, actors) = (job.size, job.actors);
        let mode = job
            .mode
            .to_possible_value()
            .map(|v| v.get_name().to_string());
        let mode = mode.unwrap_or_default();
        let cmd = match base_of(config) {
            "erlang" => {
                let mut c = self.erl(0, &format!("mqc@{}", self.client_ip), config)?;
                c.arg(format!(
                    "micro:client('mqs@{}', {mode}, {actors}, {size}, {messages}, {echo}, {}, {}, {}, {}, {})",
                    self.server_host(),
                    (limit * 1000.0) as u64,
                    (WARMUP_S * 1000.0) as u64,
                    crate::stats::clock_ticks(),
                    job.bulk,
                    plan.bulk_size,
                ));
                c
            }
            "raw-tcp" => {
                let mut c = self.agent_cmd(0, config);
                c.args(["agent", "raw-client", "--server", self.server_addr])
                    .args(["--conns", &parallelism.to_string()]);
                c
            }
            _ => {
                let mut c = self.agent_cmd(0, config);
                c.args([
                    "agent",
                    "micro-client",
                    "--listen",
                    &format!("{}:0", self.client_ip),
                ])
                .args(["--server", self.server_addr, "--cookie", COOKIE])
                .args(["--parallelism", &parallelism.to_string()]);
                self.maquis_opts(&mut c, config)?;
                c
            }
        };
        let mut cmd = cmd;
        if base_of(config) != "erlang" {
            cmd.args(["--mode", &mode])
                .args(["--actors", &actors.to_string(), "--size", &size.to_string()])
                .args(["--messages", &messages, "--limit-s", &limit.to_string()])
                .args(["--warmup-s", &WARMUP_S.to_string()])
                .args(["--bulk-actors", &job.bulk.to_string()])
                .args(["--bulk-size", &plan.bulk_size.to_string()]);
            if echo {
                cmd.arg("--echo");
            }
        }
        let cpu_before = server.cpu()?;
        // The server's CPU during the warm-up counts too: a small overestimate, the same for all.
        // The cell's own limit plus time for start-up and the last round trips in flight; a
        // mixed cell measures twice.
        let phases = if job.mode == Mode::Mixed { 2.0 } else { 1.0 };
        let wall = Duration::from_secs_f64(phases * (limit * 2.0 + WARMUP_S) + 60.0);
        let line = run_json(&format!("{config} client"), cmd, self.log(), wall)?;
        let server_cpu = server.cpu()? - cpu_before;
        let r: RunResult =
            serde_json::from_str(&line).map_err(|e| format!("{config} client: {e}: {line}"))?;
        // Every round trip the CPU was spent on: a mixed cell's calls alone and its bulk
        // transfers too.
        let all = r.messages
            + r.alone.as_ref().map_or(0, |a| a.messages)
            + r.bulk.as_ref().map_or(0, |b| b.messages);
        let mixed = match (&r.alone, &r.bulk) {
            (Some(alone), Some(bulk)) => Some(Mixed {
                alone_ops_per_s: alone.ops_per_s,
                alone_p50_us: alone.p50_us,
                alone_p99_us: alone.p99_us,
                bulk_actors: job.bulk,
                bulk_payload_bytes: plan.bulk_size,
                bulk_ops_per_s: bulk.ops_per_s,
                bulk_p99_us: bulk.p99_us,
            }),
            _ if job.mode == Mode::Mixed => {
                return Err(format!(
                    "{config} client: a mixed run without its phases: {line}"
                ))
            }
            _ => None,
        };
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
            cpu_us_per_msg: if all > 0 {
                (r.cpu_s + server_cpu) * 1e6 / all as f64
            } else {
                0.0
            },
            series: job.series.to_string(),
            mixed,
            lanes: r.lanes,
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
    fn quick_runs_the_grid_a_stream_and_the_mixed_cells() {
        let p = plan_of(&["--quick"]).unwrap();
        let jobs = p.jobs();
        let of = |series: &str| jobs.iter().filter(|j| j.series == series).count();
        assert_eq!((of("grid"), of("stream"), of("mixed")), (4, 1, 2));
        let stream = jobs.iter().find(|j| j.series == "stream").unwrap();
        assert_eq!((stream.size, stream.actors), (1024, 16));
        let bulks: Vec<usize> = jobs
            .iter()
            .filter(|j| j.mode == Mode::Mixed)
            .map(|j| j.bulk)
            .collect();
        assert_eq!(bulks, [1, 4]);
        let p = plan_of(&["--modes", "stream", "--stream-actors", "1,2"]).unwrap();
        let jobs = p.jobs();
        assert_eq!(jobs.len(), 6, "three sizes × two actor counts");
        assert!(jobs.iter().all(|j| j.mode == Mode::Stream));
    }

    #[test]
    fn bad_mixed_and_stream_options_are_refused() {
        assert!(plan_of(&["--bulk-actors", "0"]).is_err());
        assert!(plan_of(&["--mixed-actors", "1020", "--bulk-actors", "5"]).is_err());
        assert!(plan_of(&["--mixed-actors", "1020", "--bulk-actors", "4"]).is_ok());
        assert!(plan_of(&["--stream-actors", "0"]).is_err());
        assert!(plan_of(&["--bulk-size", "33554432"]).is_err());
        assert!(plan_of(&["--modes", "sideways"]).is_err());
        // Bulk counts matter only when mixed cells run.
        assert!(plan_of(&["--modes", "rtt", "--bulk-actors", "0"]).is_ok());
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
                "keyed",
                "keyed-tls",
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

    #[test]
    fn any_configuration_runs_on_one_thread_with_its_suffix() {
        let p = plan_of(&[
            "--configs",
            "erlang-1t,affinity-1t,affinity-tls-1t,raw-tcp-1t",
        ]);
        assert_eq!(
            p.unwrap().configs,
            ["erlang-1t", "affinity-1t", "affinity-tls-1t", "raw-tcp-1t"]
        );
        assert!(plan_of(&["--configs", "affinity-1t-tls"]).is_err());
        assert!(plan_of(&["--configs", "affinity-1t-1t"]).is_err());
        assert!(plan_of(&["--configs", "-1t"]).is_err());
        assert_eq!(split_one_thread("affinity-tls-1t"), ("affinity-tls", true));
        assert_eq!(split_one_thread("affinity"), ("affinity", false));
        assert_eq!(base_of("affinity-tls-1t"), "affinity");
        assert_eq!(base_of("erlang-1t"), "erlang");
    }
}
