//! `maquis-bench heartbeat` end to end at a small size: both configurations in two rounds,
//! every call answered, the sizes the model chose reported for `stages` only.

use std::process::Command;

#[test]
fn small_heartbeat_run_measures_both_configurations() {
    let out = std::env::temp_dir().join(format!("maquis-bench-hb-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["heartbeat", "--actors", "64", "--rates", "300,600"])
        .args(["--seconds", "1,1", "--rounds", "2", "--stage-ms", "200"])
        .args(["--port", "18950", "--out"])
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    assert!(
        run.status.success(),
        "bench heartbeat failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cells: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let order: Vec<(&str, u64)> = cells
        .iter()
        .map(|c| (c["config"].as_str().unwrap(), c["rate"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        order,
        [
            ("default", 300),
            ("default", 600),
            ("stages", 300),
            ("stages", 600),
            ("stages", 300),
            ("stages", 600),
            ("default", 300),
            ("default", 600),
        ],
        "the order reverses in the second round"
    );
    for c in &cells {
        assert_eq!(c["sent"], c["rate"], "one measured second: {c}");
        assert_eq!(c["lost"], 0, "{c}");
        assert!(c["p99_us"].as_u64().unwrap() >= c["p50_us"].as_u64().unwrap());
        assert!(c["server_cpu_us"].as_f64().unwrap() > 0.0, "{c}");
        let threads = &c["stages"]["threads"];
        if c["config"] == "stages" {
            for t in threads.as_array().expect("sized") {
                assert!(t.as_u64().unwrap() >= 1, "{c}");
            }
        } else {
            assert!(threads.is_null(), "{c}");
        }
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("`stages` against `default`"), "{report}");
    let bad = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["heartbeat", "--configs", "default,nonsense", "--out"])
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("nonsense"));
    let _ = std::fs::remove_dir_all(&out);
}
