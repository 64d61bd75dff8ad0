//! An overlay written only against the public API (`examples/custom_overlay.rs`), started with
//! `Node::start_with_overlay`: four nodes joined in a line all see each other, a call crosses
//! it, and a node that stops is reported down.

#[path = "../examples/custom_overlay.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use maquis::MembershipEvent;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_overlay_connects_everyone_and_reports_a_stopped_node() {
    let nodes = example::line_of(4, Duration::from_secs(10)).await.unwrap();
    for node in &nodes {
        assert_eq!(node.members().len(), 4, "{:?}", node.members());
        assert_eq!(node.member_count(), 4);
        assert_eq!(node.neighbors().len(), 3);
    }
    // The first and the last node never joined each other, yet they talk directly.
    let rtt = maquis::echo::echo_once(
        &nodes[0],
        "intro3",
        bytes::Bytes::from_static(b"hi"),
        Duration::from_secs(5),
        &maquis::SendOpts::default(),
    )
    .await;
    assert!(rtt.is_ok(), "{rtt:?}");
    let mut events = nodes[0].subscribe();
    let gone = nodes[3].id().clone();
    nodes[3].shutdown().await;
    let down = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(MembershipEvent::Down(n)) = events.recv().await {
                if n == gone {
                    return;
                }
            }
        }
    })
    .await;
    assert!(down.is_ok(), "no Down event for {gone}");
    assert_eq!(nodes[0].members().len(), 3);
    assert_eq!(nodes[0].member_count(), 3);
    for node in &nodes[..3] {
        node.shutdown().await;
    }
}
