//! The `maquis` command: run a node, inspect one, ping through one, run the demo, emulate
//! links, simulate the overlay. The benchmarks are a binary of their own, `maquis-bench`
//! (`crates/maquis-bench`).

mod actop_cmd;
mod demo;
mod node_cmd;
mod sim_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Maquis: a distributed actor runtime.
#[derive(Parser, Debug)]
#[command(name = "maquis", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node in the foreground (Ctrl-C or SIGTERM leaves the cluster and exits).
    Node(node_cmd::NodeArgs),
    /// Print a node's status (members, peers, lanes) from its admin endpoint.
    Status {
        /// The node's admin address (HOST:PORT).
        admin: String,
        /// Print the raw JSON document instead of a table.
        #[arg(long)]
        json: bool,
        /// The endpoint's token, if it has one (node.admin_token).
        #[arg(long, env = "MAQUIS_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Make a node call the `echo` service of another node and report round-trip times.
    Ping {
        /// The admin address (HOST:PORT) of the node that sends.
        admin: String,
        /// The name of the node to ping.
        #[arg(long)]
        to: String,
        /// How many calls.
        #[arg(long, default_value_t = 10)]
        count: u32,
        /// Payload bytes per call.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// The endpoint's token, if it has one (node.admin_token).
        #[arg(long, env = "MAQUIS_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Start a local 3-node cluster and compare one connection against parallel lanes with
    /// affinity on an echo workload.
    Demo(demo::DemoArgs),
    /// The userspace link emulator: hosts in network namespaces joined by a delaying wire.
    Netem {
        /// What to do.
        #[command(subcommand)]
        cmd: maquis_netem::NetemCommand,
    },
    /// Simulate a cluster (every node's membership machine, on any overlay) and print what
    /// it measured.
    Sim(sim_cmd::SimArgs),
    /// Run ActOp's pairwise partitioning (the code the nodes run) on a graph of games and
    /// players and print how the remote share of traffic falls, round by round.
    SimActop(actop_cmd::ActopArgs),
}

fn main() -> ExitCode {
    maquis::tune_allocator();
    let cli = Cli::parse();
    maquis_cli::init_tracing();
    maquis_cli::block_on(async move {
        match cli.command {
            Command::Node(args) => node_cmd::run(args).await,
            Command::Status { admin, json, token } => status(&admin, token.as_deref(), json).await,
            Command::Ping {
                admin,
                to,
                count,
                size,
                token,
            } => ping(&admin, token.as_deref(), &to, count, size).await,
            Command::Demo(args) => demo::run(args).await,
            Command::Sim(args) => sim_cmd::run(args).await,
            Command::SimActop(args) => actop_cmd::run(args).await,
            Command::Netem { cmd } => {
                match tokio::task::spawn_blocking(move || maquis_netem::run(cmd)).await {
                    Ok(Ok(())) => ExitCode::SUCCESS,
                    Ok(Err(e)) => {
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
        }
    })
}

async fn status(admin: &str, token: Option<&str>, json: bool) -> ExitCode {
    match maquis::admin::client::get_status(admin, token).await {
        Ok(st) => {
            if json {
                match serde_json::to_string_pretty(&st) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("error: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", st.render_table());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn ping(admin: &str, token: Option<&str>, to: &str, count: u32, size: usize) -> ExitCode {
    match maquis::admin::client::ping(admin, token, to, count, size).await {
        Ok(r) => {
            println!(
                "ping {} x{} ({} bytes): {} ok, {} failed; p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
                r.to,
                r.count,
                r.size,
                r.ok,
                r.failed,
                r.p50_us as f64 / 1000.0,
                r.p99_us as f64 / 1000.0,
                r.max_us as f64 / 1000.0
            );
            for e in &r.errors {
                println!("  error: {e}");
            }
            if r.failed == 0 && r.ok == r.count {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
