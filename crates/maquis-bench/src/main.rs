//! `maquis-bench`: the benchmarks of Maquis, each against baselines measured in the same run,
//! reproducing the experiments of the PARTISAN paper. It is a tool of the project, not part of
//! the product: the `maquis` binary (`crates/maquis-cli`) does not contain it and does not
//! depend on the ring application (`apps/ring`) that the `echo` and `kvs` benchmarks run.
//!
//! Build it with `cargo build --release -p maquis-bench` (it is `target/release/maquis-bench`)
//! or run it through cargo from the workspace root:
//!
//! ```text
//! cargo run --release -p maquis-bench -- micro [--quick] [--echo] [--out bench/results/micro] …
//! cargo run --release -p maquis-bench -- echo [--quick] [--out bench/results/echo] …
//! cargo run --release -p maquis-bench -- kvs [--quick] [--redis] [--faults] [--out bench/results/kvs] …
//! cargo run --release -p maquis-bench -- clients [--clients 1024] [--procs 4] …
//! cargo run --release -p maquis-bench -- debench [--quick] [--sizes 10,40,100] …
//! cargo run --release -p maquis-bench -- local [--quick] [--out bench/results/local] …
//! ```
//!
//! - `micro` (PARTISAN Fig. 1–4, [`micro`]): closed-loop actor pairs between two emulated hosts,
//!   against Distributed Erlang ([`erlang`]) and raw TCP ([`rawtcp`]).
//! - `echo` and `kvs` (Fig. 5–8, [`ring_bench`]): the echo service and the quorum key-value
//!   store of a 3-node `maquis-ring` cluster in three emulated hosts, one connection per peer
//!   against parallel lanes with affinity; `kvs --redis` adds `redis-benchmark` ([`ring_redis`]),
//!   `kvs --faults` crash-restarts under load ([`ring_faults`], checked by [`ring_check`]).
//! - `clients` (Fig. 9, [`clients`]): the memory of a client-server overlay server as 1,024
//!   clients join and push state faster than it takes it; loopback only.
//! - `debench` (DE-Bench Fig. 5–13, [`debench`]): the worker loop of DE-Bench on 10–100-node
//!   clusters on loopback ([`debench_agent`]), against Distributed Erlang in the same run.
//! - `local` ([`local`]): messaging between actors on one node, each cell in its own process
//!   ([`local_cell`]), against actix, ractor and kameo ([`local_peers`]) and a bare tokio channel.
//!
//! `micro`, `echo` and `kvs` need root (the link emulator, `maquis netem`, makes network
//! namespaces); `clients`, `debench` and `local` do not. Each writes `results.json`, `report.md` and plots into its
//! `--out` directory (by default under `bench/results/`, relative to the working directory);
//! `--help` after a benchmark's name lists its options.
//!
//! The drivers start the other side of each measurement as child processes of this same binary
//! (`std::env::current_exe()`), through the hidden `maquis-bench agent …` subcommands
//! ([`commands::AgentCommand`]); those are not meant to be run by hand. Ctrl-C or SIGTERM during a run
//! stops the children and deletes the emulated hosts ([`teardown`]).

pub mod actop_agent;
pub mod actop_bench;
pub mod adcounter_bench;
pub mod adcounter_host;
pub mod agent;
pub mod certs;
pub mod clients;
pub mod clients_agent;
pub mod commands;
pub mod debench;
pub mod debench_agent;
pub mod debench_hist;
pub mod debench_report;
pub mod erlang;
pub mod heartbeat;
pub mod install;
pub mod local;
pub mod local_cell;
pub mod local_peers;
pub mod micro;
pub mod micro_report;
pub mod plot;
pub mod rawtcp;
pub mod ring_agent;
pub mod ring_bench;
pub mod ring_check;
pub mod ring_faults;
pub mod ring_proc;
pub mod ring_redis;
pub mod ring_report;
pub mod stats;
pub mod teardown;
pub mod ycsb_bench;
pub mod ycsb_report;

use std::process::ExitCode;

use clap::Parser;

use commands::BenchCommand;

/// Benchmarks of Maquis, each against baselines measured in the same run (not part of the
/// product).
#[derive(Parser, Debug)]
#[command(name = "maquis-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: BenchCommand,
}

fn main() -> ExitCode {
    maquis::tune_allocator();
    let cli = Cli::parse();
    maquis_cli::init_tracing();
    maquis_cli::block_on(commands::run(cli.command))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The drivers start `current_exe() agent ROLE …`; every role they name must exist.
    #[test]
    fn every_agent_role_the_drivers_start_exists() {
        for role in [
            "micro-server",
            "micro-client",
            "raw-server",
            "raw-client",
            "ring-node",
            "cs-server",
            "cs-clients",
            "debench-nodes",
            "local-cell",
            "heartbeat-server",
            "adcounter-host",
            "halo-node",
            "psadb-node",
        ] {
            let e = Cli::try_parse_from(["maquis-bench", "agent", role, "--help"]).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp,
                "agent {role}"
            );
        }
    }
}
