//! Measurement helpers shared by the benchmark agents.

use serde::{Deserialize, Serialize};

/// What one client run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// Round trips completed.
    pub messages: u64,
    /// Round trips that failed.
    pub errors: u64,
    /// Wall time of the measured run, in seconds.
    pub seconds: f64,
    /// Completed round trips per second.
    pub ops_per_s: f64,
    /// Median round-trip latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile latency, microseconds.
    pub p99_us: u64,
    /// Largest latency, microseconds.
    pub max_us: u64,
    /// CPU time the client process used during the run, seconds (user + system).
    pub cpu_s: f64,
}

impl RunResult {
    /// Summarises latencies (microseconds; sorted here) over `seconds`.
    pub fn from_latencies(mut lat: Vec<u64>, errors: u64, seconds: f64, cpu_s: f64) -> Self {
        lat.sort_unstable();
        RunResult {
            messages: lat.len() as u64,
            errors,
            seconds,
            ops_per_s: if seconds > 0.0 {
                lat.len() as f64 / seconds
            } else {
                0.0
            },
            p50_us: maquis::admin::percentile(&lat, 50.0),
            p99_us: maquis::admin::percentile(&lat, 99.0),
            max_us: lat.last().copied().unwrap_or(0),
            cpu_s,
        }
    }
}

/// CPU time (user + system) this process has used, in seconds, from /proc/self/stat.
pub fn cpu_seconds() -> f64 {
    cpu_from_stat("/proc/self/stat")
}

/// CPU time (user + system) process `pid` has used, in seconds (0 if it is gone).
pub fn cpu_seconds_of(pid: u32) -> f64 {
    cpu_from_stat(&format!("/proc/{pid}/stat"))
}

fn cpu_from_stat(path: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the ')'.
    let ticks: f64 = fields.get(11..13).map_or(0.0, |f| {
        f.iter().filter_map(|v| v.parse::<f64>().ok()).sum()
    });
    ticks / clock_ticks()
}

/// The kernel's clock tick rate, the unit of the CPU times in /proc.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// The log filter handed to the processes a benchmark starts: `RUST_LOG` when set, else `warn`.
pub fn agent_log_filter() -> String {
    std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into())
}

/// The closed-loop workload both clients of `micro` (Maquis and raw TCP) run: each client actor
/// sends `messages` messages of `size` bytes, one at a time, and waits for the answer.
#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// The server's address.
    #[arg(long)]
    pub server: std::net::SocketAddr,
    /// Client actors (each talks to partner p{i}).
    #[arg(long)]
    pub actors: usize,
    /// Payload bytes.
    #[arg(long)]
    pub size: usize,
    /// Messages per actor.
    #[arg(long)]
    pub messages: u64,
    /// Echo the payload back.
    #[arg(long)]
    pub echo: bool,
    /// Stop early after this many measured seconds (the result says how many messages were done).
    #[arg(long, default_value_t = 60.0)]
    pub limit_s: f64,
    /// Unmeasured seconds first (connections warm up, TCP windows open).
    #[arg(long, default_value_t = 1.0)]
    pub warmup_s: f64,
}
