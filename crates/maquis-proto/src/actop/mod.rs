//! ActOp (EuroSys 2016) §4 without I/O: the heaviest communication edges of a server in
//! constant space ([`SpaceSaving`]), and the pairwise exchange that moves virtual actors next
//! to the actors they talk to within a balance bound ([`partition`]); §5, the queueing model
//! that sizes a server's stages ([`stages`]).

pub mod partition;
mod space_saving;
pub mod stages;

pub use partition::{exchange, offers, Balance, Candidate, Exchange, View};
pub use space_saving::{Counted, SpaceSaving};
