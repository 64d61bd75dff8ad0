//! The `INFO` text.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::ServerState;
use crate::store::Store;

/// The Redis version reported to clients (they use it to pick features).
pub const REDIS_VERSION: &str = "7.0.0";

/// Renders `INFO` (all sections, or one of `server`, `clients`, `stats`, or the store's own).
pub(crate) async fn render<S: Store>(state: &ServerState<S>, section: Option<&str>) -> String {
    let all = matches!(
        section,
        None | Some("all") | Some("everything") | Some("default")
    );
    let want = |s: &str| all || section == Some(s);
    let store = &state.store;
    let mut out = String::new();
    if want("server") {
        let _ = write!(
            out,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:standalone\r\nserver_name:{}\r\nmaquis_version:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nnode_name:{}\r\nnode_addr:{}\r\n\r\n",
            S::SERVER_NAME,
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            state.addr.port(),
            state.started.elapsed().as_secs(),
            store.node_name(),
            store.node_addr(),
        );
    }
    if want("clients") {
        let _ = write!(
            out,
            "# Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\nclients_buffered_bytes:{}\r\nmax_buffered_bytes:{}\r\n\r\n",
            state.clients.load(Ordering::Relaxed),
            state.config.max_clients,
            state.buffered.load(Ordering::Relaxed),
            state.config.max_buffered,
        );
    }
    if want("stats") {
        let _ = write!(
            out,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nevicted_idle_clients:{}\r\nclosed_idle_clients:{}\r\nclosed_buffer_limit_clients:{}\r\n{}\r\n",
            state.connections.load(Ordering::Relaxed),
            state.commands.load(Ordering::Relaxed),
            state.closed.refused.load(Ordering::Relaxed),
            state.closed.evicted.load(Ordering::Relaxed),
            state.closed.idle.load(Ordering::Relaxed),
            state.closed.buffer.load(Ordering::Relaxed),
            store.info_stats(),
        );
    }
    out.push_str(&store.info(if all { None } else { section }).await);
    out
}
