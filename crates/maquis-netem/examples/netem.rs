//! Stand-alone front end for the `netem` subcommands, until they are mounted
//! in the `maquis` binary: `cargo run --example netem -- up --hosts 2 --rtt 20ms`.

use clap::Parser;
use maquis_netem::NetemCommand;

/// Userspace link emulator.
#[derive(Debug, Parser)]
#[command(name = "netem")]
struct Cli {
    #[command(subcommand)]
    cmd: NetemCommand,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Err(e) = maquis_netem::run(cli.cmd) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
