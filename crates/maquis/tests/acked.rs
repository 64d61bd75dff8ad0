//! Acknowledged delivery: outcomes, resends that never duplicate, routed (multi-hop) sends on
//! the peer-to-peer overlay, and the window's bound.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use maquis::{Acked, ActorRef, Node, ReplyTo, SendError, SendOpts};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
pub enum Sink {
    /// A numbered message from a sender.
    Msg { from: String, n: u64 },
    /// (distinct messages, messages handled in all).
    Count(ReplyTo<(usize, u64)>),
}

/// Counts what it handles; `work` is the time each message takes.
fn sink(node: &Node, work: Duration) -> ActorRef<Sink> {
    node.spawn_fn(move |mut inbox| async move {
        let mut seen: HashMap<(String, u64), u32> = HashMap::new();
        let mut total = 0u64;
        while let Some(m) = inbox.recv().await {
            match m {
                Sink::Msg { from, n } => {
                    total += 1;
                    *seen.entry((from, n)).or_default() += 1;
                    if !work.is_zero() {
                        tokio::time::sleep(work).await;
                    }
                }
                Sink::Count(r) => {
                    let _ = r.send((seen.len(), total)).await;
                }
            }
        }
    })
}

async fn count(s: &ActorRef<Sink>) -> (usize, u64) {
    s.call(Sink::Count, Duration::from_secs(10)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_of_acknowledged_sends() {
    let nodes = cluster("ack", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let s = sink(b, Duration::ZERO);
    b.register("sink", &s).unwrap();
    let to: ActorRef<Sink> = a.remote("ack2", "sink").unwrap();
    let acked = SendOpts::default().acked();
    to.send_with(
        Sink::Msg {
            from: "a".into(),
            n: 1,
        },
        &acked,
    )
    .await
    .expect("acknowledged");
    assert_eq!(count(&s).await, (1, 1));

    let nobody: ActorRef<Sink> = a.remote("ack2", "nobody").unwrap();
    let r = nobody
        .send_with(
            Sink::Msg {
                from: "a".into(),
                n: 2,
            },
            &acked,
        )
        .await;
    assert_eq!(r, Err(SendError::NoProc));

    let wrong: ActorRef<String> = a.remote("ack2", "sink").unwrap();
    let r = wrong.send_with("not a Sink".to_string(), &acked).await;
    assert_eq!(r, Err(SendError::TypeMismatch));

    // The receiving node is gone: the send gives up at its deadline and says so.
    b.shutdown().await;
    let quick = SendOpts::default().acked_with(Acked {
        first_retry: Duration::from_millis(50),
        max_retry: Duration::from_millis(100),
        give_up_after: Duration::from_millis(600),
    });
    let t = std::time::Instant::now();
    let r = to
        .send_with(
            Sink::Msg {
                from: "a".into(),
                n: 3,
            },
            &quick,
        )
        .await;
    assert_eq!(
        r,
        Err(SendError::Unacknowledged {
            after: Duration::from_millis(600)
        })
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(
        a.status().gauges.get("unacked").copied(),
        Some(0),
        "nothing kept"
    );
    assert!(a.counters().acked_given_up.get() >= 1);
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resends_are_handled_once() {
    let nodes = cluster("dup", 2, |mut c| {
        c.node.mailbox_capacity = 8;
        c
    })
    .await;
    let (a, b) = (&nodes[0], &nodes[1]);
    // A slow receiver behind a small mailbox: acknowledgements come late, and every message is
    // resent several times before its first copy is handled.
    let s = sink(b, Duration::from_micros(300));
    b.register("sink", &s).unwrap();
    let to: ActorRef<Sink> = a.remote("dup2", "sink").unwrap();
    let eager = SendOpts::default().acked_with(Acked {
        first_retry: Duration::from_millis(2),
        max_retry: Duration::from_millis(20),
        give_up_after: Duration::from_secs(60),
    });
    const TASKS: u64 = 16;
    const EACH: u64 = 100;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (to, eager) = (to.clone(), eager.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                to.send_with(
                    Sink::Msg {
                        from: "a".into(),
                        n: t * EACH + i,
                    },
                    &eager,
                )
                .await
                .expect("acknowledged");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let (distinct, total) = count(&s).await;
    let resends = a.counters().acked_resends.get();
    let dups = b.counters().acked_duplicates.get();
    println!("{total} handled, {resends} resends, {dups} duplicates suppressed");
    assert_eq!(
        (distinct, total),
        ((TASKS * EACH) as usize, TASKS * EACH),
        "each handled once"
    );
    assert!(
        resends > 0 && dups > 0,
        "the test exercised resends ({resends}) and duplicates ({dups})"
    );
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_to_one_node_is_bounded() {
    let nodes = cluster("win", 2, |c| c).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let to: ActorRef<Sink> = a.remote("win2", "sink").unwrap();
    b.shutdown().await;
    let opts = SendOpts::default().acked();
    let mut queued = 0;
    let err = loop {
        match to.try_send_with(
            Sink::Msg {
                from: "a".into(),
                n: queued,
            },
            &opts,
        ) {
            Ok(()) => queued += 1,
            Err(e) => break e,
        }
        assert!(queued <= 1024, "more than the window queued");
    };
    assert_eq!(queued, 1024);
    assert_eq!(err, SendError::Backpressure("acknowledged-delivery window"));
    assert_eq!(a.status().gauges.get("unacked").copied(), Some(1024));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routed_acknowledged_sends_arrive_once() {
    const N: usize = 8;
    const EACH: u64 = 30;
    let mut nodes = Vec::new();
    for i in 0..N {
        nodes.push(start_with(p2p(&format!("r{i}"))).await);
    }
    for i in 1..N {
        nodes[i]
            .join_wait(nodes[i - 1].addr(), Duration::from_secs(5))
            .await
            .expect("join");
    }
    for n in &nodes {
        until("every node knows all", Duration::from_secs(20), || async {
            n.members().len() == N
        })
        .await;
    }
    let sinks: Vec<ActorRef<Sink>> = nodes
        .iter()
        .map(|n| {
            let s = sink(n, Duration::ZERO);
            n.register("sink", &s).unwrap();
            s
        })
        .collect();
    let opts = SendOpts::default().acked();
    let mut tasks = Vec::new();
    for (i, from) in nodes.iter().enumerate() {
        for j in 0..N {
            if i == j {
                continue;
            }
            let to: ActorRef<Sink> = from.remote(&format!("r{j}"), "sink").unwrap();
            let (opts, me) = (opts.clone(), format!("r{i}"));
            tasks.push(tokio::spawn(async move {
                for k in 0..EACH {
                    to.send_with(
                        Sink::Msg {
                            from: me.clone(),
                            n: k,
                        },
                        &opts,
                    )
                    .await
                    .expect("acknowledged");
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let forwarded: u64 = nodes
        .iter()
        .map(|n| n.counters().routed_forwarded.get())
        .sum();
    let resends: u64 = nodes.iter().map(|n| n.counters().acked_resends.get()).sum();
    for s in &sinks {
        let want = (N - 1) * EACH as usize;
        assert_eq!(
            count(s).await,
            (want, want as u64),
            "each message handled once"
        );
    }
    println!("{forwarded} frames forwarded, {resends} resends");
    assert!(forwarded > 0, "some sends were routed through other nodes");
    for n in &nodes {
        n.shutdown().await;
    }
}
