//! Plumtree's identifiers, messages and effects.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Identifies one broadcast: a tag of the node that sent it and that node's sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct MsgId {
    /// A tag of the originating node (a hash of its identity).
    pub origin: u64,
    /// The originator's sequence number.
    pub seq: u64,
}

/// A broadcast topic: a name, cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Topic(Arc<str>);

impl Topic {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Topic {
    fn from(s: &str) -> Self {
        Topic(Arc::from(s))
    }
}

impl From<String> for Topic {
    fn from(s: String) -> Self {
        Topic(Arc::from(s))
    }
}

impl fmt::Debug for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Topic {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Topic {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Topic::from)
    }
}

/// What an announcement (IHAVE) or a repair request (GRAFT) refers to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Key<P> {
    /// An application broadcast.
    Msg(MsgId),
    /// A heartbeat of `origin`.
    Beat {
        /// The node the heartbeat is from.
        origin: P,
        /// Its sequence number.
        seq: u32,
    },
}

/// One entry of an IHAVE: what the sender has, and at which hop count the receiver would get it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announce<P> {
    /// What is announced.
    pub key: Key<P>,
    /// Hops from the origin to the receiver, through the sender, along the copies' path.
    pub round: u16,
    /// For a heartbeat, the sender's offer of a way to its origin: the length of the sender's
    /// own route plus one, or [`NO_WAY`] when that route goes through the receiver. `None`
    /// for a broadcast.
    pub way: Option<u16>,
}

/// A heartbeat's way for a neighbour whose route to the origin goes through the sender: a way
/// back through the sender would be a loop.
pub const NO_WAY: u16 = u16::MAX;

/// Plumtree protocol messages between neighbours.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlumtreeMsg<P> {
    /// A broadcast's payload, pushed eagerly along the tree (or sent in answer to a GRAFT).
    Gossip {
        /// The broadcast.
        id: MsgId,
        /// Its topic.
        topic: Topic,
        /// Its payload.
        payload: Bytes,
        /// Hops from the origin to the receiver.
        round: u16,
    },
    /// A heartbeat of `origin`, flooded along the same tree; receivers learn a route back.
    Heartbeat {
        /// The node the heartbeat is from.
        origin: P,
        /// Its sequence number (larger is newer).
        seq: u32,
        /// Hops from the origin to the receiver, along the path this copy travelled (what
        /// shapes the tree, as a broadcast's round).
        round: u16,
        /// The sender's offer of a way to `origin`: its own route's length plus one, or
        /// [`NO_WAY`] when that route goes through the receiver (what shapes the routes).
        way: u16,
    },
    /// Lazy announcements, batched.
    IHave(Vec<Announce<P>>),
    /// Makes the link eager again, and asks for the message if one is named.
    Graft {
        /// The message wanted, if any (none: tree optimisation only).
        key: Option<Key<P>>,
        /// The hop count the receiver should stamp on its answer.
        round: u16,
    },
    /// Makes the link lazy: the receiver stops pushing payloads to the sender.
    Prune,
}

/// The timers Plumtree asks for; each comes back through `Plumtree::on_timer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlumtreeTimer {
    /// Flushes the lazy queue (IHAVE batches) and grafts missing messages whose time is up.
    Tick,
    /// Sends this node's heartbeat.
    Heartbeat,
}

/// Something the caller does on Plumtree's behalf.
#[derive(Clone, Debug, PartialEq)]
pub enum PlumtreeEffect<P> {
    /// Send a message to a neighbour.
    Send(P, PlumtreeMsg<P>),
    /// Hand a broadcast to the application (once per message).
    Deliver {
        /// Its topic.
        topic: Topic,
        /// Its payload.
        payload: Bytes,
        /// Its identity.
        id: MsgId,
        /// Hops it travelled (0 at the originator).
        hops: u16,
    },
    /// Call `on_timer` with this timer after the delay.
    SetTimer(PlumtreeTimer, Duration),
}
