//! `maquis-bench echo` and `maquis-bench kvs`: PARTISAN's Riak Core experiments (Fig. 5–8) on
//! `maquis-ring`, three ring nodes in three emulated hosts, in two configurations measured in the
//! same run: `single` (one connection per peer) and `partisan` (parallel lanes, affinity, named
//! channels).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use maquis_netem::{Netem, NetemConfig, NetemStats};
use serde::{Deserialize, Serialize};

use crate::ring_agent::{self, Converged, NodeRun, Preloaded, RunSpec, Workload, PARTISAN, SINGLE};
use crate::ring_faults::{self, FaultCell, BACKENDS};
use crate::ring_proc::Proc;
use crate::ring_redis::{self, RedisOutcome};

/// Options shared by `maquis-bench echo` and `maquis-bench kvs`.
#[derive(Args, Debug, Clone)]
pub struct RingArgs {
    /// A reduced grid that runs in a few minutes: actors 16,32; payloads 1 KiB and 8 MiB;
    /// 4 s per cell.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json, report.md and the plots go (default bench/results/echo or
    /// bench/results/kvs; with --quick, target/bench-quick/echo or …/kvs).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Round-trip times in ms (default 1,20).
    #[arg(long, value_delimiter = ',')]
    pub rtt: Option<Vec<u64>>,
    /// Closed-loop actors per node, all three nodes at once (default 16,32,64,128; quick
    /// 16,32).
    #[arg(long, value_delimiter = ',')]
    pub actors: Option<Vec<usize>>,
    /// Payload sizes in bytes (default 1024,524288,8388608; quick 1024,8388608).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Option<Vec<usize>>,
    /// Configurations (default single,partisan).
    #[arg(long, value_delimiter = ',')]
    pub configs: Option<Vec<String>>,
    /// Measured seconds per cell (default 5; quick 4; the paper ran 120).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Unmeasured seconds at the start of each cell (default 2).
    #[arg(long)]
    pub warmup: Option<f64>,
    /// Partitions (vnodes) of the ring; the paper used 1,024.
    #[arg(long, default_value_t = 1024)]
    pub partitions: u32,
    /// Deadline of one request, in seconds (a request still unanswered fails).
    #[arg(long, default_value_t = 60)]
    pub request_timeout_s: u64,
    /// A net.* sysctl to set in every emulated host, e.g.
    /// `net.ipv4.tcp_slow_start_after_idle=0` (repeatable; default: none, the kernel's values).
    #[arg(long, value_parser = parse_sysctl)]
    pub sysctl: Vec<(String, String)>,
    /// Bytes each lane's outbound queue holds, in MiB (the runtime's default: 8).
    #[arg(long, default_value_t = 8)]
    pub lane_queue_mib: usize,
}

fn parse_sysctl(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

/// Options of `maquis-bench echo`.
#[derive(Args, Debug, Clone)]
pub struct EchoArgs {
    /// The options every ring benchmark has.
    #[command(flatten)]
    pub ring: RingArgs,
}

/// Options of `maquis-bench kvs`.
#[derive(Args, Debug, Clone)]
pub struct KvsArgs {
    /// The options every ring benchmark has.
    #[command(flatten)]
    pub ring: RingArgs,
    /// Keys of the workload (the paper: 10,000); fewer for values too large for --memory-mib.
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    /// Reads per write (the paper: 10).
    #[arg(long, default_value_t = 10)]
    pub reads_per_write: u32,
    /// Simulated storage delay of every vnode read and write, in ms (the paper: 1).
    #[arg(long, default_value_t = 1)]
    pub storage_delay_ms: u64,
    /// Memory the stored values may take, all replicas on all three nodes together, in MiB;
    /// the key space shrinks for value sizes that would not fit.
    #[arg(long, default_value_t = 2048)]
    pub memory_mib: u64,
    /// Also start three `ring serve --resp` nodes per RTT and configuration and run
    /// `redis-benchmark -t set,get -n 20000 -q` against each (installs Debian's redis-tools
    /// with apt-get when missing).
    #[arg(long)]
    pub redis: bool,
    /// Also run, per RTT, configuration and storage backend (memory, durable), the KVS
    /// workload while each node in turn is killed with SIGKILL and started again, and count
    /// the acknowledged writes lost and the stale reads (faults.json and the report's
    /// "Faults" section).
    #[arg(long)]
    pub faults: bool,
}

/// One measured cell, as written to results.json.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    /// `echo` or `kvs`.
    pub workload: String,
    /// Emulated round-trip time between any two hosts.
    pub rtt_ms: u64,
    /// Payload (echo) or value (KVS) bytes.
    pub payload_bytes: usize,
    /// Closed-loop actors per node (three nodes).
    pub actors: usize,
    /// `single` or `partisan`.
    pub config: String,
    /// Requests completed per second, the three nodes together.
    pub ops_per_s: f64,
    /// Median request latency, microseconds (all nodes).
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest.
    pub max_us: u64,
    /// Requests completed in the measured window.
    pub messages: u64,
    /// Requests that failed in the measured window.
    pub errors: u64,
    /// Measured window, seconds.
    pub seconds: f64,
    /// CPU time of the three ring processes per request, microseconds.
    pub cpu_us_per_op: f64,
    /// KVS: size of the key space.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub keys: Option<u64>,
    /// KVS: gets among `messages`.
    pub reads: u64,
    /// KVS: puts among `messages`.
    pub writes: u64,
    /// KVS: gets that found no value of the expected size.
    pub misses: u64,
    /// Longest time a node needed after the window to finish its requests in flight, seconds.
    pub drain_s: f64,
    /// Membership events seen during the cell, as `n1: down n2`; any makes the cell invalid
    /// (a node declared down has its requests served by fallback vnodes).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub membership: Vec<String>,
    /// The first failure seen, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub first_error: Option<String>,
}

/// The resolved settings of a run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Echo or KVS.
    pub workload: Workload,
    /// The reduced grid.
    pub quick: bool,
    /// RTTs, ms.
    pub rtts: Vec<u64>,
    /// Actors per node.
    pub actors: Vec<usize>,
    /// Payload bytes.
    pub sizes: Vec<usize>,
    /// Configurations.
    pub configs: Vec<String>,
    /// Measured seconds per cell.
    pub seconds: f64,
    /// Warm-up seconds per cell.
    pub warmup: f64,
    /// Ring partitions.
    pub partitions: u32,
    /// Request deadline, seconds.
    pub request_timeout_s: u64,
    /// KVS: keys.
    pub keys: u64,
    /// KVS: reads per write.
    pub reads_per_write: u32,
    /// Storage delay, ms (0 for echo).
    pub storage_delay_ms: u64,
    /// KVS: memory budget for stored values, MiB.
    pub memory_mib: u64,
    /// Also run the redis-benchmark step.
    pub redis: bool,
    /// Also run the fault cells.
    pub faults: bool,
    /// Sysctls set in every emulated host.
    pub sysctls: Vec<(String, String)>,
    /// Lane queue size, MiB.
    pub lane_queue_mib: usize,
}

impl Cell {
    /// Whether the cell measured the cluster it was meant to: no node was declared down or
    /// left during it.
    pub fn valid(&self) -> bool {
        self.membership.is_empty()
    }
}

impl Plan {
    /// The key space for values of `size` bytes: all keys, or as many as fit the memory
    /// budget with three replicas each.
    pub fn kvs_keys(&self, size: usize) -> u64 {
        let fit = (self.memory_mib << 20) / (3 * size.max(1) as u64);
        self.keys.min(fit).max(1)
    }

    /// Mean and standard deviation of the key distribution over `keys` keys.
    pub fn key_distribution(keys: u64) -> (f64, f64) {
        ((keys as f64 - 1.0) / 2.0, keys as f64 / 6.0)
    }
}

/// How one configuration's cluster came up (for the report).
#[derive(Clone, Debug)]
pub struct ClusterInfo {
    /// RTT, ms.
    pub rtt_ms: u64,
    /// Configuration.
    pub config: String,
    /// What node n1 reported once converged.
    pub converged: Converged,
}

/// One KVS pre-load (for the report).
#[derive(Clone, Debug)]
pub struct PreloadInfo {
    /// RTT, ms.
    pub rtt_ms: u64,
    /// Configuration.
    pub config: String,
    /// Value bytes.
    pub size: usize,
    /// Keys written.
    pub keys: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Failed writes.
    pub errors: u64,
}

/// Everything the report needs.
pub struct Outcome {
    /// The settings.
    pub plan: Plan,
    /// Cells measured.
    pub cells: Vec<Cell>,
    /// Clusters started.
    pub clusters: Vec<ClusterInfo>,
    /// KVS pre-loads.
    pub preloads: Vec<PreloadInfo>,
    /// Link emulator statistics per RTT.
    pub netem: Vec<(u64, NetemStats)>,
    /// Further TCP settings as seen inside the first emulated host.
    pub host_sysctls: Vec<(String, String)>,
    /// The redis-benchmark step.
    pub redis: RedisOutcome,
    /// The fault cells.
    pub faults: Vec<FaultCell>,
    /// Why the run stopped before the end, if it did.
    pub stopped: Option<String>,
    /// Configurations that failed part-way (their remaining cells were skipped).
    pub failures: Vec<String>,
    /// Wall time.
    pub took: Duration,
}

const NODE_PORT: u16 = 9500;
const COOKIE: &str = "maquis-bench-ring";
const ALL_CONFIGS: [&str; 2] = [SINGLE, PARTISAN];

fn plan(a: &RingArgs, workload: Workload) -> Result<Plan, String> {
    let q = a.quick;
    let p = Plan {
        workload,
        quick: q,
        rtts: a.rtt.clone().unwrap_or(vec![1, 20]),
        actors: a.actors.clone().unwrap_or(if q {
            vec![16, 32]
        } else {
            vec![16, 32, 64, 128]
        }),
        sizes: a.sizes.clone().unwrap_or(if q {
            vec![1024, 8 * 1024 * 1024]
        } else {
            vec![1024, 512 * 1024, 8 * 1024 * 1024]
        }),
        configs: a
            .configs
            .clone()
            .unwrap_or(ALL_CONFIGS.iter().map(|s| s.to_string()).collect()),
        seconds: a.seconds.unwrap_or(if q { 4.0 } else { 5.0 }),
        warmup: a.warmup.unwrap_or(2.0),
        partitions: a.partitions,
        request_timeout_s: a.request_timeout_s,
        keys: 0,
        reads_per_write: 0,
        storage_delay_ms: 0,
        memory_mib: 0,
        redis: false,
        faults: false,
        sysctls: a.sysctl.clone(),
        lane_queue_mib: a.lane_queue_mib,
    };
    if let Some(bad) = p
        .configs
        .iter()
        .find(|c| !ALL_CONFIGS.contains(&c.as_str()))
    {
        return Err(format!(
            "unknown configuration {bad:?} (known: {})",
            ALL_CONFIGS.join(",")
        ));
    }
    if p.rtts.is_empty() || p.actors.is_empty() || p.sizes.is_empty() || p.configs.is_empty() {
        return Err("--rtt, --actors, --sizes and --configs need at least one value".into());
    }
    if p.rtts.iter().any(|&r| r == 0 || r > 1000) || p.actors.iter().any(|&n| n == 0 || n > 1024) {
        return Err("--rtt must be 1..1000 ms and --actors 1..1024".into());
    }
    if p.sizes.iter().any(|&s| s == 0 || s > 16 * 1024 * 1024) {
        return Err("--sizes must be 1 byte to 16 MiB".into());
    }
    if !(0.001..=3600.0).contains(&p.seconds) || !(0.0..=600.0).contains(&p.warmup) {
        return Err("--seconds must be in (0, 3600] and --warmup in [0, 600]".into());
    }
    if p.partitions == 0 || p.partitions > maquis_ring::MAX_PARTITIONS {
        return Err("--partitions must be 1 to 1024".into());
    }
    if p.lane_queue_mib == 0 || p.lane_queue_mib > 4095 {
        return Err("--lane-queue-mib must be 1 to 4095".into());
    }
    if p.request_timeout_s == 0 {
        return Err("--request-timeout-s must be positive".into());
    }
    Ok(p)
}

/// Runs `maquis-bench echo`.
/// Where a run writes without `--out`: `bench/results/<name>`, or for `--quick`
/// `target/bench-quick/<name>` (a short run does not replace the committed full one).
fn default_out(name: &str, quick: bool) -> PathBuf {
    if quick {
        crate::commands::quick_dir(name)
    } else {
        Path::new("bench/results").join(name)
    }
}

pub fn run_echo(args: &EchoArgs) -> Result<Vec<Cell>, String> {
    let plan = plan(&args.ring, Workload::Echo)?;
    let out = args
        .ring
        .out
        .clone()
        .unwrap_or_else(|| default_out("echo", args.ring.quick));
    run(plan, &out)
}

/// Runs `maquis-bench kvs`.
pub fn run_kvs(args: &KvsArgs) -> Result<Vec<Cell>, String> {
    let mut plan = plan(&args.ring, Workload::Kvs)?;
    if args.keys == 0 || args.memory_mib == 0 {
        return Err("--keys and --memory-mib must be positive".into());
    }
    plan.keys = args.keys;
    plan.reads_per_write = args.reads_per_write;
    plan.storage_delay_ms = args.storage_delay_ms;
    plan.memory_mib = args.memory_mib;
    plan.redis = args.redis;
    plan.faults = args.faults;
    let out = args
        .ring
        .out
        .clone()
        .unwrap_or_else(|| default_out("kvs", args.ring.quick));
    run(plan, &out)
}

fn run(plan: Plan, out: &Path) -> Result<Vec<Cell>, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let log = File::create(out.join("agents.log")).map_err(|e| e.to_string())?;
    let mut o = Outcome {
        plan: plan.clone(),
        cells: Vec::new(),
        clusters: Vec::new(),
        preloads: Vec::new(),
        netem: Vec::new(),
        host_sysctls: Vec::new(),
        redis: RedisOutcome::default(),
        faults: Vec::new(),
        stopped: None,
        failures: Vec::new(),
        took: Duration::ZERO,
    };
    let started = Instant::now();
    if plan.redis {
        o.redis = ring_redis::prepare(&exe);
    }
    let mut r = run_grid(&plan, out, &exe, &log, &mut o, started);
    if let Err(e) = &r {
        o.stopped = Some(e.clone());
    } else if !o.failures.is_empty() {
        r = Err(format!(
            "{} configuration(s) failed part-way: {}",
            o.failures.len(),
            o.failures.join("; ")
        ));
    }
    o.took = started.elapsed();
    crate::ring_report::write(out, &o)?;
    r.map(|()| o.cells)
}

fn run_grid(
    plan: &Plan,
    out: &Path,
    exe: &Path,
    log: &File,
    o: &mut Outcome,
    started: Instant,
) -> Result<(), String> {
    let total = plan.rtts.len() * plan.configs.len() * plan.sizes.len() * plan.actors.len();
    let mut done = 0;
    let (prefix, network) = match plan.workload {
        Workload::Echo => ("mqecho", [10, 78, 0, 0]),
        Workload::Kvs => ("mqkvs", [10, 79, 0, 0]),
    };
    eprintln!(
        "bench {}: {total} cells of {} s (+{} s warm-up), configurations {}",
        plan.workload.name(),
        plan.seconds,
        plan.warmup,
        plan.configs.join(",")
    );
    for &rtt in &plan.rtts {
        let net = Netem::up(NetemConfig {
            hosts: 3,
            delay: Duration::from_micros(rtt * 500),
            prefix: prefix.into(),
            network: network.into(),
            sysctls: plan.sysctls.clone(),
            ..Default::default()
        })
        .map_err(|e| format!("link emulator: {e}"))?;
        if o.host_sysctls.is_empty() {
            o.host_sysctls = read_sysctls(&net);
        }
        for (ci, config) in plan.configs.iter().enumerate() {
            let setup = Setup {
                net: &net,
                exe,
                log,
                plan,
                port: NODE_PORT + ci as u16,
            };
            let base = done;
            let mut grid = Grid {
                out,
                o: &mut *o,
                done: &mut done,
                total,
                started,
            };
            if let Err(e) = grid.config(&setup, config, rtt) {
                // The remaining cells of this configuration at this RTT are skipped; the
                // cluster is torn down and the run goes on.
                eprintln!("rtt {rtt} ms, {config}: {e}");
                o.failures.push(format!("rtt {rtt} ms, {config}: {e}"));
                done = base + plan.sizes.len() * plan.actors.len();
            }
        }
        if plan.faults {
            run_faults(plan, out, exe, log, o, &net, rtt)?;
        }
        if plan.redis {
            let rows = ring_redis::run(&net, rtt, plan, log, &mut o.redis);
            o.redis.rows.extend(rows);
        }
        let stats = net
            .shutdown()
            .map_err(|e| format!("link emulator teardown: {e}"))?;
        o.netem.push((rtt, stats));
    }
    Ok(())
}

/// The fault cells of one RTT: each configuration with each backend, on ports of their own
/// (a killed node restarts on its port).
fn run_faults(
    plan: &Plan,
    out: &Path,
    exe: &Path,
    log: &File,
    o: &mut Outcome,
    net: &Netem,
    rtt: u64,
) -> Result<(), String> {
    for (ci, config) in plan.configs.iter().enumerate() {
        for (bi, backend) in BACKENDS.iter().enumerate() {
            let setup = Setup {
                net,
                exe,
                log,
                plan,
                port: NODE_PORT + 10 + (ci * BACKENDS.len() + bi) as u16,
            };
            let t = Instant::now();
            match ring_faults::cell(&setup, config, rtt, backend, o.faults.len() + 1) {
                Ok(c) => {
                    let f = &c.findings;
                    eprintln!(
                        "[faults] rtt {rtt} ms  {config:<8} {backend:<7} (cell {:.0} s with set-up and checks): {} writes acknowledged, {} reads, {} errors, {} stale reads, {} acknowledged writes lost{}",
                        t.elapsed().as_secs_f64(),
                        f.acked_writes,
                        f.reads,
                        f.errors,
                        f.stale_reads,
                        f.lost_acked_writes,
                        c.first_error
                            .as_deref()
                            .map(|e| format!(" (first error: {e})"))
                            .unwrap_or_default()
                    );
                    o.faults.push(c);
                    let json =
                        serde_json::to_string_pretty(&o.faults).map_err(|e| e.to_string())?;
                    std::fs::write(out.join("faults.json"), json).map_err(|e| e.to_string())?;
                }
                Err(e) => {
                    eprintln!("[faults] rtt {rtt} ms, {config}, {backend}: {e}");
                    o.failures
                        .push(format!("faults, rtt {rtt} ms, {config}, {backend}: {e}"));
                }
            }
        }
    }
    Ok(())
}

/// Progress through the grid.
struct Grid<'a> {
    out: &'a Path,
    o: &'a mut Outcome,
    done: &'a mut usize,
    total: usize,
    started: Instant,
}

impl Grid<'_> {
    /// One configuration at one RTT: a fresh cluster, every payload and actor count.
    fn config(&mut self, setup: &Setup, config: &str, rtt: u64) -> Result<(), String> {
        let plan = setup.plan;
        let t = Instant::now();
        let (mut nodes, converged) = setup.cluster(
            config,
            Storage {
                data: None,
                delay_ms: plan.storage_delay_ms,
            },
        )?;
        eprintln!(
            "rtt {rtt} ms, {config}: 3 nodes up and converged in {:.1} s (ring v{}, n1 owns {} partitions, lanes to a peer: {})",
            t.elapsed().as_secs_f64(),
            converged.ring_version,
            converged.owned,
            lanes_summary(&converged.lanes)
        );
        self.o.clusters.push(ClusterInfo {
            rtt_ms: rtt,
            config: config.to_string(),
            converged,
        });
        for &size in &plan.sizes {
            let keys = plan.kvs_keys(size);
            if plan.workload == Workload::Kvs {
                let p = setup.preload(&mut nodes, size, keys)?;
                eprintln!(
                    "rtt {rtt} ms, {config}: pre-loaded {} keys of {} in {:.1} s{}",
                    p.stored,
                    human(size),
                    p.seconds,
                    if p.errors > 0 {
                        format!(
                            " ({} failed: {})",
                            p.errors,
                            p.first_error.unwrap_or_default()
                        )
                    } else {
                        String::new()
                    }
                );
                self.o.preloads.push(PreloadInfo {
                    rtt_ms: rtt,
                    config: config.to_string(),
                    size,
                    keys: p.stored,
                    seconds: p.seconds,
                    errors: p.errors,
                });
            }
            for &actors in &plan.actors {
                *self.done += 1;
                let cell = setup.cell(&mut nodes, config, rtt, size, actors, keys, *self.done)?;
                progress(*self.done, self.total, self.started, &cell);
                self.o.cells.push(cell);
                write_results(self.out, &self.o.cells)?;
            }
        }
        for n in nodes {
            n.stop(Duration::from_secs(10));
        }
        Ok(())
    }
}

/// TCP settings the report mentions besides the link emulator's own list.
const EXTRA_SYSCTLS: [&str; 2] = [
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

fn read_sysctls(net: &Netem) -> Vec<(String, String)> {
    EXTRA_SYSCTLS
        .iter()
        .filter_map(|k| {
            let path = format!("/proc/sys/{}", k.replace('.', "/"));
            let v = net
                .run_in_host(0, move || std::fs::read_to_string(path))
                .ok()?
                .ok()?;
            Some((k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// `vnode 16/16, default 16/16, …`
pub fn lanes_summary(lanes: &[(String, usize, usize)]) -> String {
    lanes
        .iter()
        .map(|(c, up, want)| format!("{c} {up}/{want}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn progress(done: usize, total: usize, started: Instant, c: &Cell) {
    eprintln!(
        "[{done:>3}/{total}] {:>5.0}s  rtt {:>2} ms  {:<8} actors {:>3}/node  payload {:>7}  {:>9.1} ops/s  p50 {:>8.2} ms  p99 {:>8.2} ms{}",
        started.elapsed().as_secs_f64(),
        c.rtt_ms,
        c.config,
        c.actors,
        human(c.payload_bytes),
        c.ops_per_s,
        c.p50_us as f64 / 1e3,
        c.p99_us as f64 / 1e3,
        if c.errors > 0 {
            format!(
                "  ({} errors: {})",
                c.errors,
                c.first_error.as_deref().unwrap_or("?")
            )
        } else {
            String::new()
        } + &if c.membership.is_empty() {
            String::new()
        } else {
            format!("  INVALID, membership changed: {}", c.membership.join(", "))
        }
    );
}

/// `1 KiB`, `8 MiB`.
pub fn human(size: usize) -> String {
    if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{} MiB", size >> 20)
    } else if size >= 1024 && size.is_multiple_of(1024) {
        format!("{} KiB", size >> 10)
    } else {
        format!("{size} B")
    }
}

fn write_results(out: &Path, cells: &[Cell]) -> Result<(), String> {
    let json = serde_json::to_string_pretty(cells).map_err(|e| e.to_string())?;
    std::fs::write(out.join("results.json"), json).map_err(|e| e.to_string())
}

/// What starting the nodes of one configuration at one RTT needs.
pub(crate) struct Setup<'a> {
    pub(crate) net: &'a Netem,
    pub(crate) exe: &'a Path,
    pub(crate) log: &'a File,
    pub(crate) plan: &'a Plan,
    pub(crate) port: u16,
}

/// Where a node keeps its data, and the storage delay it simulates.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Storage<'a> {
    /// The durable backend, in `DIR/nI`; in memory when `None`.
    pub(crate) data: Option<&'a Path>,
    /// Simulated delay of every vnode read and write, ms.
    pub(crate) delay_ms: u64,
}

impl Setup<'_> {
    fn log(&self) -> Stdio {
        self.log
            .try_clone()
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null())
    }

    fn host_cmd(&self, host: usize, program: &Path) -> Result<Command, String> {
        self.net
            .try_command(host, program)
            .map_err(|e| format!("link emulator: {e}"))
    }

    /// Starts node `n{i+1}` in host `i` (joining the node of host `join`, if any) and waits
    /// until it has joined.
    pub(crate) fn node(
        &self,
        i: usize,
        config: &str,
        join: Option<usize>,
        storage: Storage,
    ) -> Result<Proc, String> {
        let hosts = self.net.hosts();
        let addr = |i: usize| {
            hosts
                .get(i)
                .map(|h| format!("{}:{}", h.addr, self.port))
                .ok_or_else(|| format!("the link emulator has no host {i}"))
        };
        let mut c = self.host_cmd(i, self.exe)?;
        c.env("RUST_LOG", crate::stats::agent_log_filter())
            .args(["agent", "ring-node"])
            .args(["--name", &format!("n{}", i + 1)])
            .args(["--listen", &addr(i)?])
            .args(["--config", config, "--cookie", COOKIE])
            .args(["--partitions", &self.plan.partitions.to_string()])
            .args(["--storage-delay-ms", &storage.delay_ms.to_string()])
            .args([
                "--request-timeout-s",
                &self.plan.request_timeout_s.to_string(),
            ])
            .args(["--lane-queue-mib", &self.plan.lane_queue_mib.to_string()]);
        if let Some(j) = join {
            c.args(["--join", &addr(j)?]);
        }
        if let Some(d) = storage.data {
            c.arg("--data-dir").arg(d.join(format!("n{}", i + 1)));
        }
        let mut p = Proc::start(&format!("{config} node n{}", i + 1), c, self.log())?;
        p.expect(&["ready"], Duration::from_secs(90))?;
        Ok(p)
    }

    /// Starts the three nodes (n2 and n3 join n1) and waits for the ring to converge.
    pub(crate) fn cluster(
        &self,
        config: &str,
        storage: Storage,
    ) -> Result<(Vec<Proc>, Converged), String> {
        let mut nodes = Vec::new();
        for i in 0..3 {
            nodes.push(self.node(i, config, (i > 0).then_some(0), storage)?);
        }
        let limit = 600.0;
        nodes[0].command(&ring_agent::Command::Converge {
            nodes: 3,
            timeout_s: limit,
            recovered: false,
        })?;
        let c: Converged = nodes[0].answer(Duration::from_secs_f64(limit + 30.0))?;
        Ok((nodes, c))
    }

    /// Writes keys `0..keys` with values of `size` bytes, a third from each node.
    fn preload(&self, nodes: &mut [Proc], size: usize, keys: u64) -> Result<Preloaded, String> {
        let n = nodes.len() as u64;
        for (i, p) in nodes.iter_mut().enumerate() {
            let i = i as u64;
            p.command(&ring_agent::Command::Preload {
                from: keys * i / n,
                to: keys * (i + 1) / n,
                size,
                concurrency: 16,
                check: None,
            })?;
        }
        let mut all = Preloaded::default();
        for p in nodes.iter_mut() {
            let r: Preloaded = p.answer(Duration::from_secs(1800))?;
            all.stored += r.stored;
            all.errors += r.errors;
            all.seconds = all.seconds.max(r.seconds);
            if all.first_error.is_none() {
                all.first_error = r.first_error;
            }
        }
        Ok(all)
    }

    #[allow(clippy::too_many_arguments)]
    fn cell(
        &self,
        nodes: &mut [Proc],
        config: &str,
        rtt: u64,
        size: usize,
        actors: usize,
        keys: u64,
        seq: usize,
    ) -> Result<Cell, String> {
        let plan = self.plan;
        let kvs = plan.workload == Workload::Kvs;
        let (mean, stddev) = Plan::key_distribution(keys);
        let spec = RunSpec {
            workload: plan.workload,
            actors,
            size,
            warmup_s: plan.warmup,
            seconds: plan.seconds,
            keys,
            mean,
            stddev,
            reads_per_write: plan.reads_per_write,
            seed: seq as u64 * 7919,
            until_stop: false,
            check: None,
        };
        // All three nodes start together (the commands leave within a millisecond).
        for p in nodes.iter_mut() {
            p.command(&ring_agent::Command::Run(spec.clone()))?;
        }
        let limit = Duration::from_secs_f64(
            plan.warmup + plan.seconds + plan.request_timeout_s as f64 + 60.0,
        );
        let mut runs: Vec<NodeRun> = Vec::new();
        for p in nodes.iter_mut() {
            runs.push(p.answer(limit)?);
        }
        let mut buckets = std::collections::BTreeMap::new();
        for r in &runs {
            for &(v, c) in &r.hist {
                *buckets.entry(v).or_insert(0u64) += c;
            }
        }
        let buckets: Vec<(u64, u64)> = buckets.into_iter().collect();
        let messages: u64 = runs.iter().map(|r| r.messages).sum();
        let cpu: f64 = runs.iter().map(|r| r.cpu_s).sum();
        Ok(Cell {
            workload: plan.workload.name().to_string(),
            rtt_ms: rtt,
            payload_bytes: size,
            actors,
            config: config.to_string(),
            ops_per_s: runs
                .iter()
                .map(|r| {
                    if r.seconds > 0.0 {
                        r.messages as f64 / r.seconds
                    } else {
                        0.0
                    }
                })
                .sum(),
            p50_us: ring_agent::percentile(&buckets, 50.0),
            p99_us: ring_agent::percentile(&buckets, 99.0),
            max_us: runs.iter().map(|r| r.max_us).max().unwrap_or(0),
            messages,
            errors: runs.iter().map(|r| r.errors).sum(),
            seconds: runs.iter().map(|r| r.seconds).fold(0.0, f64::max),
            cpu_us_per_op: if messages > 0 {
                cpu * 1e6 / messages as f64
            } else {
                0.0
            },
            keys: kvs.then_some(keys),
            reads: runs.iter().map(|r| r.reads).sum(),
            writes: runs.iter().map(|r| r.writes).sum(),
            misses: runs.iter().map(|r| r.misses).sum(),
            drain_s: runs.iter().map(|r| r.drain_s).fold(0.0, f64::max),
            membership: runs
                .iter()
                .enumerate()
                .flat_map(|(i, r)| r.membership.iter().map(move |m| format!("n{}: {m}", i + 1)))
                .collect(),
            first_error: runs.iter().find_map(|r| r.first_error.clone()),
        })
    }
}
