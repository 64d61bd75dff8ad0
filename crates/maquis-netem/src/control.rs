//! The control socket: a Unix stream socket on which a running network
//! accepts one JSON request per line and answers one JSON reply per line.
//!
//! ```text
//! → {"cmd":"set_delay","delay_ns":20000000}
//! ← {"ok":true,"error":null,"stats":null}
//! → {"cmd":"partition","hosts":["mq-h1","mq-h2"]}
//! → {"cmd":"heal"}
//! → {"cmd":"stats"}
//! ← {"ok":true,"error":null,"stats":{…NetemStats…}}
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::sys::StopEvent;
use crate::{NetemError, NetemHandle, NetemStats, Rate};

/// Longest request line the server accepts.
const MAX_LINE: usize = 64 * 1024;
/// How long a connection may stay silent before the server drops it.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A request to a running network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum ControlRequest {
    /// Sets the one-way delay (nanoseconds) for frames entering the wire
    /// from now on.
    SetDelay {
        /// One-way delay in nanoseconds.
        delay_ns: u64,
    },
    /// Sets the loss probability in `[0, 1]`.
    SetLoss {
        /// Probability that a frame is dropped.
        loss: f64,
    },
    /// Sets (or, with `null`, removes) the per-link rate limit.
    SetRate {
        /// Bits per second, or `None` for unlimited.
        rate_bit_s: Option<u64>,
    },
    /// Cuts the named hosts off from all others (replaces any partition).
    Partition {
        /// Host names (`mq-h1`), short names (`h1`), numbers (`1`) or
        /// addresses (`10.77.0.1`).
        hosts: Vec<String>,
    },
    /// Removes the partition.
    Heal,
    /// Returns [`NetemStats`].
    Stats,
    /// Zeroes all counters and the lateness histogram.
    ResetStats,
}

/// The answer to a [`ControlRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlReply {
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not, when `ok` is false.
    pub error: Option<String>,
    /// The statistics, for [`ControlRequest::Stats`].
    pub stats: Option<NetemStats>,
}

impl ControlReply {
    fn ok(stats: Option<NetemStats>) -> Self {
        ControlReply {
            ok: true,
            error: None,
            stats,
        }
    }

    fn err(e: impl ToString) -> Self {
        ControlReply {
            ok: false,
            error: Some(e.to_string()),
            stats: None,
        }
    }
}

/// Carries out `req` on the network behind `handle`.
pub fn apply(handle: &NetemHandle, req: &ControlRequest) -> ControlReply {
    let result = match req {
        ControlRequest::SetDelay { delay_ns } => {
            handle.set_delay(Duration::from_nanos(*delay_ns));
            Ok(None)
        }
        ControlRequest::SetLoss { loss } => handle.set_loss(*loss).map(|()| None),
        ControlRequest::SetRate { rate_bit_s } => {
            handle.set_rate(rate_bit_s.map(Rate::from_bits_per_sec));
            Ok(None)
        }
        ControlRequest::Partition { hosts } => hosts
            .iter()
            .map(|h| handle.resolve_host(h))
            .collect::<Result<Vec<_>, _>>()
            .and_then(|idx| handle.partition(&idx))
            .map(|()| None),
        ControlRequest::Heal => {
            handle.heal();
            Ok(None)
        }
        ControlRequest::Stats => Ok(Some(handle.stats())),
        ControlRequest::ResetStats => {
            handle.reset_stats();
            Ok(None)
        }
    };
    match result {
        Ok(stats) => ControlReply::ok(stats),
        Err(e) => ControlReply::err(e),
    }
}

/// Sends one request to the control socket at `path` and returns the
/// reply; a reply with `ok: false` becomes [`NetemError::Control`].
pub fn request(path: &Path, req: &ControlRequest) -> Result<ControlReply, NetemError> {
    let stream = UnixStream::connect(path).map_err(|e| {
        NetemError::Control(format!(
            "cannot connect to {} ({e}); is `netem up` running with this --control/--prefix?",
            path.display()
        ))
    })?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| NetemError::io("set control socket timeout", e))?;
    let mut line = serde_json::to_string(req)
        .map_err(|e| NetemError::Control(format!("encode request: {e}")))?;
    line.push('\n');
    (&stream)
        .write_all(line.as_bytes())
        .map_err(|e| NetemError::io(format!("write to {}", path.display()), e))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(|e| NetemError::io(format!("read from {}", path.display()), e))?;
    let reply: ControlReply = serde_json::from_str(reply.trim())
        .map_err(|e| NetemError::Control(format!("bad reply: {e}")))?;
    if !reply.ok {
        return Err(NetemError::Control(
            reply.error.unwrap_or_else(|| "request refused".into()),
        ));
    }
    Ok(reply)
}

/// Whether something answers on the socket at `path`.
pub(crate) fn is_live(path: &Path) -> bool {
    UnixStream::connect(path).is_ok()
}

/// The control socket server thread.
#[derive(Debug)]
pub(crate) struct ControlServer {
    path: PathBuf,
    stop: Arc<StopEvent>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `path` (replacing a stale socket file) and serves requests for
    /// `handle` until dropped.
    pub fn start(path: &Path, handle: NetemHandle) -> Result<Self, NetemError> {
        if path.exists() {
            if is_live(path) {
                return Err(NetemError::AlreadyRunning {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path)
                .map_err(|e| NetemError::io(format!("remove stale {}", path.display()), e))?;
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| NetemError::io(format!("bind control socket {}", path.display()), e))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| NetemError::io(format!("chmod {}", path.display()), e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| NetemError::io("control socket nonblocking", e))?;
        let stop = Arc::new(StopEvent::new()?);
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("netem-control".into())
            .spawn(move || serve(&listener, &handle, &st))
            .map_err(|e| NetemError::io("spawn control thread", e))?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.set();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("netem control thread panicked");
            }
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove control socket");
            }
        }
    }
}

fn serve(listener: &UnixListener, handle: &NetemHandle, stop: &StopEvent) {
    while !stop.is_set() {
        if !stop.wait_readable(listener.as_raw_fd(), None) {
            continue;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                if let Err(e) = serve_connection(stream, handle, stop) {
                    tracing::debug!(error = %e, "control connection ended");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                tracing::warn!(error = %e, "control accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn serve_connection(
    stream: UnixStream,
    handle: &NetemHandle,
    stop: &StopEvent,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    while !stop.is_set() {
        line.clear();
        let n = (&mut reader).take(MAX_LINE as u64).read_line(&mut line)?;
        if n == 0 {
            return Ok(());
        }
        let reply = match serde_json::from_str::<ControlRequest>(line.trim()) {
            Ok(req) => {
                tracing::info!(?req, "control request");
                apply(handle, &req)
            }
            Err(e) => ControlReply::err(format!("bad request: {e}")),
        };
        let mut out = serde_json::to_string(&reply).unwrap_or_else(|e| {
            format!("{{\"ok\":false,\"error\":\"encode reply: {e}\",\"stats\":null}}")
        });
        out.push('\n');
        (&stream).write_all(out.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_json_shape() {
        let r = ControlRequest::SetDelay { delay_ns: 5 };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"cmd":"set_delay","delay_ns":5}"#
        );
        let p: ControlRequest =
            serde_json::from_str(r#"{"cmd":"partition","hosts":["mq-h1","2"]}"#).unwrap();
        assert_eq!(
            p,
            ControlRequest::Partition {
                hosts: vec!["mq-h1".into(), "2".into()]
            }
        );
        assert_eq!(
            serde_json::from_str::<ControlRequest>(r#"{"cmd":"heal"}"#).unwrap(),
            ControlRequest::Heal
        );
        assert!(serde_json::from_str::<ControlRequest>(r#"{"cmd":"explode"}"#).is_err());
    }
}
