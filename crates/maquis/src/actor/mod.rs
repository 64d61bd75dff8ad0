//! Actors: mailboxes (bounded), names, typed refs that reach an actor on any node, call/reply
//! with timeouts, and monitors.
//!
//! The module owns the node's actors ([`Actors`]) and sits on the [`Router`](crate::router)
//! for everything remote; it knows nothing of the node that runs it. The `Actor` trait, the
//! `Inbox` and the `Context` live with the node (`node::context`), which spawns actors.

mod actor_ref;
mod actors;
mod call;
mod monitor;
pub(crate) mod registry;
mod scope;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use actor_ref::ActorRef;
pub(crate) use actors::Actors;
pub use call::ReplyTo;
pub use monitor::Monitor;
pub(crate) use monitor::WatchTarget;
pub(crate) use scope::{decode_frame_in, decode_in, scope as scope_actor};

/// An actor's id, unique on its node for the node's life.
pub(crate) type ActorId = u64;

/// What an actor can receive: any serde type that can cross threads. Local sends move the value;
/// remote sends encode it with postcard.
pub trait Message: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> Message for T {}
