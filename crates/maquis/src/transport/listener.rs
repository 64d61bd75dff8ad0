//! The accept loop: every connection runs its handshake in its own task, at most
//! `transport.max_pending_handshakes` at once and `transport.max_pending_handshakes_per_source`
//! from one IP address (more are closed at once and counted), so that one misbehaving source
//! cannot take every slot from the nodes that need them.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use super::{conn, Host};
use crate::per_source::PerSource;
use crate::throttle::Throttle;

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
