//! `maquis sim`: runs the membership machine of every node (peer-to-peer, client-server or
//! full-mesh overlay) in the deterministic simulator and prints what it measured, as a table
//! or as JSON.

use std::process::ExitCode;

use clap::Args;
use maquis_sim::{
    run_suite, Report, ScenarioKind, SimOverlay, Suite, SuiteError, SuiteReport, Traffic,
};

/// The options of `maquis sim`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct SimArgs {
    /// Nodes in the bootstrap.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// The overlay: peer-to-peer, client-server or full-mesh.
    #[arg(long, default_value = "peer-to-peer", value_parser = ["peer-to-peer", "client-server", "full-mesh"])]
    pub overlay: String,
    /// Client-server: how many of the nodes are servers (the first ones).
    #[arg(long, default_value_t = 1)]
    pub servers: usize,
    /// Client-server: how many servers each client attaches to.
    #[arg(long, default_value_t = 1)]
    pub servers_per_client: usize,
    /// Peer-to-peer: the member-heartbeat period in milliseconds (default: 1 s per 20 nodes,
    /// at least 1 s).
    #[arg(long)]
    pub member_heartbeat_ms: Option<u64>,
    /// Peer-to-peer: how long a node accused of being down is suspected before it is declared
    /// down, in milliseconds (`broadcast.suspicion_ms`; 0: no accusations, a crashed node goes
    /// when its heartbeats are overdue).
    #[arg(long, default_value_t = 1000)]
    pub suspicion_ms: u64,
    /// Messages routed at the end, between random live nodes (0: no routing phase).
    #[arg(long, default_value_t = 1000)]
    pub routed: usize,
    /// What happens once the overlay is built: bootstrap, massive-failure, churn, partition.
    #[arg(long, default_value = "massive-failure", value_parser = parse_kind)]
    pub scenario: ScenarioKind,
    /// Massive failure: the fractions of the nodes that crash at once, one run each.
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.4,0.6,0.8,0.9")]
    pub fail: Vec<f64>,
    /// Churn: the fraction of the nodes replaced every shuffle period.
    #[arg(long, default_value_t = 0.02)]
    pub churn: f64,
    /// Churn and partition: how many shuffle periods the fault lasts (default 10 for churn,
    /// 5 for a partition).
    #[arg(long)]
    pub periods: Option<u32>,
    /// Seed of every random choice: the same command prints the same metrics.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_kind(s: &str) -> Result<ScenarioKind, SuiteError> {
    s.parse()
}

impl SimArgs {
    /// The suite these options describe.
    pub fn suite(&self) -> Suite {
        let mut suite = Suite::new(self.scenario, self.nodes);
        suite.seed = self.seed;
        suite.fail = self.fail.clone();
        suite.churn = self.churn;
        if let Some(p) = self.periods {
            suite.periods = p;
        }
        suite.overlay = match self.overlay.as_str() {
            "client-server" => SimOverlay::ClientServer {
                servers: self.servers,
                servers_per_client: self.servers_per_client,
            },
            "full-mesh" => SimOverlay::FullMesh,
            _ => SimOverlay::PeerToPeer,
        };
        suite.member_heartbeat = self
            .member_heartbeat_ms
            .map(std::time::Duration::from_millis);
        suite.routed_sends = self.routed;
        suite.suspicion = std::time::Duration::from_millis(self.suspicion_ms);
        suite
    }
}

/// Runs the simulation on a blocking thread and prints its report.
pub async fn run(args: SimArgs) -> ExitCode {
    match tokio::task::spawn_blocking(move || simulate(&args)).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(args: &SimArgs) -> ExitCode {
    let suite = args.suite();
    if let Err(e) = suite.scenarios() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    if !args.json {
        println!("{}", Report::header());
    }
    let json = args.json;
    let result = run_suite(&suite, |r| {
        tracing::info!(run = %r.name, wall_ms = r.wall_ms, "simulated");
        if !json {
            println!("{r}");
        }
    });
    match result {
        Ok(report) => print_report(&report, json),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_report(report: &SuiteReport, json: bool) -> ExitCode {
    if !json {
        println!();
        println!("Messages by kind:");
        println!();
        println!("{}", Traffic::header());
        for r in &report.runs {
            println!("{}", r.traffic.row(&r.name));
        }
        println!();
        println!("{}", report.totals());
        return ExitCode::SUCCESS;
    }
    match serde_json::to_string_pretty(report) {
        Ok(s) => {
            println!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
