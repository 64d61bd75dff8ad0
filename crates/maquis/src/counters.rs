//! Node-wide event counters, exported at `/metrics` as `maquis_<name>_total`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    /// Raises the value to `v` if it is below (to mirror a count kept elsewhere).
    pub(crate) fn raise_to(&self, v: u64) {
        self.0.fetch_max(v, Ordering::Relaxed);
    }
    /// Adds one and returns the new value (to log the 1st, 2nd, 4th, 8th… occurrence only).
    pub(crate) fn inc_get(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

macro_rules! counters {
    ($($name:ident: $doc:literal),* $(,)?) => {
        /// Node-wide event counters, exported at `/metrics` as `maquis_<name>_total`.
        #[derive(Debug, Default)]
        pub struct Counters { $(#[doc = $doc] pub $name: Counter,)* }
        impl Counters {
            /// Name → value.
            pub fn snapshot(&self) -> BTreeMap<String, u64> {
                BTreeMap::from([$((stringify!($name).to_string(), self.$name.get()),)*])
            }
        }
    };
}

counters! {
    virtual_activations: "virtual actors activated on this node",
    virtual_deactivations: "virtual actors deactivated on this node (idle, or stopped by themselves)",
    virtual_forwarded: "messages for a virtual actor passed on to the node whose activation holds its name (two nodes activated it at once)",
    virtual_migrations: "virtual actors that moved from this node to another (Node::migrate)",
    virtual_arrivals: "virtual actors handed over to this node by the node they moved from, once their hand-over ended here (activated, or found held elsewhere or failed); equal to the cluster's virtual_migrations when no move is under way",
    virtual_fences: "fences sent behind the messages of a key handed back to this node while it was passing them on (the key's messages from elsewhere wait for it)",
    virtual_sent_local: "messages from virtual actors to virtual actors on the same node",
    virtual_sent_remote: "messages from virtual actors to virtual actors on other nodes (ActOp lowers their share)",
    virtual_save_errors: "virtual actor states that could not be saved after a message (encoding or store failed; the actor went on)",
    virtual_refused: "messages for a virtual actor this node could not take: unknown kind, too many activations or held messages, a failed activation (a call is answered NoProc)",
    decode_errors: "messages dropped because they did not decode as the actor's type",
    type_mismatch: "remote messages refused because their type's fingerprint is not the actor's",
    unknown_actor: "messages for an actor that does not exist here",
    stale_target: "messages addressed to an older incarnation of this node",
    late_replies: "replies that arrived after their call gave up",
    handshake_failures: "incoming connections that failed the handshake",
    handshakes_refused: "connections closed because too many handshakes were in progress",
    bad_frames: "connections closed for a malformed or oversized frame",
    stripes_dropped: "striped messages received in part and dropped: a part lost with a connection, or not arrived within the heartbeat timeout of its commit, a commit lost with a connection, numbered for a table this node no longer has (it dropped the peer), or given up by the sender part-way (its send dropped, or refused for room)",
    barriers_given_up: "barriers across a channel's lanes let go after the heartbeat timeout because a lane did not arrive (its connection lost): messages whose key changed lanes there may be out of order",
    control_drops: "protocol frames dropped because the membership lane was full (the node's or the lane's queue bound)",
    control_no_peer: "protocol frames dropped because their peer had no connection, or its connection closed before they were written",
    peers_down: "peers declared down",
    links_silent: "connections dropped because the peer sent nothing for the heartbeat timeout (the peer gone, or one of the two nodes too slow)",
    dials_refused: "membership-lane dials that failed with evidence that the peer is down (refused, unreachable): on peer-to-peer the peer is accused",
    dials_inconclusive: "membership-lane dials that failed without evidence that the peer is down (a timeout, a handshake broken off, this node's own resources): nobody is accused",
    members_accused: "down notices this node broadcast: a member whose connection it lost without a goodbye, or whose dial was refused (peer-to-peer; copied from the membership machine at every link heartbeat interval)",
    members_declared_down: "members this node declared down because their suspicion ended before they were heard from (peer-to-peer; copied at every link heartbeat interval)",
    accusations_refuted: "down notices about this node that it refuted with a heartbeat (peer-to-peer; copied at every link heartbeat interval)",
    members_silent_dials: "dials to members whose heartbeats were half the member timeout late without a down notice, to join an overlay split into parts with full views (peer-to-peer; copied at every link heartbeat interval)",
    heartbeats_sent: "link heartbeats sent (to the peers written nothing to since the last interval, and to all every tenth interval)",
    routed_forwarded: "routed messages this node passed on toward their destination",
    routed_hop_limit: "routed messages dropped because they reached the hop limit",
    routed_no_route: "routed messages dropped because this node knew no way on",
    routed_queue_full: "routed messages dropped because the next hop's lane stayed full",
    routed_invalid: "routed messages dropped because their lane or header made no sense here",
    unsent_resent: "frames a dropped connection left unwritten, sent again by another way",
    unsent_dropped: "frames a dropped connection left unwritten that found no other way in time (calls among them fail at once)",
    subscription_drops: "broadcast messages dropped from full topic subscriptions (oldest first)",
    names_send_failed: "directory messages not sent (no connection or route, or a full queue); requests are sent again",
    names_lost: "global names of this node that lost a conflict when a partition healed",
    groups_send_failed: "group membership messages not sent (no connection or route, or a full queue); repaired by the next change or the digest",
    acked_resends: "acknowledged messages sent again because no acknowledgement came in time",
    acked_given_up: "acknowledged messages given up unacknowledged (the sender was told)",
    acked_duplicates: "acknowledged messages that arrived again and were acknowledged, not handled",
    acked_invalid: "acknowledged messages dropped because their number was outside the sender's window",
    broadcast_route_moves: "member heartbeats that gave their origin a first route or a route through another neighbour (peer-to-peer; copied from the broadcast layer at every link heartbeat interval)",
    broadcast_strangers_ignored: "member heartbeats ignored because they came from a node that is not a broadcast neighbour (its view had not caught up)",
    broadcast_lazy_dropped: "broadcast announcements dropped because the lazy queue was full",
    broadcast_missing_dropped: "broadcast announcements ignored because the table of messages announced and not received was full",
    membership_sent_overlay: "the overlay's own messages this node sent (joins, neighbour requests, shuffles; copied from the membership machine at every link heartbeat interval, as the other membership_sent counts)",
    membership_sent_heartbeats: "member heartbeats this node sent along the broadcast tree, its own and those it relayed (peer-to-peer)",
    membership_sent_notices: "down and leave notices this node sent along the broadcast tree, its own and those it relayed",
    membership_sent_gossip: "payloads of application broadcast topics this node sent along the broadcast tree",
    membership_sent_ihave: "batches of lazy broadcast announcements (IHAVE) this node sent",
    membership_sent_tree: "grafts and prunes this node sent (the broadcast tree's repairs)",
    membership_sent_bytes: "bytes of every membership_sent message, as encoded (before the frame's head)",
}
