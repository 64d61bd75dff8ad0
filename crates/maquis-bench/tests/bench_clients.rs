//! `maquis-bench clients` end to end at a small size: a server process and two swarm processes,
//! the load, the drain, and a report whose verdict holds.

use std::process::Command;

#[test]
fn small_client_server_memory_run_accounts_for_every_state() {
    let out = std::env::temp_dir().join(format!("maquis-bench-clients-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["clients", "--clients", "16", "--procs", "2"])
        .args(["--period-ms", "50", "--load-s", "2", "--out"])
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "bench clients failed: {stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["after"]["members"], 17, "every client is a member");
    let sum = |field: &str| -> u64 {
        results["swarms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s[field].as_u64().unwrap())
            .sum()
    };
    let sent = sum("sent");
    assert!(sent > 16, "states were pushed: {sent}");
    assert_eq!(
        results["after"]["merged"].as_u64(),
        Some(sent),
        "all merged"
    );
    assert_eq!(
        sum("relayed"),
        sum("received"),
        "every relayed state arrived"
    );
    assert_eq!(sum("errors"), 0);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        report.contains("peak within the bound: **yes**"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
