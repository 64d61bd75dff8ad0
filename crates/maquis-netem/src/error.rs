//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while building, running, controlling or
/// tearing down an emulated network.
#[derive(Debug, thiserror::Error)]
pub enum NetemError {
    /// Creating namespaces and TUN devices needs root (CAP_NET_ADMIN and
    /// CAP_SYS_ADMIN); the effective user id is not 0.
    #[error("maquis-netem needs root (effective uid is {euid}); run it with sudo or as root")]
    NotRoot {
        /// The effective user id the process runs with.
        euid: u32,
    },
    /// The TUN/TAP character device is missing (no `tun` kernel module, or a
    /// container without `/dev/net/tun`).
    #[error("{} is missing: this kernel or container has no TUN support (try `modprobe tun`)", path.display())]
    NoTunDevice {
        /// The path that was looked for.
        path: PathBuf,
    },
    /// A configuration value is out of range or inconsistent.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A user-supplied value (duration, rate, loss, host name…) could not be parsed.
    #[error("cannot parse {what} from {input:?}: {reason}")]
    Parse {
        /// What was being parsed ("rate", "loss", …).
        what: &'static str,
        /// The offending input.
        input: String,
        /// Why it was rejected.
        reason: String,
    },
    /// A host name, index or address does not name a host of this network.
    #[error("unknown host {0:?}")]
    UnknownHost(String),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// An external command (`ip`, …) exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on standard error.
        stderr: String,
    },
    /// Another `netem up` with the same control socket is already running.
    #[error("another netem instance is already listening on {}", path.display())]
    AlreadyRunning {
        /// The control socket path that answered.
        path: PathBuf,
    },
    /// The control socket answered with an error, or could not be reached.
    #[error("control: {0}")]
    Control(String),
    /// A worker thread panicked or could not be started.
    #[error("thread {0} failed")]
    Thread(String),
}

impl NetemError {
    /// Wraps an I/O error with a short description of what was being done.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        NetemError::Io {
            context: context.into(),
            source,
        }
    }

    /// Builds a [`NetemError::Parse`].
    pub(crate) fn parse(what: &'static str, input: &str, reason: impl Into<String>) -> Self {
        NetemError::Parse {
            what,
            input: input.to_string(),
            reason: reason.into(),
        }
    }
}
