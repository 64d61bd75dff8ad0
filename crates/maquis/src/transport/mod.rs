//! Transport: one TCP connection per lane, handshakes, writers that batch, readers that hand
//! frames to mailboxes, and dialers that reconnect with backoff.

pub(crate) mod conn;
pub(crate) mod connector;
pub(crate) mod lane;
pub(crate) mod listener;
pub(crate) mod peer;

pub(crate) use lane::QueueBudget;
pub(crate) use peer::Peer;
