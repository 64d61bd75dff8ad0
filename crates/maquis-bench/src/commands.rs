//! The commands of `maquis-bench`: the benchmarks, and the hidden agents their drivers start.

use std::process::ExitCode;

use clap::Subcommand;

use crate::{
    actop_agent, actop_bench, adcounter_bench, adcounter_host, agent, clients, clients_agent,
    debench, debench_agent, heartbeat, local, local_cell, micro, rawtcp, ring_agent, ring_bench,
    teardown, ycsb_bench,
};

/// Benchmark commands.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// PARTISAN Fig. 1–4: closed-loop actor pairs over an emulated link, against Distributed
    /// Erlang and raw TCP (needs root for the link emulator).
    Micro(micro::MicroArgs),
    /// PARTISAN Fig. 5–6: the echo service of a 3-node ring (`maquis-ring`), one connection
    /// per peer against parallel lanes with affinity, over an emulated link (needs root).
    Echo(ring_bench::EchoArgs),
    /// PARTISAN Fig. 7–8: the quorum key-value store of a 3-node ring, the same two
    /// configurations (needs root); `--redis` adds redis-benchmark against `ring serve --resp`.
    Kvs(ring_bench::KvsArgs),
    /// PARTISAN Fig. 9's failure: the memory of a client-server overlay server (its own
    /// process) as 1,024 clients join and then push state faster than it takes it (loopback,
    /// no root needed).
    Clients(clients::ClientsArgs),
    /// DE-Bench (Fig. 5–13): spawn, RPC, server calls, global and local names from every node
    /// of 10–100-node clusters on loopback, Maquis (full mesh, peer-to-peer) against
    /// Distributed Erlang.
    Debench(debench::DebenchArgs),
    /// Messaging between actors on one node (one to one, many to one, calls, idle-actor
    /// memory), against actix, ractor, kameo and a bare tokio channel (no root needed).
    Local(local::LocalArgs),
    /// ActOp Fig. 10–11: Halo Presence with games and players as virtual actors on nodes in
    /// this process, random placement against ActOp's partitioning (no root needed).
    Actop(actop_bench::ActopArgs),
    /// ActOp's Heartbeat benchmark (§6.2): one server, stage sizing by the queueing model
    /// against the default.
    Heartbeat(heartbeat::HeartbeatArgs),
    /// PARTISAN's advertisement counter (§6.3, Fig. 9): 32 to 1,024 nodes, client-server and
    /// peer-to-peer.
    Adcounter(adcounter_bench::AdcounterArgs),
    /// psaDB's Table 1: YCSB (its real workload generator, through the Redis protocol)
    /// workloads A–E against psaDB (3 groups × 3 members), the ring store and a real
    /// redis-server, plus a kill -9 of a psaDB node counting lost acknowledged writes
    /// (loopback, no root needed; installs Java, Maven and redis-server when missing).
    Ycsb(ycsb_bench::YcsbArgs),
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
    /// Ring node that also generates the echo or key-value load.
    RingNode(ring_agent::RingNodeArgs),
    /// Client-server overlay server with a slow sink actor.
    CsServer(clients_agent::CsServerArgs),
    /// Many client nodes in one process, pushing state to the server.
    CsClients(clients_agent::CsClientsArgs),
    /// Several DE-Bench nodes in one process, running the worker loop on `go`.
    DebenchNodes(debench_agent::DebenchNodesArgs),
    /// One cell of `local` (one system, one workload) in a process of its own.
    LocalCell(local_cell::LocalCellArgs),
    /// The Heartbeat benchmark's server: heartbeat actors, stages sized or not.
    HeartbeatServer(heartbeat::HeartbeatServerArgs),
    /// A range of the advertisement counter's nodes, each with its replica.
    AdcounterHost(adcounter_host::AdcounterHostArgs),
    /// A psaDB node (`psadb serve`): members of its groups and the Redis front.
    PsadbNode(maquis_psadb::serve::ServeArgs),
    /// A Halo Presence node of `maquis-bench actop`: players, games and its share of the clients.
    HaloNode(actop_agent::HaloNodeArgs),
}

/// Where a `--quick` run writes when `--out` is left at the full run's directory: under
/// `target/` (not in the tree), so that a short run does not replace the committed full one.
fn quick_out(out: &mut std::path::PathBuf, quick: bool, name: &str) {
    if quick && *out == std::path::Path::new("bench/results").join(name) {
        *out = quick_dir(name);
    }
}

/// The directory of a `--quick` run of `name` without `--out`.
pub fn quick_dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new("target/bench-quick").join(name)
}

/// Runs a benchmark command.
pub async fn run(cmd: BenchCommand) -> ExitCode {
    if !matches!(cmd, BenchCommand::Agent(_)) {
        if let Err(e) = teardown::install() {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    let r = match cmd {
        BenchCommand::Micro(mut args) => {
            quick_out(&mut args.out, args.quick, "micro");
            tokio::task::spawn_blocking(move || micro::run(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Echo(args) => {
            tokio::task::spawn_blocking(move || ring_bench::run_echo(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Kvs(args) => {
            tokio::task::spawn_blocking(move || ring_bench::run_kvs(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Clients(args) => tokio::task::spawn_blocking(move || clients::run(&args))
            .await
            .unwrap_or_else(|e| Err(e.to_string())),
        BenchCommand::Debench(mut args) => {
            quick_out(&mut args.out, args.quick, "debench");
            tokio::task::spawn_blocking(move || debench::run(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Local(mut args) => {
            quick_out(&mut args.out, args.quick, "local");
            tokio::task::spawn_blocking(move || local::run(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Adcounter(mut args) => {
            quick_out(&mut args.out, args.quick, "adcounter");
            tokio::task::spawn_blocking(move || adcounter_bench::run(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Heartbeat(mut args) => {
            quick_out(&mut args.out, args.quick, "heartbeat");
            tokio::task::spawn_blocking(move || heartbeat::run(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Actop(mut args) => {
            quick_out(&mut args.out, args.quick, "actop");
            tokio::task::spawn_blocking(move || actop_bench::run(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Ycsb(mut args) => {
            quick_out(&mut args.out, args.quick, "ycsb");
            tokio::task::spawn_blocking(move || ycsb_bench::run(&args).map(|_| ()))
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
        }
        BenchCommand::Agent(a) => match a {
            AgentCommand::MicroServer(x) => agent::server(x).await,
            AgentCommand::MicroClient(x) => agent::client(x).await,
            AgentCommand::RawServer(x) => rawtcp::server(x).await,
            AgentCommand::RawClient(x) => rawtcp::client(x).await,
            AgentCommand::RingNode(x) => ring_agent::ring_node(x).await,
            AgentCommand::CsServer(x) => clients_agent::server(x).await,
            AgentCommand::CsClients(x) => clients_agent::clients(x).await,
            AgentCommand::DebenchNodes(x) => debench_agent::debench_nodes(x).await,
            AgentCommand::HeartbeatServer(x) => heartbeat::server(x).await,
            AgentCommand::AdcounterHost(x) => adcounter_host::host(x).await,
            AgentCommand::HaloNode(x) => actop_agent::node(x).await,
            AgentCommand::PsadbNode(x) => maquis_psadb::serve::serve(x).await,
            AgentCommand::LocalCell(x) => tokio::task::spawn_blocking(move || local_cell::run(&x))
                .await
                .unwrap_or_else(|e| Err(e.to_string())),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn quick_runs_without_out_stay_out_of_the_committed_results() {
        let mut out = PathBuf::from("bench/results/local");
        quick_out(&mut out, true, "local");
        assert_eq!(out, PathBuf::from("target/bench-quick/local"));
        // A full run keeps its directory, and so does a quick run told where to write.
        let mut full = PathBuf::from("bench/results/local");
        quick_out(&mut full, false, "local");
        assert_eq!(full, PathBuf::from("bench/results/local"));
        let mut chosen = PathBuf::from("bench/results/micro-quick");
        quick_out(&mut chosen, true, "micro");
        assert_eq!(chosen, PathBuf::from("bench/results/micro-quick"));
    }
}
