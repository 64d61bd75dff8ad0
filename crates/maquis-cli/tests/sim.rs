//! `maquis sim`: the JSON document of a small run, and bad options refused without a panic.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_maquis");

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("sim")
        .args(args)
        .output()
        .expect("maquis starts")
}

#[test]
fn json_report_of_a_small_massive_failure() {
    let out = sim(&[
        "--nodes",
        "200",
        "--scenario",
        "massive-failure",
        "--fail",
        "0.2,0.5",
        "--seed",
        "3",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["scenario"], "massive-failure");
    assert_eq!(doc["nodes"], 200);
    assert_eq!(doc["seed"], 3);
    assert!(doc["wall_ms"].is_u64());
    assert!(doc["peak_rss_kb"].as_u64().is_some_and(|k| k > 0));
    let runs = doc["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["name"], "fail-20%");
    assert_eq!(runs[1]["live"], 100);
    for r in runs {
        for key in ["components", "isolated"] {
            assert!(r[key].is_u64(), "{key} in {r}");
        }
        for key in [
            "symmetry",
            "delivery_first",
            "delivery_mean_100",
            "delivery_last",
            "rmr",
            "ldh",
            "routed_delivery",
        ] {
            assert!(r[key].is_f64(), "{key} in {r}");
        }
        assert!(r["healing_periods"].is_u64() || r["healing_periods"].is_null());
        assert!(r["delivery_last"].as_f64().is_some_and(|d| d > 0.9), "{r}");
    }
}

#[test]
fn client_server_and_full_mesh_runs_report_their_overlay() {
    for (overlay, extra) in [
        (
            "client-server",
            &["--servers", "3", "--servers-per-client", "2"][..],
        ),
        ("full-mesh", &[][..]),
    ] {
        let mut args = vec![
            "--nodes",
            "40",
            "--overlay",
            overlay,
            "--fail",
            "0.25",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = sim(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(doc["overlay"], overlay);
        let run = &doc["runs"][0];
        assert_eq!(run["overlay"], overlay);
        assert_eq!(run["live"], 30);
        assert_eq!(run["components"], 1, "{run}");
        assert!(
            run["delivery_last"].as_f64().is_some_and(|d| d > 0.9),
            "{run}"
        );
        assert!(
            run["routed_delivery"].as_f64().is_some_and(|d| d > 0.9),
            "{run}"
        );
    }
}

#[test]
fn table_ends_with_time_and_memory() {
    let out = sim(&["--nodes", "50", "--scenario", "partition", "--periods", "2"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("| scenario |"), "{text}");
    assert!(text.contains("| partition | peer-to-peer | 50 |"), "{text}");
    assert!(
        text.contains("wall time") && text.contains("peak memory"),
        "{text}"
    );
}

#[test]
fn bad_options_are_refused() {
    for args in [
        &["--scenario", "meltdown"][..],
        &["--fail", "1.5"],
        &["--fail", "x"],
        &["--nodes", "1"],
        &["--nodes", "-3"],
        &["--scenario", "churn", "--churn", "NaN"],
        &["--scenario", "partition", "--periods", "0"],
        &["--overlay", "ring"],
        &["--overlay", "client-server", "--servers", "0"],
        &[
            "--overlay",
            "client-server",
            "--servers",
            "3",
            "--servers-per-client",
            "5",
        ],
        &["--overlay", "full-mesh", "--nodes", "501"],
    ] {
        let out = sim(args);
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
