//! The Distributed Erlang baseline: installs Erlang when missing and compiles a benchmark
//! program from `bench/erlang/`.

use std::process::Command;

/// The `micro` benchmark's program, built into the binary so the command works from any
/// directory.
pub const MICRO_ERL: &str = include_str!("../../../bench/erlang/micro.erl");

/// Emulator flags that keep idle schedulers from spinning: a spinning scheduler burns CPU that
/// the benchmarks count (they count all of a VM's CPU time, user and system, as they do
/// Maquis's), so the baseline runs the way that costs it least.
pub const NO_BUSY_WAIT: [&str; 6] = ["+sbwt", "none", "+sbwtdcpu", "none", "+sbwtdio", "none"];

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Makes sure `erl` and `erlc` exist (installing Debian's `erlang-nox` if not) and compiles
/// the module `file` (its text: `source`) into a temporary directory (not the results': a
/// build is no result), removed when the returned handle is dropped.
pub fn prepare(file: &str, source: &str) -> Result<tempfile::TempDir, String> {
    if !have("erlc") {
        eprintln!(
            "Distributed Erlang is not installed: installing Debian's erlang-nox (apt-get) ..."
        );
        let ok = Command::new("sh")
            .args(["-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq erlang-nox >/dev/null"])
            .status()
            .map_err(|e| format!("apt-get: {e}"))?
            .success();
        if !ok || !have("erlc") {
            return Err(
                "could not install erlang-nox; install it or leave `erlang` out of --configs"
                    .into(),
            );
        }
    }
    let build = tempfile::Builder::new()
        .prefix("maquis-bench-erlang-")
        .tempdir()
        .map_err(|e| format!("a directory for the Erlang build: {e}"))?;
    let dir = build.path();
    let src = dir.join(file);
    std::fs::write(&src, source).map_err(|e| e.to_string())?;
    // erlc runs in the build directory with relative names: given absolute ones, it shortens
    // them by the working directory as a string prefix, so `/tmp/cc` turns `/tmp/ccx/…` into
    // `x/…`.
    let status = Command::new("erlc")
        .current_dir(dir)
        .args(["-o", ".", file])
        .status()
        .map_err(|e| format!("erlc: {e}"))?;
    if !status.success() {
        return Err(format!("erlc failed to compile {file}"));
    }
    Ok(build)
}
