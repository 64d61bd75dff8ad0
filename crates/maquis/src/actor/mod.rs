//! Actors: mailboxes (bounded), names, typed refs that reach an actor on any node, call/reply
//! with timeouts, and monitors.
//!
//! The module owns the node's actors ([`Actors`]: registry, pending calls, monitors) and sits
//! on the [`Router`](crate::router) for everything remote; it knows nothing of the node that
//! runs it. The `Actor` trait, the `Inbox` and the `Context` live with the node
//! (`node::context`), which spawns actors.
//!
//! # A send
//!
//! [`ActorRef::send`] compares the ref's node with this one (same name, another incarnation:
//! `StaleIncarnation`). A local target gets the value itself in its mailbox — nothing is
//! serialized, and a mailbox of another message type is `TypeMismatch`. A remote one gets it
//! encoded once (`maquis::encode`: postcard into a buffer of the exact size) behind an
//! `ActorHeader::Send { to, incarnation, call, ty }` (`ty`: the fingerprint of the message's
//! type, see `fingerprint.rs`), handed to the router with the sender's id
//! (`current_actor()`: the actor running the task, else a hash of the tokio task id) for lane
//! affinity.
//!
//! A call ([`ActorRef::call_with`]) opens an entry in the pending calls and puts a
//! [`ReplyTo`] (call id, caller, channel, partition key) into the request; one deadline covers
//! both the wait for room and the wait for the answer. `ReplyTo::send` answers on the
//! request's channel and key, so request and reply share a lane (or completes the entry
//! directly when the caller is local); a late reply finds no entry and is counted.
//!
//! # An arrival
//!
//! [`Actors::handle_app`] takes the actor traffic the node hands it, direct or routed (with the
//! node it came from): a `Send` whose fingerprint is not its actor's is refused before it is
//! decoded (counted in `type_mismatch`, a call answered `TypeMismatch`); another is pushed into
//! its mailbox (waiting for room, so a full mailbox stops that lane's reader: backpressure
//! reaches the sender through TCP), or, with no such actor, counted in `unknown_actor` and
//! answered `NoProc` if it is a call; a `Reply` completes its call; `Monitor`, `Demonitor` and
//! `Down` add or remove a remote watcher or fire a monitor. The receiving actor decodes the
//! payload itself ([`decode_frame_in`]): refs inside bind to this node's actors, and `Payload`
//! fields of 4 KiB or more become slices of the frame instead of copies (`payload.rs`). A
//! payload that does not decode is dropped and counted (`decode_errors`); a call gets `Reply {
//! status: Failed }`.

mod actor_ref;
mod actors;
mod call;
mod deadline;
mod fingerprint;
pub(crate) mod mailbox;
mod monitor;
pub(crate) mod registry;
mod reliable;
mod scope;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub(crate) use actor_ref::outcome_of;
pub use actor_ref::ActorRef;
pub(crate) use actors::{Actors, NewActor, Offer, Unnamed, UnnamedSink};
pub use call::ReplyTo;
pub(crate) use fingerprint::{compatible, fingerprint};
pub use monitor::Monitor;
pub(crate) use monitor::WatchTarget;
pub(crate) use reliable::run_timers as run_reliable_timers;
pub(crate) use scope::{
    adopting, current_actor, decode_frame_in, decode_in, in_actor, note_spawn, Adopted,
};

/// An actor's id, unique on its node for the node's life.
pub(crate) type ActorId = u64;

/// What an actor can receive: any serde type that can cross threads. Local sends move the value;
/// remote sends encode it with postcard.
pub trait Message: Serialize + DeserializeOwned + Send + 'static {}
impl<T: Serialize + DeserializeOwned + Send + 'static> Message for T {}
