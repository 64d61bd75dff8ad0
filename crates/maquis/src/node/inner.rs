//! The node's shared state: the router and the actors it owns, the membership the control
//! loop publishes, and the node's part of the frame path.
//!
//! Every frame a connection reads comes to [`Inner::handle_frame`] (through the transport's
//! `Host::on_frame`), which sorts it by header:
//!
//! - `Actor`: to the actors (`Actors::handle_app`), with the peer it came from;
//! - `Routed`: for this node's name, to the actors as if its sender had sent it directly (for
//!   another incarnation: dropped, counted in `stale_target`, a call answered `NoProc`); for
//!   another node, on to the next hop (`Router::forward`);
//! - `Overlay` and `Broadcast`: to the control loop's queue, for the membership machine (from a
//!   peer closed here: dropped, the machine has been told it is gone);
//! - `Heartbeat`: answered with `HeartbeatAck` on the membership lane; `HeartbeatAck` sets the
//!   peer's round-trip time;
//! - `Bye`: the peer leaves (the control loop reports it `Left`, not `Down`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use tokio::sync::{broadcast, mpsc, Semaphore};

use super::control::Control;
use super::topics::Topics;
use super::MembershipEvent;
use crate::actor::Actors;
use crate::config::Config;
use crate::id::NodeId;
use crate::router::{PeerEntry, Router};
use crate::transport::peer::Arriving;
use crate::transport::{connector, Peer, PeerRefused};
use crate::wire::frame::{Frame, Header};

/// The shared state of a running node.
pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) cookie: Vec<u8>,
    /// The TLS configurations, when `transport.tls` is on.
    pub(crate) tls: Option<crate::tls::Tls>,
    /// Peers, routes and the frame path.
    pub(crate) router: Arc<Router>,
    /// The node's actors.
    pub(crate) actors: Arc<Actors>,
    pub(crate) overlay_name: &'static str,
    /// The nodes broadcast runs over (the overlay's neighbours), as the control loop last set.
    pub(crate) neighbors: RwLock<Vec<NodeId>>,
    /// Local broadcast subscribers.
    pub(crate) topics: Topics,
    pub(crate) events: broadcast::Sender<MembershipEvent>,
    pub(crate) control: mpsc::Sender<Control>,
    pub(crate) next_conn: AtomicU64,
    pub(crate) handshakes: Arc<Semaphore>,
    pub(crate) admin_addr: Option<std::net::SocketAddr>,
    /// Handshakes refused lately, for `/status`.
    pub(crate) refusals: super::refusals::Refusals,
    pub(crate) listener_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The application's numbers for `/status` and `/metrics`.
    pub(crate) app_metrics: Mutex<Vec<Arc<dyn crate::admin::AppMetrics>>>,
    /// The directory service's queue, and its lost-name notices.
    pub(crate) names: crate::names::Names,
    /// The actor kinds and functions other nodes may use here.
    pub(crate) remote: crate::remote::Registry,
    /// The groups service's queue.
    pub(crate) groups: crate::service::Queue<crate::groups::Cmd>,
    /// Moves whenever the groups' members may have changed (`Node::group_changes`).
    pub(crate) group_changes: tokio::sync::watch::Sender<u64>,
    /// The groups' members as the service last answered (`groups::MembersCache`).
    pub(crate) group_members: crate::groups::MembersCache,
    /// Room for publishes waiting for room in local members' mailboxes (`groups::deliver`).
    pub(crate) group_deliveries: Arc<tokio::sync::Semaphore>,
    /// The virtual actors this node offers and hosts.
    pub(crate) virtuals: Arc<crate::virtual_actors::Host>,
}

impl Inner {
    /// The members as the control loop last published them (sorted).
    pub(crate) fn members_now(&self) -> Arc<Vec<NodeId>> {
        self.router.members()
    }

    /// Finds or creates the peer for `id`, with a dialer per lane. A newer incarnation
    /// replaces an older one (which is reported down); an older one than we know is refused,
    /// and so is another node of a connected peer's name (see [`Router::peer_entry`]).
    pub(crate) fn peer_get_or_create(
        self: &Arc<Self>,
        id: &NodeId,
    ) -> Result<Arc<Peer>, PeerRefused> {
        self.peer_entry(id, None).map(|(peer, _)| peer)
    }

    /// [`Inner::peer_get_or_create`] for a connection in hand for the lane in `slot`: marked
    /// arriving before any dialer of a new peer starts, until the guard is dropped.
    pub(crate) fn peer_with_connection(
        self: &Arc<Self>,
        id: &NodeId,
        slot: usize,
    ) -> Result<(Arc<Peer>, Arriving), PeerRefused> {
        let (peer, arriving) = self.peer_entry(id, Some(slot))?;
        Ok((peer, arriving.expect("asked for")))
    }

    fn peer_entry(
        self: &Arc<Self>,
        id: &NodeId,
        slot: Option<usize>,
    ) -> Result<(Arc<Peer>, Option<Arriving>), PeerRefused> {
        let (peer, new) = match self.router.peer_entry(id)? {
            PeerEntry::Known(peer) => (peer, false),
            PeerEntry::New { peer, replaced } => {
                if let Some(old) = replaced {
                    let _ = self.control.try_send(Control::PeerDown {
                        peer: old,
                        reason: "restarted".into(),
                    });
                }
                (peer, true)
            }
        };
        // Taken before a new peer's dialers start.
        let arriving = slot.map(|s| peer.arriving(s));
        if new {
            for slot in 0..peer.lanes.len() {
                tokio::spawn(connector::run(self.clone(), peer.clone(), slot));
            }
        }
        Ok((peer, arriving))
    }

    /// Hands an arriving frame on: to a mailbox, a waiting call, the overlay, broadcast, a
    /// monitor, or (routed frames for other nodes) to the next hop.
    pub(crate) async fn handle_frame(&self, peer: &Arc<Peer>, frame: Frame) {
        let Frame { header, payload } = frame;
        match header {
            // A peer closed here (its connections read on for what it still sends, replies
            // among it) no longer speaks to the membership machine, which has been told it is
            // gone: its protocol messages are dropped, as the other end's would be once the
            // connection is cut.
            Header::Overlay | Header::Broadcast if peer.close.is_cancelled() => {}
            Header::Overlay | Header::Broadcast => {
                let from = peer.id.clone();
                let msg = if matches!(header, Header::Overlay) {
                    Control::OverlayMsg { from, payload }
                } else {
                    Control::BroadcastMsg { from, payload }
                };
                let _ = self.control.send(msg).await;
            }
            Header::Heartbeat { seq, sent_us } => {
                let ack = Header::HeartbeatAck { seq, sent_us };
                self.router.send_control(peer, &ack, Bytes::new());
            }
            Header::HeartbeatAck { sent_us, .. } => {
                let rtt = self.router.now_us().saturating_sub(sent_us).max(1);
                peer.rtt_us.store(rtt, Ordering::Relaxed);
            }
            Header::Bye => {
                // From now on sends take another way, and its lanes, which it closes after
                // this, are not dialed again.
                peer.said_bye.store(true, Ordering::Release);
                peer.up.store(false, Ordering::Release);
                let _ = self
                    .control
                    .send(Control::Bye {
                        peer: peer.id.clone(),
                    })
                    .await;
            }
            Header::Routed {
                to,
                from,
                hops,
                lane,
                actor,
            } => {
                if to.name == self.router.id.name {
                    return self.actors.handle_routed(&to, &from, actor, payload).await;
                }
                self.router
                    .forward(&peer.id, to, from, hops, lane, actor, payload)
                    .await;
            }
            Header::Actor(actor) => self.actors.handle_app(&peer.id, actor, payload).await,
            // The frame decoder puts a frame sent in parts together, and the transport a striped
            // one; they hand on the whole. Barriers stay in the transport too.
            Header::Part { .. }
            | Header::Stripe { .. }
            | Header::Commit { .. }
            | Header::Barrier { .. }
            | Header::StripeWindow { .. } => {}
        }
    }
}
