//! Stamps the benchmark binary with the commit it is built from (`git describe --always
//! --dirty`), which every report names: a binary built in another checkout reports its own.

use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown (not built from a git checkout)".into());
    println!("cargo:rustc-env=MAQUIS_BENCH_COMMIT={commit}");
    // Stamped again when the checkout moves, or the sources change (then it may be dirty).
    for path in [
        "../../.git/HEAD",
        "../../.git/index",
        "../../crates",
        "../../apps",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
}
