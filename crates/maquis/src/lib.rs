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

pub mod actor;
pub mod admin;
pub mod allocator;
pub mod config;
pub mod dispatch;
pub mod echo;
pub mod error;
pub mod node;
pub mod payload;
pub mod transport;

pub use maquis_proto::{broadcast, encode, id, membership, overlay, wire};

pub use actor::{Actor, ActorRef, Context, Inbox, Message, Monitor, ReplyTo};
pub use allocator::tune_allocator;
pub use broadcast::Topic;
pub use config::{ChannelConfig, Config, OverlayKind};
pub use dispatch::SendOpts;
pub use error::{BroadcastError, CallError, JoinError, RegisterError, SendError, StartError};
pub use id::{LaneId, NodeId};
pub use node::{MembershipEvent, Node, Subscription};
pub use payload::Payload;
pub use wire::frame::DownReason;
