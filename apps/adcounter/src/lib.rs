//! PARTISAN's advertisement counter (§6.3, after Lasp): impressions of ads counted in
//! grow-only counter CRDTs ([`crdt`]), one replica per node ([`replica`]) that sends its
//! state to the overlay's neighbours when it changed, and merges theirs; an ad is disabled
//! once its counter reaches its limit. Built on Maquis's public API only, so it runs on
//! every overlay the configuration names: full mesh, client-server, peer-to-peer.

pub mod crdt;
pub mod replica;

pub use crdt::{AdError, Ads, GCounter, Merged};
pub use replica::{start, unix_ms, AdMsg, Settings, Snapshot, StartError, NAME};
