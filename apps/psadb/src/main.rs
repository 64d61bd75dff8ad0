//! `psadb`: run a psaDB node: members of its groups, and a Redis-protocol front.
//!
//! ```text
//! psadb serve --name a --listen 127.0.0.1:7101 --resp 127.0.0.1:6391
//! psadb serve --name b --listen 127.0.0.1:7102 --resp 127.0.0.1:6392 --join 127.0.0.1:7101
//! psadb serve --name c --listen 127.0.0.1:7103 --resp 127.0.0.1:6393 --join 127.0.0.1:7101
//! redis-cli -p 6391 HSET user1 name ada
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};
use maquis::{Config, Node};
use maquis_psadb::resp::{Front, RespConfig};
use maquis_psadb::{start_member, Client, ClientSettings, MemberSettings};

#[derive(Parser, Debug)]
#[command(
    name = "psadb",
    version,
    about = "psaDB on Maquis: a key-value store on actor groups, with a Redis front"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node with a member of each of its groups, and serve the Redis protocol until
    /// interrupted.
    Serve(Serve),
}

#[derive(Parser, Debug)]
struct Serve {
    /// Node name, unique in the cluster.
    #[arg(long, default_value = "psadb")]
    name: String,
    /// Address the node listens on for other nodes.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Address of a node of the cluster to join (repeatable); retried until it answers.
    #[arg(long)]
    join: Vec<SocketAddr>,
    /// Cluster secret.
    #[arg(long, default_value = "maquis", env = "PSADB_COOKIE")]
    cookie: String,
    /// Groups the keys are split among (the same on every node), 1 to 1024.
    #[arg(long, default_value_t = 3)]
    groups: u32,
    /// The groups this node has a member of (default: all).
    #[arg(long, value_delimiter = ',')]
    members: Vec<u32>,
    /// How long a new member waits before it takes its snapshot and answers, milliseconds.
    #[arg(long, default_value_t = 3000)]
    settle_ms: u64,
    /// Address of the Redis-protocol front.
    #[arg(long, default_value = "127.0.0.1:6379")]
    resp: SocketAddr,
    /// Optional admin HTTP address (`/status`, `/metrics`).
    #[arg(long)]
    admin: Option<SocketAddr>,
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
                eprintln!("psadb: {e}");
                1
            }
        },
    };
    std::process::exit(code);
}

async fn serve(s: Serve) -> Result<(), String> {
    if !(1..=1024).contains(&s.groups) {
        return Err("--groups is 1 to 1024".into());
    }
    if let Some(g) = s.members.iter().find(|g| **g >= s.groups) {
        return Err(format!(
            "--members names group {g}, but there are {} groups",
            s.groups
        ));
    }
    let mut config = Config::new(&s.name).listen(s.listen).cookie(&s.cookie);
    config.node.admin = s.admin;
    for j in &s.join {
        config = config.peer(*j);
    }
    let node = Node::start(config).await.map_err(|e| e.to_string())?;
    let hosted: Vec<u32> = if s.members.is_empty() {
        (0..s.groups).collect()
    } else {
        s.members.clone()
    };
    let settings = MemberSettings {
        settle: Duration::from_millis(s.settle_ms),
        ..MemberSettings::default()
    };
    for g in &hosted {
        start_member(&node, *g, settings.clone())
            .await
            .map_err(|e| e.to_string())?;
    }
    let client = Client::new(
        &node,
        ClientSettings {
            groups: s.groups,
            ..ClientSettings::default()
        },
    );
    let front = Front::new(&node, client, s.groups);
    let server = maquis_psadb::resp::serve(front, s.resp, RespConfig::default())
        .await
        .map_err(|e| format!("RESP front on {}: {e}", s.resp))?;
    println!(
        "psadb node {} listening on {}, members of groups {:?}, RESP on {}",
        s.name,
        node.addr(),
        hosted,
        server.local_addr()
    );
    maquis::shutdown_signal().await;
    server.stop();
    node.shutdown().await;
    Ok(())
}
