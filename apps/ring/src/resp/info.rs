//! The `INFO` text.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::ServerState;

/// The Redis version reported to clients (they use it to pick features).
pub const REDIS_VERSION: &str = "7.0.0";

/// Renders `INFO` (all sections, or one of `server`, `clients`, `stats`, `ring`).
pub(crate) async fn render(state: &ServerState, section: Option<&str>) -> String {
    let want = |s: &str| {
        matches!(
            section,
            None | Some("all") | Some("everything") | Some("default")
        ) || section == Some(s)
    };
    let ring = &state.ring;
    let mut out = String::new();
    if want("server") {
        let _ = write!(
            out,
            "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:standalone\r\nserver_name:maquis-ring\r\nmaquis_ring_version:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\nuptime_in_seconds:{}\r\nnode_name:{}\r\nnode_addr:{}\r\n\r\n",
            env!("CARGO_PKG_VERSION"),
            std::process::id(),
            state.addr.port(),
            state.started.elapsed().as_secs(),
            ring.name(),
            ring.node().addr(),
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
        let s = ring.stats();
        let _ = write!(
            out,
            "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\nrejected_connections:{}\r\nevicted_idle_clients:{}\r\nclosed_idle_clients:{}\r\nclosed_buffer_limit_clients:{}\r\nring_reads:{}\r\nring_writes:{}\r\nring_echoes:{}\r\nring_read_repairs:{}\r\n\r\n",
            state.connections.load(Ordering::Relaxed),
            state.commands.load(Ordering::Relaxed),
            state.closed.refused.load(Ordering::Relaxed),
            state.closed.evicted.load(Ordering::Relaxed),
            state.closed.idle.load(Ordering::Relaxed),
            state.closed.buffer.load(Ordering::Relaxed),
            s.reads.get(),
            s.writes.get(),
            s.echoes.get(),
            s.read_repairs.get(),
        );
    }
    if want("ring") {
        let cfg = ring.config();
        let r = ring.ring();
        let _ = write!(
            out,
            "# Ring\r\nring_partitions:{}\r\nring_version:{}\r\nring_claimant:{}\r\nring_nodes:{}\r\nring_members:{}\r\nring_pending_transfers:{}\r\nring_leaving:{}\r\nn_val:{}\r\nr:{}\r\nw:{}\r\nstorage_delay_ms:{}\r\n",
            r.partitions,
            r.version,
            r.claimant,
            r.nodes.join(","),
            ring.node().members().len(),
            r.pending_transfers(),
            r.leaving.join(","),
            cfg.n_val,
            cfg.r,
            cfg.w,
            cfg.storage_delay.as_millis(),
        );
        if let Ok(st) = ring.status().await {
            let _ = write!(
                out,
                "ring_owned_partitions:{}\r\nring_local_vnodes:{}\r\nring_local_keys:{}\r\nring_local_bytes:{}\r\nring_handoffs:{}\r\nring_fallback_keys:{}\r\nring_recovering_vnodes:{}\r\n",
                st.owned, st.vnodes, st.keys, st.bytes, st.handoffs, st.stray_keys, st.recovering
            );
        }
        let s = ring.stats();
        let _ = write!(
            out,
            "aae_exchanges:{}\r\naae_in_sync:{}\r\naae_errors:{}\r\naae_objects_repaired:{}\r\naae_vnodes_recovered:{}\r\n",
            s.aae_exchanges.get(),
            s.aae_in_sync.get(),
            s.aae_errors.get(),
            s.aae_objects.get(),
            s.aae_recovered.get(),
        );
        let (backend, st) = ring.storage_stats();
        let _ = write!(
            out,
            "storage:{backend}\r\nstorage_commits:{}\r\nstorage_objects_written:{}\r\nstorage_partitions_cleared:{}\r\nstorage_errors:{}\r\nstorage_corrupt_objects:{}\r\nstorage_commit_ms:{}\r\nstorage_replayed_records:{}\r\nstorage_checkpoints:{}\r\n",
            st.commits,
            st.objects,
            st.clears,
            st.errors,
            st.corrupt,
            st.commit_us / 1000,
            st.replayed,
            st.checkpoints,
        );
        out.push_str("\r\n");
    }
    out
}
