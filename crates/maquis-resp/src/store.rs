//! What a store gives the RESP front: its keys and what `INFO` shows of it.

use std::future::Future;

use bytes::Bytes;

/// Why a store could not do a command: the error line the client gets (without the `-`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

impl StoreError {
    /// An `ERR …` error.
    pub fn err(msg: impl std::fmt::Display) -> Self {
        StoreError(format!("ERR {msg}"))
    }

    /// Redis's `WRONGTYPE` error: the key holds the other kind of value.
    pub fn wrong_type() -> Self {
        StoreError("WRONGTYPE Operation against a key holding the wrong kind of value".into())
    }

    fn no_hashes() -> Self {
        StoreError::err("this store keeps no hashes")
    }
}

/// A key-value store served by [`crate::serve`]. Strings are required; hashes (`HSET` and
/// friends) are optional: a store without them answers those commands with an error.
pub trait Store: Send + Sync + 'static {
    /// `server_name` in `INFO`.
    const SERVER_NAME: &'static str;

    /// This node's name (`INFO server`).
    fn node_name(&self) -> String;

    /// This node's address (`INFO server`).
    fn node_addr(&self) -> String;

    /// Whether the store's node stopped: the server then stops too.
    fn stopped(&self) -> bool;

    /// `GET`.
    fn get(&self, key: Bytes) -> impl Future<Output = Result<Option<Bytes>, StoreError>> + Send;

    /// `SET key value`.
    fn set(&self, key: Bytes, value: Bytes) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// `DEL` of one key: whether it held a value (what `DEL` counts).
    fn del(&self, key: Bytes) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// `EXISTS` of one key.
    fn exists(&self, key: Bytes) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async move { self.get(key).await.map(|v| v.is_some()) }
    }

    /// `HSET key field value …`: how many fields it counts as written.
    fn hset(
        &self,
        key: Bytes,
        fields: Vec<(Bytes, Bytes)>,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send {
        let _ = (key, fields);
        async { Err(StoreError::no_hashes()) }
    }

    /// `HGETALL`.
    fn hgetall(
        &self,
        key: Bytes,
    ) -> impl Future<Output = Result<Vec<(Bytes, Bytes)>, StoreError>> + Send {
        let _ = key;
        async { Err(StoreError::no_hashes()) }
    }

    /// `HMGET key field …` (and `HGET`).
    fn hmget(
        &self,
        key: Bytes,
        fields: Vec<Bytes>,
    ) -> impl Future<Output = Result<Vec<Option<Bytes>>, StoreError>> + Send {
        let _ = (key, fields);
        async { Err(StoreError::no_hashes()) }
    }

    /// `HDEL key field …`: how many fields it counts as deleted.
    fn hdel(
        &self,
        key: Bytes,
        fields: Vec<Bytes>,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send {
        let _ = (key, fields);
        async { Err(StoreError::no_hashes()) }
    }

    /// `KEYSFROM start count`: the keys showing a value, in byte order, from `start` on, at
    /// most `count` (at most [`crate::MAX_KEYSFROM`]: the command refuses more). Optional: a
    /// store that keeps no key order answers with an error.
    fn keys_from(
        &self,
        start: Bytes,
        count: usize,
    ) -> impl Future<Output = Result<Vec<Bytes>, StoreError>> + Send {
        let _ = (start, count);
        async {
            Err(StoreError::err(
                "this store keeps no key order: KEYSFROM is not supported",
            ))
        }
    }

    /// Lines (`name:value\r\n`) the store adds to `INFO stats`.
    fn info_stats(&self) -> String {
        String::new()
    }

    /// The store's own `INFO` sections (with their `# Title` lines), when `section` names one
    /// of them or is `None` (all).
    fn info(&self, section: Option<&str>) -> impl Future<Output = String> + Send;
}
