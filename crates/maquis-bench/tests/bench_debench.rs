//! `maquis-bench debench` end to end at a small size: three Maquis nodes on each overlay, the
//! global-command series for one second per cell after a warm-up of one, and results that account for every command.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `maquis-bench debench` with `args` into a fresh directory named after `tag`; its
/// directory and its cells (it must have succeeded).
fn debench(tag: &str, args: &[&str]) -> (PathBuf, Vec<serde_json::Value>) {
    let out = std::env::temp_dir().join(format!("maquis-bench-{tag}-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .arg("debench")
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("maquis-bench runs");
    assert!(
        run.status.success(),
        "bench debench failed: {}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let cells =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    (out, cells)
}

fn report(out: &Path) -> String {
    std::fs::read_to_string(out.join("report.md")).unwrap()
}

#[test]
fn small_debench_run_measures_every_command_without_errors() {
    let (out, cells) = debench(
        "debench",
        &[
            "--sizes",
            "3",
            "--series",
            "global,server",
            "--systems",
            "maquis-full-mesh,maquis-peer-to-peer",
            "--seconds",
            "1",
            "--warmup",
            "1",
            "--procs",
            "2",
            "--base-port",
            "27100",
        ],
    );
    // Two overlays × (4 global shares + 3 server shares).
    assert_eq!(cells.len(), 14);
    for c in &cells {
        assert_eq!(c["errors"], 0, "{c}");
        assert_eq!(c["processes"], 2, "3 nodes, 2 per process");
        assert!(c["ops_per_s"].as_f64().unwrap() > 0.0);
        assert!(c["cpu_s"].as_f64().unwrap() > 0.0);
        let count = |k: &str| c["commands"][k]["count"].as_u64().unwrap_or(0);
        let global = c["global_pct"].as_f64().unwrap();
        let server = c["server_pct"].as_f64().unwrap();
        if global >= 1.0 {
            // Each sequence is a register, a whereis and an unregister.
            assert!(count("register") > 0, "{c}");
            assert_eq!(count("register"), count("whereis"), "{c}");
            assert_eq!(count("register"), count("unregister"), "{c}");
        }
        if global == 0.0 {
            assert_eq!(count("register"), 0, "{c}");
        }
        if server == 100.0 {
            assert!(
                count("call") > 0 && count("rpc") == 0 && count("spawn") == 0,
                "{c}"
            );
        } else if server == 0.0 {
            assert!(
                count("rpc") > 0 && count("spawn") > 0 && count("call") == 0,
                "{c}"
            );
        }
    }
    let report = report(&out);
    assert!(report.contains("## Targets"));
    // One warm-up per cluster, counted in no cell, reported at the end.
    let warm = report
        .split("## Warm-up")
        .nth(1)
        .expect("a warm-up section");
    assert_eq!(warm.matches("| maquis-").count(), 2, "{warm}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_paced_run_offers_the_rate_asked_for() {
    let (out, cells) = debench(
        "debench-rate",
        &[
            "--sizes",
            "3",
            "--series",
            "global",
            "--systems",
            "maquis-full-mesh",
            "--seconds",
            "2",
            "--warmup",
            "0",
            "--procs",
            "1",
            "--total-workers",
            "30",
            "--rate",
            "300",
            "--base-port",
            "27200",
        ],
    );
    assert_eq!(cells.len(), 4);
    for c in &cells {
        assert_eq!(c["offered_per_s"], 300.0, "{c}");
        assert_eq!(c["errors"], 0, "{c}");
        // Closed-loop workers do tens of thousands a second here; paced ones what is offered
        // (a global sequence is three commands, at most 1 % of the starts).
        let ops = c["ops_per_s"].as_f64().unwrap();
        assert!((200.0..=400.0).contains(&ops), "{c}");
    }
    let report = report(&out);
    assert!(report.contains("--rate 300"), "{report}");
    let _ = std::fs::remove_dir_all(&out);
    let bad = Command::new(env!("CARGO_BIN_EXE_maquis-bench"))
        .args(["debench", "--rate", "0"])
        .output()
        .expect("maquis-bench runs");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--rate"));
}
