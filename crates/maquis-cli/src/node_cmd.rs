//! `maquis node`: one node in the foreground.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use maquis::config::{parse_channels, parse_switch, ClientServerOptions, OverlayConfig};
use maquis::overlay::Role;
use maquis::{Config, Node, OverlayKind};

/// Options of `maquis node`; each overrides the config file and the `MAQUIS_*` environment.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The node's name.
    #[arg(long)]
    name: Option<String>,
    /// Address to listen on (port 0 picks a free one; the address is printed).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Address for the admin HTTP endpoint (/status, /metrics, /ping).
    #[arg(long)]
    admin: Option<SocketAddr>,
    /// A node to join (repeatable). With the static overlay, these are the fixed peers.
    #[arg(long = "join")]
    join: Vec<SocketAddr>,
    /// The cluster secret.
    #[arg(long)]
    cookie: Option<String>,
    /// static, full-mesh, peer-to-peer or client-server.
    #[arg(long)]
    overlay: Option<OverlayKind>,
    /// Client-server overlay: server or client.
    #[arg(long)]
    role: Option<Role>,
    /// Client-server overlay: how many servers a client connects to.
    #[arg(long)]
    servers_per_client: Option<usize>,
    /// Named channels, comma separated, each optionally with its own parallelism (`vnode:16`).
    #[arg(long)]
    channels: Option<String>,
    /// Lanes per peer per channel.
    #[arg(long)]
    parallelism: Option<u16>,
    /// on or off.
    #[arg(long)]
    affinity: Option<String>,
    /// A TOML configuration file.
    #[arg(long)]
    config: Option<PathBuf>,
}

fn build_config(a: &NodeArgs) -> Result<Config, String> {
    let base = match &a.config {
        Some(path) => Config::from_file(path).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    let mut c = base.apply_env().map_err(|e| e.to_string())?;
    if let Some(v) = &a.name {
        c.node.name = v.clone();
    }
    if let Some(v) = a.listen {
        c.node.listen = v;
    }
    if let Some(v) = a.admin {
        c.node.admin = Some(v);
    }
    if !a.join.is_empty() {
        c.node.peers = a.join.clone();
    }
    if let Some(v) = &a.cookie {
        c.node.cookie = v.clone();
    }
    if let Some(v) = a.overlay {
        c.overlay.switch_to(v);
    }
    if let Some(v) = a.role {
        client_server(&mut c, "--role")?.role = v;
    }
    if let Some(v) = a.servers_per_client {
        client_server(&mut c, "--servers-per-client")?.servers_per_client = v;
    }
    if let Some(v) = &a.channels {
        c.transport.channels = parse_channels(v).map_err(|e| e.to_string())?;
    }
    if let Some(v) = a.parallelism {
        c.transport.parallelism = v;
    }
    if let Some(v) = &a.affinity {
        c.transport.affinity = parse_switch(v).map_err(|e| e.to_string())?;
    }
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

/// The client-server options that `flag` sets; an error if the overlay is another one.
fn client_server<'a>(c: &'a mut Config, flag: &str) -> Result<&'a mut ClientServerOptions, String> {
    let kind = c.overlay.kind();
    c.overlay.client_server_mut().ok_or_else(|| {
        format!(
            "{flag} is an option of the client-server overlay, but the overlay is {kind} (add \
             --overlay client-server)"
        )
    })
}

pub async fn run(args: NodeArgs) -> ExitCode {
    let config = match build_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let node = match Node::start(config).await {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let overlay = match &node.config().overlay {
        OverlayConfig::ClientServer(o) => format!("client-server, {}", o.role),
        other => other.kind().to_string(),
    };
    println!(
        "node {} listening on {} (incarnation {}, overlay {overlay})",
        node.id().name,
        node.addr(),
        node.id().incarnation,
    );
    if let Some(a) = node.admin_addr() {
        println!("admin on http://{a}");
    }
    let mut events = node.subscribe();
    let printer = tokio::spawn(async move {
        while let Ok(ev) = events.recv().await {
            println!("{ev:?}");
        }
    });
    maquis::shutdown_signal().await;
    println!("leaving");
    node.leave().await;
    node.shutdown().await;
    printer.abort();
    ExitCode::SUCCESS
}
