//! psaDB's Redis-protocol (RESP2) front: `maquis_resp`'s server over a [`Client`] on this
//! node. Strings (`GET`, `SET`, `DEL`, `EXISTS`, `MGET`, `MSET`) and hashes (`HSET`/`HMSET`,
//! `HGET`, `HMGET`, `HGETALL`, `HDEL`: what YCSB's Redis binding uses) and `KEYSFROM` (range
//! scans: every group asked, the answers merged).
//!
//! `DEL` and `HDEL` count what showed a value just before, in the copy of the member that
//! answers for the key (one request); `HSET` counts the fields it wrote (psaDB's writes are
//! blind: a member cannot tell which fields are new before every member has the write).

use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use maquis::Node;
pub use maquis_resp::{RespConfig, RespServer};
use maquis_resp::{Store, StoreError};

use crate::client::{Client, PsadbError};
use crate::member::{group_name, ready_name, MemberMsg};

/// What the RESP front serves: a client on this node.
pub struct Front {
    node: Node,
    client: Client,
    groups: u32,
}

impl Front {
    /// A front for `client`, which runs on `node` and splits keys among `groups`.
    pub fn new(node: &Node, client: Client, groups: u32) -> Self {
        Front {
            node: node.clone(),
            client,
            groups,
        }
    }
}

fn store_err(e: PsadbError) -> StoreError {
    match e {
        PsadbError::WrongType => StoreError::wrong_type(),
        e => StoreError::err(e),
    }
}

impl Store for Front {
    const SERVER_NAME: &'static str = "maquis-psadb";

    fn node_name(&self) -> String {
        self.node.id().name.to_string()
    }

    fn node_addr(&self) -> String {
        self.node.addr().to_string()
    }

    fn stopped(&self) -> bool {
        self.node.is_stopped()
    }

    async fn get(&self, key: Bytes) -> Result<Option<Bytes>, StoreError> {
        self.client.get(&key).await.map_err(store_err)
    }

    async fn set(&self, key: Bytes, value: Bytes) -> Result<(), StoreError> {
        self.client.set(&key, value).await.map_err(store_err)
    }

    async fn del(&self, key: Bytes) -> Result<bool, StoreError> {
        self.client.del(&key).await.map_err(store_err)
    }

    async fn exists(&self, key: Bytes) -> Result<bool, StoreError> {
        self.client.exists(&key).await.map_err(store_err)
    }

    async fn hset(&self, key: Bytes, fields: Vec<(Bytes, Bytes)>) -> Result<i64, StoreError> {
        let n = fields.len() as i64;
        self.client.hset(&key, fields).await.map_err(store_err)?;
        Ok(n)
    }

    async fn hgetall(&self, key: Bytes) -> Result<Vec<(Bytes, Bytes)>, StoreError> {
        self.client.hgetall(&key).await.map_err(store_err)
    }

    async fn hmget(
        &self,
        key: Bytes,
        fields: Vec<Bytes>,
    ) -> Result<Vec<Option<Bytes>>, StoreError> {
        self.client.hmget(&key, fields).await.map_err(store_err)
    }

    async fn hdel(&self, key: Bytes, fields: Vec<Bytes>) -> Result<i64, StoreError> {
        let n = self.client.hdel(&key, fields).await.map_err(store_err)?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }

    async fn keys_from(&self, start: Bytes, count: usize) -> Result<Vec<Bytes>, StoreError> {
        let count = u32::try_from(count).map_err(StoreError::err)?;
        self.client
            .keys_from(&start, count)
            .await
            .map_err(store_err)
    }

    async fn info(&self, section: Option<&str>) -> String {
        let mut out = String::new();
        if !matches!(section, None | Some("psadb")) {
            return out;
        }
        let _ = write!(out, "# psaDB\r\npsadb_groups:{}\r\n", self.groups);
        for g in 0..self.groups {
            let count = |name: String| {
                let node = self.node.clone();
                async move {
                    node.group_members::<MemberMsg>(&name)
                        .await
                        .map(|m| m.len())
                        .unwrap_or(0)
                }
            };
            let members = count(group_name(g)).await;
            let ready = count(ready_name(g)).await;
            let _ = write!(out, "psadb_group_{g}:members={members},ready={ready}\r\n");
        }
        out.push_str("\r\n");
        out
    }
}

/// Binds `addr` and serves the Redis protocol for `front`.
pub async fn serve(
    front: Front,
    addr: SocketAddr,
    config: RespConfig,
) -> std::io::Result<RespServer> {
    maquis_resp::serve(Arc::new(front), addr, config).await
}
