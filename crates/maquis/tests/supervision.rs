//! Supervisors (restart strategies, intensity, subtrees, ordered shutdown) and links (local,
//! remote, a node going down).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use maquis::supervisor::{self, ChildSpec, Restart, Strategy, SupervisorSpec};
use maquis::{ActorRef, DownReason, LinkError, Node, ReplyTo};
use serde::{Deserialize, Serialize};

const LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, Serialize, Deserialize)]
enum Work {
    /// Panics with this message.
    Crash(String),
    /// Ends normally.
    Quit,
    /// Answers with the actor's id.
    Who(ReplyTo<u64>),
    /// Never answers: waits forever holding the request.
    Hang(ReplyTo<u64>),
}

/// Records the order in which workers end (their future is dropped or returns).
type Log = Arc<Mutex<Vec<String>>>;

struct OnEnd(String, Log);
impl Drop for OnEnd {
    fn drop(&mut self) {
        self.1.lock().unwrap().push(self.0.clone());
    }
}

fn worker(node: &Node, tag: &str, log: &Log) -> ActorRef<Work> {
    let end = OnEnd(tag.to_string(), log.clone());
    node.spawn_fn(move |mut inbox| async move {
        let _end = end;
        let me = inbox.myself().id().unwrap();
        while let Some(m) = inbox.recv().await {
            match m {
                Work::Crash(why) => panic!("{why}"),
                Work::Quit => return,
                Work::Who(r) => {
                    let _ = r.send(me).await;
                }
                Work::Hang(_held) => std::future::pending::<()>().await,
            }
        }
    })
}

fn child(id: &str, log: &Log) -> ChildSpec {
    let (tag, log) = (id.to_string(), log.clone());
    ChildSpec::new(id, move |node: &Node| worker(node, &tag, &log)).register_as(id)
}

/// The actor ids of a supervisor's children, in order (`None`: down).
async fn ids(sup: &ActorRef<supervisor::SupervisorMsg>) -> Vec<Option<u64>> {
    supervisor::children(sup, LIMIT)
        .await
        .expect("supervisor answers")
        .into_iter()
        .map(|c| c.actor)
        .collect()
}

async fn who(node: &Node, name: &str) -> u64 {
    let r: ActorRef<Work> = node.whereis(name).expect("registered");
    r.call(Work::Who, LIMIT).await.expect("answers")
}

/// Waits until the supervisor has restarted its children `restarts` times in all.
async fn wait_restarts(sup: &ActorRef<supervisor::SupervisorMsg>, restarts: u32) {
    until("children restarted", LIMIT, || async {
        let c = supervisor::children(sup, LIMIT).await.unwrap();
        c.iter().map(|c| c.restarts).sum::<u32>() >= restarts && c.iter().all(|c| c.actor.is_some())
    })
    .await;
}

fn crash(node: &Node, name: &str) {
    let r: ActorRef<Work> = node.whereis(name).expect("registered");
    r.try_send(Work::Crash(format!("{name} fails"))).unwrap();
}

#[tokio::test]
async fn one_for_one_restarts_the_child_that_panicked_and_no_other() {
    let node = start("sup1").await;
    let log = Log::default();
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .child(child("a", &log))
        .child(child("b", &log));
    let sup = node.supervise(spec).unwrap();
    let before = ids(&sup).await;
    let old_b = node.whereis::<Work>("b").unwrap();
    let watch_b = node.monitor(&old_b);
    crash(&node, "b");
    assert_eq!(
        tokio::time::timeout(LIMIT, watch_b).await.unwrap(),
        DownReason::Panicked("b fails".into())
    );
    wait_restarts(&sup, 1).await;
    let after = ids(&sup).await;
    assert_eq!(after[0], before[0], "a untouched");
    assert_ne!(after[1], before[1], "b is a new actor");
    assert_eq!(
        Some(who(&node, "b").await),
        after[1],
        "the name reaches the new b"
    );
    assert_eq!(*log.lock().unwrap(), vec!["b".to_string()]);
    node.shutdown().await;
}

#[tokio::test]
async fn one_for_all_restarts_every_child() {
    let node = start("sup2").await;
    let log = Log::default();
    let spec = SupervisorSpec::new(Strategy::OneForAll)
        .child(child("a", &log))
        .child(child("b", &log))
        .child(child("c", &log));
    let sup = node.supervise(spec).unwrap();
    let before = ids(&sup).await;
    let watch_a = node.monitor(&node.whereis::<Work>("a").unwrap());
    crash(&node, "b");
    assert_eq!(
        tokio::time::timeout(LIMIT, watch_a).await.unwrap(),
        DownReason::Shutdown,
        "a is stopped by the supervisor"
    );
    wait_restarts(&sup, 3).await;
    let after = ids(&sup).await;
    for i in 0..3 {
        assert_ne!(after[i], before[i], "child {i} restarted");
    }
    // b went down first; then the others, last started first.
    assert_eq!(*log.lock().unwrap(), vec!["b", "c", "a"]);
    node.shutdown().await;
}

#[tokio::test]
async fn rest_for_one_restarts_the_child_and_those_after_it() {
    let node = start("sup3").await;
    let log = Log::default();
    let spec = SupervisorSpec::new(Strategy::RestForOne)
        .child(child("a", &log))
        .child(child("b", &log))
        .child(child("c", &log))
        .child(child("d", &log));
    let sup = node.supervise(spec).unwrap();
    let before = ids(&sup).await;
    crash(&node, "b");
    wait_restarts(&sup, 3).await;
    let after = ids(&sup).await;
    assert_eq!(after[0], before[0], "a untouched");
    for i in 1..4 {
        assert_ne!(after[i], before[i], "child {i} restarted");
    }
    assert_eq!(*log.lock().unwrap(), vec!["b", "d", "c"]);
    node.shutdown().await;
}

#[tokio::test]
async fn exceeding_the_intensity_stops_the_supervisor_and_its_children() {
    let node = start("sup4").await;
    let log = Log::default();
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .intensity(2, Duration::from_secs(60))
        .child(child("a", &log))
        .child(child("b", &log));
    let sup = node.supervise(spec).unwrap();
    let watch_sup = node.monitor(&sup);
    for round in 1..=2 {
        crash(&node, "b");
        wait_restarts(&sup, round).await;
    }
    crash(&node, "b");
    match tokio::time::timeout(LIMIT, watch_sup).await.unwrap() {
        DownReason::Failed(why) => assert!(why.contains("more than 2 restarts"), "{why}"),
        other => panic!("the supervisor ends with Failed, not {other:?}"),
    }
    assert!(node.whereis::<Work>("a").is_none(), "a was stopped");
    assert!(node.whereis::<Work>("b").is_none());
    assert_eq!(log.lock().unwrap().last().map(String::as_str), Some("a"));
    node.shutdown().await;
}

#[tokio::test]
async fn transient_and_temporary_children() {
    let node = start("sup5").await;
    let log = Log::default();
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .child(child("t", &log).restart(Restart::Transient))
        .child(child("tmp", &log).restart(Restart::Temporary));
    let sup = node.supervise(spec).unwrap();
    // A transient child that ends normally stays down.
    let t = node.whereis::<Work>("t").unwrap();
    let watch = node.monitor(&t);
    t.send(Work::Quit).await.unwrap();
    assert_eq!(
        tokio::time::timeout(LIMIT, watch).await.unwrap(),
        DownReason::Stopped
    );
    // A temporary one stays down even after a panic.
    let tmp = node.whereis::<Work>("tmp").unwrap();
    let watch = node.monitor(&tmp);
    crash(&node, "tmp");
    assert!(matches!(
        tokio::time::timeout(LIMIT, watch).await.unwrap(),
        DownReason::Panicked(_)
    ));
    let c = supervisor::children(&sup, LIMIT).await.unwrap();
    assert_eq!(
        c.iter().map(|c| (c.actor, c.restarts)).collect::<Vec<_>>(),
        [(None, 0), (None, 0)]
    );

    // A transient child that panics is restarted.
    let node2 = start("sup5b").await;
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .child(child("t", &log).restart(Restart::Transient));
    let sup2 = node2.supervise(spec).unwrap();
    crash(&node2, "t");
    wait_restarts(&sup2, 1).await;
    node.shutdown().await;
    node2.shutdown().await;
}

#[tokio::test]
async fn a_subtree_that_gives_up_is_restarted_by_its_parent() {
    let node = start("sup6").await;
    let log = Log::default();
    let inner = SupervisorSpec::new(Strategy::OneForOne)
        .intensity(0, Duration::from_secs(60))
        .child(child("leaf", &log));
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .child(ChildSpec::supervisor("inner", inner))
        .child(child("sibling", &log));
    let sup = node.supervise(spec).unwrap();
    let before = ids(&sup).await;
    let leaf_before = who(&node, "leaf").await;
    // The inner supervisor allows no restart: the leaf's panic makes it give up, and the outer
    // one starts it again, with a new leaf.
    crash(&node, "leaf");
    wait_restarts(&sup, 1).await;
    let after = ids(&sup).await;
    assert_ne!(after[0], before[0], "a new inner supervisor");
    assert_eq!(after[1], before[1], "the sibling untouched");
    until("a new leaf runs", LIMIT, || async {
        match node.whereis::<Work>("leaf") {
            Some(r) => r
                .call(Work::Who, LIMIT)
                .await
                .is_ok_and(|id| id != leaf_before),
            None => false,
        }
    })
    .await;
    node.shutdown().await;
}

#[tokio::test]
async fn a_stopped_supervisor_stops_its_children_last_first() {
    let node = start("sup7").await;
    let log = Log::default();
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .child(child("a", &log))
        .child(child("b", &log))
        .child(child("c", &log));
    let sup = node.supervise(spec).unwrap();
    let watch = node.monitor(&sup);
    node.stop_actor(&sup).unwrap();
    assert_eq!(
        tokio::time::timeout(LIMIT, watch).await.unwrap(),
        DownReason::Shutdown
    );
    assert_eq!(
        *log.lock().unwrap(),
        vec!["c", "b", "a"],
        "stopped before the supervisor ended"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn bad_specs_are_refused() {
    let node = start("sup8").await;
    let log = Log::default();
    let dup = SupervisorSpec::new(Strategy::OneForOne)
        .child(child("a", &log))
        .child(child("a", &log));
    assert_eq!(
        node.supervise(dup).unwrap_err(),
        supervisor::SuperviseError::DuplicateChild("a".into())
    );
    // A start function that hands back an actor it did not spawn.
    let existing = worker(&node, "x", &log);
    let spec = SupervisorSpec::new(Strategy::OneForOne)
        .child(child("first", &log))
        .child(ChildSpec::new("borrowed", move |_: &Node| existing.clone()));
    match node.supervise(spec).unwrap_err() {
        supervisor::SuperviseError::Start { child, .. } => assert_eq!(child, "borrowed"),
        e => panic!("{e:?}"),
    }
    until(
        "the child started first is stopped again",
        LIMIT,
        || async { node.whereis::<Work>("first").is_none() },
    )
    .await;
    node.shutdown().await;
}

#[tokio::test]
async fn local_links_stop_the_other_end_unless_the_end_is_normal() {
    let node = start("link1").await;
    let log = Log::default();
    let (a, b) = (worker(&node, "a", &log), worker(&node, "b", &log));
    node.link(&a, &b).unwrap();
    let watch_a = node.monitor(&a);
    b.send(Work::Crash("boom".into())).await.unwrap();
    match tokio::time::timeout(LIMIT, watch_a).await.unwrap() {
        DownReason::Linked(why) => assert!(why.contains("panicked: boom"), "{why}"),
        other => panic!("a stops with Linked, not {other:?}"),
    }

    // A normal end does not propagate.
    let (c, d) = (worker(&node, "c", &log), worker(&node, "d", &log));
    node.link(&c, &d).unwrap();
    let watch_d = node.monitor(&d);
    d.send(Work::Quit).await.unwrap();
    assert_eq!(
        tokio::time::timeout(LIMIT, watch_d).await.unwrap(),
        DownReason::Stopped
    );
    c.call(Work::Who, LIMIT).await.expect("c still runs");

    // Unlinked: no longer stopped.
    let (e, f) = (worker(&node, "e", &log), worker(&node, "f", &log));
    node.link(&e, &f).unwrap();
    assert!(node.unlink(&f, &e));
    f.send(Work::Crash("alone".into())).await.unwrap();
    let watch_f = node.monitor(&f);
    let _ = tokio::time::timeout(LIMIT, watch_f).await.unwrap();
    e.call(Work::Who, LIMIT).await.expect("e still runs");

    // Errors.
    let gone = worker(&node, "g", &log);
    gone.send(Work::Quit).await.unwrap();
    let _ = tokio::time::timeout(LIMIT, node.monitor(&gone)).await;
    assert_eq!(node.link(&c, &gone), Err(LinkError::NoProc));
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_links_both_ways_and_a_node_going_down() {
    let nodes = cluster("rlink", 3, |c| c).await;
    let (n1, n2, n3) = (&nodes[0], &nodes[1], &nodes[2]);
    let log = Log::default();
    let remote_ref = |on: &Node, name: &str| -> ActorRef<Work> {
        nodes[0].remote(&on.id().name, name).expect("member")
    };

    // The remote end panics: the local end stops.
    let a = worker(n1, "a", &log);
    let b = worker(n2, "b", &log);
    n2.register("b", &b).unwrap();
    n1.link(&a, &remote_ref(n2, "b")).unwrap();
    wait_links(n2, 1).await;
    let watch_a = n1.monitor(&a);
    b.send(Work::Crash("remote boom".into())).await.unwrap();
    match tokio::time::timeout(LIMIT, watch_a).await.unwrap() {
        DownReason::Linked(why) => assert!(why.contains("panicked: remote boom"), "{why}"),
        other => panic!("{other:?}"),
    }
    wait_links(n1, 0).await;

    // The local end panics: the remote end stops.
    let a = worker(n1, "a2", &log);
    let b = worker(n2, "b2", &log);
    n2.register("b2", &b).unwrap();
    let watch_b = n2.monitor(&b);
    n1.link(&a, &remote_ref(n2, "b2")).unwrap();
    wait_links(n2, 1).await;
    a.send(Work::Crash("local boom".into())).await.unwrap();
    match tokio::time::timeout(LIMIT, watch_b).await.unwrap() {
        DownReason::Linked(why) => assert!(why.contains("panicked: local boom"), "{why}"),
        other => panic!("{other:?}"),
    }

    // A name nobody holds: the local end stops with NoProc inside.
    let a = worker(n1, "a3", &log);
    let watch_a = n1.monitor(&a);
    n1.link(&a, &remote_ref(n2, "nobody")).unwrap();
    match tokio::time::timeout(LIMIT, watch_a).await.unwrap() {
        DownReason::Linked(why) => assert!(why.contains("no such actor"), "{why}"),
        other => panic!("{other:?}"),
    }

    // The remote node goes down: the local end stops.
    let a = worker(n1, "a4", &log);
    let c = worker(n3, "c", &log);
    n3.register("c", &c).unwrap();
    n1.link(&a, &remote_ref(n3, "c")).unwrap();
    wait_links(n3, 1).await;
    let watch_a = n1.monitor(&a);
    n3.shutdown().await;
    match tokio::time::timeout(Duration::from_secs(10), watch_a)
        .await
        .unwrap()
    {
        DownReason::Linked(why) => assert!(why.contains("went down"), "{why}"),
        other => panic!("{other:?}"),
    }
    // A node that is not reachable cannot be linked with.
    let a = worker(n1, "a5", &log);
    until(
        "n3 gone from n1's view",
        Duration::from_secs(10),
        || async { n1.link(&a, &c) == Err(LinkError::NodeDown) },
    )
    .await;
    for n in &nodes[..2] {
        n.shutdown().await;
    }
}

async fn wait_links(node: &Node, n: u64) {
    until("remote links", LIMIT, || async {
        node.status()
            .gauges
            .get("remote_links")
            .copied()
            .unwrap_or(0)
            == n
    })
    .await;
}

#[tokio::test]
async fn an_actor_keeps_a_bounded_number_of_watchers() {
    let node = start("limit1").await;
    let log = Log::default();
    let a = worker(&node, "a", &log);
    let mut held = Vec::new();
    for _ in 0..65_536 {
        held.push(node.monitor(&a));
    }
    let refused = node.monitor(&a);
    assert_eq!(
        tokio::time::timeout(LIMIT, refused).await.unwrap(),
        DownReason::WatcherLimit
    );
    let b = worker(&node, "b", &log);
    assert_eq!(node.link(&b, &a), Err(LinkError::WatcherLimit));
    drop(held);
    node.link(&b, &a)
        .expect("room again once the monitors are dropped");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_an_actor_that_is_stopped_fail_at_once() {
    let nodes = cluster("stopcall", 2, |c| c).await;
    let (n1, n2) = (&nodes[0], &nodes[1]);
    let log = Log::default();
    let w = worker(n2, "w", &log);
    n2.register("w", &w).unwrap();
    let remote: ActorRef<Work> = n1.remote(&n2.id().name, "w").unwrap();
    let long = Duration::from_secs(60);
    let started = std::time::Instant::now();
    // The first call is being handled (the actor holds its request), the second waits in the
    // mailbox.
    let held = tokio::spawn({
        let r = remote.clone();
        async move { r.call(Work::Hang, long).await }
    });
    until("the first call is being handled", LIMIT, || async {
        n1.status().gauges.get("pending_calls").copied() == Some(1)
    })
    .await;
    let queued = tokio::spawn({
        let r = remote.clone();
        async move { r.call(Work::Who, long).await }
    });
    until("the second call is queued", LIMIT, || async {
        n1.status().gauges.get("pending_calls").copied() == Some(2)
    })
    .await;
    n2.stop_actor(&w).unwrap();
    let held = held.await.unwrap();
    let queued = queued.await.unwrap();
    assert!(held.is_err(), "{held:?}");
    assert_eq!(queued, Err(maquis::CallError::NoProc));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no call waited for its timeout"
    );
    for n in &nodes {
        n.shutdown().await;
    }
}
