//! The agent of `maquis-bench echo` and `maquis-bench kvs`: one ring node inside an emulated
//! host that also generates load. The driver sends it one JSON command per line on stdin (see
//! [`Command`]); it answers each with one line on stdout: a JSON object, or `error <why>`. It
//! prints `ready <addr>` once it runs (and has joined, with `--join`), and stops when stdin
//! closes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use maquis::{Config, MembershipEvent, Node};
use maquis_ring::{RespConfig, Ring, RingConfig, RingNode};
use serde::{Deserialize, Serialize};

use crate::ring_check::{self, Check, OpLog};
use crate::stats::cpu_seconds;

/// The configuration with one connection per peer.
pub const SINGLE: &str = "single";
/// The configuration with parallel lanes, affinity and the ring's named channels.
pub const PARTISAN: &str = "partisan";
/// Lanes per peer and channel in `partisan`.
pub const PARTISAN_PARALLELISM: u16 = 16;

/// Options of the `ring-node` agent.
#[derive(Args, Debug)]
pub struct RingNodeArgs {
    /// Node name, unique in the cluster.
    #[arg(long)]
    pub name: String,
    /// Address for the other nodes.
    #[arg(long)]
    pub listen: SocketAddr,
    /// A node of the cluster to join.
    #[arg(long)]
    pub join: Option<SocketAddr>,
    /// `single` or `partisan`.
    #[arg(long, default_value = PARTISAN)]
    pub config: String,
    /// Partitions of the ring.
    #[arg(long, default_value_t = 1024)]
    pub partitions: u32,
    /// Simulated storage delay of every vnode read and write, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub storage_delay_ms: u64,
    /// Deadline of one request, in seconds.
    #[arg(long, default_value_t = 60)]
    pub request_timeout_s: u64,
    /// Cluster secret.
    #[arg(long, default_value = "maquis-bench-ring")]
    pub cookie: String,
    /// Also serve the Redis protocol on this address.
    #[arg(long)]
    pub resp: Option<SocketAddr>,
    /// Bytes a lane's outbound queue holds, in MiB (the runtime's default: 8).
    #[arg(long, default_value_t = 8)]
    pub lane_queue_mib: usize,
    /// Keep the vnodes' data in this directory (the durable backend); in memory without it.
    #[arg(long)]
    pub data_dir: Option<std::path::PathBuf>,
}

/// What the driver asks of an agent.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Command {
    /// Wait until the ring lists `nodes` members and has converged; answered with [`Converged`].
    Converge {
        /// Ring members to wait for.
        nodes: usize,
        /// Give up after this many seconds.
        timeout_s: f64,
        /// Also wait until no vnode of any member is recovering.
        #[serde(default)]
        recovered: bool,
    },
    /// Write keys `from..to` ([`kvs_key`]) with values of `size` bytes, `concurrency` at a
    /// time; answered with [`Preloaded`].
    Preload {
        /// First key index.
        from: u64,
        /// One past the last key index.
        to: u64,
        /// Value bytes.
        size: usize,
        /// Writes in flight at once.
        concurrency: usize,
        /// Stamp the values and log the acknowledgements (the fault mode).
        #[serde(default)]
        check: Option<Check>,
    },
    /// Run closed-loop actors for a while; answered with [`NodeRun`].
    Run(RunSpec),
    /// Ends a run with `until_stop` (ignored otherwise).
    Stop,
    /// Reads keys `0..keys` once each, `concurrency` at a time; answered with [`Verified`].
    Verify {
        /// One past the last key index.
        keys: u64,
        /// Reads in flight at once.
        concurrency: usize,
    },
}

/// Answer to [`Command::Verify`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Verified {
    /// Per key index: the stamp read ([`crate::ring_check::stamp_of`]), `None` for nil.
    pub stamps: Vec<Option<u64>>,
    /// Key indices whose read failed (their `stamps` entry is `None`).
    pub failed: Vec<u64>,
    /// The first failure.
    pub first_error: Option<String>,
}

/// The two workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// `RingNode::echo`: the payload to the vnode of a uniformly drawn key and back.
    Echo,
    /// Quorum gets and puts over a key space drawn from a normal distribution.
    Kvs,
}

impl Workload {
    /// Its name in results and file names.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Echo => "echo",
            Workload::Kvs => "kvs",
        }
    }
}

/// One measurement on one node.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunSpec {
    /// Echo or KVS.
    pub workload: Workload,
    /// Closed-loop actors on this node.
    pub actors: usize,
    /// Payload (echo) or value (KVS) bytes.
    pub size: usize,
    /// Unmeasured seconds first.
    pub warmup_s: f64,
    /// Measured seconds.
    pub seconds: f64,
    /// KVS: keys `0..keys` ([`kvs_key`]).
    pub keys: u64,
    /// KVS: mean of the key distribution.
    pub mean: f64,
    /// KVS: standard deviation of the key distribution.
    pub stddev: f64,
    /// KVS: reads per write.
    pub reads_per_write: u32,
    /// Seed of the actors' random draws.
    pub seed: u64,
    /// Run until a [`Command::Stop`] (`seconds` is then only an upper bound).
    #[serde(default)]
    pub until_stop: bool,
    /// KVS: stamp values, write only this node's keys, log every request (the fault mode).
    #[serde(default)]
    pub check: Option<Check>,
}

/// Answer to [`Command::Converge`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Converged {
    /// Seconds it took.
    pub seconds: f64,
    /// Ring version reached.
    pub ring_version: u64,
    /// Partitions this node owns.
    pub owned: usize,
    /// Lanes to one peer: (channel, connected, configured).
    pub lanes: Vec<(String, usize, usize)>,
}

/// Answer to [`Command::Preload`].
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Preloaded {
    /// Keys written.
    pub stored: u64,
    /// Writes that failed.
    pub errors: u64,
    /// Seconds it took.
    pub seconds: f64,
    /// The first failure.
    pub first_error: Option<String>,
}

/// Answer to [`Command::Run`]: what one node measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeRun {
    /// Requests that completed (successfully) inside the measured window.
    pub messages: u64,
    /// Requests that failed inside the measured window.
    pub errors: u64,
    /// Length of the measured window, seconds.
    pub seconds: f64,
    /// CPU seconds of this process during the window.
    pub cpu_s: f64,
    /// Largest latency, microseconds.
    pub max_us: u64,
    /// Latency histogram: (bucket midpoint µs, count), increasing.
    pub hist: Vec<(u64, u64)>,
    /// KVS: gets among `messages`.
    pub reads: u64,
    /// KVS: puts among `messages`.
    pub writes: u64,
    /// KVS: gets that found no value of the expected size.
    pub misses: u64,
    /// Seconds from the end of the window until the last request in flight finished.
    pub drain_s: f64,
    /// Membership events this node saw from the start of the run to the end of the drain
    /// (`down n2`, `left n3`, `up n2`); any means the cell is not a clean measurement.
    pub membership: Vec<String>,
    /// The first failure.
    pub first_error: Option<String>,
    /// Operation-log lines that could not be written (the fault mode).
    #[serde(default)]
    pub log_failures: u64,
}

/// The key of index `i` in the KVS workload.
pub fn kvs_key(i: u64) -> String {
    format!("key:{i:06}")
}

/// A log-linear latency histogram: exact below 128 µs, then 128 buckets per power of two
/// (under 0.8% error), up to 2⁴⁰ µs.
#[derive(Clone, Debug)]
pub struct Hist {
    counts: Vec<u64>,
}

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
const TOP_BIT: u32 = 40;

impl Default for Hist {
    fn default() -> Self {
        Hist {
            counts: vec![0; (SUB + u64::from(TOP_BIT - SUB_BITS) * SUB) as usize],
        }
    }
}

impl Hist {
    fn index(v: u64) -> usize {
        let v = v.min((1u64 << TOP_BIT) - 1);
        if v < SUB {
            return v as usize;
        }
        let e = 63 - v.leading_zeros();
        let sub = (v >> (e - SUB_BITS)) - SUB;
        (SUB + u64::from(e - SUB_BITS) * SUB + sub) as usize
    }

    /// The midpoint of bucket `i`.
    fn value(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let k = i - SUB;
        let shift = (k / SUB) as u32;
        let low = (SUB + k % SUB) << shift;
        low + (1u64 << shift) / 2
    }

    /// Counts one latency.
    pub fn record(&mut self, us: u64) {
        self.counts[Self::index(us)] += 1;
    }

    /// Adds another histogram.
    pub fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    /// The non-empty buckets as (midpoint, count).
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| (Self::value(i), *c))
            .collect()
    }
}

/// The `p`th percentile of (value, count) buckets sorted by value, with the nearest-rank rule
/// of `maquis::admin::percentile`.
pub fn percentile(buckets: &[(u64, u64)], p: f64) -> u64 {
    let n: u64 = buckets.iter().map(|b| b.1).sum();
    if n == 0 {
        return 0;
    }
    let rank = ((p / 100.0) * (n as f64 - 1.0)).round() as u64;
    let mut seen = 0;
    for &(v, c) in buckets {
        seen += c;
        if seen > rank {
            return v;
        }
    }
    buckets.last().map(|b| b.0).unwrap_or(0)
}

/// SplitMix64: small, fast, good enough for drawing keys.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// A key index from N(mean, stddev) rounded, drawn again until it falls in `0..keys`.
    fn normal_key(&mut self, keys: u64, mean: f64, stddev: f64) -> u64 {
        for _ in 0..64 {
            // Box–Muller.
            let z =
                (-2.0 * self.unit().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.unit()).cos();
            let k = (mean + stddev * z).round();
            if k >= 0.0 && k < keys as f64 {
                return k as u64;
            }
        }
        self.next_u64() % keys.max(1)
    }
}

fn ring_config(args: &RingNodeArgs) -> RingConfig {
    let mut c = RingConfig::default()
        .partitions(args.partitions)
        .storage_delay(Duration::from_millis(args.storage_delay_ms))
        .request_timeout(Duration::from_secs(args.request_timeout_s.max(1)));
    // Start-up moves about two thirds of the partitions to the joining nodes; more handoffs at
    // once make that quicker. Nothing is handed off while measuring.
    c.handoff_concurrency = 16;
    if let Some(dir) = &args.data_dir {
        c = c.storage(maquis_ring::StorageConfig::Durable(dir.clone()));
    }
    c
}

/// Starts the node in one of the two configurations.
pub async fn start_node(args: &RingNodeArgs) -> Result<RingNode, String> {
    let mut base = Config::new(&args.name)
        .listen(args.listen)
        .cookie(args.cookie.clone());
    base.transport.lane_queue_bytes = args.lane_queue_mib.clamp(1, 4095) << 20;
    let rc = ring_config(args);
    match args.config.as_str() {
        // No named channels: the ring's vnode, gossip and handoff traffic fall back to the
        // `default` channel, one lane per peer.
        SINGLE => {
            let node = Node::start(base.parallelism(1).affinity(false))
                .await
                .map_err(|e| e.to_string())?;
            Ring::start_on(node, rc).map_err(|e| e.to_string())
        }
        PARTISAN => Ring::start(base.parallelism(PARTISAN_PARALLELISM).affinity(true), rc)
            .await
            .map_err(|e| e.to_string()),
        other => Err(format!(
            "unknown configuration {other:?} (known: {SINGLE}, {PARTISAN})"
        )),
    }
}

/// Runs the agent until stdin closes.
pub async fn ring_node(args: RingNodeArgs) -> Result<(), String> {
    use tokio::io::AsyncBufReadExt;
    let ring = start_node(&args).await?;
    if let Some(contact) = args.join {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match ring.join(contact, Duration::from_secs(5)).await {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => {
                    ring.shutdown().await;
                    return Err(format!("join {contact}: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    let resp = match args.resp {
        Some(addr) => Some(
            ring.serve_resp(addr, RespConfig::default())
                .await
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    say(&format!("ready {}", ring.node().addr()));
    // Commands arrive on a channel, so that a run can watch for its `stop`.
    let (tx, mut commands) = tokio::sync::mpsc::channel::<String>(16);
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if !line.trim().is_empty() && tx.send(line).await.is_err() {
                break;
            }
        }
    });
    while let Some(line) = commands.recv().await {
        let answer = match serde_json::from_str::<Command>(line.trim()) {
            Err(e) => Err(format!("bad command: {e}")),
            Ok(Command::Converge {
                nodes,
                timeout_s,
                recovered,
            }) => converge(&ring, nodes, timeout_s, recovered)
                .await
                .and_then(|c| serde_json::to_string(&c).map_err(|e| e.to_string())),
            Ok(Command::Preload {
                from,
                to,
                size,
                concurrency,
                check,
            }) => match check.as_ref().map(|c| OpLog::open(&c.log)).transpose() {
                Err(e) => Err(e),
                Ok(log) => serde_json::to_string(
                    &preload(&ring, from, to, size, concurrency, log.map(Arc::new)).await,
                )
                .map_err(|e| e.to_string()),
            },
            Ok(Command::Run(spec)) => match run(&ring, &spec, &mut commands).await {
                Ok(r) => serde_json::to_string(&r).map_err(|e| e.to_string()),
                Err(e) => Err(e),
            },
            Ok(Command::Stop) => continue,
            Ok(Command::Verify { keys, concurrency }) => {
                serde_json::to_string(&verify(&ring, keys, concurrency).await)
                    .map_err(|e| e.to_string())
            }
        };
        match answer {
            Ok(json) => say(&json),
            Err(e) => say(&format!("error {}", e.replace('\n', " "))),
        }
    }
    if let Some(r) = resp {
        r.stop();
    }
    ring.shutdown().await;
    Ok(())
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn converge(
    ring: &RingNode,
    nodes: usize,
    timeout_s: f64,
    recovered: bool,
) -> Result<Converged, String> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(timeout_s.max(0.1));
    let mut last_said = start;
    loop {
        let r = ring.ring();
        let why = if r.nodes.len() < nodes {
            format!("ring lists {:?}, waiting for {nodes} nodes", r.nodes)
        } else {
            match ring.check_converged().await {
                Ok(()) if !recovered => break,
                Ok(()) => match still_recovering(ring).await {
                    None => break,
                    Some(why) => why,
                },
                Err(why) => why,
            }
        };
        if Instant::now() >= deadline {
            return Err(format!("not converged after {timeout_s} s: {why}"));
        }
        if last_said.elapsed() >= Duration::from_secs(5) {
            tracing::info!(waited_s = start.elapsed().as_secs(), %why, "not converged yet");
            last_said = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = ring.ring();
    let me = ring.name().to_string();
    let peer = r.nodes.iter().find(|n| **n != me).cloned();
    Ok(Converged {
        seconds: start.elapsed().as_secs_f64(),
        ring_version: r.version,
        owned: r.owned_by(&me).len(),
        lanes: peer
            .map(|p| ring.node().lanes_connected(&p))
            .unwrap_or_default(),
    })
}

/// Which members still have vnodes recovering (`None`: none).
async fn still_recovering(ring: &RingNode) -> Option<String> {
    let mut busy = Vec::new();
    for (name, st) in ring.cluster_status().await {
        match st {
            Ok(st) if st.recovering == 0 => {}
            Ok(st) => busy.push(format!("{name}: {} vnodes recovering", st.recovering)),
            Err(e) => busy.push(format!("{name}: {e}")),
        }
    }
    (!busy.is_empty()).then(|| busy.join(", "))
}

/// Reads every key once through this node.
async fn verify(ring: &RingNode, keys: u64, concurrency: usize) -> Verified {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.clamp(1, 256) {
        let (ring, next) = (ring.clone(), next.clone());
        tasks.spawn(async move {
            let mut got = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    break;
                }
                let r = ring
                    .get(kvs_key(i))
                    .await
                    .map(|v| v.map(|v| ring_check::stamp_of(&v)))
                    .map_err(|e| e.to_string());
                got.push((i, r));
            }
            got
        });
    }
    let mut out = Verified {
        stamps: vec![None; keys as usize],
        ..Verified::default()
    };
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(got) => {
                for (i, r) in got {
                    match r {
                        Ok(s) => out.stamps[i as usize] = s,
                        Err(e) => {
                            out.failed.push(i);
                            out.first_error.get_or_insert(e);
                        }
                    }
                }
            }
            Err(e) => {
                out.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    out.failed.sort_unstable();
    out
}

async fn preload(
    ring: &RingNode,
    from: u64,
    to: u64,
    size: usize,
    concurrency: usize,
    log: Option<Arc<OpLog>>,
) -> Preloaded {
    let start = Instant::now();
    let value = Bytes::from(vec![0x5au8; size]);
    let next = Arc::new(AtomicU64::new(from));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.clamp(1, 256) {
        let (ring, value, next, log) = (ring.clone(), value.clone(), next.clone(), log.clone());
        tasks.spawn(async move {
            let (mut stored, mut errors, mut first) = (0u64, 0u64, None);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= to {
                    break;
                }
                let stamp = ring_check::now_us();
                let value = match &log {
                    Some(_) => ring_check::stamped(stamp, size),
                    None => value.clone(),
                };
                match ring.put(kvs_key(i), value).await {
                    Ok(()) => {
                        stored += 1;
                        if let Some(log) = &log {
                            log.acked(i, stamp);
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        first.get_or_insert_with(|| e.to_string());
                    }
                }
            }
            (stored, errors, first)
        });
    }
    let mut out = Preloaded::default();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok((s, e, f)) => {
                out.stored += s;
                out.errors += e;
                if out.first_error.is_none() {
                    out.first_error = f;
                }
            }
            Err(e) => {
                out.errors += 1;
                out.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    out.seconds = start.elapsed().as_secs_f64();
    out
}

/// What one actor measured.
#[derive(Default)]
struct ActorRun {
    hist: Hist,
    max_us: u64,
    messages: u64,
    errors: u64,
    reads: u64,
    writes: u64,
    misses: u64,
    first_error: Option<String>,
    finished: Option<Instant>,
}

/// The measured window of a run: from `measure_from` until the stop time, which a `stop`
/// command can bring forward.
struct Window {
    start: Instant,
    measure_from: Instant,
    stop_us: AtomicU64,
}

impl Window {
    fn stop_at(&self) -> Instant {
        self.start + Duration::from_micros(self.stop_us.load(Ordering::Relaxed))
    }

    fn stop_now(&self) {
        let now = self.start.elapsed().as_micros() as u64;
        self.stop_us.fetch_min(now, Ordering::Relaxed);
    }
}

/// What an actor needs in the fault mode: the log, the key it may write, a lock per key.
#[derive(Clone)]
struct Checking {
    check: Check,
    log: Arc<OpLog>,
    locks: Arc<Vec<tokio::sync::Mutex<()>>>,
}

/// Waits for a `stop` command (other commands are not expected during a run and are dropped).
async fn wait_stop(commands: &mut tokio::sync::mpsc::Receiver<String>) {
    while let Some(line) = commands.recv().await {
        match serde_json::from_str::<Command>(line.trim()) {
            Ok(Command::Stop) => return,
            _ => tracing::warn!(%line, "command during a run dropped"),
        }
    }
}

async fn run(
    ring: &RingNode,
    spec: &RunSpec,
    commands: &mut tokio::sync::mpsc::Receiver<String>,
) -> Result<NodeRun, String> {
    let checking = match &spec.check {
        None => None,
        Some(c) => Some(Checking {
            check: c.clone(),
            log: Arc::new(OpLog::open(&c.log)?),
            locks: Arc::new(
                (0..spec.keys)
                    .map(|_| tokio::sync::Mutex::new(()))
                    .collect(),
            ),
        }),
    };
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(spec.warmup_s.max(0.0));
    let cap = measure_from + Duration::from_secs_f64(spec.seconds.max(0.001));
    let window = Arc::new(Window {
        start,
        measure_from,
        stop_us: AtomicU64::new(cap.duration_since(start).as_micros() as u64),
    });
    let payload = Bytes::from(vec![0x42u8; spec.size]);
    let name_hash = ring
        .name()
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(u64::from(b)));
    let mut events = ring.node().subscribe();
    let mut waits = Vec::with_capacity(spec.actors);
    for i in 0..spec.actors {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (ring2, payload, spec) = (ring.clone(), payload.clone(), spec.clone());
        let (window, checking) = (window.clone(), checking.clone());
        let seed = spec.seed ^ name_hash.rotate_left(17) ^ (i as u64).wrapping_mul(0x1000_0001);
        ring.node()
            .spawn_fn(move |_inbox: maquis::Inbox<()>| async move {
                let r = actor(ring2, payload, spec, seed, window, checking).await;
                let _ = tx.send(r);
            });
        waits.push(rx);
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = cpu_seconds();
    if spec.until_stop {
        tokio::select! {
            () = tokio::time::sleep_until(cap.into()) => {}
            () = wait_stop(commands) => {}
        }
        window.stop_now();
    } else {
        tokio::time::sleep_until(cap.into()).await;
    }
    let stop_at = window.stop_at();
    let cpu_s = cpu_seconds() - cpu0;
    let mut out = NodeRun {
        seconds: stop_at.duration_since(measure_from).as_secs_f64(),
        cpu_s,
        ..NodeRun::default()
    };
    let mut hist = Hist::default();
    let mut last = stop_at;
    for w in waits {
        match w.await {
            Ok(a) => {
                hist.merge(&a.hist);
                out.max_us = out.max_us.max(a.max_us);
                out.messages += a.messages;
                out.errors += a.errors;
                out.reads += a.reads;
                out.writes += a.writes;
                out.misses += a.misses;
                if out.first_error.is_none() {
                    out.first_error = a.first_error;
                }
                if let Some(f) = a.finished {
                    last = last.max(f);
                }
            }
            Err(_) => {
                out.errors += 1;
                out.first_error
                    .get_or_insert_with(|| "a load actor died".to_string());
            }
        }
    }
    out.drain_s = last.duration_since(stop_at).as_secs_f64();
    out.hist = hist.buckets();
    out.log_failures = checking.as_ref().map_or(0, |c| c.log.failures());
    loop {
        use tokio::sync::broadcast::error::TryRecvError;
        let what = match events.try_recv() {
            Ok(MembershipEvent::Up(n)) => format!("up {}", n.name),
            Ok(MembershipEvent::Down(n)) => format!("down {}", n.name),
            Ok(MembershipEvent::Left(n)) => format!("left {}", n.name),
            Err(TryRecvError::Lagged(k)) => format!("{k} events lost"),
            Err(_) => break,
        };
        out.membership.push(what);
    }
    Ok(out)
}

/// One request of the KVS workload in the fault mode: values stamped, writes of one key one
/// at a time, every request logged. Ok(whether a read found no value of this size).
async fn checked_request(
    ring: &RingNode,
    c: &Checking,
    read: bool,
    k: u64,
    size: usize,
) -> Result<bool, String> {
    let start_us = ring_check::now_us();
    let r = if read {
        ring.get(kvs_key(k)).await.map(|v| {
            c.log
                .read(k, v.as_ref().map(|v| ring_check::stamp_of(v)), start_us);
            v.is_none_or(|v| v.len() != size)
        })
    } else {
        let _turn = c.locks[k as usize].lock().await;
        // Stamped once this write's turn has come: the stamps of a key grow in write order.
        let stamp = ring_check::now_us();
        ring.put(kvs_key(k), ring_check::stamped(stamp, size))
            .await
            .map(|()| {
                c.log.acked(k, stamp);
                false
            })
    };
    r.map_err(|e| {
        c.log.failed(start_us);
        e.to_string()
    })
}

/// One closed-loop actor: a request, wait for its answer, the next request. Requests that
/// complete inside the window count; none starts after it.
async fn actor(
    ring: RingNode,
    payload: Bytes,
    spec: RunSpec,
    seed: u64,
    window: Arc<Window>,
    checking: Option<Checking>,
) -> ActorRun {
    let mut rng = Rng::new(seed);
    let mut a = ActorRun::default();
    let size = spec.size;
    let deadline = ring.config().request_timeout;
    loop {
        let t0 = Instant::now();
        if t0 >= window.stop_at() {
            break;
        }
        // What to do: an echo, or a get or put of a key from the distribution.
        let (read, key) = match spec.workload {
            Workload::Echo => (false, None),
            Workload::Kvs => {
                let k = rng.normal_key(spec.keys, spec.mean, spec.stddev);
                let write = rng
                    .next_u64()
                    .is_multiple_of(u64::from(spec.reads_per_write) + 1);
                let k = match &checking {
                    Some(c) if write => c.check.owned_key(k, spec.keys),
                    _ => k,
                };
                (!write, Some(k))
            }
        };
        let request = async {
            match (key, &checking) {
                (None, _) => match ring.echo(payload.clone()).await {
                    Ok(b) if b.len() == size => Ok(false),
                    Ok(b) => Err(format!("echo returned {} of {size} bytes", b.len())),
                    Err(e) => Err(e.to_string()),
                },
                (Some(k), Some(c)) => checked_request(&ring, c, read, k, size).await,
                (Some(k), None) if read => match ring.get(kvs_key(k)).await {
                    Ok(Some(v)) => Ok(v.len() != size),
                    Ok(None) => Ok(true),
                    Err(e) => Err(e.to_string()),
                },
                (Some(k), None) => ring
                    .put(kvs_key(k), payload.clone())
                    .await
                    .map(|()| false)
                    .map_err(|e| e.to_string()),
            }
        };
        // The ring's own deadline covers the wait for the answer; this one also covers the
        // wait for room in a full lane before the request leaves.
        // Ok(whether a read found no value of this size) or the failure.
        let outcome: Result<bool, String> = tokio::time::timeout(deadline, request)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {deadline:?}")));
        let t1 = Instant::now();
        if t1 >= window.measure_from && t1 <= window.stop_at() {
            match outcome {
                Ok(miss) => {
                    let us = t1.duration_since(t0).as_micros() as u64;
                    a.hist.record(us);
                    a.max_us = a.max_us.max(us);
                    a.messages += 1;
                    if spec.workload == Workload::Kvs {
                        if read {
                            a.reads += 1;
                        } else {
                            a.writes += 1;
                        }
                    }
                    if miss {
                        a.misses += 1;
                    }
                }
                Err(e) => {
                    a.errors += 1;
                    a.first_error.get_or_insert(e);
                }
            }
        }
    }
    a.finished = Some(Instant::now());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_close() {
        for v in [0u64, 1, 127, 128, 129, 1000, 65_537, 1_234_567, 987_654_321] {
            let mid = Hist::value(Hist::index(v));
            let err = (mid as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err < 0.01, "{v} -> {mid}");
        }
        let mut h = Hist::default();
        for v in 1..=1000u64 {
            h.record(v * 10);
        }
        let b = h.buckets();
        let p50 = percentile(&b, 50.0) as f64;
        let p99 = percentile(&b, 99.0) as f64;
        assert!((p50 - 5000.0).abs() < 60.0, "{p50}");
        assert!((p99 - 9900.0).abs() < 100.0, "{p99}");
    }

    #[test]
    fn normal_keys_stay_in_range() {
        let mut r = Rng::new(7);
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let k = r.normal_key(10_000, 5_000.0, 10_000.0 / 6.0);
            assert!(k < 10_000);
            sum += k as f64;
        }
        assert!((sum / 10_000.0 - 5_000.0).abs() < 100.0);
    }
}
