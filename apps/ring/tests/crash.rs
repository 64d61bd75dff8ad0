//! Crash consistency, with real processes: `ring serve` nodes killed with SIGKILL and started
//! again while a client writes and reads through the Redis front.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A free local port below the kernel's ephemeral range (bound, then released). A node
/// restarts on its old ports, and a port of the ephemeral range could meanwhile have become
/// the local port of some outgoing connection.
fn free_port() -> u16 {
    use std::sync::atomic::AtomicU16;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let (lo, span) = (20_000u16, 12_000u16);
    let start = (std::process::id() % u32::from(span)) as u16;
    for _ in 0..span {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = lo + (start.wrapping_add(i.wrapping_mul(7))) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {lo}..{}", lo + span);
}

struct RingProc {
    name: String,
    listen: SocketAddr,
    resp: SocketAddr,
    data: Option<PathBuf>,
    join: Option<SocketAddr>,
    child: Option<Child>,
}

impl RingProc {
    fn new(name: &str, data: Option<&Path>, join: Option<SocketAddr>) -> RingProc {
        RingProc {
            name: name.to_string(),
            listen: SocketAddr::from(([127, 0, 0, 1], free_port())),
            resp: SocketAddr::from(([127, 0, 0, 1], free_port())),
            data: data.map(|d| d.join(name)),
            join,
            child: None,
        }
    }

    /// Starts the process and waits for the line it prints once it serves.
    fn start(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ring"));
        cmd.args(["serve", "--name", &self.name, "--gossip-ms", "100"])
            .args(["--listen", &self.listen.to_string()])
            .args(["--resp", &self.resp.to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(d) = &self.data {
            cmd.arg("--data-dir").arg(d);
        }
        if let Some(j) = self.join {
            cmd.args(["--join", &j.to_string()]);
        }
        let mut child = cmd.spawn().expect("ring binary");
        let out = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        if !line.contains("listening") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("{} did not start: {line}{err}", self.name);
        }
        // Its log goes on being read (and dropped), so that the pipe never fills.
        if let Some(e) = child.stderr.take() {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut BufReader::new(e), &mut std::io::sink());
            });
        }
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RingProc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn client(addr: SocketAddr) -> Option<redis::Connection> {
    let c = redis::Client::open(format!("redis://{addr}/")).ok()?;
    let conn = c.get_connection_with_timeout(Duration::from_secs(2)).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    Some(conn)
}

fn info_ring(addr: SocketAddr) -> Option<BTreeMap<String, String>> {
    let mut c = client(addr)?;
    let text: String = redis::cmd("INFO").arg("ring").query(&mut c).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.trim().split_once(':'))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// Waits until every node reports the same complete ring, with no transfer pending and no
/// vnode recovering.
fn converged(nodes: &[RingProc], names: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let infos: Vec<_> = nodes.iter().map(|n| info_ring(n.resp)).collect();
        let done = infos.iter().all(|i| {
            i.as_ref().is_some_and(|i| {
                i.get("ring_nodes").map(String::as_str) == Some(names)
                    && i.get("ring_pending_transfers").map(String::as_str) == Some("0")
                    && i.get("ring_members").map(String::as_str) == Some("3")
                    && i.get("ring_recovering_vnodes").map(String::as_str) == Some("0")
            })
        }) && infos
            .iter()
            .map(|i| i.as_ref().and_then(|i| i.get("ring_version").cloned()))
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == 1;
        if done {
            return;
        }
        assert!(Instant::now() < deadline, "not converged: {infos:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the client saw.
#[derive(Default)]
struct Seen {
    /// Keys whose SET was acknowledged, with the value.
    acked: BTreeMap<String, String>,
    /// Reads, during the run, of a key acknowledged before the read began that came back
    /// nil or with another value.
    wrong_reads: Vec<String>,
    reads: u64,
}

/// Writes keys (and reads back earlier ones) through the nodes in turn until `stop`.
fn client_loop(addrs: Vec<SocketAddr>, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let mut i = 0usize;
    let mut conns: Vec<Option<redis::Connection>> = addrs.iter().map(|_| None).collect();
    while !stop.load(Ordering::Relaxed) {
        let n = i % addrs.len();
        i += 1;
        if conns[n].is_none() {
            conns[n] = client(addrs[n]);
        }
        let Some(c) = conns[n].as_mut() else { continue };
        let (key, value) = (format!("key{i}"), format!("value{i}"));
        match redis::cmd("SET").arg(&key).arg(&value).query::<()>(c) {
            Ok(()) => {
                seen.lock().unwrap().acked.insert(key, value);
            }
            Err(_) => {
                conns[n] = None;
                continue;
            }
        }
        // Read back a key acknowledged a while ago.
        let old = {
            let s = seen.lock().unwrap();
            let j = (i * 7919) % s.acked.len().max(1);
            s.acked.iter().nth(j).map(|(k, v)| (k.clone(), v.clone()))
        };
        if let Some((k, v)) = old {
            match redis::cmd("GET").arg(&k).query::<Option<String>>(c) {
                Ok(got) => {
                    let mut s = seen.lock().unwrap();
                    s.reads += 1;
                    if got.as_deref() != Some(v.as_str()) {
                        s.wrong_reads.push(format!("{k} via node {n}: {got:?}"));
                    }
                }
                Err(_) => conns[n] = None,
            }
        }
    }
}

/// Every acknowledged key, read through every node after the run.
fn lost_after(nodes: &[RingProc], acked: &BTreeMap<String, String>) -> Vec<String> {
    let mut lost = Vec::new();
    for n in nodes {
        let mut c = client(n.resp).expect("client");
        for (k, v) in acked {
            let got: Option<String> = redis::cmd("GET").arg(k).query(&mut c).unwrap();
            if got.as_deref() != Some(v.as_str()) {
                lost.push(format!("{k} via {}: {got:?}", n.name));
            }
        }
    }
    lost
}

#[test]
fn durable_nodes_lose_nothing_through_rolling_kill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    rolling_kill_and_restart(Some(dir.path()));
}

#[test]
fn in_memory_nodes_lose_nothing_through_rolling_kill_and_restart() {
    rolling_kill_and_restart(None);
}

/// Three nodes; each in turn is killed and started again under writes, the next one only
/// once the cluster has converged and no vnode is recovering. With a durable backend the
/// restarted node has its data; in memory it comes back empty, its vnodes recovering, and
/// anti-entropy refills them from the two others.
fn rolling_kill_and_restart(data: Option<&Path>) {
    // One run at a time: a node restarts on its old ports, which a run beside it could have
    // picked as free meanwhile.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut nodes = vec![RingProc::new("r1", data, None)];
    let seed = nodes[0].listen;
    nodes.push(RingProc::new("r2", data, Some(seed)));
    nodes.push(RingProc::new("r3", data, Some(seed)));
    // The first node joins the others when it comes back.
    nodes[0].join = Some(nodes[1].listen);
    for n in nodes.iter_mut() {
        n.start();
    }
    converged(&nodes, "r1,r2,r3");

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let writer = {
        let addrs = nodes.iter().map(|n| n.resp).collect();
        let (stop, seen) = (stop.clone(), seen.clone());
        std::thread::spawn(move || client_loop(addrs, stop, seen))
    };
    let acked_now = || seen.lock().unwrap().acked.len();
    // Some writes before the first crash, then each node in turn: SIGKILL, restart, converge.
    let until = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while acked_now() < n {
            assert!(
                Instant::now() < deadline,
                "the client stalled at {}",
                acked_now()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    until(300);
    for victim in [2, 1, 0] {
        nodes[victim].kill();
        let at = acked_now();
        until(at + 100);
        nodes[victim].start();
        converged(&nodes, "r1,r2,r3");
        let at = acked_now();
        until(at + 100);
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    let seen = seen.lock().unwrap();
    let lost = lost_after(&nodes, &seen.acked);
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged keys lost or wrong (×3 nodes): {:?}",
        lost.len(),
        seen.acked.len(),
        &lost[..lost.len().min(10)]
    );
    assert!(
        seen.wrong_reads.is_empty(),
        "{} of {} reads during the run were wrong: {:?}",
        seen.wrong_reads.len(),
        seen.reads,
        &seen.wrong_reads[..seen.wrong_reads.len().min(10)]
    );
    eprintln!(
        "{} keys acknowledged, {} reads during the run, none lost or wrong",
        seen.acked.len(),
        seen.reads
    );
}
