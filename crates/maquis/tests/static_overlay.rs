//! The static overlay: connections only to configured peers and to nodes that joined explicitly.

mod common;

use std::time::Duration;

use common::*;
use maquis::{MembershipEvent, OverlayKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_peers_connect_fail_and_come_back() {
    let n2 = start_with(config("st2").overlay(OverlayKind::Static)).await;
    let n3 = start_with(config("st3").overlay(OverlayKind::Static)).await;
    let n2_addr = n2.addr();
    let n1 = start_with(
        config("st1")
            .overlay(OverlayKind::Static)
            .peer(n2.addr())
            .peer(n3.addr()),
    )
    .await;
    until("st1 connects to both", Duration::from_secs(10), || {
        let m = member_names(&n1);
        async move { m == ["st1", "st2", "st3"] }
    })
    .await;
    // No gossip: st2 and st3 know st1 only.
    until("st2 sees st1", Duration::from_secs(5), || {
        let m = member_names(&n2);
        async move { m == ["st1", "st2"] }
    })
    .await;
    assert_eq!(member_names(&n3), vec!["st1", "st3"]);
    assert!(n2.lanes_connected("st3").is_empty());

    // st2 dies: st1 reports it down; st2 restarts on the same address and st1 re-dials it.
    let mut events = n1.subscribe();
    n2.shutdown().await;
    next_event(
        &mut events,
        Duration::from_secs(5),
        |e| matches!(e, MembershipEvent::Down(n) if &*n.name == "st2"),
    )
    .await;
    assert_eq!(member_names(&n1), vec!["st1", "st3"]);
    let n2b = start_with(config("st2").overlay(OverlayKind::Static).listen(n2_addr)).await;
    let back = next_event(
        &mut events,
        Duration::from_secs(10),
        |e| matches!(e, MembershipEvent::Up(n) if &*n.name == "st2"),
    )
    .await;
    assert_eq!(
        back,
        MembershipEvent::Up(n2b.id().clone()),
        "the new incarnation is the member"
    );

    // A clean leave is reported as Left, and st1 stops re-dialing it.
    n3.leave().await;
    next_event(
        &mut events,
        Duration::from_secs(5),
        |e| matches!(e, MembershipEvent::Left(n) if &*n.name == "st3"),
    )
    .await;
    assert_eq!(member_names(&n1), vec!["st1", "st2"]);
    for n in [n1, n2b, n3] {
        n.shutdown().await;
    }
}
