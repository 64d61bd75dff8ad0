//! Identities: nodes, actors and lanes.

use std::cmp::Ordering;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// What a node's identity, and the part of it that names the node, must be: comparable,
/// hashable, printable, sendable between threads and on the wire.
pub trait Ident:
    Clone
    + Eq
    + Ord
    + std::hash::Hash
    + fmt::Debug
    + fmt::Display
    + Send
    + Sync
    + Serialize
    + DeserializeOwned
    + 'static
{
}

impl<T> Ident for T where
    T: Clone
        + Eq
        + Ord
        + std::hash::Hash
        + fmt::Debug
        + fmt::Display
        + Send
        + Sync
        + Serialize
        + DeserializeOwned
        + 'static
{
}

/// What the protocols need of a node's identity.
///
/// The runtime identifies nodes by [`NodeId`] (name, address, incarnation); the simulator by
/// small integers. Overlays, broadcast and the membership machine are generic over this trait,
/// so both run the same code, and ten thousand simulated nodes keep their tables small.
pub trait PeerId: Ident {
    /// What two incarnations of one node share: a restarted node has the same name and a
    /// larger incarnation.
    type Name: Ident;

    /// The node's name.
    fn name(&self) -> &Self::Name;

    /// Which life of the node this is: larger is newer.
    fn incarnation(&self) -> u64;

    /// The address the node is reached at, for identities that have one.
    fn addr(&self) -> Option<SocketAddr> {
        None
    }
}

/// The identity of one running node.
///
/// A node that restarts gets a new `incarnation`, so a [`NodeId`] names one life of a node: refs
/// that point at an older incarnation fail fast instead of reaching the new one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeId {
    /// The node's name, unique in a cluster. Shared, so that copying an identity (every route,
    /// member entry and reply address holds one) allocates nothing.
    pub name: Arc<str>,
    /// The address the node listens on.
    pub addr: SocketAddr,
    /// Which life of the node this is: larger is newer.
    pub incarnation: u64,
}

impl NodeId {
    /// Builds a node identity.
    pub fn new(name: impl Into<Arc<str>>, addr: SocketAddr, incarnation: u64) -> Self {
        NodeId {
            name: name.into(),
            addr,
            incarnation,
        }
    }

    /// The tie-break order between two nodes: when both dial the same lane at once, the
    /// connection dialed by the smaller node survives.
    pub fn wins_tie_against(&self, other: &NodeId) -> bool {
        (&self.name, self.incarnation, self.addr) < (&other.name, other.incarnation, other.addr)
    }
}

/// Ordered by name, then address, then incarnation.
impl Ord for NodeId {
    fn cmp(&self, other: &Self) -> Ordering {
        // Copies of one identity share their name: its bytes need no comparing then.
        let names = if Arc::ptr_eq(&self.name, &other.name) {
            Ordering::Equal
        } else {
            self.name.cmp(&other.name)
        };
        names
            .then_with(|| self.addr.cmp(&other.addr))
            .then_with(|| self.incarnation.cmp(&other.incarnation))
    }
}

impl PartialOrd for NodeId {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PeerId for NodeId {
    type Name = Arc<str>;

    fn name(&self) -> &Arc<str> {
        &self.name
    }

    fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn addr(&self) -> Option<SocketAddr> {
        Some(self.addr)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.addr)
    }
}

/// A lane: one TCP connection between two nodes, named by channel and index
/// (`index < parallelism` of that channel).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LaneId {
    /// The channel's name (`default`, `membership`, or one from the configuration).
    pub channel: String,
    /// Which of the channel's parallel connections.
    pub index: u16,
}

impl LaneId {
    /// Builds a lane identity.
    pub fn new(channel: impl Into<String>, index: u16) -> Self {
        LaneId {
            channel: channel.into(),
            index,
        }
    }
}

impl fmt::Display for LaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.channel, self.index)
    }
}

/// The name of the channel that always exists and carries application traffic by default.
pub const DEFAULT_CHANNEL: &str = "default";
/// The reserved channel for overlay protocol messages and heartbeats.
pub const MEMBERSHIP_CHANNEL: &str = "membership";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(name: &str, port: u16, incarnation: u64) -> NodeId {
        NodeId::new(name, SocketAddr::from(([127, 0, 0, 1], port)), incarnation)
    }

    proptest! {
        /// The order is the tuple order of (name, address, incarnation), whether two
        /// identities share their name's allocation or not.
        #[test]
        fn order_is_name_address_incarnation(
            a in ("[ab]{0,3}", 0u16..3, 0u64..3),
            b in ("[ab]{0,3}", 0u16..3, 0u64..3),
        ) {
            let (x, y) = (node(&a.0, a.1, a.2), node(&b.0, b.1, b.2));
            let want = (&a.0, a.1, a.2).cmp(&(&b.0, b.1, b.2));
            prop_assert_eq!(x.cmp(&y), want);
            prop_assert_eq!(x == y, want == Ordering::Equal);
            // The same with the name shared, as copies of one identity have it.
            let shared = NodeId { name: x.name.clone(), ..y.clone() };
            let want = (&a.0, b.1, b.2).cmp(&(&a.0, a.1, a.2));
            prop_assert_eq!(shared.cmp(&x), want);
            prop_assert_eq!(shared.partial_cmp(&x), Some(want));
        }
    }
}
