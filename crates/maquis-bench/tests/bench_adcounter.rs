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
