//! Child processes of a benchmark run: agents inside emulated hosts, read line by line.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A long-running agent (a server) whose stdout lines arrive on a channel.
pub struct Agent {
    what: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Agent {
    /// Starts `cmd` with piped stdin/stdout (stderr goes to `log`).
    pub fn start(what: &str, mut cmd: Command, log: Stdio) -> Result<Agent, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("{what}: cannot start: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Agent {
            what: what.to_string(),
            child,
            stdin,
            lines,
        })
    }

    /// Waits for a line starting with `prefix`.
    pub fn expect(&mut self, prefix: &str, limit: Duration) -> Result<String, String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return Ok(l),
                Ok(_) => continue,
                Err(_) => {
                    let status = self.child.try_wait().ok().flatten();
                    return Err(format!(
                        "{}: no {prefix:?} line within {limit:?} (exit status {status:?})",
                        self.what
                    ));
                }
            }
        }
    }

    /// The agent's CPU seconds so far (it answers a line on stdin with `cpu <seconds>`).
    pub fn cpu(&mut self) -> Result<f64, String> {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "cpu").map_err(|e| format!("{}: {e}", self.what))?;
        stdin.flush().map_err(|e| e.to_string())?;
        let line = self.expect("cpu ", Duration::from_secs(30))?;
        line[4..]
            .trim()
            .parse::<f64>()
            .map_err(|e| format!("{}: bad cpu line: {e}", self.what))
    }

    /// Closes stdin (the agent exits) and waits up to 10 s, then kills it.
    pub fn stop(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
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

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a one-shot command to completion (killed after `limit`) and returns its last stdout
/// line that starts with `{`.
pub fn run_json(
    what: &str,
    mut cmd: Command,
    log: Stdio,
    limit: Duration,
) -> Result<String, String> {
    let mut a = Agent::start(what, std::mem::replace(&mut cmd, Command::new("true")), log)?;
    drop(a.stdin.take());
    let line = a.expect("{", limit)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = a.child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(line)
}
