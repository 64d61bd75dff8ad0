//! `maquis demo` end to end at a small size: both echo configurations and the isolation case
//! run, every call succeeds, and the tables with their ratios are printed.

use std::process::Command;

#[test]
fn a_short_demo_prints_both_tables() {
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
        .output()
        .expect("maquis runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "1 KiB     single",
        "1 KiB     parallel+affinity",
        "ratio (2nd/1st)",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
    for line in [
        "one channel",
        "own channels",
        "1 MiB ops/s",
        "how much lower",
    ] {
        assert!(stdout.contains(line), "{line:?} missing from:\n{stdout}");
    }
}

#[test]
fn bad_demo_options_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_maquis"))
        .args(["demo", "--seconds", "0"])
        .output()
        .expect("maquis runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be positive"));
}
