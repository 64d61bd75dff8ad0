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
