//! Maquis: a distributed actor runtime.
//!
//! The overlay (who connects to whom) is chosen by configuration; latency falls through parallel
//! connections per peer (lanes), named channels, and affinity (one sender's messages to one
//! receiver share a lane, so they stay in order while different pairs run in parallel).
//!
//! ```no_run
//! use maquis::{Config, Node, ReplyTo};
//! use serde::{Deserialize, Serialize};
//! use std::time::Duration;
//!
//! #[derive(Serialize, Deserialize)]
//! enum Counter { Add(u64), Get(ReplyTo<u64>) }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let a = Node::start(Config::new("a")).await?;
//! let b = Node::start(Config::new("b")).await?;
//! b.join_wait(a.addr(), Duration::from_secs(5)).await?;
//! let counter = a.spawn_fn(|mut inbox| async move {
//!     let mut total = 0;
//!     while let Some(msg) = inbox.recv().await {
//!         match msg {
//!             Counter::Add(n) => total += n,
//!             Counter::Get(reply) => { let _ = reply.send(total).await; }
//!         }
//!     }
//! });
//! a.register("counter", &counter)?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]
#![warn(unreachable_pub)]

mod actor;
pub mod admin;
pub mod config;
mod counters;
mod dispatch;
mod error;
pub mod groups;
pub mod names;
mod node;
pub mod payload;
mod per_source;
mod process;
pub mod remote;
mod router;
mod service;
mod slab;
mod stages;
pub mod supervisor;
mod throttle;
mod tls;
mod transport;
pub mod virtual_actors;

/// Overlays: the [`Overlay`](overlay::Overlay) trait to write your own (see
/// `examples/custom_overlay.rs`), and the built-in ones with their configurations.
pub mod overlay {
    pub use maquis_proto::id::PeerId;
    pub use maquis_proto::overlay::{
        ClientServer, ClientServerConfig, ClientServerMsg, ClientServerStats, Effect, Effects,
        FullMesh, FullMeshEntry, FullMeshMsg, HyParView, HyParViewConfig, HyParViewMsg, Liveness,
        Member, MemberState, Overlay, ParseRoleError, Role, Route, StaticMsg, StaticOverlay,
        TimerId, MAX_SERVERS_PER_CLIENT,
    };
}

/// The built-in echo service every node runs, registered as [`echo::ECHO`]: it sends the
/// payload of each request back to the caller (`maquis ping` uses it).
pub mod echo {
    pub use crate::node::echo::{echo_once, Echo, ECHO};
}

// The protocol crate's modules the runtime uses internally.
use maquis_proto::{broadcast, id, membership, wire};

pub use maquis_proto::encode;

pub use actor::{ActorRef, Message, Monitor, ReplyTo};
pub use broadcast::Topic;
pub use config::{ChannelConfig, Config, ConfigError, OverlayKind};
pub use counters::{Counter, Counters};
pub use dispatch::{Acked, SendOpts};
pub use error::{
    BroadcastError, CallError, JoinError, LinkError, RegisterError, SendError, StartError,
};
pub use id::{LaneId, NodeId, DEFAULT_CHANNEL, MEMBERSHIP_CHANNEL};
pub use node::{Actor, Context, Inbox, MembershipEvent, Node, Subscription, TooManySources};
pub use payload::Payload;
pub use process::{init_logging, shutdown_signal, tune_allocator};
pub use wire::frame::DownReason;
