//! The accept loop: every connection runs its handshake in its own task, at most
//! `transport.max_pending_handshakes` at once and `transport.max_pending_handshakes_per_source`
//! from one IP address (more are closed at once and counted), so that one misbehaving source
//! cannot take every slot from the nodes that need them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;

use super::{conn, Host};
use crate::throttle::Throttle;

/// Handshakes in progress by source address. An entry lives while its source has one, so the
/// table never holds more entries than there are handshakes in progress.
#[derive(Debug, Default)]
struct PerSource(Mutex<HashMap<IpAddr, usize>>);

/// One handshake's place in its source's count; given back when dropped.
struct SourceSlot {
    table: Arc<PerSource>,
    ip: IpAddr,
}

impl PerSource {
    fn take(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<SourceSlot> {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = t.entry(ip).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut t = self.table.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

pub(crate) async fn run<H: Host>(inner: Arc<H>, listener: TcpListener) {
    let sources = Arc::new(PerSource::default());
    let per_source = inner.config().transport.max_pending_handshakes_per_source;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = inner.shutdown().cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, remote)) => {
                let Ok(permit) = inner.handshakes().clone().try_acquire_owned() else {
                    static WARN: Throttle = Throttle::new(Duration::from_secs(1));
                    inner.counters().handshakes_refused.inc();
                    if let Some(held) = WARN.allow() {
                        tracing::warn!(%remote, more_since_last = held, "too many handshakes in progress; connection closed");
                    }
                    continue;
                };
                let Some(slot) = sources.take(remote.ip(), per_source) else {
                    static WARN: Throttle = Throttle::new(Duration::from_secs(1));
                    inner.counters().handshakes_refused.inc();
                    if let Some(held) = WARN.allow() {
                        tracing::warn!(%remote, more_since_last = held, "too many handshakes in progress from this address; connection closed");
                    }
                    continue;
                };
                let inner = inner.clone();
                tokio::spawn(async move {
                    conn::accept(inner, stream, remote).await;
                    drop((permit, slot));
                });
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_holds_at_most_its_share_and_gives_it_back() {
        let t = Arc::new(PerSource::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let held: Vec<_> = (0..3).map(|_| t.take(a, 3).expect("room")).collect();
        assert!(t.take(a, 3).is_none(), "a is at its limit");
        let other = t.take(b, 3).expect("b has its own share");
        drop(held);
        assert!(t.take(a, 3).is_some(), "given back");
        drop(other);
        assert!(
            t.0.lock().unwrap().is_empty(),
            "no entry outlives its handshakes"
        );
    }
}
