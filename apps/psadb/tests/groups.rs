//! psaDB on running nodes: three groups, a member of each on each of three nodes; every write
//! acknowledged is read back, from any node, after a node leaves in the middle of a stream of
//! writes; a member that joins late answers only once it holds the group's keys.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use maquis::{Config, Node};
use maquis_psadb::member::{ready_name, MemberMsg};
use maquis_psadb::{start_member, Client, ClientSettings, MemberSettings, PsadbError};

const T: Duration = Duration::from_secs(15);
const GROUPS: u32 = 3;

fn config(name: &str) -> Config {
    let mut c = Config::new(name).cookie("psadb-test");
    c.transport.heartbeat_interval_ms = 200;
    c.transport.heartbeat_timeout_ms = 1500;
    c
}

fn member_settings() -> MemberSettings {
    MemberSettings {
        settle: Duration::from_millis(300),
        ..MemberSettings::default()
    }
}

fn client_settings() -> ClientSettings {
    ClientSettings {
        groups: GROUPS,
        attempt_timeout: Duration::from_millis(300),
        attempts: 40,
    }
}

fn b(s: String) -> Bytes {
    Bytes::from(s)
}

async fn until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + T;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ready_everywhere(nodes: &[&Node], n: usize) {
    for node in nodes {
        for g in 0..GROUPS {
            until(
                &format!("{} sees {n} ready in group {g}", node.id().name),
                || async {
                    node.group_members::<MemberMsg>(&ready_name(g))
                        .await
                        .map(|m| m.len() == n)
                        .unwrap_or(false)
                },
            )
            .await;
        }
    }
}

async fn node_with_members(name: &str, join: Option<&Node>) -> Node {
    let node = Node::start(config(name)).await.expect("node starts");
    if let Some(first) = join {
        node.join_wait(first.addr(), T).await.expect("joins");
    }
    for g in 0..GROUPS {
        start_member(&node, g, member_settings())
            .await
            .expect("member starts");
    }
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_writes_survive_a_node_leaving_mid_stream_and_late_members_catch_up() {
    let a = node_with_members("pa", None).await;
    let bn = node_with_members("pb", Some(&a)).await;
    let c = node_with_members("pc", Some(&a)).await;
    ready_everywhere(&[&a, &bn, &c], 3).await;

    let client = Client::new(&a, client_settings());
    // Strings and hashes, and the kinds kept apart.
    let h = b("user1".into());
    client
        .hset(
            &h,
            vec![
                (b("f0".into()), b("x".into())),
                (b("f1".into()), b("y".into())),
            ],
        )
        .await
        .unwrap();
    assert_eq!(client.hgetall(&h).await.unwrap().len(), 2);
    assert_eq!(client.get(&h).await, Err(PsadbError::WrongType));
    assert_eq!(
        client
            .hmget(&h, vec![b("f1".into()), b("zz".into())])
            .await
            .unwrap(),
        vec![Some(b("y".into())), None]
    );

    // A stream of writes from node a while node c leaves; every acknowledged one is kept.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let (client, done) = (client.clone(), done.clone());
        tokio::spawn(async move {
            let mut acked: BTreeMap<Bytes, Bytes> = BTreeMap::new();
            for i in 0..600u32 {
                let (k, v) = (b(format!("k{}", i % 200)), b(format!("v{i}")));
                match client.set(&k, v.clone()).await {
                    Ok(()) => {
                        acked.insert(k, v);
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Err(e) => panic!("write {i} failed: {e}"),
                }
            }
            acked
        })
    };
    until("100 writes acknowledged", || async {
        assert!(!writer.is_finished(), "the writer stopped early");
        done.load(std::sync::atomic::Ordering::Relaxed) >= 100
    })
    .await;
    c.shutdown().await;
    let acked = writer.await.unwrap();
    assert_eq!(acked.len(), 200);
    ready_everywhere(&[&a, &bn], 2).await;
    let reader = Client::new(&bn, client_settings());
    for (k, v) in &acked {
        assert_eq!(reader.get(k).await.unwrap().as_ref(), Some(v), "{k:?}");
    }
    client.del(&b("k0".into())).await.unwrap();
    assert!(!reader.exists(&b("k0".into())).await.unwrap());

    // A node that joins late: once its members are ready, they answer for their share with
    // everything the group held.
    let d = node_with_members("pd", Some(&a)).await;
    ready_everywhere(&[&a, &bn, &d], 3).await;
    let late = Client::new(&d, client_settings());
    for (k, v) in acked.iter().skip(1) {
        assert_eq!(
            late.get(k).await.unwrap().as_ref(),
            Some(v),
            "{k:?} after the join"
        );
    }
    for n in [a, bn, d] {
        n.shutdown().await;
    }
}
