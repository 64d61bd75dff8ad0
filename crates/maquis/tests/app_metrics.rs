//! An application's numbers in the node's `/status` and `/metrics`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use maquis::admin::{render_metrics, AppMetrics, MAX_METRICS_SOURCES};

struct Things(u64);

impl AppMetrics for Things {
    fn collect(&self, counters: &mut BTreeMap<String, u64>, gauges: &mut BTreeMap<String, u64>) {
        counters.insert("app_things".into(), self.0);
        gauges.insert("app_queue".into(), 7);
        // The node's own names keep the node's values.
        gauges.insert("actors".into(), 999_999);
    }
}

#[tokio::test]
async fn an_applications_numbers_are_shown_beside_the_nodes() {
    let node = start("appm").await;
    node.add_metrics(Arc::new(Things(5))).unwrap();
    let status = node.status();
    assert_eq!(status.counters.get("app_things"), Some(&5));
    assert_eq!(status.gauges.get("app_queue"), Some(&7));
    assert_ne!(status.gauges.get("actors"), Some(&999_999));
    let text = render_metrics(&status);
    assert!(text.contains("maquis_app_things_total 5"), "{text}");
    assert!(text.contains("maquis_app_queue 7"), "{text}");
    // Bounded: the sources beyond the limit are refused.
    for i in 1..MAX_METRICS_SOURCES {
        node.add_metrics(Arc::new(Things(i as u64))).unwrap();
    }
    assert!(node.add_metrics(Arc::new(Things(0))).is_err());
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_byte_totals_outlive_its_peers() {
    let nodes = cluster("bt", 2, |c| c).await;
    let sent = |n: &maquis::Node| n.status().counters["bytes_sent"];
    let peer = nodes[1].id().name.to_string();
    let payload = bytes::Bytes::from(vec![1u8; 64 * 1024]);
    for _ in 0..4 {
        maquis::echo::echo_once(
            &nodes[0],
            &peer,
            payload.clone(),
            std::time::Duration::from_secs(5),
            &maquis::SendOpts::default(),
        )
        .await
        .expect("echoed");
    }
    // A writer counts its bytes once its write returns, which may be after the echo came
    // back (the peer read them meanwhile): the counts get there a moment later.
    until(
        "the echoes' bytes counted on both ends",
        std::time::Duration::from_secs(10),
        || async {
            sent(&nodes[0]) >= 4 * 64 * 1024
                && nodes[1].status().counters["bytes_received"] >= 4 * 64 * 1024
        },
    )
    .await;
    let before = sent(&nodes[0]);
    // The peer goes: its lanes with it, their bytes stay counted.
    nodes[1].shutdown().await;
    // (Its lanes are dropped once their tasks end: the totals come back to at least what
    // they were then, and stay.)
    until(
        "the peer gone, its bytes still counted",
        std::time::Duration::from_secs(10),
        || async { nodes[0].status().peers.is_empty() && sent(&nodes[0]) >= before },
    )
    .await;
    nodes[0].shutdown().await;
}
