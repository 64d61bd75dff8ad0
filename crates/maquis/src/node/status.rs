//! The node as seen by the admin endpoint: `/status`, `/metrics` and `/ping`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Node;
use crate::admin::{percentile, AdminSource, LaneStatus, PeerStatus, PingReport, Status};
use crate::dispatch::SendOpts;

/// [`Node::add_metrics`] was called more than
/// [`MAX_METRICS_SOURCES`](crate::admin::MAX_METRICS_SOURCES) times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "too many metrics sources on this node (at most {})",
    crate::admin::MAX_METRICS_SOURCES
)]
pub struct TooManySources;

impl Node {
    /// A snapshot of the node: members, peers, lanes and counters (the `/status` document).
    pub fn status(&self) -> Status {
        let inner = &self.inner;
        let mut peers: Vec<PeerStatus> = inner
            .router
            .peers()
            .iter()
            .map(|p| PeerStatus {
                name: p.id.name.to_string(),
                addr: p.id.addr.to_string(),
                incarnation: p.id.incarnation,
                up: p.is_up(),
                rtt_us: match p.rtt_us.load(Ordering::Relaxed) {
                    0 => None,
                    v => Some(v),
                },
                stripe_window_bytes: p.stripes_out.window_bytes(),
                lanes: p
                    .lanes
                    .iter()
                    .enumerate()
                    .map(|(slot, l)| LaneStatus {
                        channel: l.id.channel.clone(),
                        index: l.id.index,
                        connected: l.is_connected(),
                        msgs_out: l.metrics.msgs_out.load(Ordering::Relaxed),
                        direct_out: l.metrics.direct_out.load(Ordering::Relaxed),
                        bytes_out: l.metrics.bytes_out.load(Ordering::Relaxed),
                        msgs_in: l.metrics.msgs_in.load(Ordering::Relaxed),
                        bytes_in: l.metrics.bytes_in.load(Ordering::Relaxed),
                        queued_bytes: l.queued_bytes(),
                        dropped: l.metrics.dropped.load(Ordering::Relaxed),
                        small: p.carries_small(slot),
                        striped: p.carries_striped(slot),
                    })
                    .collect(),
            })
            .collect();
        peers.sort_by(|a, b| a.name.cmp(&b.name));
        let counters = inner.router.counters.snapshot();
        let gauges = std::collections::BTreeMap::from([
            ("actors".to_string(), inner.actors.registry.len() as u64),
            ("pending_calls".to_string(), inner.actors.calls.len() as u64),
            ("monitors".to_string(), inner.actors.monitors.len() as u64),
            (
                "remote_watchers".to_string(),
                inner.actors.registry.remote_watchers() as u64,
            ),
            (
                "unacked".to_string(),
                inner.actors.reliable.unacked() as u64,
            ),
            (
                "remote_links".to_string(),
                inner.actors.registry.remote_links() as u64,
            ),
            (
                "registered_names".to_string(),
                inner.actors.registry.names() as u64,
            ),
            (
                "queued_bytes".to_string(),
                inner.router.queue_budget.queued_bytes(),
            ),
            (
                "virtual_activations".to_string(),
                inner.virtuals.active() as u64,
            ),
        ]);
        let (mut counters, mut gauges) = (counters, gauges);
        // The node's traffic: its peers' lanes now, and those of peers that are gone.
        let (mut out, mut inb) = (
            inner.router.retired.bytes_out.load(Ordering::Relaxed),
            inner.router.retired.bytes_in.load(Ordering::Relaxed),
        );
        for l in peers.iter().flat_map(|p| p.lanes.iter()) {
            out += l.bytes_out;
            inb += l.bytes_in;
        }
        counters.insert("bytes_sent".to_string(), out);
        counters.insert("bytes_received".to_string(), inb);
        if let Some(stages) = &inner.router.stages {
            gauges.extend(stages.gauges());
        }
        if !inner.virtuals.actop_settings().interval.is_zero() {
            gauges.extend(inner.virtuals.actop_gauges.read());
        }
        let sources = inner
            .app_metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for source in sources {
            let (mut c, mut g) = Default::default();
            source.collect(&mut c, &mut g);
            for (k, v) in c {
                counters.entry(k).or_insert(v);
            }
            for (k, v) in g {
                gauges.entry(k).or_insert(v);
            }
        }
        Status {
            name: inner.router.id.name.to_string(),
            incarnation: inner.router.id.incarnation,
            overlay: inner.overlay_name.to_string(),
            listen: inner.router.id.addr.to_string(),
            members: self
                .members()
                .into_iter()
                .map(|m| m.name.to_string())
                .collect(),
            peers,
            counters,
            gauges,
            refusals: inner.refusals.snapshot(inner.router.now_us()),
        }
    }

    /// Adds the application's numbers to `/status` and `/metrics` (see
    /// [`AppMetrics`](crate::admin::AppMetrics)). At most
    /// [`MAX_METRICS_SOURCES`](crate::admin::MAX_METRICS_SOURCES) per node: beyond, the source
    /// is refused with `Err` (and not shown).
    pub fn add_metrics(
        &self,
        source: Arc<dyn crate::admin::AppMetrics>,
    ) -> Result<(), TooManySources> {
        let mut all = self
            .inner
            .app_metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if all.len() >= crate::admin::MAX_METRICS_SOURCES {
            return Err(TooManySources);
        }
        all.push(source);
        Ok(())
    }

    /// Calls the echo service on `to` `count` times, one after another, and summarises.
    pub async fn ping(&self, to: &str, count: u32, size: usize) -> PingReport {
        let payload = Bytes::from(vec![0x5a; size]);
        let mut rtts = Vec::with_capacity(count as usize);
        let mut errors: Vec<String> = Vec::new();
        let mut failed = 0;
        for _ in 0..count {
            let r = super::echo::echo_once(
                self,
                to,
                payload.clone(),
                Duration::from_secs(10),
                &SendOpts::default(),
            )
            .await;
            match r {
                Ok(d) => rtts.push(d.as_micros() as u64),
                Err(e) => {
                    failed += 1;
                    let msg = e.to_string();
                    if errors.len() < 10 && !errors.contains(&msg) {
                        errors.push(msg);
                    }
                }
            }
        }
        rtts.sort_unstable();
        PingReport {
            to: to.to_string(),
            count,
            size,
            ok: rtts.len() as u32,
            failed,
            p50_us: percentile(&rtts, 50.0),
            p99_us: percentile(&rtts, 99.0),
            max_us: rtts.last().copied().unwrap_or(0),
            errors,
        }
    }
}

impl AdminSource for Node {
    fn status(&self) -> Status {
        Node::status(self)
    }

    fn ping(
        &self,
        to: String,
        count: u32,
        size: usize,
    ) -> Pin<Box<dyn Future<Output = PingReport> + Send>> {
        let node = self.clone();
        Box::pin(async move { node.ping(&to, count, size).await })
    }
}
