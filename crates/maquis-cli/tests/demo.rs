//! `maquis demo` end to end at a small size: both echo configurations and the isolation case
//! run, every call succeeds, and the tables with their ratios are printed.

use std::process::Command;

/// Runs a short demo (4 actors, 1 KiB, 0.3 s per cell, 1 MiB bulk) with `extra` options,
/// checks it succeeded and printed every line of `want`; its output.
fn short_demo(extra: &[&str], want: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_maquis"))
        .args([
            "demo",
            "--actors",
            "4",
            "--sizes",
            "1024",
            "--seconds",
            "0.3",
        ])
        .args(["--bulk-size", "1048576"])
        .args(extra)
        .output()
        .expect("maquis runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in want {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    stdout
}

#[test]
fn a_short_demo_prints_both_tables() {
    short_demo(
        &[],
        &[
            "1 KiB     single",
            "1 KiB     parallel+affinity",
            "ratio (2nd/1st)",
            "one channel",
            "own channels",
            "1 MiB ops/s",
            "how much lower",
        ],
    );
}

/// The same over the link emulator (needs root and /dev/net/tun; skipped with a message
/// without them): every node in a namespace of its own, 20 ms round trips between them.
#[test]
fn a_short_wan_demo_runs_over_the_link_emulator() {
    if let Err(e) = maquis_netem::preflight() {
        eprintln!("skipping: {e}");
        return;
    }
    let stdout = short_demo(
        &["--wan"],
        &[
            "3 nodes in 3 network namespaces, 20 ms round trips",
            "1 KiB     parallel+affinity",
            "own channels",
        ],
    );
    // Every call waited for a round trip of the emulated link.
    let p50: f64 = stdout
        .lines()
        .find(|l| l.starts_with("1 KiB     single"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|v| v.parse().ok())
        .expect("a p50 for 1 KiB single");
    assert!(p50 >= 20.0, "p50 {p50} ms is under the emulated 20 ms");
}

#[test]
fn bad_demo_options_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_maquis"))
        .args(["demo", "--seconds", "0"])
        .output()
        .expect("maquis runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be positive"));
    let out = Command::new(env!("CARGO_BIN_EXE_maquis"))
        .args(["demo", "--wan", "--rtt-ms", "0"])
        .output()
        .expect("maquis runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rtt-ms must be"));
}
