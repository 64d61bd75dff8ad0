//! Pipelined requests through a running server: consecutive reads run at once, a write waits
//! for the reads before it, and replies come in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use maquis_resp::{serve, RespConfig, Store, StoreError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Barrier;

/// An in-memory store whose reads of keys starting with `b` wait until three of them are in
/// flight together: served one at a time, they would wait for ever.
struct Gated {
    map: Mutex<HashMap<Bytes, Bytes>>,
    gate: Barrier,
}

impl Store for Gated {
    const SERVER_NAME: &'static str = "gated";

    fn node_name(&self) -> String {
        "gated".into()
    }

    fn node_addr(&self) -> String {
        "127.0.0.1:0".into()
    }

    fn stopped(&self) -> bool {
        false
    }

    async fn get(&self, key: Bytes) -> Result<Option<Bytes>, StoreError> {
        if key.starts_with(b"b") {
            self.gate.wait().await;
        }
        Ok(self.map.lock().unwrap().get(&key).cloned())
    }

    async fn set(&self, key: Bytes, value: Bytes) -> Result<(), StoreError> {
        self.map.lock().unwrap().insert(key, value);
        Ok(())
    }

    async fn del(&self, key: Bytes) -> Result<bool, StoreError> {
        Ok(self.map.lock().unwrap().remove(&key).is_some())
    }

    async fn info(&self, _section: Option<&str>) -> String {
        String::new()
    }
}

fn command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Sends `commands` in one write and reads until `expect` has arrived.
async fn pipeline(addr: std::net::SocketAddr, commands: &[&[&str]], expect: &str) {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let bytes: Vec<u8> = commands.iter().flat_map(|c| command(c)).collect();
    sock.write_all(&bytes).await.unwrap();
    let mut got = Vec::new();
    let read = async {
        while got.len() < expect.len() {
            let mut buf = [0u8; 1024];
            let n = sock.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("no full answer: {:?}", String::from_utf8_lossy(&got)));
    assert_eq!(String::from_utf8_lossy(&got), expect);
}

async fn server() -> maquis_resp::RespServer {
    let store = Gated {
        map: Mutex::new(HashMap::new()),
        gate: Barrier::new(3),
    };
    let addr = "127.0.0.1:0".parse().unwrap();
    serve(Arc::new(store), addr, RespConfig::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn consecutive_pipelined_reads_run_at_once_and_answer_in_order() {
    let s = server().await;
    pipeline(
        s.local_addr(),
        &[
            &["SET", "b2", "two"],
            &["GET", "b1"],
            &["GET", "b2"],
            &["GET", "b3"],
        ],
        "+OK\r\n$-1\r\n$3\r\ntwo\r\n$-1\r\n",
    )
    .await;
    s.stop();
}

#[tokio::test]
async fn a_write_in_a_pipeline_waits_for_the_reads_before_it() {
    let s = server().await;
    pipeline(
        s.local_addr(),
        &[
            &["SET", "k", "1"],
            &["GET", "k"],
            &["EXISTS", "k"],
            &["SET", "k", "2"],
            &["GET", "k"],
            &["DEL", "k"],
            &["GET", "k"],
            &["PING"],
        ],
        "+OK\r\n$1\r\n1\r\n:1\r\n+OK\r\n$1\r\n2\r\n:1\r\n$-1\r\n+PONG\r\n",
    )
    .await;
    s.stop();
}

#[tokio::test]
async fn a_client_reply_after_pipelined_reads_leaves_their_replies_alone() {
    let s = server().await;
    // The two reads run together before `CLIENT REPLY OFF`; the `SKIP` silences only the
    // first, and `OFF` only what follows it.
    pipeline(
        s.local_addr(),
        &[
            &["CLIENT", "REPLY", "SKIP"],
            &["ECHO", "one"],
            &["ECHO", "two"],
            &["CLIENT", "REPLY", "OFF"],
            &["ECHO", "three"],
            &["CLIENT", "REPLY", "ON"],
            &["ECHO", "four"],
        ],
        "$3\r\ntwo\r\n+OK\r\n$4\r\nfour\r\n",
    )
    .await;
    s.stop();
}
