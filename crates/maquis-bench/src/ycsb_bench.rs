//! `maquis-bench ycsb`: psaDB's Table 1 (CoNEXT '12) with YCSB's own workload generator.
//!
//! YCSB's core (`site.ycsb:core` 0.17.0, from Maven Central) drives each store through the Redis
//! protocol with the binding in `bench/ycsb` (built here with Maven). In one invocation:
//!
//! - **psadb**: three `psadb serve` processes (`maquis-bench agent psadb-node`, the same library
//!   call), each with a member of each of 3 groups: 3 groups × 3 members, as in the paper.
//!   Records are hashes; scans use `KEYSFROM` (every group asked, the answers merged).
//! - **ring**: three ring nodes (`maquis-bench agent ring-node --resp`, the calls `ring serve`
//!   makes). The ring keeps strings only, so field `f` of record `k` is the key `k/f` (MSET /
//!   MGET); it keeps no key order, so workload E is not run on it.
//! - **redis**: one Debian `redis-server` without persistence, the single-node reference.
//!   Scans use a sorted set of the keys (as YCSB's own Redis binding does).
//!
//! Each system is loaded once (`--records` records of 10 fields of `--field-length` bytes: the
//! paper's 100,000 records of ten 1 kB values), then runs workloads A–E in turn, each for
//! `--seconds` at each of the `--threads` counts (client threads spread over its nodes): one
//! thread, YCSB's default, for Table 1's latencies; eight to load the system for throughput. Workloads D and E insert
//! new records after the loaded ones (E's overwrite D's: the same key sequence).
//!
//! The fault run: a fresh psaDB cluster; YCSB loads `--fault-records` records (inserts of new
//! keys, values that YCSB derives from key and field: `dataintegrity=true`) through two of the
//! three nodes, paced to last about ten seconds; at the first status line past a third of them
//! done, the third node is killed with SIGKILL.
//! The binding logs every acknowledged insert; afterwards every logged key is read back through
//! a surviving node and counted lost unless all its fields hold YCSB's value. Then the killed
//! node is started again (new members that join, take the others' snapshots page by page and
//! become ready) and every key is read back through it too.
//!
//! Writes `results.json`, `report.md` and plots into `--out`.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::install::{apt_install, version_of};
use crate::ring_proc::{run_capture, Proc};

/// `maquis-bench ycsb`.
#[derive(clap::Args, Debug, Clone)]
pub struct YcsbArgs {
    /// A short run: workload A only, 1,000 records, 10 s, a fault run of 3,000 records.
    #[arg(long)]
    pub quick: bool,
    /// Where results.json, report.md and the plots go (with --quick and no --out:
    /// target/bench-quick/ycsb).
    #[arg(long, default_value = "bench/results/ycsb")]
    pub out: PathBuf,
    /// Systems: psadb, ring, redis.
    #[arg(long, value_delimiter = ',', default_value = "psadb,ring,redis")]
    pub systems: Vec<String>,
    /// Workloads, in order (default a,b,c,d,e; a with --quick).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Vec<String>,
    /// Records loaded (default 100,000; 1,000 with --quick).
    #[arg(long)]
    pub records: Option<u64>,
    /// Bytes of each of a record's 10 fields.
    #[arg(long, default_value_t = 1000)]
    pub field_length: u64,
    /// Seconds each workload runs (default 30; 10 with --quick).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// YCSB client threads: each workload runs once at each count (the first, YCSB's default
    /// of one, gives Table 1's latencies; the largest keeps the system busy for its
    /// throughput, and also runs the loads: at 8, psaDB's three single-threaded nodes still
    /// wait on each other's messages with CPU to spare).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub threads: Vec<u32>,
    /// Records of the fault run (default 20,000; 3,000 with --quick; 0: no fault run).
    #[arg(long)]
    pub fault_records: Option<u64>,
    /// The binding's Maven project (default: bench/ycsb of this source tree).
    #[arg(long)]
    pub ycsb_dir: Option<PathBuf>,
    /// First port: the nodes listen on port, port+1, port+2 and serve RESP on port+10…
    #[arg(long, default_value_t = 23_000)]
    pub base_port: u16,
}

/// One operation type of a cell.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OpStats {
    /// Operations that succeeded.
    pub ok: u64,
    /// Operations that returned anything but OK.
    pub errors: u64,
    /// Mean latency of the successful operations, µs.
    pub avg_us: f64,
    /// 95th percentile, µs.
    pub p95_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// The slowest, µs.
    pub max_us: f64,
}

/// One cell of results.json: a system running one workload (or its load, or the fault run).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Cell {
    /// `psadb`, `ring` or `redis`.
    pub system: String,
    /// `load`, `a` … `e`, or `fault` (the load with a node killed).
    pub workload: String,
    /// Records loaded before it.
    pub records: u64,
    /// YCSB client threads.
    pub threads: u32,
    /// Seconds YCSB ran.
    pub seconds: f64,
    /// Operations per second (all types, YCSB's `[OVERALL] Throughput`).
    pub ops_per_s: f64,
    /// Per operation type (`READ`, `UPDATE`, `INSERT`, `SCAN`).
    pub ops: std::collections::BTreeMap<String, OpStats>,
    /// Operations that failed, all types.
    pub errors: u64,
    /// The fault run: acknowledged inserts not readable afterwards (null elsewhere: not
    /// measured).
    pub lost_acked_writes: Option<u64>,
    /// The fault run: inserts acknowledged.
    pub acked_writes: Option<u64>,
    /// The fault run: of `lost_acked_writes`, those not readable through the killed node
    /// once restarted and ready (its members caught up from the others).
    pub lost_after_restart: Option<u64>,
    /// The fault run: seconds from the restart of the killed node to every node answering
    /// with all its members ready.
    pub restart_s: Option<f64>,
    /// CPU seconds the servers spent in the run (all of the system's processes).
    pub server_cpu_s: f64,
}

fn log_stdio(log: &File) -> Stdio {
    log.try_clone()
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

/// What the run found on the machine, for the report.
#[derive(Clone, Debug, Default)]
pub struct Tools {
    /// `java -version`.
    pub java: String,
    /// `redis-server --version`.
    pub redis: String,
    /// What was installed, or could not be.
    pub notes: Vec<String>,
    /// The YCSB classpath (binding jar, YCSB core, Jedis …).
    pub classpath: String,
    /// The workload files.
    pub workloads: PathBuf,
}

fn ycsb_dir(a: &YcsbArgs) -> PathBuf {
    a.ycsb_dir.clone().unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../bench/ycsb")
            .canonicalize()
            .unwrap_or_else(|_| PathBuf::from("bench/ycsb"))
    })
}

/// Finds or installs Java, Maven and redis-server, and builds the binding.
pub fn prepare(a: &YcsbArgs) -> Result<Tools, String> {
    let mut t = Tools::default();
    let java = || {
        Command::new("java")
            .arg("-version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
    };
    let mut missing = Vec::new();
    if java().is_none() {
        missing.push("openjdk-17-jdk-headless");
    }
    if version_of("mvn").is_none() {
        missing.push("maven");
    }
    if a.systems.iter().any(|s| s == "redis") && version_of("redis-server").is_none() {
        missing.push("redis-server");
    }
    if !missing.is_empty() {
        eprintln!("installing {} with apt-get ...", missing.join(", "));
        apt_install(&missing).map_err(|e| format!("cannot install {missing:?}: {e}"))?;
        t.notes.push(format!(
            "This run installed Debian's {} with apt-get.",
            missing.join(", ")
        ));
    }
    t.java = java().ok_or("java does not run")?;
    t.redis = version_of("redis-server").unwrap_or_default();
    let dir = ycsb_dir(a);
    eprintln!(
        "building the YCSB binding in {} with Maven ...",
        dir.display()
    );
    let mut mvn = Command::new("mvn");
    mvn.current_dir(&dir).args([
        "-q",
        "-B",
        "package",
        "dependency:build-classpath",
        "-Dmdep.outputFile=target/classpath.txt",
    ]);
    let (status, out) = run_capture("mvn", mvn, Duration::from_secs(1800))?;
    if !status.success() {
        return Err(format!("mvn package in {}: {status}: {out}", dir.display()));
    }
    let deps = std::fs::read_to_string(dir.join("target/classpath.txt"))
        .map_err(|e| format!("{}: {e}", dir.join("target/classpath.txt").display()))?;
    t.classpath = format!(
        "{}:{}",
        dir.join("target/maquis-ycsb-0.1.0.jar").display(),
        deps.trim()
    );
    t.workloads = dir.join("workloads");
    Ok(t)
}

/// A system's running processes and their RESP addresses.
pub struct Cluster {
    /// `psadb`, `ring` or `redis`.
    pub system: String,
    /// The processes, node 0 first.
    pub procs: Vec<Proc>,
    /// Their RESP addresses.
    pub resp: Vec<SocketAddr>,
}

/// Tokio worker threads of each psaDB and ring node: three nodes (and YCSB) share two
/// cores, where one thread each costs less CPU an operation than one a core (fewer thread
/// wake-ups; measured: 170 against 275 µs of the nodes' CPU a psaDB operation on workload A).
pub const NODE_WORKER_THREADS: usize = 1;

const GROUPS: u32 = 3;
const NODES: u16 = 3;

impl Cluster {
    /// Starts `system` on loopback and waits until every node answers.
    pub fn start(system: &str, base_port: u16, log: &File) -> Result<Cluster, String> {
        let mut procs = Vec::new();
        let mut resp = Vec::new();
        let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        match system {
            "psadb" | "ring" => {
                for i in 0..NODES {
                    let (p, r) = start_node(system, i, base_port, log)?;
                    procs.push(p);
                    resp.push(r);
                }
            }
            "redis" => {
                let r = addr(base_port + 10);
                let mut c = Command::new("redis-server");
                c.args(["--port", &r.port().to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                    .arg("--logfile")
                    .arg(std::env::temp_dir().join(format!(
                        "maquis-bench-ycsb-redis-{}.log",
                        std::process::id()
                    )));
                procs.push(Proc::start("redis-server", c, log_stdio(log))?);
                resp.push(r);
            }
            other => return Err(format!("unknown system {other:?} (psadb, ring, redis)")),
        }
        let c = Cluster {
            system: system.to_string(),
            procs,
            resp,
        };
        c.wait_ready(Duration::from_secs(180))?;
        Ok(c)
    }

    /// Starts node `i` of a psaDB or ring cluster again (after it was killed) and waits until
    /// every node answers again (psaDB: until its members are ready, their snapshots taken).
    pub fn restart(&mut self, i: u16, base_port: u16, log: &File) -> Result<(), String> {
        let (p, r) = start_node(&self.system, i, base_port, log)?;
        self.procs[usize::from(i)] = p;
        self.resp[usize::from(i)] = r;
        self.wait_ready(Duration::from_secs(300))
    }

    /// Waits until every node answers a write and a read (psaDB: until every group has all
    /// its members ready).
    fn wait_ready(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        for r in &self.resp {
            // Another process's state: polled, as nothing here can await it.
            while let Err(e) = self.probe(*r) {
                if Instant::now() > deadline {
                    return Err(format!("{} node {r} not ready: {e}", self.system));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    fn probe(&self, r: SocketAddr) -> Result<(), String> {
        let mut conn = connect(r)?;
        if self.system == "psadb" {
            let info: String = redis::cmd("INFO")
                .arg("psadb")
                .query(&mut conn)
                .map_err(|e| e.to_string())?;
            let want = NODES.to_string();
            for g in 0..GROUPS {
                let line = format!("psadb_group_{g}:members={want},ready={want}");
                if !info.contains(&line) {
                    return Err(format!("waiting for {line}"));
                }
            }
        }
        let key = format!("probe/{r}");
        let () = redis::cmd("SET")
            .arg(&key)
            .arg("1")
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        let v: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query(&mut conn)
            .map_err(|e| e.to_string())?;
        if v.as_deref() == Some("1") {
            Ok(())
        } else {
            Err(format!("read {v:?} after writing 1"))
        }
    }

    /// CPU seconds of the system's processes so far.
    pub fn cpu_s(&self) -> f64 {
        self.procs
            .iter()
            .map(|p| crate::stats::cpu_seconds_of(p.pid()))
            .sum()
    }

    /// The binding's properties for this system.
    fn binding_props(&self) -> Vec<(String, String)> {
        let hosts: Vec<String> = self.resp.iter().map(ToString::to_string).collect();
        let (layout, scan) = match self.system.as_str() {
            "psadb" => ("hash", "keysfrom"),
            "ring" => ("keys", "none"),
            _ => ("hash", "zset"),
        };
        vec![
            ("resp.hosts".into(), hosts.join(",")),
            ("resp.layout".into(), layout.into()),
            ("resp.scan".into(), scan.into()),
        ]
    }

    /// Stops every process.
    pub fn stop(self) {
        for p in self.procs {
            p.stop(Duration::from_millis(500));
        }
    }
}

/// Starts node `i` of a psaDB or ring cluster (node 0 first; the others join it) and waits for
/// its first line; the process and its RESP address.
fn start_node(
    system: &str,
    i: u16,
    base_port: u16,
    log: &File,
) -> Result<(Proc, SocketAddr), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let addr = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let listen = addr(base_port + i).to_string();
    let r = addr(base_port + 10 + i);
    let name = format!("{}{i}", &system[..1]);
    let mut c = Command::new(&exe);
    c.args(["agent", &format!("{system}-node")]).args([
        "--name",
        &name,
        "--listen",
        &listen,
        "--resp",
        &r.to_string(),
    ]);
    if system == "psadb" {
        c.args(["--groups", &GROUPS.to_string(), "--settle-ms", "1000"])
            .args(["--cookie", "maquis-bench-ycsb"]);
    } else {
        c.args(["--partitions", "64", "--cookie", "maquis-bench-ycsb"]);
    }
    if i > 0 {
        c.args(["--join", &addr(base_port).to_string()]);
    }
    c.env("RUST_LOG", crate::stats::agent_log_filter())
        .env("TOKIO_WORKER_THREADS", NODE_WORKER_THREADS.to_string());
    let mut p = Proc::start(&format!("{system} node {name}"), c, log_stdio(log))?;
    let ready = if system == "psadb" {
        "psadb node"
    } else {
        "ready"
    };
    p.expect(&[ready], Duration::from_secs(120))?;
    Ok((p, r))
}

fn connect(r: SocketAddr) -> Result<redis::Connection, String> {
    let client = redis::Client::open(format!("redis://{r}/")).map_err(|e| e.to_string())?;
    let conn = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    Ok(conn)
}

/// One YCSB invocation.
struct Invocation<'a> {
    tools: &'a Tools,
    load: bool,
    workload: &'a str,
    props: Vec<(String, String)>,
    threads: u32,
}

impl Invocation<'_> {
    fn command(&self) -> Command {
        let mut c = Command::new("java");
        c.args(["-Xmx4g", "-cp", &self.tools.classpath, "site.ycsb.Client"])
            .arg(if self.load { "-load" } else { "-t" })
            .args(["-db", "maquis.ycsb.RespClient", "-P"])
            .arg(
                self.tools
                    .workloads
                    .join(format!("workload{}", self.workload)),
            )
            .args(["-threads", &self.threads.to_string(), "-s"]);
        for (k, v) in &self.props {
            c.args(["-p", &format!("{k}={v}")]);
        }
        c
    }

    /// Runs YCSB to its end; its stdout (the measurements). `during` is called with each
    /// status line's count of operations done.
    fn run(&self, log: &File, mut during: impl FnMut(u64)) -> Result<String, String> {
        let mut c = self.command();
        let mut child = c
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("java (YCSB): cannot start: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut s);
            s
        });
        let mut log = log.try_clone().map_err(|e| e.to_string())?;
        if let Some(stderr) = child.stderr.take() {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = std::io::Write::write_all(&mut log, format!("ycsb: {line}\n").as_bytes());
                if let Some(n) = status_ops(&line) {
                    during(n);
                }
            }
        }
        let status = child.wait().map_err(|e| e.to_string())?;
        let out = reader.join().map_err(|_| "YCSB output reader panicked")?;
        if !status.success() {
            return Err(format!("YCSB exited with {status}: {}", tail(&out)));
        }
        Ok(out)
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// The operations count of a YCSB status line (`… 10 sec: 12345 operations; …`).
pub fn status_ops(line: &str) -> Option<u64> {
    let (before, _) = line.split_once(" operations;")?;
    before.rsplit(' ').next()?.parse().ok()
}

/// Parses YCSB's measurements (`[READ], AverageLatency(us), 512.3` …) into a cell's numbers.
pub fn parse_output(out: &str, cell: &mut Cell) -> Result<(), String> {
    let mut runtime_ms = None;
    for line in out.lines() {
        let parts: Vec<&str> = line.splitn(3, ", ").collect();
        let [section, metric, value] = parts[..] else {
            continue;
        };
        let Some(section) = section.strip_prefix('[').and_then(|s| s.strip_suffix(']')) else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        if section == "OVERALL" {
            match metric {
                "RunTime(ms)" => runtime_ms = Some(v),
                "Throughput(ops/sec)" => cell.ops_per_s = v,
                _ => {}
            }
            continue;
        }
        if section.ends_with("-FAILED") || section == "CLEANUP" || section.starts_with("TOTAL") {
            continue;
        }
        let op = cell.ops.entry(section.to_string()).or_default();
        match metric {
            "AverageLatency(us)" => op.avg_us = v,
            "95thPercentileLatency(us)" => op.p95_us = v,
            "99thPercentileLatency(us)" => op.p99_us = v,
            "MaxLatency(us)" => op.max_us = v,
            "Return=OK" => op.ok = v as u64,
            m if m.starts_with("Return=") => op.errors += v as u64,
            _ => {}
        }
    }
    let ms = runtime_ms
        .ok_or_else(|| format!("no [OVERALL] RunTime in YCSB's output: {}", tail(out)))?;
    cell.seconds = ms / 1000.0;
    cell.ops.retain(|_, o| o.ok + o.errors > 0);
    cell.errors = cell.ops.values().map(|o| o.errors).sum();
    Ok(())
}

struct Plan {
    records: u64,
    seconds: u64,
    workloads: Vec<String>,
    fault_records: u64,
    /// The most client threads: the loads' and the fault run's.
    most_threads: u32,
}

fn plan(a: &YcsbArgs) -> Result<Plan, String> {
    let workloads = if a.workloads.is_empty() {
        if a.quick {
            vec!["a".to_string()]
        } else {
            ["a", "b", "c", "d", "e"].map(String::from).to_vec()
        }
    } else {
        a.workloads.iter().map(|w| w.to_lowercase()).collect()
    };
    if let Some(w) = workloads
        .iter()
        .find(|w| !["a", "b", "c", "d", "e"].contains(&w.as_str()))
    {
        return Err(format!("unknown workload {w:?} (a, b, c, d, e)"));
    }
    if let Some(s) = a
        .systems
        .iter()
        .find(|s| !["psadb", "ring", "redis"].contains(&s.as_str()))
    {
        return Err(format!("unknown system {s:?} (psadb, ring, redis)"));
    }
    if a.threads.is_empty() || a.threads.contains(&0) || a.field_length == 0 {
        return Err("--threads and --field-length are at least 1".into());
    }
    Ok(Plan {
        records: a
            .records
            .unwrap_or(if a.quick { 1_000 } else { 100_000 })
            .max(1),
        seconds: a.seconds.unwrap_or(if a.quick { 10 } else { 30 }).max(1),
        workloads,
        most_threads: a.threads.iter().copied().max().unwrap_or(1),
        fault_records: a
            .fault_records
            .unwrap_or(if a.quick { 3_000 } else { 20_000 }),
    })
}

fn common_props(a: &YcsbArgs, records: u64) -> Vec<(String, String)> {
    vec![
        ("recordcount".into(), records.to_string()),
        ("fieldlength".into(), a.field_length.to_string()),
        ("status.interval".into(), "1".into()),
    ]
}

/// Runs the benchmark; its cells.
pub fn run(a: &YcsbArgs) -> Result<Vec<Cell>, String> {
    let p = plan(a)?;
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let log_path =
        std::env::temp_dir().join(format!("maquis-bench-ycsb-{}.log", std::process::id()));
    let log = File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    eprintln!("logs of the servers and YCSB: {}", log_path.display());
    let tools = prepare(a)?;
    let mut cells = Vec::new();
    let mut notes = tools.notes.clone();
    for system in &a.systems {
        eprintln!("{system}: starting ...");
        let cluster = Cluster::start(system, a.base_port, &log)?;
        let mut props = common_props(a, p.records);
        props.extend(cluster.binding_props());
        let cpu0 = cluster.cpu_s();
        eprintln!("{system}: loading {} records ...", p.records);
        let load = Invocation {
            tools: &tools,
            load: true,
            workload: "a",
            props: props.clone(),
            threads: p.most_threads,
        };
        let mut cell = Cell {
            system: system.clone(),
            workload: "load".into(),
            records: p.records,
            threads: p.most_threads,
            ..Cell::default()
        };
        parse_output(&load.run(&log, |_| {})?, &mut cell)?;
        cell.server_cpu_s = cluster.cpu_s() - cpu0;
        eprintln!("  {:.0} ops/s, {} errors", cell.ops_per_s, cell.errors);
        cells.push(cell);
        for w in &p.workloads {
            if w == "e" && system == "ring" {
                notes.push("The ring store keeps no key order (no range scans): workload E was not run on it.".into());
                continue;
            }
            for &threads in &a.threads {
                let mut props = props.clone();
                props.push(("operationcount".into(), "1000000000".into()));
                props.push(("maxexecutiontime".into(), p.seconds.to_string()));
                let inv = Invocation {
                    tools: &tools,
                    load: false,
                    workload: w,
                    props,
                    threads,
                };
                eprintln!(
                    "{system}: workload {}, {threads} threads, for {} s ...",
                    w.to_uppercase(),
                    p.seconds
                );
                let mut cell = Cell {
                    system: system.clone(),
                    workload: w.clone(),
                    records: p.records,
                    threads,
                    ..Cell::default()
                };
                let cpu0 = cluster.cpu_s();
                parse_output(&inv.run(&log, |_| {})?, &mut cell)?;
                cell.server_cpu_s = cluster.cpu_s() - cpu0;
                eprintln!(
                    "  {:.0} ops/s, {} errors: {}",
                    cell.ops_per_s,
                    cell.errors,
                    cell.ops
                        .iter()
                        .map(|(k, o)| format!("{k} avg {:.0} µs p99 {:.0} µs", o.avg_us, o.p99_us))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                cells.push(cell);
            }
        }
        cluster.stop();
    }
    if p.fault_records > 0 && a.systems.iter().any(|s| s == "psadb") {
        cells.push(fault_run(
            a,
            &tools,
            p.fault_records,
            p.most_threads,
            &log,
            &mut notes,
        )?);
    }
    crate::stats::write_results(&a.out, &cells)?;
    crate::ycsb_report::write(
        a,
        &cells,
        &tools,
        &notes,
        p.records,
        p.seconds,
        &load_before,
    )?;
    eprintln!("wrote {}", a.out.join("report.md").display());
    Ok(cells)
}

/// The fault run's pace, operations per second: about ten seconds for `records`.
pub fn fault_pace(records: u64) -> u64 {
    (records / 10).max(1)
}

/// The load with a node killed -9 once a third of the records is acknowledged; counts the
/// acknowledged inserts not readable afterwards.
fn fault_run(
    a: &YcsbArgs,
    tools: &Tools,
    records: u64,
    threads: u32,
    log: &File,
    notes: &mut Vec<String>,
) -> Result<Cell, String> {
    eprintln!("psadb fault run: loading {records} records, node 2 killed after a third ...");
    let mut cluster = Cluster::start("psadb", a.base_port, log)?;
    let acklog = std::env::temp_dir().join(format!(
        "maquis-bench-ycsb-acked-{}.txt",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&acklog);
    let survivors: Vec<String> = cluster.resp[..2].iter().map(ToString::to_string).collect();
    let mut props = common_props(a, records);
    props.extend([
        ("resp.hosts".to_string(), survivors.join(",")),
        ("resp.layout".into(), "hash".into()),
        ("resp.scan".into(), "keysfrom".into()),
        ("resp.acklog".into(), acklog.display().to_string()),
        ("dataintegrity".into(), "true".into()),
        // Paced to last about ten seconds whatever the size, so that the kill (at the first
        // status line past a third) comes early and the rest of the load runs after it.
        ("target".into(), fault_pace(records).to_string()),
    ]);
    let inv = Invocation {
        tools,
        load: true,
        workload: "a",
        props,
        threads,
    };
    let victim = cluster.procs[2].pid();
    let mut killed_at = None;
    let started = Instant::now();
    let cpu0 = cluster.cpu_s();
    let out = inv.run(log, |done| {
        if killed_at.is_none() && done >= records / 3 {
            // SAFETY: kill(2) on the pid of a child this process started and has not reaped.
            unsafe { libc::kill(victim as i32, libc::SIGKILL) };
            killed_at = Some((started.elapsed(), done));
        }
    })?;
    let mut cell = Cell {
        system: "psadb".into(),
        workload: "fault".into(),
        records,
        threads,
        ..Cell::default()
    };
    parse_output(&out, &mut cell)?;
    cell.server_cpu_s = cluster.cpu_s() - cpu0;
    match killed_at {
        Some((t, done)) => notes.push(format!(
            "Fault run: node 2 (a member of each group) was killed with SIGKILL {:.1} s into the load, when YCSB reported {done} of {records} inserts done.",
            t.as_secs_f64()
        )),
        None => return Err("the fault run's load ended before a third of it was reported: nothing was killed (use more --fault-records)".into()),
    }
    let acked: Vec<String> = std::fs::read_to_string(&acklog)
        .map_err(|e| format!("{}: {e}", acklog.display()))?
        .lines()
        .map(str::to_string)
        .collect();
    let _ = std::fs::remove_file(&acklog);
    let lost = count_lost(cluster.resp[0], &acked)?;
    cell.acked_writes = Some(acked.len() as u64);
    eprintln!(
        "  {} inserts acknowledged, {} errors, {lost} acknowledged not readable; restarting node 2 ...",
        acked.len(),
        cell.errors
    );
    // The paper's recovery: a new member in place of the dead one, caught up from the others.
    let restarted = Instant::now();
    cluster.restart(2, a.base_port, log)?;
    cell.restart_s = Some(restarted.elapsed().as_secs_f64());
    let lost_restarted = count_lost(cluster.resp[2], &acked)?;
    cell.lost_after_restart = Some(lost_restarted);
    cell.lost_acked_writes = Some(lost + lost_restarted);
    eprintln!(
        "  node 2 ready again in {:.1} s: {lost_restarted} acknowledged not readable through it",
        cell.restart_s.unwrap_or_default()
    );
    cluster.stop();
    Ok(cell)
}

/// Reads every key through `r`: a key is lost unless each of its 10 fields holds YCSB's
/// deterministic value (which begins with `key:field`).
fn count_lost(r: SocketAddr, keys: &[String]) -> Result<u64, String> {
    let mut conn = connect(r)?;
    let mut lost = 0;
    for chunk in keys.chunks(100) {
        let mut pipe = redis::pipe();
        for k in chunk {
            pipe.cmd("HGETALL").arg(k);
        }
        let rows: Vec<std::collections::HashMap<String, String>> = pipe
            .query(&mut conn)
            .map_err(|e| format!("reading back: {e}"))?;
        for (k, row) in chunk.iter().zip(rows) {
            let whole = row.len() == 10
                && (0..10).all(|i| {
                    let f = format!("field{i}");
                    row.get(&f)
                        .is_some_and(|v| v.starts_with(&format!("{k}:{f}")))
                });
            if !whole {
                lost += 1;
            }
        }
    }
    Ok(lost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ycsb_output_is_parsed() {
        let out = "\
[OVERALL], RunTime(ms), 10000
[OVERALL], Throughput(ops/sec), 1234.5
[TOTAL_GCS_G1_Young_Generation], Count, 3
[CLEANUP], Operations, 8
[CLEANUP], AverageLatency(us), 10.0
[READ], Operations, 600
[READ], AverageLatency(us), 512.5
[READ], 95thPercentileLatency(us), 800
[READ], 99thPercentileLatency(us), 1200
[READ], Return=OK, 598
[READ], Return=ERROR, 2
[READ-FAILED], Operations, 2
[READ-FAILED], AverageLatency(us), 9000.0
[UPDATE], Operations, 400
[UPDATE], AverageLatency(us), 700.25
[UPDATE], 95thPercentileLatency(us), 900
[UPDATE], 99thPercentileLatency(us), 1500
[UPDATE], Return=OK, 400
";
        let mut c = Cell::default();
        parse_output(out, &mut c).unwrap();
        assert_eq!(c.seconds, 10.0);
        assert_eq!(c.ops_per_s, 1234.5);
        assert_eq!(c.errors, 2);
        assert_eq!(c.ops.len(), 2, "{:?}", c.ops.keys());
        let r = &c.ops["READ"];
        assert_eq!(
            (r.ok, r.errors, r.avg_us, r.p95_us, r.p99_us),
            (598, 2, 512.5, 800.0, 1200.0)
        );
        assert_eq!(c.ops["UPDATE"].avg_us, 700.25);
        assert!(parse_output("no numbers here", &mut Cell::default()).is_err());
    }

    #[test]
    fn status_lines_give_the_operations_done() {
        assert_eq!(
            status_ops("2026-11-27 20:40:01:123 3 sec: 4521 operations; 1507 current ops/sec; [INSERT: Count=1507]"),
            Some(4521)
        );
        assert_eq!(status_ops("Loading workload..."), None);
    }

    #[test]
    fn bad_arguments_are_refused() {
        let base = YcsbArgs {
            quick: true,
            out: PathBuf::from("x"),
            systems: vec!["psadb".into()],
            workloads: vec![],
            records: None,
            field_length: 1000,
            seconds: None,
            threads: vec![1, 8],
            fault_records: None,
            ycsb_dir: None,
            base_port: 1,
        };
        let p = plan(&base).unwrap();
        assert_eq!(p.most_threads, 8);
        assert_eq!(
            (p.records, p.seconds, p.workloads.as_slice()),
            (1_000, 10, &["a".to_string()][..])
        );
        let mut bad = base.clone();
        bad.workloads = vec!["f".into()];
        assert!(plan(&bad).is_err());
        let mut bad = base.clone();
        bad.systems = vec!["mongo".into()];
        assert!(plan(&bad).is_err());
        let mut bad = base;
        bad.threads = vec![1, 0];
        assert!(plan(&bad).is_err());
    }
}
