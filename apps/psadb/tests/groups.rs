//! psaDB on running nodes: three groups, a member of each on each of three nodes; every write
//! acknowledged is read back, from any node, after a node leaves in the middle of a stream of
//! writes; a member that joins late answers only once it holds the group's keys.

mod common;

use std::collections::BTreeMap;

use bytes::Bytes;
use common::*;
use maquis_psadb::{Client, PsadbError};

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
    assert!(
        client.del(&b("k0".into())).await.unwrap(),
        "k0 held a value"
    );
    assert!(!reader.exists(&b("k0".into())).await.unwrap());
    assert!(
        !client.del(&b("k0".into())).await.unwrap(),
        "nothing left to delete"
    );

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
