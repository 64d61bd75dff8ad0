//! The node as the transport's host: what a connection needs from the node, and where the
//! frames and lane changes it produces go.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::control::Control;
use super::inner::Inner;
use crate::config::Config;
use crate::counters::Counters;
use crate::dispatch::Dispatcher;
use crate::id::NodeId;
use crate::tls::Tls;
use crate::transport::peer::Arriving;
use crate::transport::{Host, LaneEvent, Peer, PeerRefused};
use crate::wire::frame::Frame;

impl Host for Inner {
    fn id(&self) -> &NodeId {
        &self.router.id
    }

    fn cookie(&self) -> &[u8] {
        &self.cookie
    }

    fn tls(&self) -> Option<&Tls> {
        self.tls.as_ref()
    }

    fn stages(&self) -> Option<&Arc<crate::stages::Stages>> {
        self.router.stages.as_ref()
    }

    fn config(&self) -> &Config {
        &self.config
    }

    fn dispatch(&self) -> &Dispatcher {
        &self.router.dispatch
    }

    fn counters(&self) -> &Counters {
        &self.router.counters
    }

    fn shutdown(&self) -> &CancellationToken {
        &self.router.shutdown
    }

    fn handshakes(&self) -> &Arc<Semaphore> {
        &self.handshakes
    }

    fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn now_us(&self) -> u64 {
        self.router.now_us()
    }

    fn dials_on_demand(&self) -> bool {
        self.router.liveness == crate::overlay::Liveness::Membership
    }

    fn peer_for(
        self: &Arc<Self>,
        id: &NodeId,
        slot: usize,
    ) -> Result<(Arc<Peer>, Arriving), PeerRefused> {
        self.peer_with_connection(id, slot)
    }

    async fn on_frame(&self, peer: &Arc<Peer>, frame: Frame) {
        self.handle_frame(peer, frame).await
    }

    fn on_refused(&self, addr: std::net::SocketAddr, by_us: bool, reason: &str) -> Option<u64> {
        self.refusals
            .record(addr, by_us, reason, self.router.now_us())
    }

    async fn on_lane(&self, event: LaneEvent) {
        let msg = match event {
            LaneEvent::Up { peer, slot } => Control::LaneUp { peer, slot },
            LaneEvent::Down { peer, slot } => Control::LaneDown { peer, slot },
            LaneEvent::DialFailed {
                peer,
                slot,
                error,
                evidence,
            } => Control::DialFailed {
                peer,
                slot,
                error,
                evidence,
            },
        };
        let _ = self.control.send(msg).await;
    }
}
