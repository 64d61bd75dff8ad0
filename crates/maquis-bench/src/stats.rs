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
    /// `mixed` mode: the same calls measured first without the bulk transfers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alone: Option<Box<RunResult>>,
    /// `mixed` mode: the bulk transfers' round trips while the calls were measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bulk: Option<Box<RunResult>>,
    /// Maquis: what the lanes of the client's `default` channel to the server carried while it
    /// measured (none for the baselines, or when no sample was taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lanes: Option<LaneUse>,
}

/// How often a Maquis client of `micro` looks at what its lanes carry.
pub const LANE_SAMPLE: std::time::Duration = std::time::Duration::from_millis(50);

/// What the lanes of one channel to one peer carried over a measurement, sampled every
/// [`LANE_SAMPLE`]: how many took small messages (the channel's width) and how many took
/// striped messages' parts (its spread), as the node's status reports them
/// ([`maquis::admin::LaneStatus`]'s `small` and `striped`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LaneUse {
    /// Samples taken.
    pub samples: u64,
    /// Lanes taking small messages, mean over the samples.
    pub small_mean: f64,
    /// Lanes taking small messages, the most in one sample.
    pub small_max: u64,
    /// Lanes taking striped messages' parts, mean over the samples.
    pub striped_mean: f64,
    /// Lanes taking striped messages' parts, the most in one sample.
    pub striped_max: u64,
}

/// Adds up samples of a node's status into a [`LaneUse`].
#[derive(Default)]
pub struct LaneTally {
    samples: u64,
    small: u64,
    striped: u64,
    small_max: u64,
    striped_max: u64,
}

impl LaneTally {
    /// One sample: the lanes of `channel` to `peer` in `status` (a peer not there yet, or gone,
    /// adds no sample).
    pub fn add(&mut self, status: &maquis::admin::Status, peer: &str, channel: &str) {
        let Some(p) = status.peers.iter().find(|p| p.name == peer) else {
            return;
        };
        let lanes = p.lanes.iter().filter(|l| l.channel == channel);
        let (small, striped) = lanes.fold((0, 0), |(a, b), l| {
            (a + u64::from(l.small), b + u64::from(l.striped))
        });
        self.samples += 1;
        self.small += small;
        self.striped += striped;
        self.small_max = self.small_max.max(small);
        self.striped_max = self.striped_max.max(striped);
    }

    /// What the samples add up to; none without a sample.
    pub fn finish(&self) -> Option<LaneUse> {
        (self.samples > 0).then(|| LaneUse {
            samples: self.samples,
            small_mean: self.small as f64 / self.samples as f64,
            small_max: self.small_max,
            striped_mean: self.striped as f64 / self.samples as f64,
            striped_max: self.striped_max,
        })
    }
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
            alone: None,
            bulk: None,
            lanes: None,
        }
    }

    /// A one-way run: `messages` delivered (counted by the receivers) over `seconds`; it has no
    /// latencies.
    pub fn delivered(messages: u64, errors: u64, seconds: f64, cpu_s: f64) -> Self {
        RunResult {
            messages,
            errors,
            seconds,
            ops_per_s: if seconds > 0.0 {
                messages as f64 / seconds
            } else {
                0.0
            },
            cpu_s,
            ..Default::default()
        }
    }
}

/// What one caller of `micro` measured: latencies (µs), failed calls, when it stopped.
pub type Calls = (Vec<u64>, u64, std::time::Instant);

/// Callers' measurements taken together, from an empty total that ends at `window.from`.
pub fn merge_calls(all: impl IntoIterator<Item = Calls>, window: Window) -> Calls {
    let mut total: Calls = (Vec::new(), 0, window.from);
    for (lat, errors, end) in all {
        total.0.extend(lat);
        total.1 += errors;
        total.2 = total.2.max(end);
    }
    total
}

/// One streaming actor of `micro`: messages delivered between the partner's two counts,
/// messages sent but never delivered, and when it measured.
pub struct Streamed {
    /// Delivered in the measured window.
    pub delivered: u64,
    /// Sent and never delivered.
    pub missing: u64,
    /// When its window started (after the first count).
    pub from: std::time::Instant,
    /// When everything it sent had arrived (or it gave up).
    pub until: std::time::Instant,
}

impl RunResult {
    /// Callers' merged measurement over `window`.
    pub fn of_calls((lat, errors, end): Calls, window: Window, cpu_s: f64) -> Self {
        let seconds = end.duration_since(window.from).as_secs_f64();
        RunResult::from_latencies(lat, errors, seconds, cpu_s)
    }

    /// A `mixed` run: the calls measured beside the transfers in `window`, with the same
    /// calls measured `alone` before; `cpu_s` is the client's over both phases.
    pub fn mixed(alone: RunResult, calls: Calls, bulk: Calls, window: Window, cpu_s: f64) -> Self {
        let mut r = RunResult::of_calls(calls, window, cpu_s);
        r.alone = Some(Box::new(alone));
        r.bulk = Some(Box::new(RunResult::of_calls(bulk, window, 0.0)));
        r
    }

    /// A `stream` run: what the streaming actors delivered, over the span from the first
    /// one's start to the last one's end.
    pub fn of_streams(streams: impl IntoIterator<Item = Streamed>, cpu_s: f64) -> Self {
        let (mut delivered, mut missing) = (0, 0);
        let mut span: Option<(std::time::Instant, std::time::Instant)> = None;
        for s in streams {
            delivered += s.delivered;
            missing += s.missing;
            span = Some(span.map_or((s.from, s.until), |(a, b)| (a.min(s.from), b.max(s.until))));
        }
        let seconds = span.map_or(0.0, |(a, b)| b.duration_since(a).as_secs_f64());
        RunResult::delivered(delivered, missing, seconds, cpu_s)
    }
}

/// What the client actors of `micro` do.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Closed loop: send, wait for the answer, send the next.
    Rtt,
    /// One-way: send as fast as the runtime lets the sender; the receivers count what arrives.
    Stream,
    /// The closed loop measured twice, alone and then while bulk transfers (closed loop too,
    /// their own actors and partners) run between the same two nodes.
    Mixed,
}

/// The client actors' timeline of a measurement: `warmup_s` unmeasured, then `limit_s`
/// measured.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// When measuring starts.
    pub from: std::time::Instant,
    /// When actors stop starting new messages.
    pub until: std::time::Instant,
}

impl Window {
    /// The window that starts after `load.warmup_s` from now.
    pub fn after_warmup(load: &LoadArgs) -> Window {
        let from = std::time::Instant::now() + std::time::Duration::from_secs_f64(load.warmup_s);
        Window {
            from,
            until: from + std::time::Duration::from_secs_f64(load.limit_s),
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

/// The workload both clients of `micro` (Maquis and raw TCP) run: in `rtt` mode each client
/// actor sends at most `messages` messages of `size` bytes, one at a time, and waits for the
/// answer; `stream` and `mixed` are described at [`Mode`].
#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// What the client actors do.
    #[arg(long, value_enum, default_value_t = Mode::Rtt)]
    pub mode: Mode,
    /// `mixed`: the actors running bulk transfers (partners after the callers').
    #[arg(long, default_value_t = 4)]
    pub bulk_actors: usize,
    /// `mixed`: the bulk transfers' payload bytes.
    #[arg(long, default_value_t = 8 * 1024 * 1024)]
    pub bulk_size: usize,
    /// The server's address.
    #[arg(long)]
    pub server: std::net::SocketAddr,
    /// Client actors (each talks to partner p{i}).
    #[arg(long)]
    pub actors: usize,
    /// Payload bytes.
    #[arg(long)]
    pub size: usize,
    /// Round trips per actor at most (a `stream` runs for its time alone).
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

/// A field of `/proc/self/status` in KiB (`VmRSS:`, `VmHWM:`), 0 if it cannot be read.
pub fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The lines every report starts its description with: the machine, its TCP settings and
/// the commit the binary was built from (each ending in a Markdown line break).
pub fn setting_lines() -> String {
    format!(
        "Machine: {}  \nTCP: {}  \nCommit: {}  \n",
        crate::micro_report::machine(),
        crate::debench_report::tcp_settings(),
        crate::micro_report::build_commit()
    )
}

/// Writes `cells` as `out/results.json`.
pub fn write_results<T: serde::Serialize>(out: &std::path::Path, cells: &T) -> Result<(), String> {
    let json = serde_json::to_string_pretty(cells).map_err(|e| e.to_string())?;
    std::fs::write(out.join("results.json"), json).map_err(|e| format!("{}: {e}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status with one peer `p` whose lanes are (channel, small, striped).
    fn status(lanes: &[(&str, bool, bool)]) -> maquis::admin::Status {
        let lanes: Vec<_> = lanes
            .iter()
            .enumerate()
            .map(|(i, (channel, small, striped))| {
                serde_json::json!({
                    "channel": channel, "index": i, "connected": true, "msgs_out": 0,
                    "bytes_out": 0, "msgs_in": 0, "bytes_in": 0, "queued_bytes": 0,
                    "dropped": 0, "small": small, "striped": striped,
                })
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "name": "c", "incarnation": 1, "overlay": "full-mesh", "listen": "x",
            "members": [], "counters": {},
            "peers": [{"name": "p", "addr": "y", "incarnation": 1, "up": true,
                       "rtt_us": null, "lanes": lanes}],
        }))
        .expect("a status")
    }

    #[test]
    fn lane_use_counts_the_channels_lanes_by_what_they_carry() {
        let mut t = LaneTally::default();
        assert_eq!(t.finish(), None, "no sample, nothing to report");
        let one = status(&[
            ("membership", true, false),
            ("default", true, false),
            ("default", false, true),
            ("default", false, true),
            ("default", false, false),
        ]);
        let two = status(&[
            ("default", true, false),
            ("default", true, true),
            ("default", false, true),
            ("default", false, true),
        ]);
        t.add(&one, "p", "default");
        t.add(&two, "p", "default");
        t.add(&two, "elsewhere", "default");
        let u = t.finish().expect("two samples");
        assert_eq!(
            u,
            LaneUse {
                samples: 2,
                small_mean: 1.5,
                small_max: 2,
                striped_mean: 2.5,
                striped_max: 3,
            }
        );
    }
}
