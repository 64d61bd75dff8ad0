//! Broadcast over an overlay's neighbours: Plumtree epidemic broadcast trees, and multi-hop
//! routing to non-neighbours learned from heartbeats that travel the same trees.
//!
//! [`Plumtree`] is a state machine without I/O, independent of the overlay: tell it when a
//! neighbour comes and goes, hand it what arrives, and carry out the [`PlumtreeEffect`]s it
//! pushes (send to a neighbour, deliver to the application, set a timer). It is generic over the
//! peer identity `P`, so the runtime runs it on `NodeId`s and a simulator on small integers.
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use maquis_proto::broadcast::{Plumtree, PlumtreeConfig, PlumtreeEffect, Topic};
//!
//! let mut a = Plumtree::new(1u32, PlumtreeConfig::default());
//! let mut out = Vec::new();
//! a.on_neighbor_up(2, Duration::ZERO, &mut out);
//! let id = a.broadcast(Topic::from("news"), Bytes::from_static(b"hi"), Duration::ZERO, &mut out);
//! assert!(out.iter().any(|e| matches!(e, PlumtreeEffect::Deliver { id: d, .. } if *d == id)));
//! assert!(out.iter().any(|e| matches!(e, PlumtreeEffect::Send(2, _))));
//! ```

mod cache;
mod config;
mod plumtree;
mod routing;
mod types;

pub use config::PlumtreeConfig;
pub use plumtree::{Plumtree, PlumtreeStats};
pub use routing::{decide_forward, DropReason, ForwardDecision, RouteInfo};
pub use types::{Announce, Key, MsgId, PlumtreeEffect, PlumtreeMsg, PlumtreeTimer, Topic, NO_WAY};
