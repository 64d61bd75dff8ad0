//! psaDB on Maquis: a key-value store without a coordinator. The key space is split among
//! groups of actors (a key belongs to group `hash(key) mod groups`); a client publishes each
//! request to its key's group, where one member answers it and every member keeps a replica.
//!
//! - [`store`]: a member's copy of the keys, a last-writer-wins map that converges whatever
//!   order writes arrive in.
//! - [`replica`]: one member as a state machine without I/O: who answers what, and when a
//!   write is acknowledged (once every member has it, so a member's death loses none).
//! - [`member`]: the actor that drives a replica with Maquis's process groups, and joins late
//!   members safely.
//! - [`client`]: the handle that sends each request to its key's group and retries.
//! - [`resp`]: the Redis-protocol front over a client.
//! - [`serve`]: `psadb serve`, a node with its members and the front.

pub mod client;
pub mod member;
pub mod replica;
pub mod resp;
pub mod serve;
pub mod store;

pub use client::{Client, ClientSettings, PsadbError};
pub use member::{start_member, MemberSettings};

#[cfg(test)]
mod tests;
