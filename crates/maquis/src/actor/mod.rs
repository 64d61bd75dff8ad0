//! Local actors: spawn, mailboxes (bounded), names, monitors, call/reply with timeouts.

mod actor_ref;
mod call;
mod context;
mod monitor;
pub(crate) mod registry;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use actor_ref::ActorRef;
pub use call::ReplyTo;
pub(crate) use call::{CallOutcome, PendingCalls};
pub(crate) use context::{current_actor, decode_frame_in, decode_in, scope as scope_actor};
pub use context::{Actor, Context, Inbox};
pub use monitor::Monitor;
pub(crate) use monitor::{notify_stopped, Monitors, WatchTarget};

/// An actor's id, unique on its node for the node's life.
pub(crate) type ActorId = u64;

/// What an actor can receive: any serde type that can cross threads. Local sends move the value;
/// remote sends encode it with postcard.
pub trait Message: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> Message for T {}
