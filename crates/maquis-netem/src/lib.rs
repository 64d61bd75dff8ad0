#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod cli;
mod control;
mod error;
mod hist;
mod netem;
mod ns;
mod pacer;
mod parse;
mod shaper;
mod stats;
mod sys;
mod tun;
mod wire;

pub use cli::{run, CleanArgs, CtlAction, CtlArgs, ExecArgs, NetemCommand, UpArgs};
pub use control::{request as control_request, ControlReply, ControlRequest};
pub use error::NetemError;
pub use netem::{
    cleanup_stale, host_command, preflight, Host, Netem, NetemConfig, NetemHandle, DEVICE_NAME,
};
pub use ns::{exists as namespace_exists, list as list_namespaces};
pub use parse::{fmt_duration, parse_duration, parse_loss, Rate};
pub use stats::{DirectionStats, HostStats, LatenessStats, NetemStats};
