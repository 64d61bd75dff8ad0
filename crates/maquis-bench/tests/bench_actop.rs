//! `maquis-bench actop` end to end at a small size: every configuration on a fresh cluster,
//! every request accounted for, the report reading the targets.

use std::process::Command;

#[test]
fn small_actop_run_measures_every_configuration() {
    let out = std::env::temp_dir().join(format!("maquis-bench-actop-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args([
            "actop",
            "--games",
            "20",
            "--rate",
            "200,400",
            "--clients",
            "4",
        ])
        .args(["--churn", "300"])
        .args([
            "--seconds",
            "2,1,1",
            "--interval-ms",
            "300",
            "--base-port",
            "18700",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    assert!(
        run.status.success(),
        "bench actop failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let cells: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let configs: Vec<&str> = cells
        .iter()
        .map(|c| c["config"].as_str().unwrap())
        .collect();
    assert_eq!(configs, ["random", "local", "actop", "actop+stages"]);
    for c in &cells {
        let sent = c["sent"].as_u64().unwrap();
        assert!(sent > 0, "{c}");
        assert_eq!(
            c["handled"].as_u64().unwrap() + c["lost"].as_u64().unwrap(),
            sent
        );
        assert_eq!(c["lost"], 0, "nothing lost: {c}");
        assert!(c["p99_us"].as_u64().unwrap() >= c["p50_us"].as_u64().unwrap());
        assert_eq!(
            c["timeline"].as_array().unwrap().len(),
            4,
            "a share per second: {c}"
        );
        assert_eq!(
            c["moves_timeline"].as_array().unwrap().len(),
            4,
            "moves counted per second: {c}"
        );
        let loads = c["loads"].as_array().unwrap();
        let rates: Vec<u64> = loads.iter().map(|l| l["rate"].as_u64().unwrap()).collect();
        assert_eq!(rates, [200, 400], "{c}");
        for l in loads {
            assert_eq!(l["lost"], 0, "{c}");
            assert!(l["achieved_per_s"].as_f64().unwrap() > 0.0, "{c}");
            let cdf: Vec<u64> = l["cdf_us"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(cdf.len(), 101, "{c}");
            assert!(cdf.windows(2).all(|w| w[0] <= w[1]), "a CDF rises: {c}");
            assert_eq!(cdf[50], l["p50_us"].as_u64().unwrap(), "{c}");
        }
        // One game a second ends (300 % of 20 games a minute): its 4 leavers are replaced by
        // 4 newcomers, and a new game forms.
        assert_eq!(
            c["refused"], 0,
            "no message to a virtual actor refused: {c}"
        );
        let ended = c["games_ended"].as_u64().unwrap();
        assert!((3..=4).contains(&ended), "{c}");
        let actors: u64 = c["activations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(
            actors,
            20 * 9 + 5 * ended,
            "every game and player active once: {c}"
        );
        let stages = c["stage_threads"].as_array().unwrap();
        if c["config"] == "actop+stages" {
            assert_eq!(stages.len(), 4, "every node's stages: {c}");
            for t in stages.iter().flat_map(|n| n.as_array().unwrap()) {
                assert!((1..=2).contains(&t.as_u64().unwrap()), "{c}");
            }
        } else {
            assert!(stages.is_empty(), "stages sized only when asked: {c}");
        }
    }
    assert_eq!(
        cells[0]["migrations_per_min"], 0.0,
        "random placement moves nothing"
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for needle in [
        "## Results",
        "## Targets",
        "Remote share at steady state",
        "Peak throughput",
    ] {
        assert!(report.contains(needle), "{needle} missing from the report");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["actop", "--configs", "random,nonsense", "--out"])
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("nonsense"));
    let _ = std::fs::remove_dir_all(&out);
}
