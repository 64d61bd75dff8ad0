//! Helpers shared by the multi-node tests.
#![allow(dead_code)]

pub mod probe;
pub mod raw;
pub mod tls;

use std::future::Future;
use std::time::{Duration, Instant};

use maquis::{Config, MembershipEvent, Node};

/// A test node configuration: fast heartbeats so failures show within a second or two.
pub fn config(name: &str) -> Config {
    let mut c = Config::new(name).cookie("test-cookie");
    c.transport.heartbeat_interval_ms = 200;
    c.transport.heartbeat_timeout_ms = 1500;
    c
}

/// Logs to the test output when `RUST_LOG` is set.
pub fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// A peer-to-peer test node: small views (most pairs are not neighbours), fast shuffles and
/// member heartbeats.
pub fn p2p(name: &str) -> Config {
    let mut c = config(name).overlay(maquis::config::PeerToPeerOptions {
        active_size: 3,
        passive_size: 6,
        shuffle_period_ms: 400,
        ..maquis::config::PeerToPeerOptions::default()
    });
    c.broadcast.member_heartbeat_ms = 250;
    c.broadcast.member_timeout_ms = 2000;
    c
}

pub async fn start(name: &str) -> Node {
    init_tracing();
    Node::start(config(name)).await.expect("node starts")
}

pub async fn start_with(cfg: Config) -> Node {
    init_tracing();
    Node::start(cfg).await.expect("node starts")
}

/// Waits until `cond` holds, re-checking whenever the node reports a membership event (and at
/// least every 20 ms for state that has no event, such as lane counts). Panics after `limit`.
pub async fn until<F, Fut>(what: &str, limit: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if cond().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The names of these nodes.
pub fn names(ids: &[maquis::NodeId]) -> std::collections::BTreeSet<String> {
    ids.iter().map(|n| n.name.to_string()).collect()
}

/// Waits until every node's member list names exactly `want`.
pub async fn all_members(
    nodes: &[&Node],
    want: &std::collections::BTreeSet<String>,
    what: &str,
    limit: Duration,
) {
    until(what, limit, || {
        let ok = nodes.iter().all(|n| names(&n.members()) == *want);
        async move { ok }
    })
    .await;
}

pub fn member_names(n: &Node) -> Vec<String> {
    let mut v: Vec<String> = n
        .members()
        .into_iter()
        .map(|m| m.name.to_string())
        .collect();
    v.sort();
    v
}

/// Waits for a membership event matching `pred` on a subscription.
pub async fn next_event(
    rx: &mut tokio::sync::broadcast::Receiver<MembershipEvent>,
    limit: Duration,
    pred: impl Fn(&MembershipEvent) -> bool,
) -> MembershipEvent {
    tokio::time::timeout(limit, async {
        loop {
            match rx.recv().await {
                Ok(ev) if pred(&ev) => return ev,
                Ok(_) => continue,
                Err(e) => panic!("event stream: {e}"),
            }
        }
    })
    .await
    .expect("event arrives in time")
}

/// Starts `n` full-mesh nodes named `{prefix}{i}`, all joined through the first, and waits until
/// every node sees all of them.
pub async fn cluster(prefix: &str, n: usize, cfg: impl Fn(Config) -> Config) -> Vec<Node> {
    let mut nodes = Vec::new();
    for i in 1..=n {
        nodes.push(start_with(cfg(config(&format!("{prefix}{i}")))).await);
    }
    let contact = nodes[0].addr();
    for node in &nodes[1..] {
        node.join_wait(contact, Duration::from_secs(5))
            .await
            .expect("join");
    }
    let want: Vec<String> = {
        let mut v: Vec<String> = (1..=n).map(|i| format!("{prefix}{i}")).collect();
        v.sort();
        v
    };
    for node in &nodes {
        let want = want.clone();
        until("membership converges", Duration::from_secs(10), || {
            let got = member_names(node);
            let want = want.clone();
            async move { got == want }
        })
        .await;
    }
    nodes
}

/// Waits (up to 10 s) for the next message of a topic subscription.
pub async fn next<M: maquis::Message>(sub: &mut maquis::Subscription<M>) -> M {
    tokio::time::timeout(Duration::from_secs(10), sub.recv())
        .await
        .expect("broadcast arrives in time")
        .expect("node running")
}
