//! `maquis-bench adcounter` end to end at a small size: both overlays, every replica ending
//! with the exact count, the bytes and node 0's memory measured.

use std::process::Command;

#[test]
fn small_adcounter_run_counts_exactly_on_both_overlays() {
    let out = std::env::temp_dir().join(format!("maquis-bench-adc-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["adcounter", "--sizes", "4,8", "--increments", "5"])
        .args(["--base-port", "21500", "--timeout-s", "60", "--out"])
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    assert!(
        run.status.success(),
        "bench adcounter failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cells: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let shape: Vec<(&str, u64)> = cells
        .iter()
        .map(|c| (c["overlay"].as_str().unwrap(), c["nodes"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        shape,
        [
            ("client-server", 4),
            ("client-server", 8),
            ("peer-to-peer", 4),
            ("peer-to-peer", 8)
        ]
    );
    for c in &cells {
        let n = c["nodes"].as_u64().unwrap();
        assert_eq!(c["increments"].as_u64().unwrap(), (n - 1) * 5, "{c}");
        assert_eq!(c["final_count"], c["increments"], "{c}");
        assert!(c["bytes_total"].as_u64().unwrap() > 0, "{c}");
        assert!(
            c["bytes_busiest"].as_u64().unwrap() >= c["bytes_per_node"].as_u64().unwrap(),
            "{c}"
        );
        assert!(c["peak_rss_kib"].as_u64().unwrap() > 0, "{c}");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## Targets"), "{report}");
    let bad = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["adcounter", "--overlays", "ring", "--out"])
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown overlay"));
    let _ = std::fs::remove_dir_all(&out);
}

/// A cell that fails is recorded with its reason, the overlay's larger sizes are skipped, and
/// the run still writes its results.
#[test]
fn a_failed_cell_is_recorded_and_the_larger_ones_skipped() {
    let out = std::env::temp_dir().join(format!("maquis-bench-adc-fail-{}", std::process::id()));
    // Node 0 cannot listen: its port is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:21620").expect("port 21620 is free");
    let run = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["adcounter", "--sizes", "4,8", "--overlays", "peer-to-peer"])
        .args(["--base-port", "21620", "--timeout-s", "30", "--out"])
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    drop(taken);
    assert!(
        run.status.success(),
        "a failed cell fails the cell, not the run: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cells: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(cells.len(), 1, "the 8-node cell is skipped: {cells:?}");
    assert_eq!(cells[0]["nodes"], 4);
    assert!(
        cells[0]["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{}",
        cells[0]
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("failed"), "{report}");
    let _ = std::fs::remove_dir_all(&out);
}
