//! Named sets of scenarios, as a command line asks for them, and their combined report.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::report::{peak_rss_kb, Report};
use crate::scenario::{Fault, Scenario, SimOverlay};

/// The most nodes a suite may simulate (a simulated node's index lives in 24 bits of its
/// address, and churn adds nodes).
pub const MAX_NODES: usize = 1 << 22;

/// The most nodes a full-mesh simulation may have: every node keeps a connection to, and an
/// entry for, every other, so memory and gossip grow with the square of the nodes.
pub const MAX_FULL_MESH_NODES: usize = 500;

/// A kind of scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScenarioKind {
    /// The overlay is built and measured, without a fault.
    Bootstrap,
    /// A fraction of the nodes crash at once; one run per fraction.
    MassiveFailure,
    /// Nodes crash and join every shuffle period for a while.
    Churn,
    /// The nodes split into two halves for a while, then the network heals.
    Partition,
}

impl ScenarioKind {
    /// Every kind, in the order of [`ScenarioKind::name`]s shown to users.
    pub const ALL: [ScenarioKind; 4] = [
        ScenarioKind::Bootstrap,
        ScenarioKind::MassiveFailure,
        ScenarioKind::Churn,
        ScenarioKind::Partition,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ScenarioKind::Bootstrap => "bootstrap",
            ScenarioKind::MassiveFailure => "massive-failure",
            ScenarioKind::Churn => "churn",
            ScenarioKind::Partition => "partition",
        }
    }
}

impl fmt::Display for ScenarioKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a suite cannot be built.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SuiteError {
    /// No scenario has this name.
    #[error("unknown scenario {0:?} (expected bootstrap, massive-failure, churn or partition)")]
    UnknownScenario(String),
    /// Too few or too many nodes.
    #[error("nodes must be between 2 and {max}, not {got}")]
    Nodes {
        /// What was asked.
        got: usize,
        /// The most allowed.
        max: usize,
    },
    /// A fraction outside `[0, 1]` (or not a number).
    #[error("fraction {0} is not between 0 and 1")]
    Fraction(f64),
    /// A massive failure without any fraction.
    #[error("massive-failure needs at least one failure fraction")]
    NoFraction,
    /// A churn or partition of zero periods.
    #[error("periods must be at least 1")]
    Periods,
    /// A client-server overlay without a server, or with only servers.
    #[error("client-server needs between 1 and {nodes} servers, not {servers}")]
    Servers {
        /// Servers asked for.
        servers: usize,
        /// Nodes in the bootstrap.
        nodes: usize,
    },
    /// Clients attached to no server, or to more servers than there are.
    #[error("a client attaches to between 1 and {servers} servers, not {servers_per_client}")]
    ServersPerClient {
        /// Servers per client asked for.
        servers_per_client: usize,
        /// Servers in the cluster.
        servers: usize,
    },
    /// A full mesh larger than [`MAX_FULL_MESH_NODES`].
    #[error(
        "a full mesh of {0} nodes is too large to simulate here (at most {MAX_FULL_MESH_NODES})"
    )]
    FullMeshTooLarge(usize),
}

impl FromStr for ScenarioKind {
    type Err = SuiteError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ScenarioKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| SuiteError::UnknownScenario(s.to_string()))
    }
}

/// A fraction as a percentage, to two decimals at most (0.2 → 20, 0.125 → 12.5).
fn percent(f: f64) -> f64 {
    (f * 10_000.0).round() / 100.0
}

/// What to simulate: a kind of scenario at a size, with its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Suite {
    /// The kind.
    pub kind: ScenarioKind,
    /// Nodes in the bootstrap.
    pub nodes: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Massive failure: the fractions of the nodes that crash, one run each.
    pub fail: Vec<f64>,
    /// Churn: the fraction of the nodes replaced every shuffle period.
    pub churn: f64,
    /// Churn and partition: how many shuffle periods the fault lasts.
    pub periods: u32,
    /// The overlay every node runs.
    pub overlay: SimOverlay,
    /// The member-heartbeat period (`None`: the scenario's default, see
    /// [`Scenario::member_heartbeat`]).
    pub member_heartbeat: Option<std::time::Duration>,
    /// Routed messages in the routing phase (0: none).
    pub routed_sends: usize,
    /// How long an accused node is suspected ([`Scenario::suspicion`]; zero: no accusations).
    pub suspicion: std::time::Duration,
}

impl Suite {
    /// A suite with the defaults: seed 42, failures of 20, 40, 60, 80 and 90 %, churn of 2 % per
    /// period for 10 periods, a partition of 5 periods.
    pub fn new(kind: ScenarioKind, nodes: usize) -> Suite {
        Suite {
            kind,
            nodes,
            seed: 42,
            fail: vec![0.2, 0.4, 0.6, 0.8, 0.9],
            churn: 0.02,
            periods: match kind {
                ScenarioKind::Partition => 5,
                _ => 10,
            },
            overlay: SimOverlay::PeerToPeer,
            member_heartbeat: None,
            routed_sends: 1000,
            suspicion: std::time::Duration::from_secs(1),
        }
    }

    /// The scenarios to run, in order; an error if a parameter is out of range.
    pub fn scenarios(&self) -> Result<Vec<Scenario>, SuiteError> {
        if !(2..=MAX_NODES).contains(&self.nodes) {
            return Err(SuiteError::Nodes {
                got: self.nodes,
                max: MAX_NODES,
            });
        }
        match self.overlay {
            SimOverlay::ClientServer { servers, .. } if servers == 0 || servers > self.nodes => {
                return Err(SuiteError::Servers {
                    servers,
                    nodes: self.nodes,
                })
            }
            SimOverlay::ClientServer {
                servers,
                servers_per_client,
            } if servers_per_client == 0 || servers_per_client > servers => {
                return Err(SuiteError::ServersPerClient {
                    servers_per_client,
                    servers,
                })
            }
            SimOverlay::FullMesh if self.nodes > MAX_FULL_MESH_NODES => {
                return Err(SuiteError::FullMeshTooLarge(self.nodes))
            }
            _ => {}
        }
        let fraction = |f: f64| {
            if (0.0..=1.0).contains(&f) {
                Ok(f)
            } else {
                Err(SuiteError::Fraction(f))
            }
        };
        let n = self.nodes;
        let mut all = match self.kind {
            ScenarioKind::Bootstrap => vec![Scenario::new("bootstrap", n, Fault::None)],
            ScenarioKind::MassiveFailure => {
                if self.fail.is_empty() {
                    return Err(SuiteError::NoFraction);
                }
                self.fail
                    .iter()
                    .map(|&f| {
                        let fraction = fraction(f)?;
                        let name = format!("fail-{}%", percent(fraction));
                        Ok(Scenario::new(name, n, Fault::MassiveFailure { fraction }))
                    })
                    .collect::<Result<Vec<_>, SuiteError>>()?
            }
            ScenarioKind::Churn => {
                let fault = Fault::Churn {
                    fraction: fraction(self.churn)?,
                    periods: self.periods_checked()?,
                };
                let name = format!("churn-{}%", percent(self.churn));
                vec![Scenario::new(name, n, fault)]
            }
            ScenarioKind::Partition => {
                let fault = Fault::Partition {
                    periods: self.periods_checked()?,
                };
                vec![Scenario::new("partition", n, fault)]
            }
        };
        // Churn adds nodes: keep every index within the address space.
        if let ScenarioKind::Churn = self.kind {
            let added = (n as f64 * self.churn).round() as usize * self.periods as usize;
            if n.saturating_add(added) > MAX_NODES {
                return Err(SuiteError::Nodes {
                    got: n.saturating_add(added),
                    max: MAX_NODES,
                });
            }
        }
        for s in &mut all {
            s.seed = self.seed;
            s.overlay = self.overlay.clone();
            s.member_heartbeat = self.member_heartbeat;
            s.routed_sends = self.routed_sends;
            s.suspicion = self.suspicion;
        }
        Ok(all)
    }

    fn periods_checked(&self) -> Result<u32, SuiteError> {
        if self.periods == 0 {
            Err(SuiteError::Periods)
        } else {
            Ok(self.periods)
        }
    }
}

/// The reports of a suite's runs, with the time and memory they took in all.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SuiteReport {
    /// The kind of scenario.
    pub scenario: ScenarioKind,
    /// The overlay simulated.
    pub overlay: String,
    /// Nodes in the bootstrap.
    pub nodes: usize,
    /// The seed.
    pub seed: u64,
    /// One report per run, in order.
    pub runs: Vec<Report>,
    /// Wall-clock time of all runs.
    pub wall_ms: u64,
    /// Peak resident memory of the process (VmHWM), in KiB.
    pub peak_rss_kb: u64,
}

impl SuiteReport {
    /// An empty report of `suite`, to which runs are added as they end.
    pub fn new(suite: &Suite) -> SuiteReport {
        SuiteReport {
            scenario: suite.kind,
            overlay: suite.overlay.name().to_string(),
            nodes: suite.nodes,
            seed: suite.seed,
            runs: Vec::new(),
            wall_ms: 0,
            peak_rss_kb: 0,
        }
    }

    /// Adds a run's report and updates the totals.
    pub fn push(&mut self, r: Report) {
        self.wall_ms += r.wall_ms;
        self.peak_rss_kb = self.peak_rss_kb.max(r.peak_rss_kb).max(peak_rss_kb());
        self.runs.push(r);
    }

    /// The totals line printed under the table.
    pub fn totals(&self) -> String {
        format!(
            "{} run(s) of {} on the {} overlay at {} nodes (seed {}): wall time {:.1} s, peak \
             memory {:.1} MiB",
            self.runs.len(),
            self.scenario,
            self.overlay,
            self.nodes,
            self.seed,
            self.wall_ms as f64 / 1000.0,
            self.peak_rss_kb as f64 / 1024.0
        )
    }
}

/// Runs every scenario of a suite in order, calling `each` with every report as it is made.
pub fn run_suite(suite: &Suite, mut each: impl FnMut(&Report)) -> Result<SuiteReport, SuiteError> {
    let scenarios = suite.scenarios()?;
    let mut out = SuiteReport::new(suite);
    for s in &scenarios {
        let r = crate::run(s);
        each(&r);
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_input_is_an_error() {
        for k in ScenarioKind::ALL {
            assert_eq!(k.name().parse::<ScenarioKind>(), Ok(k));
        }
        assert!(matches!(
            "meltdown".parse::<ScenarioKind>(),
            Err(SuiteError::UnknownScenario(_))
        ));
        let mut s = Suite::new(ScenarioKind::MassiveFailure, 100);
        assert_eq!(s.scenarios().map(|v| v.len()), Ok(5));
        s.fail = vec![0.5, 1.5];
        assert_eq!(s.scenarios(), Err(SuiteError::Fraction(1.5)));
        s.fail = vec![f64::NAN];
        assert!(matches!(s.scenarios(), Err(SuiteError::Fraction(_))));
        s.fail.clear();
        assert_eq!(s.scenarios(), Err(SuiteError::NoFraction));
        let s = Suite::new(ScenarioKind::Bootstrap, 1);
        assert!(matches!(s.scenarios(), Err(SuiteError::Nodes { .. })));
        let mut s = Suite::new(ScenarioKind::Partition, 10);
        s.periods = 0;
        assert_eq!(s.scenarios(), Err(SuiteError::Periods));
        let mut s = Suite::new(ScenarioKind::Churn, MAX_NODES);
        s.churn = 0.5;
        assert!(matches!(s.scenarios(), Err(SuiteError::Nodes { .. })));
        let mut s = Suite::new(ScenarioKind::Bootstrap, 10);
        s.overlay = SimOverlay::ClientServer {
            servers: 0,
            servers_per_client: 1,
        };
        assert!(matches!(s.scenarios(), Err(SuiteError::Servers { .. })));
        s.overlay = SimOverlay::ClientServer {
            servers: 3,
            servers_per_client: 5,
        };
        assert!(matches!(
            s.scenarios(),
            Err(SuiteError::ServersPerClient { .. })
        ));
        let mut s = Suite::new(ScenarioKind::Bootstrap, MAX_FULL_MESH_NODES + 1);
        s.overlay = SimOverlay::FullMesh;
        assert!(matches!(
            s.scenarios(),
            Err(SuiteError::FullMeshTooLarge(_))
        ));
    }

    #[test]
    fn the_seed_reaches_every_scenario() {
        let mut s = Suite::new(ScenarioKind::MassiveFailure, 100);
        s.seed = 9;
        s.fail = vec![0.25, 0.5];
        let all = s.scenarios().unwrap();
        assert_eq!(all.len(), 2);
        assert!(all.iter().all(|x| x.seed == 9));
        assert_eq!(&*all[0].name, "fail-25%");
    }
}
