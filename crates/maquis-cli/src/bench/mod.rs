//! `maquis bench …`: benchmarks against baselines measured in the same run.

pub mod agent;
pub mod erlang;
pub mod micro;
pub mod micro_report;
pub mod procs;
pub mod rawtcp;
pub mod stats;

use std::process::ExitCode;

use clap::Subcommand;

/// Benchmark commands.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// PARTISAN Fig. 1–4: closed-loop actor pairs over an emulated link, against Distributed
    /// Erlang and raw TCP (needs root for the link emulator).
    Micro(micro::MicroArgs),
    /// Internal: one side of a benchmark, started by the benchmark driver inside an emulated host.
    #[command(subcommand, hide = true)]
    Agent(AgentCommand),
}

/// The roles a benchmark driver starts.
#[derive(Subcommand, Debug)]
pub enum AgentCommand {
    /// Maquis node hosting partner actors.
    MicroServer(agent::ServerArgs),
    /// Maquis node whose actors send to the partners and wait for each acknowledgement.
    MicroClient(agent::ClientArgs),
    /// Plain TCP echo server.
    RawServer(rawtcp::RawServerArgs),
    /// Plain TCP client over several connections.
    RawClient(rawtcp::RawClientArgs),
}

/// Runs a benchmark command.
pub async fn run(cmd: BenchCommand) -> ExitCode {
    let r = match cmd {
        BenchCommand::Micro(args) => {
            tokio::task::spawn_blocking(move || micro::run(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Agent(a) => match a {
            AgentCommand::MicroServer(x) => agent::server(x).await,
            AgentCommand::MicroClient(x) => agent::client(x).await,
            AgentCommand::RawServer(x) => rawtcp::server(x).await,
            AgentCommand::RawClient(x) => rawtcp::client(x).await,
        },
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
