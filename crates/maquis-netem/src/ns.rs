//! Network namespaces: creation and deletion through iproute2, and running
//! code inside one from a dedicated thread.
//!
//! `setns(2)` for a network namespace only changes the calling *thread*, so
//! [`in_netns`] spawns a short-lived thread, moves it into the namespace,
//! runs the closure there and lets the thread exit. Sockets and TUN devices
//! created by the closure stay bound to that namespace and keep working from
//! any thread afterwards.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::NetemError;

/// Where `ip netns add` bind-mounts named namespaces.
pub const NETNS_DIR: &str = "/var/run/netns";

/// The bind-mount path of namespace `name`.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Whether the named namespace exists.
pub fn exists(name: &str) -> bool {
    netns_path(name).exists()
}

/// Checks that `name` is usable as a namespace name (and so as a file name).
pub fn validate_name(name: &str) -> Result<(), NetemError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(NetemError::InvalidConfig(format!(
            "bad namespace name {name:?}: use 1-64 of [A-Za-z0-9_.-], not starting with '.' or '-'"
        )))
    }
}

/// Runs `ip ARGS…`, returning its standard output or a [`NetemError::Command`].
pub fn ip(args: &[&str]) -> Result<String, NetemError> {
    ip_with_stdin(args, None)
}

/// Runs `ip ARGS…` feeding `stdin` (for `-batch -`).
pub fn ip_with_stdin(args: &[&str], stdin: Option<&str>) -> Result<String, NetemError> {
    let command = format!("ip {}", args.join(" "));
    let mut child = Command::new("ip")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NetemError::io(format!("run `{command}` (is iproute2 installed?)"), e))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(|e| NetemError::io(format!("write to `{command}`"), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| NetemError::io(format!("wait for `{command}`"), e))?;
    if !out.status.success() {
        return Err(NetemError::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Creates the named namespace.
pub fn add(name: &str) -> Result<(), NetemError> {
    validate_name(name)?;
    ip(&["netns", "add", name]).map(drop)
}

/// Deletes the named namespace (and with it every device inside).
/// A namespace that does not exist is not an error.
pub fn delete(name: &str) -> Result<(), NetemError> {
    validate_name(name)?;
    if !exists(name) {
        return Ok(());
    }
    match ip(&["netns", "delete", name]) {
        Ok(_) => Ok(()),
        Err(_) if !exists(name) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Names of all named namespaces.
pub fn list() -> Result<Vec<String>, NetemError> {
    let dir = match std::fs::read_dir(NETNS_DIR) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(NetemError::io(format!("read {NETNS_DIR}"), e)),
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// Runs `f` on a fresh thread that has joined namespace `name`, and returns
/// its result. The thread exits afterwards, so the caller's namespace is
/// never changed. Fails if the namespace cannot be entered or `f` panics.
pub fn in_netns<F, R>(name: &str, f: F) -> Result<R, NetemError>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let handle = spawn_in_netns(name, f)?;
    handle
        .join()
        .map_err(|_| NetemError::Thread(format!("in namespace {name}")))?
}

/// Spawns a thread that joins namespace `name` and then runs `f`. The
/// thread's result is `Err` (and `f` is not run) if joining fails.
pub fn spawn_in_netns<F, R>(
    name: &str,
    f: F,
) -> Result<std::thread::JoinHandle<Result<R, NetemError>>, NetemError>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    validate_name(name)?;
    let path = netns_path(name);
    let ns = std::fs::File::open(&path)
        .map_err(|e| NetemError::io(format!("open {}", path.display()), e))?;
    let ns_name = name.to_string();
    std::thread::Builder::new()
        .name(format!("netns-{name}"))
        .spawn(move || {
            // SAFETY: ns is an open namespace file; setns only affects this
            // thread, which never leaves the closure's scope.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(NetemError::io(
                    format!("setns into {ns_name}"),
                    std::io::Error::last_os_error(),
                ));
            }
            drop(ns);
            Ok(f())
        })
        .map_err(|e| NetemError::io("spawn namespace thread", e))
}

/// Writes `value` to the sysctl `key` (dotted or slashed form) in the
/// calling thread's network namespace.
pub fn write_sysctl(key: &str, value: &str) -> Result<(), NetemError> {
    let path = sysctl_path(key)?;
    std::fs::write(&path, value)
        .map_err(|e| NetemError::io(format!("write {value:?} to {}", path.display()), e))
}

/// Reads the sysctl `key` in the calling thread's network namespace.
pub fn read_sysctl(key: &str) -> Result<String, NetemError> {
    let path = sysctl_path(key)?;
    std::fs::read_to_string(&path)
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .map_err(|e| NetemError::io(format!("read {}", path.display()), e))
}

fn sysctl_path(key: &str) -> Result<PathBuf, NetemError> {
    let rel = key.replace('.', "/");
    if rel.is_empty()
        || rel.starts_with('/')
        || rel.split('/').any(|c| c.is_empty() || c == "..")
        || !rel
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '/')
    {
        return Err(NetemError::parse(
            "sysctl",
            key,
            "expected e.g. net.ipv4.tcp_rmem",
        ));
    }
    Ok(Path::new("/proc/sys").join(rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("mq-h1").is_ok());
        assert!(validate_name("a_b.c-1").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("../x").is_err());
        assert!(validate_name("-x").is_err());
        assert!(validate_name("a b").is_err());
    }

    #[test]
    fn sysctl_paths() {
        assert_eq!(
            sysctl_path("net.ipv4.tcp_rmem").unwrap(),
            Path::new("/proc/sys/net/ipv4/tcp_rmem")
        );
        assert!(sysctl_path("net..x").is_err());
        assert!(sysctl_path("/etc/passwd").is_err());
        assert!(sysctl_path("net/../../etc").is_err());
    }
}
