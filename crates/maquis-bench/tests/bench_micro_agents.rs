//! The agents of `maquis-bench micro` (Maquis and raw TCP) on loopback, without the link
//! emulator: every mode delivers what it sent and reports what it measured.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_maquis-bench");

/// A server agent, ended by closing its stdin when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(EXE)
            .arg("agent")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the server agent starts");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("not ready: {line:?}"))
            .trim()
            .to_string();
        Server { child, addr }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// Runs a client agent in `mode` and returns its JSON result.
fn client(kind: &[&str], server: &Server, mode: &str) -> serde_json::Value {
    let out = Command::new(EXE)
        .arg("agent")
        .args(kind)
        .args(["--server", &server.addr, "--mode", mode])
        .args(["--actors", "4", "--size", "1024", "--messages", "100000"])
        .args(["--limit-s", "0.5", "--warmup-s", "0.2"])
        .args(["--bulk-actors", "1", "--bulk-size", "1048576"])
        .output()
        .expect("the client agent runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{kind:?} {mode}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("one JSON line")
}

/// What a result says of the client's lanes: a Maquis client samples them (`parallelism`
/// lanes of its `default` channel), a raw TCP client has none.
fn check_lanes(result: &serde_json::Value, parallelism: Option<u64>) {
    let lanes = &result["lanes"];
    let Some(n) = parallelism else {
        assert!(lanes.is_null(), "raw TCP has no lanes: {result}");
        return;
    };
    assert!(lanes["samples"].as_u64().unwrap() > 0, "{result}");
    let small = lanes["small_max"].as_u64().unwrap();
    assert!((1..=n).contains(&small), "{result}");
    assert!(lanes["striped_max"].as_u64().unwrap() <= n, "{result}");
    let mean = lanes["small_mean"].as_f64().unwrap();
    assert!(mean >= 1.0 && mean <= small as f64, "{result}");
}

fn check(kind: &[&str], server: &Server, parallelism: Option<u64>) {
    let rtt = client(kind, server, "rtt");
    check_lanes(&rtt, parallelism);
    assert!(rtt["messages"].as_u64().unwrap() > 0, "{rtt}");
    assert_eq!(rtt["errors"], 0, "{rtt}");
    assert!(rtt["p99_us"].as_u64().unwrap() > 0, "{rtt}");
    assert!(rtt.get("alone").is_none(), "{rtt}");

    let stream = client(kind, server, "stream");
    assert!(stream["messages"].as_u64().unwrap() > 0, "{stream}");
    assert_eq!(
        stream["errors"], 0,
        "every message sent was delivered: {stream}"
    );
    assert_eq!(stream["p99_us"], 0, "a stream has no latencies: {stream}");
    assert!(stream["ops_per_s"].as_f64().unwrap() > 0.0, "{stream}");
    check_lanes(&stream, parallelism);

    let mixed = client(kind, server, "mixed");
    assert!(mixed["messages"].as_u64().unwrap() > 0, "{mixed}");
    assert_eq!(mixed["errors"], 0, "{mixed}");
    check_lanes(&mixed, parallelism);
    for phase in ["alone", "bulk"] {
        assert!(
            mixed[phase]["messages"].as_u64().unwrap() > 0,
            "{phase}: {mixed}"
        );
        assert_eq!(mixed[phase]["errors"], 0, "{phase}: {mixed}");
    }
}

#[test]
fn the_maquis_agents_run_every_mode() {
    for affinity in ["off", "on"] {
        let server = Server::start(&[
            "micro-server",
            "--listen",
            "127.0.0.1:0",
            "--actors",
            "8",
            "--parallelism",
            "4",
            "--affinity",
            affinity,
        ]);
        check(
            &[
                "micro-client",
                "--listen",
                "127.0.0.1:0",
                "--parallelism",
                "4",
                "--affinity",
                affinity,
            ],
            &server,
            Some(4),
        );
    }
}

#[test]
fn the_raw_tcp_agents_run_every_mode() {
    let server = Server::start(&["raw-server", "--listen", "127.0.0.1:0"]);
    check(&["raw-client", "--conns", "2"], &server, None);
}
