//! A deterministic discrete-event simulator for Maquis's peer-to-peer protocols.
//!
//! It runs the very same [`HyParView`](maquis_proto::overlay::HyParView) overlay (through the
//! [`Overlay`](maquis_proto::overlay::Overlay) trait) and [`Plumtree`](maquis_proto::broadcast::Plumtree)
//! broadcast state machines that a node runs, thousands of them in one thread, on simulated
//! time (a queue of events), with a latency per message, simulated connections and failure
//! detection. A [`Scenario`] says what happens (bootstrap, massive failure, churn, partition);
//! [`run`] returns the [`Report`] of what was measured. The same scenario gives the same report.
//!
//! ```
//! use maquis_sim::{run, Fault, Scenario};
//!
//! let mut s = Scenario::new("tiny", 40, Fault::MassiveFailure { fraction: 0.3 });
//! s.broadcasts = 10;
//! s.routed_sends = 50;
//! let r = run(&s);
//! assert_eq!(r.live, 28);
//! assert_eq!(r.components, 1);
//! ```
#![deny(missing_docs)]

mod actop;
mod report;
mod run;
mod scenario;
mod suite;
mod world;

pub use actop::{run_actop, ActopRound, ActopSim};
pub use report::{Report, Traffic};
pub use run::run;
pub use scenario::{Fault, Scenario, SimOverlay};
pub use suite::{
    run_suite, ScenarioKind, Suite, SuiteError, SuiteReport, MAX_FULL_MESH_NODES, MAX_NODES,
};
