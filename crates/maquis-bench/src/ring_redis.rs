//! The `--redis` step of `maquis-bench kvs`: three `ring serve --resp` nodes in the emulated
//! hosts and `redis-benchmark -t set,get -n 20000 -q` against each node's RESP port, the three at
//! once.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use maquis_netem::Netem;

use crate::ring_agent::{PARTISAN, PARTISAN_PARALLELISM, SINGLE};
use crate::ring_bench::Plan;
use crate::ring_proc::{run_capture, Proc};

/// The arguments given to `redis-benchmark` (besides `-h`/`-p`).
pub const REDIS_ARGS: [&str; 5] = ["-t", "set,get", "-n", "20000", "-q"];

const LISTEN_PORT: u16 = 9600;
const RESP_PORT: u16 = 6379;
const COOKIE: &str = "maquis-bench-redis";
/// Storage delay of the Redis step's nodes: `ring serve`'s default. (With redis-benchmark's
/// one key, a delay would only measure how fast one vnode sleeps.)
pub const STORAGE_DELAY_MS: u64 = 0;

/// What serves the Redis protocol.
#[derive(Clone, Debug)]
pub enum Server {
    /// The `ring` binary of `apps/ring`: `ring serve --resp`.
    RingBinary(PathBuf),
    /// This binary's ring agent with `--resp` (the same `Ring::start` and `serve_resp`), when
    /// no `ring` binary was found.
    Agent(PathBuf),
}

/// One `redis-benchmark` run against one node.
#[derive(Clone, Debug, Default)]
pub struct RedisRow {
    /// RTT, ms.
    pub rtt_ms: u64,
    /// `single` or `partisan`.
    pub config: String,
    /// The node benchmarked (from its own host).
    pub node: String,
    /// SET requests per second.
    pub set_rps: Option<f64>,
    /// SET median latency, ms (newer redis-benchmark versions print it).
    pub set_p50_ms: Option<f64>,
    /// GET requests per second.
    pub get_rps: Option<f64>,
    /// GET median latency, ms.
    pub get_p50_ms: Option<f64>,
    /// Why the run failed, if it did.
    pub error: Option<String>,
}

/// The step's state and results.
#[derive(Clone, Debug, Default)]
pub struct RedisOutcome {
    /// Whether the step was asked for.
    pub wanted: bool,
    /// `redis-benchmark` version, once found.
    pub version: Option<String>,
    /// What serves RESP.
    pub server: Option<Server>,
    /// What happened (installation, which server, failures).
    pub notes: Vec<String>,
    /// Results.
    pub rows: Vec<RedisRow>,
}

fn find_ring_binary(exe: &Path) -> Option<PathBuf> {
    let beside = exe.parent().map(|d| d.join("ring"));
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("ring"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    beside.into_iter().chain(on_path).find(|p| {
        p.is_file()
            && p.to_str()
                .and_then(crate::install::version_of)
                .is_some_and(|v| v.starts_with("ring "))
    })
}

/// Finds (or installs) redis-benchmark and finds the `ring` binary.
pub fn prepare(exe: &Path) -> RedisOutcome {
    let mut o = RedisOutcome {
        wanted: true,
        ..RedisOutcome::default()
    };
    o.version = crate::install::version_of("redis-benchmark");
    if o.version.is_none() {
        eprintln!(
            "redis-benchmark is not installed: installing Debian's redis-tools with apt-get ..."
        );
        match crate::install::apt_install(&["redis-tools"]) {
            Ok(()) => {
                o.version = crate::install::version_of("redis-benchmark");
                o.notes
                    .push("redis-benchmark was missing: this run installed Debian's `redis-tools` with apt-get.".into());
            }
            Err(e) => o.notes.push(format!(
                "redis-benchmark is missing and installing `redis-tools` with apt-get failed: {e}"
            )),
        }
    }
    o.server = match find_ring_binary(exe) {
        Some(p) => {
            o.notes.push(format!(
                "Servers: `{} serve --resp …`, the `ring` binary of `apps/ring`.",
                p.display()
            ));
            Some(Server::RingBinary(p))
        }
        None => {
            o.notes.push(format!(
                "No `ring` binary beside {} or on PATH (build it with `cargo build --release -p maquis-ring`): the nodes ran `maquis-bench agent ring-node --resp`, which starts the ring and its Redis front with the same library calls as `ring serve`.",
                exe.display()
            ));
            Some(Server::Agent(exe.to_path_buf()))
        }
    };
    o
}

/// Runs the step at one RTT for every configuration of the plan; failures become notes.
pub fn run(net: &Netem, rtt: u64, plan: &Plan, log: &File, o: &mut RedisOutcome) -> Vec<RedisRow> {
    let mut rows = Vec::new();
    if o.version.is_none() {
        return rows;
    }
    let Some(server) = o.server.clone() else {
        return rows;
    };
    for (ci, config) in plan.configs.iter().enumerate() {
        eprintln!("rtt {rtt} ms, {config}: redis-benchmark against three ring nodes ...");
        match run_config(net, rtt, plan, log, &server, config, ci as u16) {
            Ok(r) => {
                for row in &r {
                    eprintln!(
                        "  {}: SET {} req/s, GET {} req/s{}",
                        row.node,
                        fmt_opt(row.set_rps, 0),
                        fmt_opt(row.get_rps, 0),
                        row.error
                            .as_deref()
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    );
                }
                rows.extend(r);
            }
            Err(e) => {
                eprintln!("  failed: {e}");
                o.notes.push(format!("rtt {rtt} ms, {config}: {e}"));
            }
        }
    }
    rows
}

/// `12.3`, or `–`.
pub fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

fn log_stdio(log: &File) -> Stdio {
    log.try_clone()
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

#[allow(clippy::too_many_arguments)]
fn run_config(
    net: &Netem,
    rtt: u64,
    plan: &Plan,
    log: &File,
    server: &Server,
    config: &str,
    offset: u16,
) -> Result<Vec<RedisRow>, String> {
    let hosts = net.hosts();
    if hosts.len() < 3 {
        return Err("the link emulator has fewer than 3 hosts".into());
    }
    let port = LISTEN_PORT + offset;
    let resp_port = RESP_PORT + offset;
    let first = format!("{}:{port}", hosts[0].addr);
    let mut nodes = Vec::new();
    for (i, h) in hosts.iter().take(3).enumerate() {
        let name = format!("r{}", i + 1);
        let listen = format!("{}:{port}", h.addr);
        let resp = format!("{}:{resp_port}", h.addr);
        let common = |c: &mut Command| {
            c.args(["--name", &name, "--listen", &listen, "--resp", &resp])
                .args(["--partitions", &plan.partitions.to_string()])
                .args(["--storage-delay-ms", &STORAGE_DELAY_MS.to_string()])
                .args(["--cookie", COOKIE]);
            if i > 0 {
                c.args(["--join", &first]);
            }
        };
        let (mut c, ready) = match server {
            Server::RingBinary(p) => {
                let mut c = net.try_command(i, p).map_err(|e| e.to_string())?;
                c.arg("serve");
                common(&mut c);
                // `ring serve` has affinity on by default and its `--affinity` takes no value;
                // with one lane per channel affinity makes no difference anyway.
                let p = if config == PARTISAN {
                    PARTISAN_PARALLELISM
                } else {
                    1
                };
                c.args(["--parallelism", &p.to_string()]);
                (c, "ring node")
            }
            Server::Agent(exe) => {
                let mut c = net.try_command(i, exe).map_err(|e| e.to_string())?;
                c.args(["agent", "ring-node", "--config", config]);
                common(&mut c);
                (c, "ready")
            }
        };
        c.env("RUST_LOG", crate::stats::agent_log_filter());
        let mut p = Proc::start(&format!("{config} resp node {name}"), c, log_stdio(log))?;
        p.expect(&[ready], Duration::from_secs(90))?;
        nodes.push(p);
    }
    wait_converged(net, resp_port, Duration::from_secs(600))?;
    let mut cmds = Vec::new();
    for (i, h) in hosts.iter().take(3).enumerate() {
        let mut c = net
            .try_command(i, "redis-benchmark")
            .map_err(|e| e.to_string())?;
        c.args(["-h", &h.addr.to_string(), "-p", &resp_port.to_string()])
            .args(REDIS_ARGS);
        cmds.push((format!("r{}", i + 1), c));
    }
    let results: Vec<(String, Result<String, String>)> = std::thread::scope(|s| {
        let handles: Vec<_> =
            cmds.into_iter()
                .map(|(name, c)| {
                    s.spawn(move || {
                        let r = run_capture("redis-benchmark", c, Duration::from_secs(1800))
                            .and_then(|(status, out)| {
                                if status.success() {
                                    Ok(out)
                                } else {
                                    Err(format!("{status}: {}", out.trim()))
                                }
                            });
                        (name, r)
                    })
                })
                .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| (String::new(), Err("thread panicked".into())))
            })
            .collect()
    });
    for n in nodes {
        n.stop(Duration::from_millis(200));
    }
    Ok(results
        .into_iter()
        .map(|(node, r)| {
            let mut row = RedisRow {
                rtt_ms: rtt,
                config: config.to_string(),
                node,
                ..RedisRow::default()
            };
            match r {
                Ok(out) => {
                    (row.set_rps, row.set_p50_ms) = parse(&out, "SET");
                    (row.get_rps, row.get_p50_ms) = parse(&out, "GET");
                    if row.set_rps.is_none() || row.get_rps.is_none() {
                        row.error = Some(format!(
                            "unexpected output: {}",
                            out.trim().chars().take(200).collect::<String>()
                        ));
                    }
                }
                Err(e) => row.error = Some(e),
            }
            row
        })
        .collect())
}

/// Polls `INFO ring` on the three nodes until each lists three ring nodes, the same ring
/// version, no pending transfer and no handoff.
fn wait_converged(net: &Netem, resp_port: u16, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let mut why = String::new();
        let mut versions = Vec::new();
        for (i, h) in net.hosts().iter().take(3).enumerate() {
            let mut c = net.try_command(i, "redis-cli").map_err(|e| e.to_string())?;
            c.args(["-h", &h.addr.to_string(), "-p", &resp_port.to_string()])
                .args(["INFO", "ring"]);
            let info = match run_capture("redis-cli", c, Duration::from_secs(10)) {
                Ok((s, out)) if s.success() => out,
                Ok((_, out)) => {
                    why = out.trim().to_string();
                    break;
                }
                Err(e) => {
                    why = e;
                    break;
                }
            };
            let field = |k: &str| {
                info.lines()
                    .find_map(|l| l.trim().strip_prefix(k).map(|v| v.trim().to_string()))
                    .unwrap_or_default()
            };
            let nodes = field("ring_nodes:");
            let pending = field("ring_pending_transfers:");
            let handoffs = field("ring_handoffs:");
            if nodes.split(',').filter(|n| !n.is_empty()).count() != 3
                || pending != "0"
                || handoffs != "0"
            {
                why = format!(
                    "{}: nodes {nodes:?}, pending {pending}, handoffs {handoffs}",
                    h.addr
                );
                break;
            }
            versions.push(field("ring_version:"));
        }
        if versions.len() == 3 && versions.iter().all(|v| *v == versions[0]) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("ring did not converge within {limit:?}: {why}"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Parses `SET: 12345.68 requests per second, p50=0.123 msec` (the last such line).
fn parse(out: &str, test: &str) -> (Option<f64>, Option<f64>) {
    let prefix = format!("{test}:");
    out.split(['\r', '\n'])
        .map(str::trim)
        .rfind(|l| l.starts_with(&prefix) && l.contains("requests per second"))
        .map(|l| {
            let rps = l[prefix.len()..]
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok());
            let p50 = l.split("p50=").nth(1).and_then(|r| {
                r.split(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
            });
            (rps, p50)
        })
        .unwrap_or((None, None))
}

/// What `single` means for the Redis step's servers.
pub fn single_meaning(server: &Server) -> String {
    match server {
        Server::RingBinary(_) => format!(
            "`ring serve --parallelism 1`: `ring serve` always adds the ring's `vnode`, `gossip` and `handoff` channels, so each has one connection per peer (affinity, on by default in `ring serve`, makes no difference with one lane per channel); `{PARTISAN}` is `ring serve --parallelism {PARTISAN_PARALLELISM}` with its default affinity (on)"
        ),
        Server::Agent(_) => format!(
            "the same `{SINGLE}` and `{PARTISAN}` node configurations as the grid above"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn parses_quiet_output() {
        let out = "SET: rps=1234.0 (overall: 1200.0) avg_msec=3.1\r                  \rSET: 15384.62 requests per second, p50=2.543 msec\nGET: 20000.00 requests per second, p50=1.111 msec\n";
        assert_eq!(parse(out, "SET"), (Some(15384.62), Some(2.543)));
        assert_eq!(parse(out, "GET"), (Some(20000.0), Some(1.111)));
        assert_eq!(
            parse("SET: 10.5 requests per second\n", "SET"),
            (Some(10.5), None)
        );
        assert_eq!(parse("nothing", "GET"), (None, None));
    }
}
