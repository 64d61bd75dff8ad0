//! Overlays: who connects to whom, who is a member, and how a message reaches a node.
//!
//! An overlay is a state machine without I/O: the runtime calls its `on_*` handlers and carries
//! out the [`Effect`]s they push (connect, disconnect, send a protocol message on the
//! `membership` channel, set a timer). The same code can run in a simulator.
//!
//! # Writing your own
//!
//! Implement [`Overlay`] and start a node with `maquis::Node::start_with_overlay`; the
//! runtime's `examples/custom_overlay.rs` is a complete one (a minimal full mesh by
//! introductions) written against the public API only. The rules the runtime relies on:
//!
//! - [`Overlay::members`] includes this node; membership events come only from the changes of
//!   `members()`, so an overlay never emits them itself, and it marks deliberate departures
//!   with [`Effects::left`].
//! - [`Overlay::on_connection`]`(peer, true)` comes when the peer's membership lane first
//!   connects, `(peer, false)` when the peer is declared down.
//! - `on_start` runs once; `on_remove` when the application calls `Node::remove`.
//! - Optional: [`Overlay::neighbors`] (what broadcast runs over; by default the connected
//!   members), [`Overlay::liveness`] (`Connection` by default; `Membership` makes connections
//!   disposable, starts member heartbeats and feeds [`Overlay::set_routes`]),
//!   [`Overlay::member_heartbeats`] (`false` turns those heartbeats off for an overlay that
//!   spreads membership and computes routes itself), and [`Overlay::epoch`] (a number that
//!   changes whenever `members`, `neighbors` or `route` may answer differently: while it
//!   stays the same the membership machine skips recomputing them).

mod client_server;
mod full_mesh;
mod hyparview;
mod static_overlay;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use client_server::{
    ClientServer, ClientServerConfig, ClientServerMsg, ClientServerStats, Member, MemberState,
    ParseRoleError, Role, MAX_SERVERS_PER_CLIENT,
};
pub use full_mesh::{Entry as FullMeshEntry, FullMesh, Msg as FullMeshMsg};
pub use hyparview::{HyParView, HyParViewConfig, HyParViewMsg};
pub use static_overlay::{Msg as StaticMsg, StaticOverlay};

use crate::id::{NodeId, PeerId};

/// How a message reaches a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route<P = NodeId> {
    /// Over a direct connection.
    Direct,
    /// Through the given neighbour (multi-hop overlays).
    Via(P),
    /// Not reachable now.
    Unreachable,
}

/// How the runtime learns that a node is down, which depends on the overlay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// A node is down when its connection is lost (or its link heartbeats stop): every member
    /// has a connection (static, full mesh). Monitors fire and calls fail at once.
    Connection,
    /// Connections come and go with the overlay's views, so a closed connection says nothing
    /// of the node: a node is down only when it leaves [`Overlay::members`]. The runtime
    /// broadcasts a heartbeat from every node and hands the routes the heartbeats reveal to
    /// [`Overlay::set_routes`] (peer-to-peer), unless the overlay knows its members and routes
    /// itself ([`Overlay::member_heartbeats`] is `false`: client-server).
    Membership,
}

/// A timer an overlay asked for; it gets the id back in `on_timer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId(pub u64);

/// Something the runtime does on an overlay's behalf.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect<M, P = NodeId> {
    /// Open (all lanes of) a connection to a node; no-op if it exists.
    Connect(P),
    /// Connect to an address whose identity the handshake reveals (then `on_join` is not called;
    /// `on_connection` is).
    Dial(SocketAddr),
    /// Close a node's connections gracefully (queued frames are written first).
    Disconnect(P),
    /// Send a protocol message on the `membership` channel.
    Send(P, M),
    /// Call `on_timer` after the delay.
    SetTimer(TimerId, Duration),
    /// The node is leaving the membership on purpose: report `Left`, not `Down`.
    Left(P),
}

/// The effects one handler call produced, in order.
#[derive(Debug)]
pub struct Effects<M, P = NodeId> {
    items: Vec<Effect<M, P>>,
}

impl<M, P> Default for Effects<M, P> {
    fn default() -> Self {
        Effects { items: Vec::new() }
    }
}

impl<M, P> Effects<M, P> {
    /// Pushes an effect.
    pub fn push(&mut self, e: Effect<M, P>) {
        self.items.push(e);
    }
    /// Asks for a connection.
    pub fn connect(&mut self, id: P) {
        self.push(Effect::Connect(id));
    }
    /// Asks to dial an address.
    pub fn dial(&mut self, addr: SocketAddr) {
        self.push(Effect::Dial(addr));
    }
    /// Asks to close a node's connections.
    pub fn disconnect(&mut self, id: P) {
        self.push(Effect::Disconnect(id));
    }
    /// Sends a protocol message.
    pub fn send(&mut self, to: P, msg: M) {
        self.push(Effect::Send(to, msg));
    }
    /// Sets a timer.
    pub fn timer(&mut self, id: TimerId, after: Duration) {
        self.push(Effect::SetTimer(id, after));
    }
    /// Marks a node as having left on purpose.
    pub fn left(&mut self, id: P) {
        self.push(Effect::Left(id));
    }
    /// Takes the effects out.
    pub fn drain(&mut self) -> std::vec::Drain<'_, Effect<M, P>> {
        self.items.drain(..)
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// An overlay protocol. Implement it (one file) to bring your own; see [`FullMesh`] for a small
/// complete example.
pub trait Overlay<P: PeerId = NodeId>: Send + 'static {
    /// The overlay's own protocol messages (sent on the `membership` channel).
    type Msg: Serialize + DeserializeOwned + Send + 'static;

    /// The overlay's name, shown in `/status`.
    fn name(&self) -> &'static str;
    /// Called once when the node starts.
    fn on_start(&mut self, _fx: &mut Effects<Self::Msg, P>) {}
    /// The node joined through `contact` (already connected).
    fn on_join(&mut self, contact: &P, fx: &mut Effects<Self::Msg, P>);
    /// The node leaves the cluster.
    fn on_leave(&mut self, fx: &mut Effects<Self::Msg, P>);
    /// The application asks to remove another node from the cluster.
    fn on_remove(&mut self, _node: &P::Name, _fx: &mut Effects<Self::Msg, P>) {}
    /// A protocol message arrived.
    fn on_message(&mut self, from: &P, msg: Self::Msg, fx: &mut Effects<Self::Msg, P>);
    /// A node's membership lane connected (`up`) or the node was declared down (`!up`).
    fn on_connection(&mut self, peer: &P, up: bool, fx: &mut Effects<Self::Msg, P>);
    /// A timer fired.
    fn on_timer(&mut self, timer: TimerId, fx: &mut Effects<Self::Msg, P>);
    /// The members the application sees (including this node).
    fn members(&self) -> Vec<P>;
    /// How to reach a node.
    fn route(&self, dst: &P) -> Route<P>;
    /// The neighbours broadcast runs over; `None` (the default) means every member with a
    /// connection.
    fn neighbors(&self) -> Option<Vec<P>> {
        None
    }
    /// How the runtime decides that a node is down (default: [`Liveness::Connection`]).
    fn liveness(&self) -> Liveness {
        Liveness::Connection
    }
    /// With [`Liveness::Membership`]: the routes to non-neighbours learned from heartbeats,
    /// `(destination, neighbour to go through)`, each heard from within the member timeout.
    /// Called periodically and whenever the neighbours change.
    fn set_routes(&mut self, _routes: Vec<(P, P)>) {}
    /// With [`Liveness::Membership`]: one route that moved since the last
    /// [`Overlay::set_routes`], as soon as a heartbeat shows it (`dst` is now reached through
    /// neighbour `via`, or heard from for the first time). Routes that lag the heartbeats
    /// make two nodes send a message back and forth. Default: nothing (the next
    /// `set_routes` brings it).
    fn update_route(&mut self, _dst: P, _via: P) {}
    /// With member heartbeats: `peer`, a member this node has no connection to, has not been
    /// heard from for half the member timeout (called at every refresh while that lasts). Its
    /// heartbeats may have stopped because the overlay split into parts that no longer reach
    /// each other; the overlay may connect to it to join them again before the member
    /// timeout declares the other part down. Default: nothing.
    fn on_silent(&mut self, _peer: &P, _fx: &mut Effects<Self::Msg, P>) {}
    /// With [`Liveness::Membership`]: whether the runtime broadcasts a heartbeat from every node
    /// (and a notice when one leaves) to learn members and routes for
    /// [`Overlay::set_routes`]. Default: `true` with `Membership`. An overlay that spreads its
    /// own membership and computes its own routes answers `false` and saves the heartbeat
    /// traffic (one broadcast per node per period, which reaches every node).
    fn member_heartbeats(&self) -> bool {
        self.liveness() == Liveness::Membership
    }
    /// A number that changes whenever [`Overlay::members`], [`Overlay::neighbors`] or
    /// [`Overlay::route`] may answer differently, a counter bumped on every change for
    /// instance; a route that [`Overlay::update_route`] only moved to another neighbour need
    /// not change it (the runtime writes that route out itself when it calls it). While it
    /// stays the same the runtime does not recompute its member list and route table after
    /// an event, which keeps a node with a thousand members cheap. A connection that comes or
    /// goes makes the runtime recompute too, unless the overlay names its neighbours
    /// ([`Overlay::neighbors`] is `Some`): then the epoch alone says when (a HyParView
    /// shuffle's reply opens a connection for one message). `None` (the default): recompute
    /// after every event.
    fn epoch(&self) -> Option<u64> {
        None
    }
}

/// An effect with its message encoded, as the runtime executes it.
pub type RawEffect<P = NodeId> = Effect<Bytes, P>;

/// The object-safe face of an overlay that the runtime drives: every handler returns its
/// effects with the overlay's messages encoded, and [`DynOverlay::on_message`] decodes.
#[allow(missing_docs)]
pub trait DynOverlay<P: PeerId = NodeId>: Send {
    fn name(&self) -> &'static str;
    fn on_start(&mut self) -> Vec<RawEffect<P>>;
    fn on_join(&mut self, contact: &P) -> Vec<RawEffect<P>>;
    fn on_leave(&mut self) -> Vec<RawEffect<P>>;
    fn on_remove(&mut self, node: &P::Name) -> Vec<RawEffect<P>>;
    fn on_message(&mut self, from: &P, bytes: &[u8]) -> Result<Vec<RawEffect<P>>, String>;
    fn on_connection(&mut self, peer: &P, up: bool) -> Vec<RawEffect<P>>;
    fn on_timer(&mut self, timer: TimerId) -> Vec<RawEffect<P>>;
    fn members(&self) -> Vec<P>;
    fn route(&self, dst: &P) -> Route<P>;
    fn neighbors(&self) -> Option<Vec<P>>;
    fn liveness(&self) -> Liveness;
    fn set_routes(&mut self, routes: Vec<(P, P)>);
    fn update_route(&mut self, dst: P, via: P);
    fn on_silent(&mut self, peer: &P) -> Vec<RawEffect<P>>;
    fn member_heartbeats(&self) -> bool;
    fn epoch(&self) -> Option<u64>;
    /// The overlay itself, to inspect it (see `Membership::overlay`).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// An [`Overlay`] seen as a [`DynOverlay`].
pub struct Erased<O>(pub O);

fn encode<M: Serialize, P>(mut fx: Effects<M, P>) -> Vec<RawEffect<P>> {
    fx.drain()
        .filter_map(|e| {
            Some(match e {
                Effect::Send(to, m) => match crate::encode(&m) {
                    Ok(v) => Effect::Send(to, Bytes::from(v)),
                    Err(err) => {
                        tracing::error!(error = %err, "overlay message does not encode; dropped");
                        return None;
                    }
                },
                Effect::Connect(n) => Effect::Connect(n),
                Effect::Dial(a) => Effect::Dial(a),
                Effect::Disconnect(n) => Effect::Disconnect(n),
                Effect::SetTimer(t, d) => Effect::SetTimer(t, d),
                Effect::Left(n) => Effect::Left(n),
            })
        })
        .collect()
}

impl<P: PeerId, O: Overlay<P>> DynOverlay<P> for Erased<O> {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn on_start(&mut self) -> Vec<RawEffect<P>> {
        let mut fx = Effects::default();
        self.0.on_start(&mut fx);
        encode(fx)
    }
    fn on_join(&mut self, contact: &P) -> Vec<RawEffect<P>> {
        let mut fx = Effects::default();
        self.0.on_join(contact, &mut fx);
        encode(fx)
    }
    fn on_leave(&mut self) -> Vec<RawEffect<P>> {
        let mut fx = Effects::default();
        self.0.on_leave(&mut fx);
        encode(fx)
    }
    fn on_remove(&mut self, node: &P::Name) -> Vec<RawEffect<P>> {
        let mut fx = Effects::default();
        self.0.on_remove(node, &mut fx);
        encode(fx)
    }
    fn on_message(&mut self, from: &P, bytes: &[u8]) -> Result<Vec<RawEffect<P>>, String> {
        let msg: <O as Overlay<P>>::Msg = postcard::from_bytes(bytes).map_err(|e| e.to_string())?;
        let mut fx = Effects::default();
        self.0.on_message(from, msg, &mut fx);
        Ok(encode(fx))
    }
    fn on_connection(&mut self, peer: &P, up: bool) -> Vec<RawEffect<P>> {
        let mut fx = Effects::default();
        self.0.on_connection(peer, up, &mut fx);
        encode(fx)
    }
    fn on_timer(&mut self, timer: TimerId) -> Vec<RawEffect<P>> {
        let mut fx = Effects::default();
        self.0.on_timer(timer, &mut fx);
        encode(fx)
    }
    fn on_silent(&mut self, peer: &P) -> Vec<RawEffect<P>> {
        let mut fx = Effects::default();
        self.0.on_silent(peer, &mut fx);
        encode(fx)
    }
    fn members(&self) -> Vec<P> {
        self.0.members()
    }
    fn route(&self, dst: &P) -> Route<P> {
        self.0.route(dst)
    }
    fn neighbors(&self) -> Option<Vec<P>> {
        self.0.neighbors()
    }
    fn liveness(&self) -> Liveness {
        self.0.liveness()
    }
    fn set_routes(&mut self, routes: Vec<(P, P)>) {
        self.0.set_routes(routes)
    }
    fn update_route(&mut self, dst: P, via: P) {
        self.0.update_route(dst, via)
    }
    fn member_heartbeats(&self) -> bool {
        self.0.member_heartbeats()
    }
    fn epoch(&self) -> Option<u64> {
        self.0.epoch()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        &self.0
    }
}
