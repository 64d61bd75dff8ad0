//! Helpers for a process that runs a node: allocator settings for large messages, logging,
//! and the signal that asks it to stop.

/// Logs to stderr through `tracing`, filtered by `RUST_LOG` or else by `default_filter`
/// (`"info"`, `"warn"`, …), in colour only on a terminal (logs sent to a file stay plain
/// text). Call it once, early in `main`; a second call does nothing.
pub fn init_logging(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// Keeps large message buffers in the heap for reuse; call it first thing in `main`.
///
/// By default glibc serves every block above a (moving) threshold with its own `mmap` and
/// returns it on free, so each large message costs a page fault and a zeroed page per 4 KiB,
/// several times over (encode, read, decode). With 8 MiB payloads that kernel work can starve
/// the runtime until peers miss each other's heartbeats. After this call, blocks up to 32 MiB
/// (glibc's largest threshold) come from the heap, and the heap is trimmed only above 512 MiB
/// free. Elsewhere than Linux with glibc it does nothing.
pub fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; glibc takes its own locks.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
    }
}

/// Resolves when the process is asked to stop: Ctrl-C (SIGINT) or, on Unix, SIGTERM. A node's
/// `main` awaits it, then leaves the cluster and shuts down.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
