//! `psadb serve`: a node with a member of each of its groups and the Redis-protocol front,
//! until interrupted (the `psadb` binary's command, callable from other programs).

use std::net::SocketAddr;
use std::time::Duration;

use maquis::{Config, Node};

use crate::resp::{Front, RespConfig};
use crate::{start_member, Client, ClientSettings, MemberSettings};

/// The arguments of `psadb serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
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

/// Runs a node until SIGINT or SIGTERM: joins the cluster, starts the members, serves RESP,
/// and prints one line (`psadb node NAME listening on …`) on standard output once it answers.
pub async fn serve(s: ServeArgs) -> Result<(), String> {
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
    let server = crate::resp::serve(front, s.resp, RespConfig::default())
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
