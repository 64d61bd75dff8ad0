//! `maquis-bench local` end to end at a small size: every system and workload once, each in its
//! own process, with results that account for every message and a report that reads the targets.

use std::process::Command;

#[test]
fn small_local_run_measures_every_system_and_workload() {
    let out = std::env::temp_dir().join(format!("maquis-bench-local-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args([
            "local",
            "--runs",
            "1",
            "--messages",
            "20000",
            "--calls",
            "4000",
        ])
        .args(["--actors", "2000", "--senders", "4", "--out"])
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    assert!(
        run.status.success(),
        "bench local failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cells: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(cells.len(), 6 * 4, "six systems, four workloads");
    for c in &cells {
        match c["workload"].as_str().unwrap() {
            "idle" => assert_eq!(c["actors"], 2000, "{c}"),
            "calls" => {
                assert_eq!(c["messages"], 4000, "{c}");
                assert_eq!(c["samples"], 4000, "every call is timed: {c}");
                assert!(c["p99_us"].as_f64().unwrap() >= c["p50_us"].as_f64().unwrap());
            }
            w => {
                assert_eq!(c["messages"], 20000, "{c}");
                // Every 64th message of each sender is stamped.
                assert!(c["samples"].as_u64().unwrap() >= 20000 / 64, "{c}");
                assert_eq!(c["senders"], if w == "one-to-one" { 1 } else { 4 }, "{c}");
            }
        }
        if c["workload"] != "idle" {
            assert!(c["msgs_per_s"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["cpu_ns_per_msg"].as_f64().unwrap() > 0.0, "{c}");
        }
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for heading in [
        "## one-to-one",
        "## many-to-one",
        "## calls",
        "## idle actors",
        "## Targets",
    ] {
        assert!(
            report.contains(heading),
            "{heading} missing from:\n{report}"
        );
    }
    assert!(
        report.contains("Maquis") && report.contains("× the tokio floor"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_sizes_are_refused() {
    let run = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["local", "--messages", "0", "--out"])
        .arg(std::env::temp_dir().join("maquis-bench-local-refused"))
        .output()
        .expect("maquis-bench runs");
    assert!(!run.status.success());
    assert!(String::from_utf8_lossy(&run.stderr).contains("at least 1"));
}
