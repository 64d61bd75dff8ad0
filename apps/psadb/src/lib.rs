//! psaDB on Maquis: a key-value store without a coordinator. The key space is split among
//! groups of actors (a key belongs to group `hash(key) mod groups`); a client publishes each
//! request to its key's group, where one member answers it and every member keeps a replica.
//!
//! - [`store`]: a member's copy of the keys, a last-writer-wins map that converges whatever
//!   order writes arrive in.
//! - [`replica`]: one member as a state machine without I/O: who answers what, and when a
//!   write is acknowledged (once every member has it, so a member's death loses none).

pub mod replica;
pub mod store;

#[cfg(test)]
mod tests;
