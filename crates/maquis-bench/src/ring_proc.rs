//! Child processes of the benchmarks: agents that take commands on stdin and answer on stdout,
//! and one-shot tools run to completion under a deadline.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Stdout lines buffered between the reader thread and the driver.
const LINE_QUEUE: usize = 256;

/// A long-running child whose stdout lines arrive on a bounded channel.
pub struct Proc {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Starts `cmd` with piped stdin and stdout; stderr goes to `log`.
    pub fn start(what: &str, mut cmd: Command, log: Stdio) -> Result<Proc, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{what}: cannot start: {e}"))?;
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what}: no stdout"));
        };
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::sync_channel(LINE_QUEUE);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Proc {
            what: what.to_string(),
            child,
            stdin,
            lines,
        })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes one line to the child's stdin.
    pub fn send(&mut self, line: &str) -> Result<(), String> {
        let what = &self.what;
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| format!("{what}: stdin closed"))?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("{what}: {e}"))
    }

    /// Sends a command as one JSON line.
    pub fn command<C: Serialize>(&mut self, cmd: &C) -> Result<(), String> {
        let line = serde_json::to_string(cmd).map_err(|e| e.to_string())?;
        self.send(&line)
    }

    /// Waits for a line starting with one of `prefixes`; other lines are skipped.
    pub fn expect(&mut self, prefixes: &[&str], limit: Duration) -> Result<String, String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if prefixes.iter().any(|p| l.starts_with(p)) => return Ok(l),
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "{}: no {prefixes:?} line within {limit:?}",
                        self.what
                    ))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.child.try_wait().ok().flatten();
                    return Err(format!(
                        "{}: exited before a {prefixes:?} line (status {status:?}; see agents.log)",
                        self.what
                    ));
                }
            }
        }
    }

    /// Waits for the answer to a command: a JSON object, or `error …`.
    pub fn answer<T: DeserializeOwned>(&mut self, limit: Duration) -> Result<T, String> {
        let line = self.expect(&["{", "error"], limit)?;
        if let Some(why) = line.strip_prefix("error") {
            return Err(format!("{}: {}", self.what, why.trim()));
        }
        serde_json::from_str(&line).map_err(|e| format!("{}: {e}: {line}", self.what))
    }

    /// The agent's CPU seconds so far (it answers a `cpu` line with `cpu <seconds>`).
    pub fn cpu(&mut self) -> Result<f64, String> {
        self.send("cpu")?;
        let line = self.expect(&["cpu "], Duration::from_secs(30))?;
        line[4..]
            .trim()
            .parse::<f64>()
            .map_err(|e| format!("{}: bad cpu line: {e}", self.what))
    }

    /// Closes stdin (an agent then exits) and waits up to `grace`, then kills it.
    pub fn stop(mut self, grace: Duration) {
        drop(self.stdin.take());
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Runs a one-shot agent (stdin closed at once) and returns its first stdout line that starts
/// with `{`, waiting up to `limit` for it; the agent then gets 10 s to exit before it is killed.
pub fn run_json(what: &str, cmd: Command, log: Stdio, limit: Duration) -> Result<String, String> {
    let mut p = Proc::start(what, cmd, log)?;
    drop(p.stdin.take());
    let line = p.expect(&["{"], limit)?;
    p.stop(Duration::from_secs(10));
    Ok(line)
}

/// Runs `cmd` to completion (killed after `limit`) and returns its exit status and its stdout
/// and stderr together.
pub fn run_capture(
    what: &str,
    mut cmd: Command,
    limit: Duration,
) -> Result<(ExitStatus, String), String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut r| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    })
    .collect();
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what}: did not finish within {limit:?}"));
            }
            Err(e) => return Err(format!("{what}: {e}")),
        }
    };
    let mut out = String::new();
    for r in readers {
        if let Ok(buf) = r.join() {
            out.push_str(&String::from_utf8_lossy(&buf));
        }
    }
    Ok((status, out))
}
