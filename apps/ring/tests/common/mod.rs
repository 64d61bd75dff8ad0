//! Helpers shared by the multi-node tests: nodes on 127.0.0.1, fast gossip and heartbeats.
#![allow(dead_code)]

use std::time::Duration;

use maquis::Config;
use maquis_ring::{Ring, RingConfig, RingNode};

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// A node configuration with fast failure detection.
pub fn node_config(name: &str) -> Config {
    let mut c = Config::new(name).cookie("ring-test");
    c.transport.heartbeat_interval_ms = 100;
    c.transport.heartbeat_timeout_ms = 1000;
    c
}

/// A ring configuration with fast gossip.
pub fn ring_config() -> RingConfig {
    RingConfig::default()
        .gossip_interval(Duration::from_millis(40))
        .forward_grace(Duration::from_millis(500))
        .request_timeout(Duration::from_secs(3))
}

/// Starts one ring node.
pub async fn start(name: &str, cfg: RingConfig) -> RingNode {
    init_tracing();
    Ring::start(node_config(name), cfg)
        .await
        .expect("ring node starts")
}

/// Starts `n` nodes named `{prefix}{i}`, joined through the first, and waits until the ring
/// has converged.
pub async fn cluster(prefix: &str, n: usize, cfg: RingConfig) -> Vec<RingNode> {
    let mut nodes = Vec::new();
    for i in 1..=n {
        nodes.push(start(&format!("{prefix}{i}"), cfg.clone()).await);
    }
    let contact = nodes[0].node().addr();
    for node in &nodes[1..] {
        node.join(contact, Duration::from_secs(5))
            .await
            .expect("join");
    }
    converge(&nodes).await;
    nodes
}

/// Waits until every node sees the same settled ring with all of them in it.
pub async fn converge(nodes: &[RingNode]) {
    let want: Vec<String> = {
        let mut v: Vec<String> = nodes.iter().map(|n| n.name().to_string()).collect();
        v.sort();
        v
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    // Every node has one ring version `v` with all of them in it, the ring is settled, and
    // still at `v` afterwards (versions only grow, so the settled ring was `v`; without this
    // check a settled ring from before the last join could pass for the final one).
    let same_full_ring = |v: u64| {
        nodes
            .iter()
            .all(|n| n.ring().nodes == want && n.ring().version == v)
    };
    loop {
        let v = nodes[0].ring().version;
        let ok = same_full_ring(v)
            && nodes[0]
                .wait_converged(Duration::from_millis(200))
                .await
                .is_ok()
            && same_full_ring(v);
        if ok {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no convergence: {:?}",
            nodes[0].check_converged().await
        );
    }
}

/// Stops every node.
pub async fn stop(nodes: &[RingNode]) {
    for n in nodes {
        n.shutdown().await;
    }
}
