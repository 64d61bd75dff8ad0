//! A Riak-Core-style ring on Maquis: consistent hashing over `P` partitions, one vnode actor
//! per partition on its owner, ring gossip, ownership handoff, an echo service and a
//! key-value store with N = 3 replicas and R = W = 2 quorums, plus a Redis-protocol front.
//!
//! Traffic uses three named channels besides `default`: `vnode` (client requests to vnodes,
//! with the partition as partition key, so each partition's requests share one lane and
//! partitions spread over the lanes), `gossip` (ring gossip and claimant requests) and
//! `handoff` (bulk data moving between owners), so that background work never queues in
//! front of requests.
//!
//! ```no_run
//! use std::time::Duration;
//! use bytes::Bytes;
//! use maquis::Config;
//! use maquis_ring::{Ring, RingConfig};
//!
//! # async fn demo() -> Result<(), maquis_ring::RingError> {
//! let a = Ring::start(Config::new("a"), RingConfig::default()).await?;
//! let b = Ring::start(Config::new("b"), RingConfig::default()).await?;
//! let c = Ring::start(Config::new("c"), RingConfig::default()).await?;
//! b.join(a.node().addr(), Duration::from_secs(5)).await?;
//! c.join(a.node().addr(), Duration::from_secs(5)).await?;
//! a.wait_converged(Duration::from_secs(10)).await?;
//! a.put("k", Bytes::from("v")).await?;
//! assert_eq!(b.get("k").await?, Some(Bytes::from("v")));
//! assert_eq!(c.echo(Bytes::from("ping")).await?, Bytes::from("ping"));
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod aae;
pub mod config;
pub mod error;
mod handoff;
pub mod hash;
pub mod kv;
pub mod manager;
pub mod node;
pub mod object;
pub mod resp;
pub mod ring;
pub mod storage;
pub mod vnode;

pub use config::{RingConfig, MAX_PARTITIONS};
pub use error::RingError;
pub use handoff::HANDOFF_CHANNEL;
pub use kv::Target;
pub use manager::{EnsureReply, ManagerMsg, NodeStatus, GOSSIP_CHANNEL, MANAGER_NAME};
pub use node::{with_ring_channels, Ring, RingNode, Stats};
pub use object::{Object, Version};
pub use resp::{RespConfig, RespServer};
pub use ring::{RingState, Role};
pub use storage::{Storage, StorageConfig, StorageError};
pub use vnode::{vnode_name, vnode_opts, VnodeMsg, VnodeReply, VNODE_CHANNEL};
