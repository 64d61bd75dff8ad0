//! The ring store's Redis-protocol (RESP2) front: `maquis_resp`'s server over a [`RingNode`]
//! (strings only: `GET`, `SET`, `DEL`, `EXISTS`, `MGET`, `MSET`; see `maquis_resp` for the
//! commands, the bounds and how connections are closed).

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
pub use maquis_resp::{parser, reply, Limits, RespConfig, RespServer, Store, StoreError};

use crate::error::RingError;
use crate::node::RingNode;

fn store_err(e: RingError) -> StoreError {
    StoreError::err(e)
}

impl Store for RingNode {
    const SERVER_NAME: &'static str = "maquis-ring";

    fn node_name(&self) -> String {
        self.name().to_string()
    }

    fn node_addr(&self) -> String {
        self.node().addr().to_string()
    }

    fn stopped(&self) -> bool {
        self.node().is_stopped()
    }

    async fn get(&self, key: Bytes) -> Result<Option<Bytes>, StoreError> {
        RingNode::get(self, &key).await.map_err(store_err)
    }

    async fn set(&self, key: Bytes, value: Bytes) -> Result<(), StoreError> {
        self.put(&key, value).await.map_err(store_err)
    }

    async fn del(&self, key: Bytes) -> Result<bool, StoreError> {
        self.delete(&key).await.map_err(store_err)
    }

    fn info_stats(&self) -> String {
        let s = self.stats();
        format!(
            "ring_reads:{}\r\nring_writes:{}\r\nring_echoes:{}\r\nring_read_repairs:{}\r\n",
            s.reads.get(),
            s.writes.get(),
            s.echoes.get(),
            s.read_repairs.get(),
        )
    }

    async fn info(&self, section: Option<&str>) -> String {
        let mut out = String::new();
        if !matches!(section, None | Some("ring")) {
            return out;
        }
        let cfg = self.config();
        let r = self.ring();
        let _ = write!(
            out,
            "# Ring\r\nring_partitions:{}\r\nring_version:{}\r\nring_claimant:{}\r\nring_nodes:{}\r\nring_members:{}\r\nring_pending_transfers:{}\r\nring_leaving:{}\r\nn_val:{}\r\nr:{}\r\nw:{}\r\nstorage_delay_ms:{}\r\n",
            r.partitions,
            r.version,
            r.claimant,
            r.nodes.join(","),
            self.node().members().len(),
            r.pending_transfers(),
            r.leaving.join(","),
            cfg.n_val,
            cfg.r,
            cfg.w,
            cfg.storage_delay.as_millis(),
        );
        if let Ok(st) = self.status().await {
            let _ = write!(
                out,
                "ring_owned_partitions:{}\r\nring_local_vnodes:{}\r\nring_local_keys:{}\r\nring_local_bytes:{}\r\nring_handoffs:{}\r\nring_fallback_keys:{}\r\nring_recovering_vnodes:{}\r\n",
                st.owned, st.vnodes, st.keys, st.bytes, st.handoffs, st.stray_keys, st.recovering
            );
        }
        let s = self.stats();
        let _ = write!(
            out,
            "aae_exchanges:{}\r\naae_in_sync:{}\r\naae_errors:{}\r\naae_objects_repaired:{}\r\naae_vnodes_recovered:{}\r\n",
            s.aae_exchanges.get(),
            s.aae_in_sync.get(),
            s.aae_errors.get(),
            s.aae_objects.get(),
            s.aae_recovered.get(),
        );
        let (backend, st) = self.storage_stats();
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
        out
    }
}

/// Binds `addr` and serves the Redis protocol for `ring`.
pub async fn serve(
    ring: RingNode,
    addr: SocketAddr,
    config: RespConfig,
) -> Result<RespServer, RingError> {
    Ok(maquis_resp::serve(Arc::new(ring), addr, config).await?)
}
