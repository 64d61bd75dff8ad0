//! The cluster the tests run on: nodes with a member of each of three groups.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use maquis::{Config, Node};
use maquis_psadb::member::{ready_name, MemberMsg};
use maquis_psadb::{start_member, ClientSettings, MemberSettings};

pub const T: Duration = Duration::from_secs(15);
pub const GROUPS: u32 = 3;

pub fn config(name: &str) -> Config {
    let mut c = Config::new(name).cookie("psadb-test");
    c.transport.heartbeat_interval_ms = 200;
    c.transport.heartbeat_timeout_ms = 1500;
    c
}

pub fn member_settings() -> MemberSettings {
    MemberSettings {
        settle: Duration::from_millis(300),
        ..MemberSettings::default()
    }
}

pub fn client_settings() -> ClientSettings {
    ClientSettings {
        groups: GROUPS,
        attempt_timeout: Duration::from_millis(300),
        attempts: 40,
    }
}

pub fn b(s: String) -> Bytes {
    Bytes::from(s)
}

pub async fn until<F, Fut>(what: &str, mut cond: F)
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

/// Waits until every node sees `n` ready members in every group.
pub async fn ready_everywhere(nodes: &[&Node], n: usize) {
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

/// A node (joined to `join`) with a member of every group.
pub async fn node_with_members(name: &str, join: Option<&Node>) -> Node {
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
