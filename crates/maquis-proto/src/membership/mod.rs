//! The membership machine: one state machine that composes an overlay, Plumtree broadcast,
//! member heartbeats, the `Up`/`Down`/`Left` bookkeeping and the route table.
//!
//! A node runs one [`Membership`]. Its driver (the runtime's control loop, or the simulator)
//! tells it what happened — a join was asked for, a peer's membership lane connected or went
//! down, a protocol message arrived, time passed — and carries out the [`Output`]s it queues:
//! open or close connections, send protocol messages, deliver broadcasts, publish the members,
//! the neighbours and the routes, report events. Every input carries `now`, the time since
//! the node started; the machine never reads a clock. Its timers live in a table: after
//! every input the driver asks [`Membership::poll_timeout`] for the earliest deadline and calls
//! [`Membership::handle_timeout`] once it has passed.
//!
//! ```text
//!            handle_join / handle_leave / handle_connected / handle_disconnected /
//!            handle_overlay_msg / handle_broadcast_msg / broadcast / handle_timeout
//!   driver ──────────────────────────────────────────────────────────────────────▶ Membership
//!          ◀────────────────────────────────────────────────────────────────────── poll_output
//!            Connect, Dial, Close, Send, Deliver, Members, Neighbors, Route, Event, Gone
//! ```
//!
//! What "down" means depends on the overlay's [`Liveness`]. With `Connection` (static, full
//! mesh) a node whose connection is lost is gone at once ([`Output::Gone`]: its monitors fire,
//! calls to it fail). With `Membership` (peer-to-peer, client-server) a lost connection only
//! tells the overlay; a node is gone when it leaves the overlay's members, which, on the
//! peer-to-peer overlay, are the nodes whose broadcast heartbeat arrived within the member
//! timeout.
//!
//! Invariants: [`Output::Members`] always comes before the events it explains, so a reader
//! woken by an event sees the new members; the member list is sorted by name, then
//! incarnation, and holds this node; with `Membership` liveness it holds only the newest
//! incarnation of a name.

mod bcast;
mod router;
pub(crate) mod timers;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use bcast::RESERVED_PREFIX;
pub use router::{forward, next_hop, Direct, NextHop, NoHop};

use self::bcast::{Bcast, PtOut, DOWN_TOPIC, LEAVE_TOPIC};
use self::timers::Timers;
use crate::broadcast::{
    Plumtree, PlumtreeConfig, PlumtreeEffect, PlumtreeMsg, PlumtreeTimer, Topic,
};
use crate::id::{NodeId, PeerId};
use crate::overlay::{DynOverlay, Effect, Liveness, RawEffect, Route, TimerId};

/// A change in the membership a node sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipEvent<P = NodeId> {
    /// A node became a member (or came back).
    Up(P),
    /// A member was declared down (connection lost and not re-established, or heartbeats missed).
    Down(P),
    /// A member left (or was removed) on purpose.
    Left(P),
}

/// The hop limit of routed messages, unless configured otherwise: a message that has
/// travelled this many hops is dropped. Routes follow the reverse of the heartbeat trees,
/// which the simulator measures 20–30 hops deep at 200–1,000 nodes; the limit only has to stop
/// a message caught between routes that disagree.
pub const DEFAULT_HOP_LIMIT: u16 = 64;

/// The parameters of a [`Membership`] machine.
#[derive(Clone, Debug)]
pub struct MembershipConfig {
    /// Plumtree's parameters (broadcast, and member heartbeats on overlays that use them).
    pub plumtree: PlumtreeConfig,
    /// How long a node whose heartbeats stopped (or a former neighbour) stays a member.
    pub member_timeout: Duration,
    /// How often the routes heartbeats reveal are handed to the overlay and the member list
    /// and route table are brought up to date even if nothing else happened.
    pub refresh_every: Duration,
    /// How long a connection the overlay no longer needs, but that is still coming up, is
    /// given to connect (so what was queued for it goes out) before it is closed.
    pub linger: Duration,
    /// With member heartbeats: how long a node accused of being down (a neighbour lost its
    /// connection to it) is suspected before it is declared down, unless it is heard from.
    /// Suspicions are judged together, at most four times per suspicion time, so a node is
    /// declared down between 1 and 1.25 suspicion times after the accusation arrived.
    /// Zero: nobody is accused; a node goes when its heartbeats are `member_timeout` overdue.
    pub suspicion: Duration,
}

impl Default for MembershipConfig {
    /// Member heartbeats every second, a member timeout of 5 s (the runtime's defaults).
    fn default() -> Self {
        let member_timeout = Duration::from_secs(5);
        MembershipConfig {
            plumtree: PlumtreeConfig {
                heartbeat_every: Duration::from_secs(1),
                route_ttl: member_timeout,
                ..PlumtreeConfig::default()
            },
            member_timeout,
            refresh_every: Duration::from_secs(1),
            linger: Duration::from_secs(5),
            suspicion: Duration::from_secs(1),
        }
    }
}

/// What a [`Membership`] machine counted since it started (overlays with member heartbeats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MembershipStats {
    /// Down notices this node broadcast (it lost its connection to a member without a
    /// goodbye, or a dial to it was refused).
    pub accusations: u64,
    /// Members this node declared down because their suspicion ended before they were heard
    /// from.
    pub declared_down: u64,
    /// Heartbeats this node sent at once to refute a down notice about itself.
    pub refutations: u64,
    /// Dials the overlay made to members whose heartbeats stopped though they were not
    /// declared down ([`Overlay::on_silent`]): parts of a split overlay looking for each other.
    pub silent_dials: u64,
}

/// Messages this machine asked its driver to send ([`Output::Send`]), by kind: what a member's
/// protocol traffic is made of (at rest, on peer-to-peer, mostly heartbeats relayed along the
/// broadcast tree and their lazy announcements).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SentStats {
    /// The overlay's own messages (joins, neighbour requests, shuffles, ...).
    pub overlay: u64,
    /// Member heartbeats, this node's and those it relays.
    pub heartbeats: u64,
    /// Broadcast payloads of the membership's own topics (down and leave notices).
    pub notices: u64,
    /// Broadcast payloads of the application's topics.
    pub gossip: u64,
    /// Batches of lazy announcements (IHAVE).
    pub ihave: u64,
    /// Grafts and prunes: the broadcast tree's repairs.
    pub tree: u64,
    /// Bytes of all of them, as encoded (before the frame's head).
    pub bytes: u64,
}

impl SentStats {
    /// Messages of every kind.
    pub fn messages(&self) -> u64 {
        self.overlay + self.heartbeats + self.notices + self.gossip + self.ihave + self.tree
    }

    fn broadcast(&mut self, msg: &PlumtreeMsg<impl PeerId>) {
        let kind = match msg {
            PlumtreeMsg::Gossip { topic, .. } if topic.as_str().starts_with(RESERVED_PREFIX) => {
                &mut self.notices
            }
            PlumtreeMsg::Gossip { .. } => &mut self.gossip,
            PlumtreeMsg::Heartbeat { .. } => &mut self.heartbeats,
            PlumtreeMsg::IHave(_) => &mut self.ihave,
            PlumtreeMsg::Graft { .. } | PlumtreeMsg::Prune => &mut self.tree,
        };
        *kind += 1;
    }
}

/// Which protocol a message on the membership lane belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// The overlay's own messages.
    Overlay,
    /// Plumtree's messages (`PlumtreeMsg<NodeId>`).
    Broadcast,
}

/// A change to the route table (routes to nodes that are not neighbours).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteChange<P: PeerId = NodeId> {
    /// Messages for `dst` (and its name) go through `via`.
    Set {
        /// The destination.
        dst: P,
        /// The neighbour to go through.
        via: P,
    },
    /// No route to the node of this name any more.
    Remove(P::Name),
}

/// What the driver does on the machine's behalf, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Output<P: PeerId = NodeId> {
    /// Make sure a connection to this node exists (all its lanes dial); nothing if it does.
    Connect(P),
    /// Connect to an address whose identity the handshake reveals; then call
    /// [`Membership::handle_connected`] (and [`Membership::handle_join`] only if a join asked
    /// for it).
    Dial(SocketAddr),
    /// Close this node's connections gracefully: a goodbye, what is queued, then the end.
    Close(P),
    /// Send a protocol message on the node's membership lane (dropped if there is none).
    Send {
        /// The neighbour.
        to: P,
        /// Whose message it is.
        protocol: Protocol,
        /// The encoded message.
        payload: Bytes,
    },
    /// Hand a broadcast to this node's subscribers of its topic.
    Deliver {
        /// The topic.
        topic: Topic,
        /// The payload.
        payload: Bytes,
        /// Hops it travelled (0 when this node broadcast it).
        hops: u16,
    },
    /// The members changed: sorted, this node included.
    Members(Arc<Vec<P>>),
    /// The nodes broadcast runs over changed: sorted, this node excluded.
    Neighbors(Vec<P>),
    /// The route table changed.
    Route(RouteChange<P>),
    /// A membership event.
    Event(MembershipEvent<P>),
    /// The node is down or gone: its monitors fire, its watchers are forgotten, calls to it
    /// fail.
    Gone(P),
    /// A broadcast for the runtime itself (a leave notice) did not decode.
    Malformed {
        /// What it was.
        what: &'static str,
        /// The decoder's complaint.
        error: String,
    },
}

/// A protocol message that did not decode; the connection it came on may be hostile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{protocol:?} message from {from} does not decode: {reason}")]
pub struct DecodeError<P = NodeId> {
    /// The sender.
    pub from: P,
    /// Whose message it was.
    pub protocol: Protocol,
    /// The decoder's complaint.
    pub reason: String,
}

/// Why a peer's connection is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Disconnect {
    /// The peer said goodbye before closing.
    Bye,
    /// The connection broke (an error, the link's heartbeats stopped, a restart), or a dial
    /// was refused: evidence that the peer may be down, so it is accused (see
    /// [`MembershipConfig::suspicion`]).
    Lost,
    /// A dial failed in a way that says nothing of whether the peer is up: it got no answer
    /// in time, the peer answered but the handshake did not complete (a busy node refuses
    /// handshakes beyond its limit), or this node lacked resources (file descriptors,
    /// ports). The peer may be alive and only slow, or this node the slow one. The overlay
    /// hears that the connection is gone; nobody is accused (the peer's heartbeats, or their
    /// absence for the member timeout, decide).
    Inconclusive,
}

/// The machine's timers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Timer<P> {
    Overlay(TimerId),
    Plumtree(PlumtreeTimer),
    /// A connection the overlay dropped while it was still coming up.
    Linger(P),
    Refresh,
    /// The earliest end of a suspicion.
    Suspicion,
    /// An accusation of this peer waiting for its turn (see `handle_disconnected`).
    Accuse(P),
}

/// The membership of one node. See the [module documentation](self).
pub struct Membership<P: PeerId = NodeId> {
    me: P,
    cfg: MembershipConfig,
    overlay: Box<dyn DynOverlay<P>>,
    liveness: Liveness,
    /// This machine broadcasts member heartbeats and leave notices, and hands the overlay the
    /// routes they reveal (`Overlay::member_heartbeats`).
    heartbeats: bool,
    bcast: Bcast<P>,
    pt_out: PtOut<P>,
    /// The members last published, sorted.
    members: Arc<Vec<P>>,
    /// The overlay's epoch and `up_changes` at the last `settle` (`Overlay::epoch`).
    epoch: Option<(u64, u64)>,
    /// Bumped whenever `up` changes: an overlay without neighbour views has the connected
    /// members as its neighbours.
    /// Dials to silent members the overlay made ([`MembershipStats::silent_dials`]).
    silent_dials: u64,
    up_changes: u64,
    /// Whether the overlay named its neighbours at the last full `settle`: then connections
    /// coming and going (`up_changes`) do not count in the epoch. Kept rather than asked, so
    /// that an event that changes nothing costs no copy of the neighbour list; an overlay
    /// whose answer changes bumps its epoch anyway.
    named_neighbors: bool,
    /// Nodes known to have left on purpose: their departure is reported `Left`, not `Down`.
    left_hint: HashSet<P>,
    /// When the suspicion timer last judged the suspects.
    judged_at: Option<Duration>,
    /// Peers whose membership lane is up.
    up: HashSet<P>,
    /// Peers the overlay disconnected while their connection was still coming up (`Membership`
    /// liveness): closed once it is up, so the frames queued for them go out first.
    unneeded: HashSet<P>,
    /// Routes to members that are not neighbours, by name: (destination, neighbour).
    routes: HashMap<P::Name, (P, P)>,
    timers: Timers<Timer<P>>,
    out: VecDeque<Output<P>>,
    sent: SentStats,
}

impl<P: PeerId> std::fmt::Debug for Membership<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("me", &self.me)
            .field("overlay", &self.overlay.name())
            .field("members", &self.members.len())
            .finish_non_exhaustive()
    }
}

impl<P: PeerId> Membership<P> {
    /// A node's membership over `overlay`; nothing happens until [`Membership::handle_start`].
    pub fn new(me: P, overlay: Box<dyn DynOverlay<P>>, cfg: MembershipConfig) -> Self {
        let liveness = overlay.liveness();
        let heartbeats = liveness == Liveness::Membership && overlay.member_heartbeats();
        Membership {
            bcast: Bcast::new(me.clone(), cfg.plumtree.clone()),
            members: Arc::new(vec![me.clone()]),
            me,
            cfg,
            overlay,
            liveness,
            heartbeats,
            pt_out: Vec::new(),
            epoch: None,
            up_changes: 0,
            silent_dials: 0,
            named_neighbors: false,
            left_hint: HashSet::new(),
            judged_at: None,
            up: HashSet::new(),
            unneeded: HashSet::new(),
            routes: HashMap::new(),
            timers: Timers::default(),
            out: VecDeque::new(),
            sent: SentStats::default(),
        }
    }

    /// This node.
    pub fn me(&self) -> &P {
        &self.me
    }

    /// The overlay's name.
    pub fn overlay_name(&self) -> &'static str {
        self.overlay.name()
    }

    /// How nodes are declared down on this overlay.
    pub fn liveness(&self) -> Liveness {
        self.liveness
    }

    /// The members, sorted, this node included (as last published).
    pub fn members(&self) -> &Arc<Vec<P>> {
        &self.members
    }

    /// The nodes broadcast runs over, sorted.
    pub fn neighbors(&self) -> &[P] {
        self.bcast.neighbors()
    }

    /// The route table's entry for a node's name: (destination, neighbour to go through).
    pub fn route(&self, name: &P::Name) -> Option<&(P, P)> {
        self.routes.get(name)
    }

    /// The overlay, if it is an `O` (for inspection: tests, the simulator, status pages).
    pub fn overlay<O: 'static>(&self) -> Option<&O> {
        self.overlay.as_any().downcast_ref::<O>()
    }

    /// The broadcast layer, for inspection.
    pub fn plumtree(&self) -> &Plumtree<P> {
        self.bcast.plumtree()
    }

    /// What this machine counted: accusations, members declared down, refutations, dials to
    /// silent members.
    pub fn stats(&self) -> MembershipStats {
        MembershipStats {
            silent_dials: self.silent_dials,
            ..self.bcast.stats()
        }
    }

    /// The messages this machine asked to send, by kind.
    pub fn sent(&self) -> SentStats {
        self.sent
    }

    /// Whether this peer's membership lane is up.
    pub fn is_up(&self, peer: &P) -> bool {
        self.up.contains(peer)
    }

    /// The next output to carry out, if any.
    pub fn poll_output(&mut self) -> Option<Output<P>> {
        self.out.pop_front()
    }

    /// The earliest time [`Membership::handle_timeout`] should be called.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.timers.next()
    }

    /// The node starts: member heartbeats begin (on overlays that use them) and the overlay
    /// starts.
    pub fn handle_start(&mut self, now: Duration) {
        if self.heartbeats {
            self.bcast.start_heartbeats(&mut self.pt_out);
            self.flush(now);
        }
        let fx = self.overlay.on_start();
        self.timers
            .set(Timer::Refresh, now + self.cfg.refresh_every);
        self.apply(now, fx);
    }

    /// The node joins the cluster through `contact`, whose membership lane is connected.
    pub fn handle_join(&mut self, now: Duration, contact: &P) {
        if self.heartbeats {
            self.bcast.start_heartbeats(&mut self.pt_out);
            self.flush(now);
        }
        let fx = self.overlay.on_join(contact);
        self.apply(now, fx);
    }

    /// The node leaves: a notice to every member (on overlays with member heartbeats), then
    /// the overlay says goodbye. The node stays alone and may join again.
    pub fn handle_leave(&mut self, now: Duration) {
        if self.heartbeats {
            self.bcast.leave(now, &mut self.pt_out);
            self.flush(now);
        }
        let fx = self.overlay.on_leave();
        self.apply(now, fx);
    }

    /// The application asks to remove another node (overlays that support it).
    pub fn handle_remove(&mut self, now: Duration, name: &P::Name) {
        let fx = self.overlay.on_remove(name);
        self.apply(now, fx);
    }

    /// A peer's membership lane connected (the first time for this incarnation).
    pub fn handle_connected(&mut self, now: Duration, peer: &P) {
        self.up.insert(peer.clone());
        self.up_changes += 1;
        self.timers.cancel(&Timer::Accuse(peer.clone()));
        let fx = self.overlay.on_connection(peer, true);
        self.apply(now, fx);
        if self.unneeded.remove(peer) {
            self.timers.cancel(&Timer::Linger(peer.clone()));
            self.close(peer.clone());
            self.settle(now, false);
        }
    }

    /// A peer's connection is gone (the driver has dropped it).
    pub fn handle_disconnected(&mut self, now: Duration, peer: &P, why: Disconnect) {
        if why == Disconnect::Bye && self.liveness == Liveness::Connection {
            // With `Membership` liveness a goodbye only closes a connection (the overlay
            // changed its views); the overlay's own messages tell whether the node left.
            self.left_hint.insert(peer.clone());
        }
        self.up.remove(peer);
        self.up_changes += 1;
        self.wanted(peer);
        if self.liveness == Liveness::Connection {
            self.out.push_back(Output::Gone(peer.clone()));
        }
        if why == Disconnect::Lost && self.heartbeats && !self.cfg.suspicion.is_zero() {
            // A crash, a cut, or a node too slow to answer link heartbeats: every member
            // suspects it now rather than when its heartbeats are overdue. (This node does not
            // refute the accusation its peer may make in turn before it hears it: heartbeats
            // from every node that lost a connection, sent while a massive failure has broken
            // the broadcast tree, cost the simulator's routes a third of their deliveries.)
            // Every neighbour of a crashed node loses its connection at once; each waits a
            // time of its own (a hash of the pair, below half the suspicion) and accuses only
            // if nobody's notice has arrived meanwhile, so that one notice, not one per
            // neighbour, crosses the broadcast tree the crash has just broken. A connection
            // that comes back meanwhile cancels it. A refused dial counts too, but only
            // against a node that is still a member here (see `Bcast::accuse`); an unanswered
            // one does not (`Disconnect::Inconclusive`: on a loaded machine a handshake that
            // times out accused live nodes, whose routes everyone then dropped and probed with
            // more dials).
            let wait = jitter(&self.me, peer, self.cfg.suspicion / 2);
            self.timers.set(Timer::Accuse(peer.clone()), now + wait);
        }
        let fx = self.overlay.on_connection(peer, false);
        self.apply(now, fx);
    }

    /// An overlay message arrived from a neighbour.
    pub fn handle_overlay_msg(
        &mut self,
        now: Duration,
        from: &P,
        payload: &[u8],
    ) -> Result<(), DecodeError<P>> {
        let fx = self
            .overlay
            .on_message(from, payload)
            .map_err(|reason| DecodeError {
                from: from.clone(),
                protocol: Protocol::Overlay,
                reason,
            })?;
        self.apply(now, fx);
        Ok(())
    }

    /// A broadcast (Plumtree) message arrived from a neighbour.
    pub fn handle_broadcast_msg(
        &mut self,
        now: Duration,
        from: &P,
        payload: &[u8],
    ) -> Result<(), DecodeError<P>> {
        let msg: PlumtreeMsg<P> = postcard::from_bytes(payload).map_err(|e| DecodeError {
            from: from.clone(),
            protocol: Protocol::Broadcast,
            reason: e.to_string(),
        })?;
        self.bcast.on_message(from, msg, now, &mut self.pt_out);
        self.flush(now);
        self.follow_moved_routes();
        Ok(())
    }

    /// Broadcasts an encoded message on a topic to every member (this node included).
    pub fn broadcast(&mut self, now: Duration, topic: Topic, payload: Bytes) {
        self.bcast.broadcast(topic, payload, now, &mut self.pt_out);
        self.flush(now);
    }

    /// Time has passed: fires every timer whose deadline is at or before `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        while let Some(t) = self.timers.expired(now) {
            match t {
                Timer::Overlay(id) => {
                    let fx = self.overlay.on_timer(id);
                    self.apply(now, fx);
                }
                Timer::Plumtree(t) => {
                    self.bcast.on_timer(t, now, &mut self.pt_out);
                    self.flush(now);
                }
                Timer::Linger(peer) => {
                    if self.unneeded.remove(&peer) {
                        self.close(peer);
                        self.settle(now, false);
                    }
                }
                Timer::Refresh => {
                    self.timers
                        .set(Timer::Refresh, now + self.cfg.refresh_every);
                    self.settle(now, true);
                }
                Timer::Suspicion => {
                    // A suspect heard from since changes nothing; one declared down is gone
                    // from the routes, which a refresh hands on.
                    self.judged_at = Some(now);
                    if self.bcast.judge_suspects(now) {
                        self.settle(now, true);
                    }
                    self.arm_suspicion();
                }
                Timer::Accuse(peer) => {
                    self.bcast.accuse(&peer, now, &mut self.pt_out);
                    self.flush(now);
                }
            }
        }
    }

    /// Carries out an overlay's effects, then brings membership up to date.
    fn apply(&mut self, now: Duration, effects: Vec<RawEffect<P>>) {
        for e in effects {
            match e {
                Effect::Connect(id) => {
                    self.wanted(&id);
                    if id.name() != self.me.name() {
                        self.out.push_back(Output::Connect(id));
                    }
                }
                Effect::Dial(addr) => {
                    if Some(addr) != self.me.addr() {
                        self.out.push_back(Output::Dial(addr));
                    }
                }
                Effect::Disconnect(id) if self.liveness == Liveness::Membership => {
                    self.disconnect_soon(now, id);
                }
                Effect::Disconnect(id) => {
                    self.close(id.clone());
                    self.out.push_back(Output::Gone(id));
                }
                Effect::Send(to, payload) => {
                    self.sent.overlay += 1;
                    self.sent.bytes += payload.len() as u64;
                    self.out.push_back(Output::Send {
                        to,
                        protocol: Protocol::Overlay,
                        payload,
                    })
                }
                Effect::SetTimer(t, after) => self.timers.set(Timer::Overlay(t), now + after),
                Effect::Left(id) => {
                    if self.liveness == Liveness::Membership {
                        self.bcast.departed(&id);
                    }
                    self.left_hint.insert(id);
                }
            }
        }
        self.settle(now, false);
    }

    /// Sets the suspicion timer to the earliest end of a suspicion (or cancels it), but no
    /// sooner than a quarter of the suspicion time after the last judgement: suspicions that
    /// end close together are judged together (each judgement that declares a node down
    /// refreshes every route; when many nodes are accused at once, one refresh each would
    /// cost more than the machine has).
    fn arm_suspicion(&mut self) {
        let earliest = self.judged_at.map(|t| t + self.cfg.suspicion / 4);
        match self.bcast.next_suspicion_end() {
            Some(t) => self
                .timers
                .set(Timer::Suspicion, earliest.map_or(t, |e| t.max(e))),
            None => {
                self.timers.cancel(&Timer::Suspicion);
            }
        }
    }

    /// `Membership` liveness: the overlay no longer needs a connection. One whose membership
    /// lane is up is closed at once (its queued frames are written first); one still
    /// connecting is closed once it connects (or after `linger`), so that a message queued for
    /// it just before (a shuffle reply, say) still goes out, unless the overlay connects it
    /// again meanwhile.
    fn disconnect_soon(&mut self, now: Duration, id: P) {
        if self.up.contains(&id) {
            self.wanted(&id);
            self.close(id);
            return;
        }
        if self.unneeded.insert(id.clone()) {
            self.timers.set(Timer::Linger(id), now + self.cfg.linger);
        }
    }

    /// The overlay wants this connection (again), or it is gone: it is no longer closed when
    /// it comes up.
    fn wanted(&mut self, id: &P) {
        if self.unneeded.remove(id) {
            self.timers.cancel(&Timer::Linger(id.clone()));
        }
    }

    /// Closes a peer's connection: it is no longer up here (the driver drops it without
    /// reporting it back).
    fn close(&mut self, id: P) {
        self.up.remove(&id);
        self.up_changes += 1;
        self.out.push_back(Output::Close(id));
    }

    /// Carries out Plumtree's effects.
    fn flush(&mut self, now: Duration) {
        let mut left_notice = false;
        let mut refute = false;
        for e in std::mem::take(&mut self.pt_out) {
            match e {
                PlumtreeEffect::Send(to, msg) => match crate::encode(&msg) {
                    Ok(bytes) => {
                        self.sent.broadcast(&msg);
                        self.sent.bytes += bytes.len() as u64;
                        self.out.push_back(Output::Send {
                            to,
                            protocol: Protocol::Broadcast,
                            payload: Bytes::from(bytes),
                        })
                    }
                    Err(e) => tracing::error!(error = %e, "broadcast message does not encode"),
                },
                PlumtreeEffect::Deliver {
                    topic,
                    payload,
                    hops,
                    ..
                } => {
                    if topic.as_str() == DOWN_TOPIC {
                        match self.bcast.on_down_notice(&payload, now, self.cfg.suspicion) {
                            Ok(me) => {
                                refute |= me;
                                self.arm_suspicion();
                            }
                            Err(e) => self.out.push_back(Output::Malformed {
                                what: "down notice",
                                error: e.to_string(),
                            }),
                        }
                    } else if topic.as_str() == LEAVE_TOPIC {
                        match self.bcast.on_leave_notice(&payload) {
                            Ok(()) => left_notice = true,
                            Err(e) => self.out.push_back(Output::Malformed {
                                what: "leave notice",
                                error: e.to_string(),
                            }),
                        }
                    } else if !topic.as_str().starts_with(RESERVED_PREFIX) {
                        self.out.push_back(Output::Deliver {
                            topic,
                            payload,
                            hops,
                        });
                    }
                }
                PlumtreeEffect::SetTimer(t, after) => {
                    self.timers.set(Timer::Plumtree(t), now + after)
                }
            }
        }
        if refute {
            self.bcast.refute(&mut self.pt_out);
            self.flush(now);
        }
        if left_notice {
            let left = self.bcast.take_left();
            if !left.is_empty() {
                self.left_hint.extend(left);
                self.settle(now, true);
            }
        }
    }

    /// After anything that may change the overlay: updates broadcast's neighbours, (with member
    /// heartbeats, when `refresh` or the neighbours changed) hands the overlay the routes
    /// heartbeats revealed, publishes membership changes, and updates the route table.
    fn settle(&mut self, now: Duration, refresh: bool) {
        // An overlay that counts its changes saves the work below when nothing changed, unless
        // heartbeat routes are due (they come from the heartbeats, not the overlay).
        // Connections count only when the neighbours are the connected members.
        let epoch = self.change_count();
        if epoch.is_some() && epoch == self.epoch && !(refresh && self.heartbeats) {
            return;
        }
        let named = self.overlay.neighbors();
        self.named_neighbors = named.is_some();
        let before = self.epoch;
        self.epoch = self.change_count();
        // An overlay that counts its changes and changed may route otherwise with the same
        // members and neighbours (a client-server record naming a client's new server).
        let rerouted = self.epoch.is_some() && self.epoch != before;
        let want = named.unwrap_or_else(|| self.connected_members());
        let changed = self.bcast.sync_neighbors(want, now, &mut self.pt_out);
        if changed {
            let nbrs = self.bcast.neighbors().to_vec();
            self.out.push_back(Output::Neighbors(nbrs));
            self.flush(now);
        }
        if self.heartbeats && (changed || refresh) {
            let routes = self.bcast.routes(self.cfg.member_timeout, now);
            self.overlay.set_routes(routes);
        }
        let moved = self.publish();
        if self.liveness == Liveness::Membership && (changed || refresh || moved || rerouted) {
            self.update_routes();
        }
        if self.heartbeats && refresh {
            self.tell_silent(now);
        }
    }

    /// Tells the overlay of the members without a connection here whose heartbeats are half
    /// the member timeout late ([`Overlay::on_silent`]): the overlay may have split.
    fn tell_silent(&mut self, now: Duration) {
        let mut fx = Vec::new();
        for p in self.bcast.silent(self.cfg.member_timeout / 2, now) {
            if !self.up.contains(&p) {
                fx.extend(self.overlay.on_silent(&p));
            }
        }
        self.silent_dials += fx
            .iter()
            .filter(|e| matches!(e, Effect::Connect(_)))
            .count() as u64;
        if !fx.is_empty() {
            self.apply(now, fx);
        }
    }

    /// The overlay's count of its changes, with the connection changes when the neighbours
    /// are the connected members (`None`: the overlay does not count).
    fn change_count(&self) -> Option<(u64, u64)> {
        let ups = if self.named_neighbors {
            0
        } else {
            self.up_changes
        };
        self.overlay.epoch().map(|e| (e, ups))
    }

    /// Members (other than this node) whose membership lane is up.
    fn connected_members(&self) -> Vec<P> {
        self.overlay
            .members()
            .into_iter()
            .filter(|m| self.up.contains(m))
            .collect()
    }

    /// Brings the route table up to date: every member the overlay reaches through a
    /// neighbour. Only the entries that differ are written out.
    fn update_routes(&mut self) {
        let wanted: Vec<(P, P)> = self
            .members
            .iter()
            .filter(|m| **m != self.me)
            .filter_map(|m| match self.overlay.route(m) {
                Route::Via(via) => Some((m.clone(), via)),
                Route::Direct | Route::Unreachable => None,
            })
            .collect();
        let keep: HashSet<&P::Name> = wanted.iter().map(|(m, _)| m.name()).collect();
        let gone: Vec<P::Name> = self
            .routes
            .keys()
            .filter(|name| !keep.contains(name))
            .cloned()
            .collect();
        for name in gone {
            self.drop_route(&name);
        }
        for (dst, via) in wanted {
            self.put_route(dst, via);
        }
    }

    /// Writes out a route that differs from the table's entry.
    fn put_route(&mut self, dst: P, via: P) {
        let same = self
            .routes
            .get(dst.name())
            .is_some_and(|(d, v)| *d == dst && *v == via);
        if !same {
            self.routes
                .insert(dst.name().clone(), (dst.clone(), via.clone()));
            self.out
                .push_back(Output::Route(RouteChange::Set { dst, via }));
        }
    }

    /// Writes out the removal of a route the table has.
    fn drop_route(&mut self, name: &P::Name) {
        if self.routes.remove(name).is_some() {
            self.out
                .push_back(Output::Route(RouteChange::Remove(name.clone())));
        }
    }

    /// Hands the overlay the routes a heartbeat just moved, and brings their entries of the
    /// route table up to date at once (between two periodic refreshes, a table that lags
    /// the heartbeats here while a neighbour's follows them sends messages back and forth).
    /// A node heard from for the first time gets its route at once too; it becomes a member
    /// at the next refresh (publishing members costs a pass over all of them).
    fn follow_moved_routes(&mut self) {
        let moved = self.bcast.take_moved_routes();
        if moved.is_empty() || !self.heartbeats || self.liveness != Liveness::Membership {
            return;
        }
        for (dst, via) in moved {
            self.overlay.update_route(dst.clone(), via);
            match self.overlay.route(&dst) {
                Route::Via(via) => self.put_route(dst, via),
                Route::Direct | Route::Unreachable => self.drop_route(dst.name()),
            }
        }
    }

    /// The overlay's members, sorted; with `Membership` liveness only the newest incarnation
    /// of a name.
    fn current_members(&self) -> Vec<P> {
        let mut all = self.overlay.members();
        // Usually sorted already (overlays keep their members in ordered sets): then this is
        // one pass.
        all.sort_unstable();
        all.dedup();
        if self.liveness == Liveness::Membership {
            // The incarnations of a name are adjacent; keep the largest.
            all.dedup_by(|later, kept| {
                if later.name() != kept.name() {
                    return false;
                }
                if later.incarnation() > kept.incarnation() {
                    std::mem::swap(later, kept);
                }
                true
            });
        }
        all
    }

    /// Publishes the changes of the overlay's members, then the events they make; returns
    /// whether there were any.
    fn publish(&mut self) -> bool {
        let now = self.current_members();
        if now == *self.members {
            return false;
        }
        let now = Arc::new(now);
        // Readers woken by an event must already see the new membership.
        self.out.push_back(Output::Members(now.clone()));
        // Both lists are sorted: one merge pass finds who came and who went.
        let (mut came, mut went) = (Vec::new(), Vec::new());
        let (mut a, mut b) = (self.members.iter().peekable(), now.iter().peekable());
        loop {
            match (a.peek(), b.peek()) {
                (Some(x), Some(y)) if x == y => {
                    a.next();
                    b.next();
                }
                (Some(x), Some(y)) if x < y => went.extend(a.next()),
                (Some(_), Some(_)) | (None, Some(_)) => came.extend(b.next()),
                (Some(_), None) => went.extend(a.next()),
                (None, None) => break,
            }
        }
        for n in came {
            tracing::debug!(node = %self.me, member = %n, "member up");
            self.out
                .push_back(Output::Event(MembershipEvent::Up(n.clone())));
        }
        for n in went {
            tracing::debug!(node = %self.me, member = %n, "member gone");
            let ev = if self.left_hint.remove(n) {
                MembershipEvent::Left(n.clone())
            } else {
                MembershipEvent::Down(n.clone())
            };
            if self.liveness == Liveness::Membership {
                self.out.push_back(Output::Gone(n.clone()));
            }
            self.out.push_back(Output::Event(ev));
        }
        self.left_hint.retain(|n| now.binary_search(n).is_ok());
        self.members = now;
        true
    }
}

/// A wait in `[0, max)` that differs from one (accuser, accused) pair to another and is the
/// same every time for one pair (the simulator stays deterministic).
fn jitter<P: std::hash::Hash>(me: &P, peer: &P, max: Duration) -> Duration {
    use std::hash::{DefaultHasher, Hasher};
    let max_us = max.as_micros() as u64;
    if max_us == 0 {
        return Duration::ZERO;
    }
    let mut h = DefaultHasher::new();
    me.hash(&mut h);
    peer.hash(&mut h);
    Duration::from_micros(h.finish() % max_us)
}

#[cfg(test)]
mod tests;
