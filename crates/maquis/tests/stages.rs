//! Stage sizing in running nodes: with `services.stage_interval_ms` set, a node measures its
//! receive, execute and send stages under traffic, sizes them by the queueing model and shows
//! it in `/status`, while every call is still answered.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use maquis::echo::echo_once;
use maquis::SendOpts;

fn gauge(node: &maquis::Node, name: &str) -> Option<u64> {
    node.status().gauges.get(name).copied()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_size_their_stages_from_what_they_measure() {
    let nodes = cluster("sz", 2, |mut c| {
        c.services.stage_interval_ms = 100;
        c
    })
    .await;
    // Off by default: no stage gauges.
    let plain = start("sz-plain").await;
    assert_eq!(gauge(&plain, "stage_threads_execute"), None);
    plain.shutdown().await;

    let to = nodes[1].id().name.to_string();
    let payload = Bytes::from(vec![7u8; 512]);
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Calls until the stages that do the work have been measured.
    until(
        "the working stages measured",
        Duration::from_secs(20),
        || {
            let nodes = nodes.clone();
            let payload = payload.clone();
            let to = to.clone();
            let answered = answered.clone();
            async move {
                for _ in 0..200 {
                    echo_once(
                        &nodes[0],
                        &to,
                        payload.clone(),
                        Duration::from_secs(5),
                        &SendOpts::default(),
                    )
                    .await
                    .expect("answered");
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let busy = |n: &maquis::Node, s: &str| {
                    gauge(n, &format!("stage_busy_milli_{s}")).unwrap_or(0) > 0
                };
                // The caller's replies arrive in its receive stage; the echo node receives the
                // requests and its echo actor answers them in the execute stage. (Small frames that
                // find room on their lane are written by their sender, in the sender's stage: the
                // send stage's writers carry only the rest, maybe nothing here.)
                busy(&nodes[0], "receive")
                    && busy(&nodes[1], "receive")
                    && busy(&nodes[1], "execute")
            }
        },
    )
    .await;
    assert!(answered.load(std::sync::atomic::Ordering::Relaxed) >= 200);
    assert!(nodes
        .iter()
        .any(|n| gauge(n, "stage_resizes").unwrap_or(0) > 0));
    for n in &nodes {
        for s in ["receive", "execute", "send"] {
            let t = gauge(n, &format!("stage_threads_{s}")).expect("sized");
            assert!((1..=2).contains(&t), "{s}: {t} threads of 2 workers");
        }
    }
    for n in nodes {
        n.shutdown().await;
    }
}
