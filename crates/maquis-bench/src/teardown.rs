//! Ctrl-C, SIGTERM or SIGHUP during a benchmark: stop the processes it started and delete the
//! emulated hosts, so that nothing is left behind, then exit.

use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Namespace prefixes the benchmarks use for their emulated hosts.
pub const PREFIXES: [&str; 3] = ["mqbench", "mqecho", "mqkvs"];

/// Starts the watcher thread; returns an error only when the handlers cannot be installed.
pub fn install() -> Result<(), String> {
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| format!("install signal handlers: {e}"))?;
    std::thread::Builder::new()
        .name("bench-teardown".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!("\nsignal {sig}: stopping the benchmark's processes and hosts");
                stop_children();
                for prefix in PREFIXES {
                    if let Err(e) = maquis_netem::cleanup_stale(prefix) {
                        eprintln!("cleanup of {prefix}*: {e}");
                    }
                }
                std::process::exit(128 + sig);
            }
        })
        .map_err(|e| format!("start the signal thread: {e}"))?;
    Ok(())
}

/// Sends SIGTERM to this process's children, then SIGKILL to those still there after a second.
fn stop_children() {
    let kids = children();
    for &pid in &kids {
        // SAFETY: kill(2) with a pid read from /proc; at worst it fails with ESRCH.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < deadline && !children().is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    for pid in children() {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The live (not zombie) children of this process, from /proc.
fn children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The fields after the command name (which is in parentheses): state, ppid, ...
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let mut fields = rest.split_whitespace();
            let state = fields.next().unwrap_or("Z");
            fields.next() == Some(me.as_str()) && state != "Z"
        })
        .collect()
}
