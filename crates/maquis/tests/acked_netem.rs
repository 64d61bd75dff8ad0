//! Acknowledged delivery over the link emulator: two nodes in their own network namespaces,
//! 1% packet loss throughout and a partition long enough for each to declare the other down,
//! then healed. Every acknowledged send must succeed and every message be handled exactly once.
//! Needs root and /dev/net/tun (skipped with a message without them).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::config;
use maquis::{Acked, ActorRef, MembershipEvent, Node, ReplyTo, SendOpts};
use maquis_netem::{Netem, NetemConfig};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
enum Sink {
    Msg(u64),
    /// (distinct, handled in all)
    Count(ReplyTo<(usize, u64)>),
}

const TASKS: u64 = 8;
const EACH: u64 = 250;
const PORT: u16 = 7411;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// What the sending node saw.
#[derive(Debug)]
struct Sent {
    ok: u64,
    errors: Vec<String>,
    resends: u64,
}

#[test]
fn acked_sends_survive_loss_and_a_partition() {
    if let Err(e) = maquis_netem::preflight() {
        eprintln!("skipping: {e}");
        return;
    }
    common::init_tracing();
    let net = Netem::up(NetemConfig {
        hosts: 2,
        delay: Duration::from_millis(1),
        loss: 0.01,
        // Loss per packet, not per 64 KB segment.
        offload: false,
        prefix: format!("ak{}", std::process::id() % 100_000),
        seed: Some(11),
        ..Default::default()
    })
    .expect("netem up");
    let addr = |i: usize| std::net::SocketAddr::new(net.hosts()[i].addr.into(), PORT);
    let (a_addr, b_addr) = (addr(0), addr(1));

    // The receiver, in host 1: counts what its actor handles until told the sender is done.
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let receiver = net
        .spawn_in_host(1, move || {
            runtime().block_on(async move {
                let mut c = config("nb");
                c.node.listen = b_addr;
                let node = Node::start(c).await.expect("receiver starts");
                let sink: ActorRef<Sink> = node.spawn_fn(|mut inbox| async move {
                    let mut seen: HashMap<u64, u32> = HashMap::new();
                    let mut total = 0;
                    while let Some(m) = inbox.recv().await {
                        match m {
                            Sink::Msg(n) => {
                                total += 1;
                                *seen.entry(n).or_default() += 1;
                            }
                            Sink::Count(r) => {
                                let _ = r.send((seen.len(), total)).await;
                            }
                        }
                    }
                });
                node.register("sink", &sink).unwrap();
                ready_tx.send(()).unwrap();
                tokio::task::spawn_blocking(move || done_rx.recv())
                    .await
                    .unwrap()
                    .unwrap();
                let counts = sink
                    .call(Sink::Count, Duration::from_secs(10))
                    .await
                    .unwrap();
                let dups = node.counters().acked_duplicates.get();
                node.shutdown().await;
                (counts, dups)
            })
        })
        .unwrap();
    ready_rx.recv().unwrap();

    // The sender, in host 0: eight tasks of acknowledged sends; tells the test when a quarter
    // is through and when it sees the receiver go down.
    let (progress_tx, progress_rx) = mpsc::channel::<&'static str>();
    let sender = net
        .spawn_in_host(0, move || {
            runtime().block_on(async move {
                let mut c = config("na");
                c.node.listen = a_addr;
                let node = Node::start(c).await.expect("sender starts");
                node.join_wait(b_addr, Duration::from_secs(10))
                    .await
                    .expect("join");
                let mut events = node.subscribe();
                let tell = progress_tx.clone();
                tokio::spawn(async move {
                    while let Ok(ev) = events.recv().await {
                        if let MembershipEvent::Down(n) = ev {
                            if &*n.name == "nb" {
                                let _ = tell.send("down");
                            }
                        }
                    }
                });
                let to: ActorRef<Sink> = node.remote("nb", "sink").expect("member");
                let opts = SendOpts::default().acked_with(Acked {
                    first_retry: Duration::from_millis(200),
                    max_retry: Duration::from_millis(500),
                    give_up_after: Duration::from_secs(60),
                });
                let done = Arc::new(AtomicU64::new(0));
                let mut tasks = Vec::new();
                for t in 0..TASKS {
                    let (to, opts, done, tell) =
                        (to.clone(), opts.clone(), done.clone(), progress_tx.clone());
                    tasks.push(tokio::spawn(async move {
                        let mut errors = Vec::new();
                        for i in 0..EACH {
                            match to.send_with(Sink::Msg(t * EACH + i), &opts).await {
                                Ok(()) => {
                                    if done.fetch_add(1, Ordering::Relaxed) + 1 == TASKS * EACH / 4
                                    {
                                        let _ = tell.send("quarter");
                                    }
                                }
                                Err(e) => errors.push(e.to_string()),
                            }
                        }
                        errors
                    }));
                }
                let mut errors = Vec::new();
                for t in tasks {
                    errors.extend(t.await.unwrap());
                }
                let sent = Sent {
                    ok: done.load(Ordering::Relaxed),
                    errors,
                    resends: node.counters().acked_resends.get(),
                };
                node.shutdown().await;
                sent
            })
        })
        .unwrap();

    let wait = Duration::from_secs(60);
    assert_eq!(progress_rx.recv_timeout(wait).unwrap(), "quarter");
    net.partition(&[0]).unwrap();
    // Held until the sender has declared the receiver down: its connections are gone, and
    // what was in flight on them with them.
    loop {
        if progress_rx.recv_timeout(wait).unwrap() == "down" {
            break;
        }
    }
    net.heal();
    let sent = sender.join().unwrap().unwrap();
    done_tx.send(()).unwrap();
    let ((distinct, total), dups) = receiver.join().unwrap().unwrap();
    let stats = net.shutdown().unwrap();
    let lost: u64 = stats.directions.iter().map(|d| d.dropped_loss).sum();
    let cut: u64 = stats.directions.iter().map(|d| d.dropped_partition).sum();
    println!(
        "sent {} ok, errors {:?}; handled {total} ({distinct} distinct); {} resends, {dups} \
         duplicates suppressed; netem dropped {lost} packets to loss and {cut} to the partition",
        sent.ok, sent.errors, sent.resends
    );
    let n = TASKS * EACH;
    assert!(sent.errors.is_empty(), "{:?}", sent.errors);
    assert_eq!(sent.ok, n);
    assert_eq!((distinct as u64, total), (n, n), "lost or duplicated");
    assert!(cut > 0, "the partition cut traffic");
}
