//! The `netem` subcommands (mounted as `maquis netem …`) and [`run`].

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::control::{self, ControlRequest};
use crate::parse::{parse_duration, parse_loss};
use crate::{netem, Netem, NetemConfig, NetemError, Rate};

/// `netem` subcommands: build an emulated network, control it, run
/// commands in its hosts.
#[derive(Debug, Clone, Subcommand)]
pub enum NetemCommand {
    /// Create the hosts, run the wire in the foreground, tear everything
    /// down on exit (Ctrl-C or SIGTERM).
    Up(UpArgs),
    /// Change a running network or read its statistics through its control
    /// socket.
    Ctl(CtlArgs),
    /// Run a command inside a host's namespace (exit code passed through).
    Exec(ExecArgs),
    /// Delete namespaces left over by a killed `netem up` with this prefix.
    Clean(CleanArgs),
}

/// Arguments of `netem up`.
#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Number of hosts (namespaces PREFIX-h1 … PREFIX-hN, addresses
    /// NETWORK.1 … NETWORK.N).
    #[arg(long, short = 'n')]
    pub hosts: usize,
    /// One-way delay per traversal of the wire (ping RTT = 2 × delay),
    /// e.g. 10ms, 1.5ms, 250us.
    #[arg(long, value_parser = parse_duration, conflicts_with = "rtt")]
    pub delay: Option<Duration>,
    /// Round-trip time; shorthand for --delay RTT/2.
    #[arg(long, value_parser = parse_duration)]
    pub rtt: Option<Duration>,
    /// Rate limit per direction of each host link, e.g. 100mbit, 10gbit.
    #[arg(long)]
    pub rate: Option<Rate>,
    /// Random loss per frame, e.g. 0.1% or 0.001.
    #[arg(long, value_parser = parse_loss, default_value = "0")]
    pub loss: f64,
    /// Prefix of the namespace names.
    #[arg(long, default_value = "mq")]
    pub prefix: String,
    /// The hosts' /24 network.
    #[arg(long, default_value = "10.77.0.0")]
    pub network: std::net::Ipv4Addr,
    /// Control socket path [default: /run/maquis-netem-PREFIX.sock].
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Device MTU.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// Byte limit of each direction's queue (tail drop beyond it).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub queue_bytes: u64,
    /// Disable checksum/TSO offload (MTU-sized packets on the wire).
    #[arg(long)]
    pub no_offload: bool,
    /// Do not try real-time priority for the wire.
    #[arg(long)]
    pub no_realtime: bool,
    /// Set a net.* sysctl in every host, e.g.
    /// --sysctl "net.ipv4.tcp_rmem=4096 131072 33554432" (repeatable).
    #[arg(long, value_parser = parse_sysctl)]
    pub sysctl: Vec<(String, String)>,
    /// Seed for the loss generator.
    #[arg(long)]
    pub seed: Option<u64>,
}

/// Arguments of `netem ctl`.
#[derive(Debug, Clone, Args)]
pub struct CtlArgs {
    /// Control socket path [default: /run/maquis-netem-PREFIX.sock].
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Prefix of the network to control (selects the default socket).
    #[arg(long, default_value = "mq")]
    pub prefix: String,
    /// What to do.
    #[command(subcommand)]
    pub action: CtlAction,
}

/// A `netem ctl` action.
#[derive(Debug, Clone, Subcommand)]
pub enum CtlAction {
    /// Set the one-way delay, e.g. `set-delay 20ms`.
    SetDelay {
        /// The new one-way delay.
        #[arg(value_parser = parse_duration)]
        delay: Duration,
    },
    /// Set the loss, e.g. `set-loss 1%`.
    SetLoss {
        /// The new loss probability.
        #[arg(value_parser = parse_loss)]
        loss: f64,
    },
    /// Set the per-link rate limit, e.g. `set-rate 1gbit`, or `set-rate off`.
    SetRate {
        /// The new rate, or `off`.
        rate: String,
    },
    /// Cut the listed hosts off from the others, e.g. `partition mq-h1,mq-h2`.
    Partition {
        /// Comma-separated host names, numbers or addresses.
        #[arg(value_delimiter = ',', required = true)]
        hosts: Vec<String>,
    },
    /// Remove the partition.
    Heal,
    /// Print statistics as JSON.
    Stats {
        /// Print the human-readable report instead of JSON.
        #[arg(long)]
        text: bool,
    },
    /// Zero the counters and the lateness histogram.
    ResetStats,
}

/// Arguments of `netem exec`.
#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// Host namespace name as printed by `netem up` (e.g. mq-h1).
    pub host: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

/// Arguments of `netem clean`.
#[derive(Debug, Clone, Args)]
pub struct CleanArgs {
    /// Prefix of the namespaces to delete.
    #[arg(long, default_value = "mq")]
    pub prefix: String,
}

fn parse_sysctl(s: &str) -> Result<(String, String), NetemError> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| NetemError::parse("sysctl", s, "expected KEY=VALUE"))?;
    Ok((k.trim().to_string(), v.trim().to_string()))
}

impl UpArgs {
    /// The library configuration these arguments describe.
    pub fn to_config(&self) -> NetemConfig {
        let delay = match (self.delay, self.rtt) {
            (Some(d), _) => d,
            (None, Some(rtt)) => rtt / 2,
            (None, None) => Duration::ZERO,
        };
        NetemConfig {
            hosts: self.hosts,
            delay,
            rate: self.rate,
            loss: self.loss,
            prefix: self.prefix.clone(),
            network: self.network,
            mtu: self.mtu,
            offload: !self.no_offload,
            realtime: !self.no_realtime,
            delay_queue_bytes: self.queue_bytes,
            control: Some(
                self.control
                    .clone()
                    .unwrap_or_else(|| NetemConfig::default_control_path(&self.prefix)),
            ),
            sysctls: self.sysctl.clone(),
            seed: self.seed,
            ..NetemConfig::default()
        }
    }
}

/// Runs a `netem` subcommand to completion. Blocking: from async code call
/// it via `tokio::task::spawn_blocking`. `up` returns after Ctrl-C/SIGTERM
/// and teardown; `exec` replaces the process with the command, so it only
/// returns on error.
pub fn run(cmd: NetemCommand) -> Result<(), NetemError> {
    match cmd {
        NetemCommand::Up(args) => up(&args),
        NetemCommand::Ctl(args) => ctl(&args),
        NetemCommand::Exec(args) => exec(&args),
        NetemCommand::Clean(args) => {
            netem::preflight()?;
            for name in netem::cleanup_stale(&args.prefix)? {
                println!("deleted {name}");
            }
            Ok(())
        }
    }
}

fn up(args: &UpArgs) -> Result<(), NetemError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let config = args.to_config();
    // Register before building so an early Ctrl-C still tears down.
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| NetemError::io("install signal handlers", e))?;
    let net = Netem::up(config.clone())?;
    {
        let mut out = std::io::stdout().lock();
        for h in net.hosts() {
            let _ = writeln!(out, "{} {}", h.name, h.addr);
        }
        let _ = out.flush();
    }
    if let Some(p) = &config.control {
        tracing::info!(control = %p.display(), "control socket ready");
    }
    let sig = signals.forever().next();
    tracing::info!(signal = ?sig, "shutting down");
    let stats = net.shutdown()?;
    print!("{}", stats.report());
    for w in &stats.warnings {
        tracing::warn!("{w}");
    }
    Ok(())
}

fn ctl(args: &CtlArgs) -> Result<(), NetemError> {
    let path = args
        .control
        .clone()
        .unwrap_or_else(|| NetemConfig::default_control_path(&args.prefix));
    let req = match &args.action {
        CtlAction::SetDelay { delay } => ControlRequest::SetDelay {
            delay_ns: delay.as_nanos().min(u128::from(u64::MAX)) as u64,
        },
        CtlAction::SetLoss { loss } => ControlRequest::SetLoss { loss: *loss },
        CtlAction::SetRate { rate } => ControlRequest::SetRate {
            rate_bit_s: match rate.trim() {
                "off" | "none" | "unlimited" => None,
                r => Some(r.parse::<Rate>()?.bits_per_sec()),
            },
        },
        CtlAction::Partition { hosts } => ControlRequest::Partition {
            hosts: hosts.clone(),
        },
        CtlAction::Heal => ControlRequest::Heal,
        CtlAction::Stats { .. } => ControlRequest::Stats,
        CtlAction::ResetStats => ControlRequest::ResetStats,
    };
    let reply = control::request(&path, &req)?;
    match (&args.action, reply.stats) {
        (CtlAction::Stats { text: true }, Some(stats)) => print!("{}", stats.report()),
        (_, Some(stats)) => {
            let json = serde_json::to_string_pretty(&stats)
                .map_err(|e| NetemError::Control(format!("encode stats: {e}")))?;
            println!("{json}");
        }
        (_, None) => println!("ok"),
    }
    Ok(())
}

fn exec(args: &ExecArgs) -> Result<(), NetemError> {
    use std::os::unix::process::CommandExt;
    crate::ns::validate_name(&args.host)?;
    if !crate::ns::exists(&args.host) {
        return Err(NetemError::UnknownHost(args.host.clone()));
    }
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| NetemError::InvalidConfig("no command given".into()))?;
    let mut cmd = netem::host_command(&args.host, program);
    cmd.args(rest);
    // Only returns on failure; on success the exit code is the command's.
    let err = cmd.exec();
    Err(NetemError::io("exec ip netns exec", err))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: NetemCommand,
    }

    fn parse(args: &[&str]) -> NetemCommand {
        Cli::try_parse_from(std::iter::once("netem").chain(args.iter().copied()))
            .unwrap()
            .cmd
    }

    #[test]
    fn up_args() {
        let NetemCommand::Up(a) = parse(&[
            "up", "--hosts", "3", "--delay", "10ms", "--rate", "10gbit", "--loss", "0.1%",
        ]) else {
            panic!()
        };
        let c = a.to_config();
        assert_eq!(c.hosts, 3);
        assert_eq!(c.delay, Duration::from_millis(10));
        assert_eq!(c.rate, Some(Rate::from_bits_per_sec(10_000_000_000)));
        assert!((c.loss - 0.001).abs() < 1e-12);
        assert_eq!(
            c.control.as_deref(),
            Some(std::path::Path::new("/run/maquis-netem-mq.sock"))
        );

        let NetemCommand::Up(a) = parse(&["up", "-n", "2", "--rtt", "20ms", "--prefix", "x"])
        else {
            panic!()
        };
        assert_eq!(a.to_config().delay, Duration::from_millis(10));
        assert!(
            Cli::try_parse_from(["netem", "up", "-n", "2", "--rtt", "2ms", "--delay", "1ms"])
                .is_err()
        );
    }

    #[test]
    fn ctl_and_exec_args() {
        let NetemCommand::Ctl(a) = parse(&["ctl", "partition", "mq-h1,mq-h2"]) else {
            panic!()
        };
        let CtlAction::Partition { hosts } = a.action else {
            panic!()
        };
        assert_eq!(hosts, vec!["mq-h1", "mq-h2"]);
        let NetemCommand::Ctl(a) = parse(&["ctl", "--control", "/tmp/x.sock", "set-loss", "1%"])
        else {
            panic!()
        };
        assert!(matches!(a.action, CtlAction::SetLoss { loss } if (loss - 0.01).abs() < 1e-12));
        let NetemCommand::Exec(e) = parse(&["exec", "mq-h1", "--", "ping", "-c", "1", "10.77.0.2"])
        else {
            panic!()
        };
        assert_eq!(e.host, "mq-h1");
        assert_eq!(e.command.len(), 4);
        assert!(Cli::try_parse_from(["netem", "ctl", "set-delay", "soon"]).is_err());
    }
}
