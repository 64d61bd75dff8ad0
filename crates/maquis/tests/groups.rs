//! Process groups in running nodes: members seen everywhere, publish reaching every member
//! once, anycast reaching exactly one, a member killed mid-call leading to a retry, dead
//! members and nodes leaving, two clusters that meet merging their groups.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use maquis::groups::GroupError;
use maquis::{ActorRef, Node, ReplyTo};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

#[derive(Debug, Serialize, Deserialize)]
enum Work {
    /// Note that this member got it.
    Note(u64),
    /// Answer with the member's node name; `stall` first waits for ever (the member is killed
    /// while it holds the request).
    Who { stall: bool, reply: ReplyTo<String> },
}

/// A member that reports every `Note` on `seen` as (its node, the note).
fn member(node: &Node, seen: mpsc::UnboundedSender<(String, u64)>) -> ActorRef<Work> {
    let me = node.id().name.to_string();
    node.spawn_fn(move |mut inbox| async move {
        while let Some(w) = inbox.recv().await {
            match w {
                Work::Note(n) => {
                    let _ = seen.send((me.clone(), n));
                }
                Work::Who { stall, reply } => {
                    if stall {
                        std::future::pending::<()>().await;
                    }
                    let _ = reply.send(me.clone()).await;
                }
            }
        }
    })
}

async fn members_everywhere(nodes: &[&Node], group: &str, n: usize) {
    for node in nodes {
        until(
            &format!("{} sees {n} members of {group}", node.id().name),
            Duration::from_secs(10),
            || async { node.group_members::<Work>(group).await.unwrap().len() == n },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publish_reaches_every_member_once_and_anycast_exactly_one() {
    let nodes = cluster("p", 4, |c| c).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    // Two members on p1, one on p2, one on p3, none on p4.
    let mut refs = Vec::new();
    for i in [0usize, 0, 1, 2] {
        let m = member(&nodes[i], tx.clone());
        nodes[i].join_group("workers", &m).await.unwrap();
        refs.push(m);
    }
    let all: Vec<&Node> = nodes.iter().collect();
    members_everywhere(&all, "workers", 4).await;
    // A member of another type is not one of these.
    let other = nodes[3].spawn_fn(|mut inbox: maquis::Inbox<u64>| async move {
        while inbox.recv().await.is_some() {}
    });
    nodes[3].join_group("workers", &other).await.unwrap();
    assert_eq!(
        nodes[3]
            .group_members::<u64>("workers")
            .await
            .unwrap()
            .len(),
        1
    );

    // From a node without members of this type: every member once.
    assert_eq!(
        nodes[3].publish("workers", &Work::Note(7)).await.unwrap(),
        4
    );
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(
            tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("delivered")
                .unwrap(),
        );
    }
    got.sort();
    assert_eq!(
        got,
        vec![
            ("p1".to_string(), 7),
            ("p1".to_string(), 7),
            ("p2".to_string(), 7),
            ("p3".to_string(), 7)
        ]
    );
    // Anycast: exactly one member, each time.
    for k in 0..20u64 {
        nodes[3]
            .anycast("workers", Work::Note(100 + k))
            .await
            .unwrap();
    }
    let mut notes = Vec::new();
    for _ in 0..20 {
        let (_, n) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("delivered")
            .unwrap();
        notes.push(n);
    }
    notes.sort();
    assert_eq!(notes, (100..120).collect::<Vec<u64>>());
    // Nothing more arrives: no message went to two members.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err());
    // A node with members of its own serves an anycast locally.
    let who = nodes[1]
        .call_any(
            "workers",
            |reply| Work::Who {
                stall: false,
                reply,
            },
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(who, "p2");

    // Leave, and a stopped member leaves by itself.
    assert!(nodes[0].leave_group("workers", &refs[0]).await);
    assert!(!nodes[0].leave_group("workers", &refs[0]).await);
    nodes[1].stop_actor(&refs[2]).unwrap();
    members_everywhere(&all, "workers", 2).await;
    // Bad input.
    assert_eq!(
        nodes[0].join_group("", &refs[1]).await,
        Err(GroupError::BadName)
    );
    assert_eq!(
        nodes[0].join_group("w", &refs[3]).await,
        Err(GroupError::NotLocal)
    );
    assert_eq!(
        nodes[0].publish("nobody", &Work::Note(1)).await,
        Err(GroupError::NoMembers("nobody".into()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_killed_mid_call_leads_to_a_retry_and_none_left_is_an_error() {
    let nodes = cluster("r", 3, |c| c).await;
    let (tx, _rx) = mpsc::unbounded_channel();
    // One member that stalls (on r2) and one that answers (on r3); the caller on r1 has none,
    // so it tries them in random order: run until the stalling one was tried first.
    let answering = member(&nodes[2], tx.clone());
    nodes[2].join_group("svc", &answering).await.unwrap();
    let stalls = Arc::new(AtomicUsize::new(0));
    let mut retried = false;
    for _ in 0..20 {
        let staller = {
            let stalls = stalls.clone();
            nodes[1].spawn_fn(move |mut inbox: maquis::Inbox<Work>| async move {
                while let Some(w) = inbox.recv().await {
                    if let Work::Who { reply, .. } = w {
                        stalls.fetch_add(1, Ordering::SeqCst);
                        // Holds the request; it is killed meanwhile.
                        std::future::pending::<()>().await;
                        drop(reply);
                    }
                }
            })
        };
        nodes[1].join_group("svc", &staller).await.unwrap();
        members_everywhere(&[&nodes[0]], "svc", 2).await;
        let before = stalls.load(Ordering::SeqCst);
        let killer = {
            let n = nodes[1].clone();
            let stalls = stalls.clone();
            let s = staller.clone();
            tokio::spawn(async move {
                until(
                    "the staller holds a call",
                    Duration::from_secs(5),
                    || async { stalls.load(Ordering::SeqCst) > before },
                )
                .await;
                n.stop_actor(&s).unwrap();
            })
        };
        let who = nodes[0]
            .call_any(
                "svc",
                |reply| Work::Who {
                    stall: false,
                    reply,
                },
                Duration::from_secs(10),
            )
            .await
            .expect("answered by the other member");
        assert_eq!(who, "r3");
        if stalls.load(Ordering::SeqCst) > before {
            // The staller got the call first and was killed holding it: the call was retried.
            let _ = killer.await;
            retried = true;
            break;
        }
        killer.abort();
        nodes[1].stop_actor(&staller).unwrap();
        members_everywhere(&[&nodes[0]], "svc", 1).await;
    }
    assert!(
        retried,
        "the stalling member was never chosen first in 20 tries"
    );

    // No member left: the caller is told.
    nodes[2].stop_actor(&answering).unwrap();
    members_everywhere(&[&nodes[0]], "svc", 0).await;
    let r: Result<String, _> = nodes[0]
        .call_any(
            "svc",
            |reply| Work::Who {
                stall: false,
                reply,
            },
            Duration::from_secs(2),
        )
        .await;
    assert_eq!(r, Err(GroupError::NoMembers("svc".into())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_nodes_members_leave_and_clusters_that_meet_merge_their_groups() {
    // A change lost on the way (a connection replaced while the two sides meet loses what
    // was written on it) is repaired by the next digest: one a second here, so that the
    // repair comes within the waits below.
    let digests = |mut c: maquis::Config| {
        c.services.group_digest_ms = 1000;
        c
    };
    let a = cluster("ga", 3, digests).await;
    let b = cluster("gb", 2, digests).await;
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut keep = Vec::new();
    for n in a.iter().chain(b.iter()) {
        let m = member(n, tx.clone());
        n.join_group("g", &m).await.unwrap();
        keep.push(m);
    }
    members_everywhere(&a.iter().collect::<Vec<_>>(), "g", 3).await;
    members_everywhere(&b.iter().collect::<Vec<_>>(), "g", 2).await;
    // The two sides meet: every node sees all five.
    b[0].join_wait(a[0].addr(), Duration::from_secs(5))
        .await
        .unwrap();
    let all: Vec<&Node> = a.iter().chain(b.iter()).collect();
    members_everywhere(&all, "g", 5).await;
    // A node killed: its member leaves everywhere.
    a[2].shutdown().await;
    let survivors: Vec<&Node> = all.into_iter().filter(|n| &*n.id().name != "ga3").collect();
    members_everywhere(&survivors, "g", 4).await;
}

#[derive(Debug, Serialize, Deserialize)]
struct Ask {
    /// The node whose member answers; the others drop their copy of `reply`.
    answerer: String,
    reply: ReplyTo<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_published_call_takes_the_one_answer_and_unanswered_copies_fail_nothing() {
    let nodes = cluster("pc", 3, |c| c).await;
    for node in &nodes {
        let me = node.id().name.to_string();
        let m: ActorRef<Ask> = node.spawn_fn(move |mut inbox: maquis::Inbox<Ask>| async move {
            while let Some(a) = inbox.recv().await {
                if a.answerer == me {
                    let _ = a.reply.send(me.clone()).await;
                }
            }
        });
        node.join_group("askers", &m).await.unwrap();
    }
    for node in &nodes {
        until(
            &format!("{} sees 3 askers", node.id().name),
            Duration::from_secs(10),
            || async { node.group_members::<Ask>("askers").await.unwrap().len() == 3 },
        )
        .await;
    }
    // Each node's member answering in turn, asked from node 0 (local and remote answers).
    for target in &nodes {
        let name = target.id().name.to_string();
        let got = nodes[0]
            .publish_call(
                "askers",
                |reply| Ask {
                    answerer: name.clone(),
                    reply,
                },
                Duration::from_secs(10),
            )
            .await;
        assert_eq!(got, Ok(name), "the one member that answers is heard");
    }
    // Nobody answers: the timeout, not a failure from a dropped copy.
    let t = std::time::Instant::now();
    let got: Result<String, _> = nodes[1]
        .publish_call(
            "askers",
            |reply| Ask {
                answerer: "nobody".into(),
                reply,
            },
            Duration::from_millis(300),
        )
        .await;
    assert_eq!(got, Err(GroupError::Timeout));
    assert!(t.elapsed() >= Duration::from_millis(300));
    let none: Result<String, _> = nodes[0]
        .publish_call(
            "nobody-here",
            |reply| Ask {
                answerer: "x".into(),
                reply,
            },
            Duration::from_secs(1),
        )
        .await;
    assert_eq!(none, Err(GroupError::NoMembers("nobody-here".into())));
    for n in nodes {
        n.shutdown().await;
    }
}

/// Waits, a change at a time, until `node` sees `n` members of `watched`.
async fn told_until(
    seen: &mut tokio::sync::watch::Receiver<u64>,
    node: &Node,
    n: usize,
    what: &str,
) {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            seen.changed().await.unwrap();
            if node.group_members::<Work>("watched").await.unwrap().len() == n {
                break;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("not told of {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_changes_move_when_members_join_and_leave_anywhere() {
    let nodes = cluster("gc", 2, |c| c).await;
    let mut seen = nodes[0].group_changes();
    let before = *seen.borrow_and_update();
    // A member joins on the other node: this node is told.
    let (tx, _rx) = mpsc::unbounded_channel();
    let m = member(&nodes[1], tx);
    nodes[1].join_group("watched", &m).await.unwrap();
    told_until(&mut seen, &nodes[0], 1, "the remote join").await;
    let joined = *seen.borrow_and_update();
    assert!(joined > before);
    // It leaves: told again.
    assert!(nodes[1].leave_group("watched", &m).await);
    told_until(&mut seen, &nodes[0], 0, "the remote leave").await;
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_that_just_joined_gets_the_next_publish_and_one_that_left_does_not() {
    // Publishes read the members from a cache that serves until the members may have
    // changed: a join or leave must be seen by the next publish of the same task.
    let node = start("fresh").await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut joined = Vec::new();
    for i in 0..30u64 {
        let m = member(&node, tx.clone());
        node.join_group("fresh", &m).await.unwrap();
        joined.push(m);
        if i % 3 == 2 {
            let gone = joined.remove(0);
            assert!(node.leave_group("fresh", &gone).await);
        }
        let sent = node.publish("fresh", &Work::Note(i)).await.unwrap();
        assert_eq!(sent, joined.len(), "round {i}");
        let mut got = 0;
        while got < joined.len() {
            let (_, n) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("every member gets the publish")
                .unwrap();
            assert_eq!(n, i, "only this round's note");
            got += 1;
        }
    }
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_publishing_to_its_own_group_with_its_mailbox_full_does_not_wait_on_itself() {
    let mut cfg = config("selfpub");
    cfg.node.mailbox_capacity = 4;
    let node = start_with(cfg).await;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let (notes_tx, mut notes_rx) = mpsc::unbounded_channel();
    let n = node.clone();
    let me = node.spawn_fn(move |mut inbox: maquis::Inbox<Work>| async move {
        let mut done = Some(done_tx);
        while let Some(w) = inbox.recv().await {
            if let Work::Note(0) = w {
                // Forty notes to its own group while it reads none: its mailbox of four fills.
                for i in 1..=40 {
                    n.publish("self", &Work::Note(i)).await.unwrap();
                }
                let _ = done.take().map(|d| d.send(()));
            } else if let Work::Note(i) = w {
                let _ = notes_tx.send(i);
            }
        }
    });
    node.join_group("self", &me).await.unwrap();
    me.send(Work::Note(0)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), done_rx)
        .await
        .expect("the publisher did not wait on its own mailbox")
        .unwrap();
    let mut got = std::collections::BTreeSet::new();
    while got.len() < 40 {
        let i = tokio::time::timeout(Duration::from_secs(10), notes_rx.recv())
            .await
            .expect("every note arrives")
            .unwrap();
        got.insert(i);
    }
    assert_eq!(got, (1..=40).collect());
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_of_a_published_call_dropped_unanswered_send_nothing_back() {
    let nodes = cluster("pq", 3, |c| c).await;
    // A probe on the caller's node: a call to it from another node travels behind anything
    // that node sent the caller before (one lane per peer).
    let probe: ActorRef<Ask> = nodes[0].spawn_fn(|mut inbox: maquis::Inbox<Ask>| async move {
        while let Some(a) = inbox.recv().await {
            let _ = a.reply.send("probe".into()).await;
        }
    });
    nodes[0].register("probe", &probe).unwrap();
    let (drop_now, drop_rx) = tokio::sync::watch::channel(false);
    let (done_tx, mut done) = mpsc::unbounded_channel();
    for node in &nodes {
        let me = node.id().name.to_string();
        let probe: ActorRef<Ask> = node.remote(&nodes[0].id().name, "probe").unwrap();
        let (mut drop_rx, done_tx) = (drop_rx.clone(), done_tx.clone());
        let m: ActorRef<Ask> = node.spawn_fn(move |mut inbox: maquis::Inbox<Ask>| async move {
            let Some(a) = inbox.recv().await else { return };
            if a.answerer == me {
                let _ = a.reply.send(me.clone()).await;
                return;
            }
            // Held until the call has ended, then let go unanswered.
            let _ = drop_rx.wait_for(|d| *d).await;
            drop(a);
            let asked = probe
                .call(
                    |reply| Ask {
                        answerer: String::new(),
                        reply,
                    },
                    Duration::from_secs(10),
                )
                .await;
            let _ = done_tx.send(asked.is_ok());
        });
        node.join_group("holders", &m).await.unwrap();
    }
    for node in &nodes {
        until(
            &format!("{} sees 3 holders", node.id().name),
            Duration::from_secs(10),
            || async { node.group_members::<Ask>("holders").await.unwrap().len() == 3 },
        )
        .await;
    }
    let answerer = nodes[2].id().name.to_string();
    let got = nodes[0]
        .publish_call(
            "holders",
            |reply| Ask {
                answerer: answerer.clone(),
                reply,
            },
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(got, Ok(answerer));
    drop_now.send(true).unwrap();
    for _ in 0..2 {
        assert_eq!(done.recv().await, Some(true), "the probe answers");
    }
    assert_eq!(
        nodes[0].counters().late_replies.get(),
        0,
        "a dropped copy sent the caller a failure after its call had ended"
    );
    for n in nodes {
        n.shutdown().await;
    }
}
