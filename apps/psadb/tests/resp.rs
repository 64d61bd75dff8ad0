//! psaDB's Redis front with a real Redis client: strings, hashes (what YCSB's Redis binding
//! sends), counts, the kinds kept apart, range scans (`KEYSFROM`), `INFO`.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use maquis_psadb::resp::{serve, Front, RespConfig};
use maquis_psadb::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_client_stores_strings_and_hashes() {
    let a = node_with_members("ra", None).await;
    let bn = node_with_members("rb", Some(&a)).await;
    let c = node_with_members("rc", Some(&a)).await;
    ready_everywhere(&[&a, &bn, &c], 3).await;
    let front = Front::new(&bn, Client::new(&bn, client_settings()), GROUPS);
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = serve(front, addr, RespConfig::default()).await.unwrap();
    let addr = server.local_addr();
    tokio::task::spawn_blocking(move || {
        let client = redis::Client::open(format!("redis://{addr}/")).unwrap();
        let mut r = client
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        let () = redis::cmd("SET").arg("k").arg("v").query(&mut r).unwrap();
        let v: Option<String> = redis::cmd("GET").arg("k").query(&mut r).unwrap();
        assert_eq!(v.as_deref(), Some("v"));
        let n: i64 = redis::cmd("HSET")
            .arg("user1")
            .arg("field0")
            .arg("a")
            .arg("field1")
            .arg("b")
            .query(&mut r)
            .unwrap();
        assert_eq!(n, 2);
        let () = redis::cmd("HMSET")
            .arg("user1")
            .arg("field1")
            .arg("c")
            .query(&mut r)
            .unwrap();
        let all: Vec<String> = redis::cmd("HGETALL").arg("user1").query(&mut r).unwrap();
        assert_eq!(all, ["field0", "a", "field1", "c"]);
        let one: Option<String> = redis::cmd("HGET")
            .arg("user1")
            .arg("field1")
            .query(&mut r)
            .unwrap();
        assert_eq!(one.as_deref(), Some("c"));
        let some: Vec<Option<String>> = redis::cmd("HMGET")
            .arg("user1")
            .arg("field0")
            .arg("nope")
            .query(&mut r)
            .unwrap();
        assert_eq!(some, [Some("a".to_string()), None]);
        let gone: i64 = redis::cmd("HDEL")
            .arg("user1")
            .arg("field0")
            .arg("nope")
            .query(&mut r)
            .unwrap();
        assert_eq!(gone, 1);
        let twice: i64 = redis::cmd("HDEL")
            .arg("user1")
            .arg("field1")
            .arg("field1")
            .query(&mut r)
            .unwrap();
        assert_eq!(twice, 1, "a field named twice counts once");
        // Back to one field, for what follows.
        let _: i64 = redis::cmd("HSET")
            .arg("user1")
            .arg("field1")
            .arg("c")
            .query(&mut r)
            .unwrap();
        let wrong: redis::RedisResult<Option<String>> =
            redis::cmd("GET").arg("user1").query(&mut r);
        let e = wrong.unwrap_err();
        assert_eq!(e.code(), Some("WRONGTYPE"), "{e}");
        let exists: i64 = redis::cmd("EXISTS")
            .arg("k")
            .arg("user1")
            .arg("nope")
            .query(&mut r)
            .unwrap();
        assert_eq!(exists, 2);
        let deleted: i64 = redis::cmd("DEL")
            .arg("k")
            .arg("nope")
            .query(&mut r)
            .unwrap();
        assert_eq!(deleted, 1);
        // A range scan over every group: 30 keys spread among the three groups.
        let mut pairs = Vec::new();
        for i in 0..30 {
            pairs.push(format!("scan{i:02}"));
            pairs.push(format!("v{i}"));
        }
        let () = redis::cmd("MSET").arg(&pairs).query(&mut r).unwrap();
        let keys: Vec<String> = redis::cmd("KEYSFROM")
            .arg("scan05")
            .arg(10)
            .query(&mut r)
            .unwrap();
        let want: Vec<String> = (5..15).map(|i| format!("scan{i:02}")).collect();
        assert_eq!(keys, want);
        let tail: Vec<String> = redis::cmd("KEYSFROM")
            .arg("scan25")
            .arg(100)
            .query(&mut r)
            .unwrap();
        assert_eq!(
            tail,
            ["scan25", "scan26", "scan27", "scan28", "scan29", "user1"]
        );
        let bad: redis::RedisResult<Vec<String>> =
            redis::cmd("KEYSFROM").arg("a").arg("many").query(&mut r);
        assert!(bad.is_err());
        let info: String = redis::cmd("INFO").arg("psadb").query(&mut r).unwrap();
        assert!(
            info.contains("psadb_groups:3") && info.contains("psadb_group_0:members=3,ready=3"),
            "{info}"
        );
    })
    .await
    .unwrap();
    server.stop();
    for n in [a, bn, c] {
        n.shutdown().await;
    }
}
