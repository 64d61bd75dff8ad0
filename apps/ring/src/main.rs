//! `ring`: run a ring node with a Redis-protocol front.
//!
//! ```text
//! ring serve --name n1 --listen 127.0.0.1:7001 --resp 127.0.0.1:6381
//! ring serve --name n2 --listen 127.0.0.1:7002 --resp 127.0.0.1:6382 --join 127.0.0.1:7001
//! redis-cli -p 6381 SET k v
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};
use maquis::Config;
use maquis_ring::{RespConfig, Ring, RingConfig, StorageConfig};

#[derive(Parser, Debug)]
#[command(
    name = "ring",
    version,
    about = "A Riak-Core-style ring on Maquis, with a Redis front"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node and serve the Redis protocol until interrupted (Ctrl-C leaves the cluster
    /// cleanly, handing the node's partitions off; a second Ctrl-C exits at once).
    Serve(Serve),
}

#[derive(Parser, Debug)]
struct Serve {
    /// Node name, unique in the cluster.
    #[arg(long, default_value = "ring")]
    name: String,
    /// Address the node listens on for other nodes.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Address of a node of the cluster to join (repeatable); retried until it answers.
    #[arg(long)]
    join: Vec<SocketAddr>,
    /// Cluster secret.
    #[arg(long, default_value = "maquis", env = "RING_COOKIE")]
    cookie: String,
    /// Partitions of the ring (same on every node), 1 to 1024.
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// Simulated storage delay of every vnode read and write, in milliseconds.
    #[arg(long, default_value_t = 0)]
    storage_delay_ms: u64,
    /// Lanes per peer and channel.
    #[arg(long, default_value_t = 1)]
    parallelism: u16,
    /// Affinity (on/off): pick lanes by (sender, receiver) for sends without a partition key.
    #[arg(long, default_value = "on", value_parser = parse_switch, action = clap::ArgAction::Set)]
    affinity: bool,
    /// Address of the Redis-protocol front.
    #[arg(long, default_value = "127.0.0.1:6379")]
    resp: SocketAddr,
    /// Optional admin HTTP address (`/status`, `/metrics`).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// Ring gossip period, in milliseconds.
    #[arg(long, default_value_t = 200)]
    gossip_ms: u64,
    /// How long a clean leave may take (handoff), in seconds.
    #[arg(long, default_value_t = 60)]
    leave_timeout_s: u64,
    /// Keep the node's data in this directory (a redb database; created if missing), so that
    /// it survives a restart; without it the data lives in memory only.
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
}

fn parse_switch(v: &str) -> Result<bool, String> {
    maquis::config::parse_switch(v).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() {
    maquis::tune_allocator();
    maquis::init_logging("info");
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Serve(s) => match serve(s).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("ring: {e}");
                1
            }
        },
    };
    std::process::exit(code);
}

async fn serve(s: Serve) -> Result<(), maquis_ring::RingError> {
    let mut config = Config::new(&s.name)
        .listen(s.listen)
        .cookie(&s.cookie)
        .parallelism(s.parallelism)
        .affinity(s.affinity);
    config.node.admin = s.admin;
    for j in &s.join {
        config = config.peer(*j);
    }
    let ring_config = RingConfig::default()
        .partitions(s.partitions)
        .storage_delay(Duration::from_millis(s.storage_delay_ms))
        .gossip_interval(Duration::from_millis(s.gossip_ms.max(1)))
        .storage(match s.data_dir {
            Some(dir) => StorageConfig::Durable(dir),
            None => StorageConfig::Memory,
        });
    let node = Ring::start(config, ring_config).await?;
    let server = node.serve_resp(s.resp, RespConfig::default()).await?;
    println!(
        "ring node {} listening on {}, RESP on {}",
        node.name(),
        node.node().addr(),
        server.local_addr()
    );
    maquis::shutdown_signal().await;
    eprintln!("ring: leaving the cluster (handing partitions off; Ctrl-C again to quit now)");
    server.stop();
    tokio::select! {
        r = node.leave(Duration::from_secs(s.leave_timeout_s)) => r,
        _ = maquis::shutdown_signal() => {
            node.shutdown().await;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_take_on_and_off() {
        let serve = |args: &[&str]| {
            Cli::try_parse_from(["ring", "serve", "--name", "a"].iter().chain(args))
                .map(|cli| match cli.command {
                    Command::Serve(s) => s.affinity,
                })
                .map_err(|e| e.kind())
        };
        assert_eq!(serve(&[]), Ok(true));
        assert_eq!(serve(&["--affinity", "off"]), Ok(false));
        assert_eq!(serve(&["--affinity=on"]), Ok(true));
        assert!(serve(&["--affinity", "maybe"]).is_err());
    }
}
