//! Drives the `maquis` binary as separate processes: two nodes, status, ping, clean leave.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_maquis");

/// A running `maquis node` whose stdout lines arrive on a channel.
struct NodeProc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl NodeProc {
    fn start(args: &[&str]) -> NodeProc {
        let mut child = Command::new(BIN)
            .arg("node")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("maquis starts");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        NodeProc { child, lines }
    }

    /// Waits for a stdout line starting with `prefix`; returns it.
    fn expect_line(&self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => continue,
                Err(e) => panic!("no line starting with {prefix:?}: {e}"),
            }
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        self.child.wait().expect("exits")
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `node NAME listening on ADDR (…)` → ADDR; `admin on http://ADDR` → ADDR.
fn word_after(line: &str, marker: &str) -> String {
    let rest = &line[line.find(marker).expect("marker") + marker.len()..];
    rest.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn maquis(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().expect("maquis runs")
}

#[test]
fn two_processes_join_ping_and_leave() {
    let common = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--cookie",
        "proc-test",
    ];
    let n1 = NodeProc::start(&[&["--name", "p1"][..], &common[..]].concat());
    let addr1 = word_after(&n1.expect_line("node p1"), "listening on ");
    let admin1 = word_after(&n1.expect_line("admin on"), "http://");
    let mut n2 = NodeProc::start(&[&["--name", "p2", "--join", &addr1][..], &common[..]].concat());
    n2.expect_line("node p2");
    // p2's join shows up in p1's event stream.
    n1.expect_line("Up(NodeId { name: \"p2\"");

    let out = maquis(&["status", &admin1, "--json"]);
    assert!(out.status.success());
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(st["name"], "p1");
    assert_eq!(st["overlay"], "full-mesh");
    let members: Vec<&str> = st["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    assert_eq!(members, vec!["p1", "p2"]);
    assert_eq!(st["peers"][0]["name"], "p2");
    assert!(st["peers"][0]["lanes"].as_array().unwrap().len() >= 2);

    let table = maquis(&["status", &admin1]);
    assert!(table.status.success());
    assert!(String::from_utf8_lossy(&table.stdout).contains("p2"));

    let ping = maquis(&[
        "ping", &admin1, "--to", "p2", "--count", "20", "--size", "4096",
    ]);
    let text = String::from_utf8_lossy(&ping.stdout).to_string();
    assert!(ping.status.success(), "ping failed: {text}");
    assert!(text.contains("20 ok, 0 failed"), "{text}");

    let bad = maquis(&["ping", &admin1, "--to", "nobody", "--count", "2"]);
    assert!(!bad.status.success(), "a ping to an unknown node must fail");

    // SIGTERM: p2 leaves cleanly and p1 reports it as Left.
    assert!(n2.terminate().success());
    n1.expect_line("Left(NodeId { name: \"p2\"");
}

#[test]
fn bad_input_gives_clear_errors() {
    let out = maquis(&[
        "node",
        "--name",
        "x",
        "--parallelism",
        "0",
        "--listen",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("parallelism"));
    let out = maquis(&["status", "127.0.0.1:1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("error"));
}
