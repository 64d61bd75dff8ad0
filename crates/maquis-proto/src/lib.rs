//! Maquis's protocols as state machines without I/O.
//!
//! Nothing in this crate opens a socket, spawns a task or reads the clock: every handler takes
//! the current time as an argument and answers with data (messages to send, connections to
//! open or close, timers to arm, events to report). The runtime (`maquis`) executes those
//! answers over TCP; the simulator (`maquis-sim`) executes them on simulated time, so both run
//! the very same protocol code.
//!
//! - [`id`]: the identities of nodes and lanes.
//! - [`wire`]: the frame layout, the handshake messages and their decoders.
//! - [`overlay`]: who connects to whom and who is a member — the [`overlay::Overlay`] trait
//!   and the static, full-mesh, peer-to-peer (HyParView) and client-server overlays.
//! - [`broadcast`]: Plumtree epidemic broadcast trees and the routes their heartbeats reveal.
//! - [`membership`]: the machine a node runs, composing an overlay, broadcast, member
//!   heartbeats, membership events and the route table; and the router's decisions.
//! - [`names`]: the directory of cluster-wide names, partitioned over the members by
//!   rendezvous hashing.
//! - [`groups`]: process groups, each node's memberships replicated to every member.
//! - `harness` (feature `test-utils`): a deterministic network of membership machines on
//!   simulated time, for tests and the simulator.
#![deny(missing_docs)]

pub mod actop;
pub mod broadcast;
pub mod groups;
#[cfg(any(test, feature = "test-utils"))]
pub mod harness;
pub mod id;
mod member_list;
pub mod membership;
pub mod names;
pub mod overlay;
pub mod reliable;
pub mod wire;

/// Encodes a value the way messages travel (postcard).
///
/// The buffer is sized exactly by a first counting pass, so a large payload is copied once
/// (a growing buffer would copy it several times).
pub fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    encode_after(&[], value)
}

/// [`encode`], after `prefix` in the same buffer (a header that travels with the value, written
/// without a second copy of the value).
pub fn encode_after<T: serde::Serialize>(
    prefix: &[u8],
    value: &T,
) -> Result<Vec<u8>, postcard::Error> {
    let size = postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())?;
    let mut buf = Vec::with_capacity(prefix.len() + size);
    buf.extend_from_slice(prefix);
    postcard::to_io(value, buf)
}
