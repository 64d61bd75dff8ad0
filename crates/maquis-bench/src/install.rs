//! What a benchmark needs from the machine: finding a program, and installing Debian's
//! packages of it when it is missing (`apt-get update`, then `apt-get install`).

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::ring_proc::run_capture;

/// What `program --version` prints, if it runs and succeeds.
pub fn version_of(program: &str) -> Option<String> {
    Command::new(program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            let out = if o.stdout.is_empty() {
                &o.stderr
            } else {
                &o.stdout
            };
            String::from_utf8_lossy(out).trim().to_string()
        })
}

/// `apt-get update`, then `apt-get install -y` of `packages`.
pub fn apt_install(packages: &[&str]) -> Result<(), String> {
    let apt = |args: &[&str]| -> Result<(), String> {
        let mut c = Command::new("apt-get");
        c.env("DEBIAN_FRONTEND", "noninteractive").args(args);
        let (status, out) = run_capture("apt-get", c, Duration::from_secs(1800))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "apt-get {}: {status}: {}",
                args.join(" "),
                out.lines().last().unwrap_or("")
            ))
        }
    };
    apt(&["update", "-q"])?;
    let mut args = vec!["install", "-y", "-q", "--no-install-recommends"];
    args.extend_from_slice(packages);
    apt(&args)
}
