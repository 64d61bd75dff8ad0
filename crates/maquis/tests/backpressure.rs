//! Bounded queues: a fast sender and a slow receiver leave memory bounded.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use maquis::{ActorRef, SendError};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Blob(Bytes);

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_sender_slow_receiver_stays_bounded() {
    const LANE_BYTES: usize = 1 << 20;
    const MSG: usize = 64 * 1024;
    const COUNT: usize = 3000; // 192 MiB in all, far more than every bound below
    let nodes = cluster("bp", 2, |mut c| {
        c.transport.lane_queue_bytes = LANE_BYTES;
        c.node.mailbox_capacity = 8;
        c
    })
    .await;
    let (a, b) = (nodes[0].clone(), nodes[1].clone());
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let mut done_tx = Some(done_tx);
    let slow = b.spawn_fn(move |mut inbox: maquis::Inbox<Blob>| async move {
        let mut n = 0;
        while let Some(Blob(bytes)) = inbox.recv().await {
            assert_eq!(bytes.len(), MSG);
            n += 1;
            if n % 10 == 0 {
                // The receiver's own (slow) work.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if n == COUNT {
                let _ = done_tx.take().map(|t| t.send(()));
            }
        }
    });
    b.register("slow", &slow).unwrap();
    let target: ActorRef<Blob> = a.remote("bp2", "slow").unwrap();
    let payload = Bytes::from(vec![7u8; MSG]);
    let before = rss_bytes();

    // try_send refuses once the lane's queue is full instead of buffering more.
    let mut refused = 0;
    let mut sent = 0;
    while refused == 0 && sent < COUNT {
        match target.try_send(Blob(payload.clone())) {
            Ok(()) => sent += 1,
            Err(SendError::Backpressure(_)) => refused += 1,
            Err(e) => panic!("unexpected: {e}"),
        }
    }
    assert_eq!(refused, 1, "try_send never reported backpressure");

    // send waits for room; watch the queue and the process while it does.
    let sender = {
        let target = target.clone();
        let payload = payload.clone();
        tokio::spawn(async move {
            for _ in sent..COUNT {
                target.send(Blob(payload.clone())).await.unwrap();
            }
        })
    };
    let mut peak_queue = 0;
    let mut peak_rss = before;
    let mut done_rx = done_rx;
    loop {
        let st = a.status();
        let queued: u64 = st
            .peers
            .iter()
            .flat_map(|p| &p.lanes)
            .filter(|l| l.channel == "default")
            .map(|l| l.queued_bytes)
            .sum();
        peak_queue = peak_queue.max(queued);
        peak_rss = peak_rss.max(rss_bytes());
        tokio::select! {
            _ = &mut done_rx => break,
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
    }
    sender.await.unwrap();
    // One default lane (parallelism 1): its queue never held more than its limit.
    assert!(
        peak_queue <= LANE_BYTES as u64,
        "queue peaked at {peak_queue}"
    );
    let grew = peak_rss.saturating_sub(before);
    assert!(
        grew < 64 << 20,
        "RSS grew by {} MiB while 192 MiB went through a 1 MiB lane and an 8-message mailbox",
        grew >> 20
    );
    for n in &nodes {
        n.shutdown().await;
    }
}

#[derive(Serialize, Deserialize)]
enum Ask {
    Fill,
    Ping(maquis::ReplyTo<u8>),
}

/// A call to an actor whose mailbox stays full fails with `Timeout` at its deadline: the wait
/// for room counts against the call's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_timeout_covers_the_wait_for_room() {
    let nodes = cluster("room", 1, |mut c| {
        c.node.mailbox_capacity = 1;
        c
    })
    .await;
    let node = nodes[0].clone();
    // An actor that never reads its mailbox.
    let stuck = node.spawn_fn(|inbox: maquis::Inbox<Ask>| async move {
        let _keep = inbox;
        std::future::pending::<()>().await;
    });
    let mut filled = 0;
    while stuck.try_send(Ask::Fill).is_ok() {
        filled += 1;
        assert!(filled <= 1, "the mailbox holds more than its capacity");
    }
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(
        Duration::from_secs(10),
        stuck.call(Ask::Ping, Duration::from_millis(200)),
    )
    .await
    .expect("the call must end at its own deadline");
    assert!(matches!(outcome, Err(maquis::CallError::Timeout)));
    assert!(started.elapsed() >= Duration::from_millis(200));
    node.shutdown().await;
}
