//! Large messages go in parts: a small message queued behind one on the same lane does not
//! wait for it to be written, unless it has to stay behind it (the same order key), and the
//! large message arrives whole. On a channel of several lanes the parts are striped over the
//! lanes, with the same promises.

mod common;

use std::time::Duration;

use common::*;
use maquis::{ActorRef, Node, SendOpts};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

const BIG: usize = 16 << 20;

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    /// A `Payload`, not a `Vec<u8>`: a debug build encodes and decodes a `Vec<u8>` byte by
    /// byte, which takes long enough on a worker thread to hold up the nodes' heartbeats when
    /// tests run side by side. The frame is as large either way.
    Big(u32, maquis::Payload),
    /// A prefix of the pattern ([`MID`] bytes, or fewer).
    Mid(u32, maquis::Payload),
    Small(u32),
}

/// A message striped in two parts of 1 MiB.
const MID: usize = 2 << 20;

/// The large message's bytes, made once (for the same reason as `Msg::Big` is a `Payload`).
fn pattern() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| (0..BIG).map(|i| (i % 251) as u8).collect())
}

/// What the sink reports of each message, in the order they arrive: its id, and whether it
/// arrived intact.
type Arrivals = mpsc::UnboundedReceiver<(u32, bool)>;

/// Two nodes with one lane per channel, a lane queue smaller than the large message, and parts
/// of `part_bytes`; a sink on the second that reports every message as it arrives.
async fn setup(prefix: &str, part_bytes: usize) -> (Vec<Node>, ActorRef<Msg>, Arrivals) {
    setup_lanes(prefix, part_bytes, 1, 1 << 20).await
}

/// As [`setup`], with `lanes` lanes per channel and lane queues of `queue` bytes.
async fn setup_lanes(
    prefix: &str,
    part_bytes: usize,
    lanes: u16,
    queue: usize,
) -> (Vec<Node>, ActorRef<Msg>, Arrivals) {
    setup_config(prefix, |mut c| {
        c.transport.lane_queue_bytes = queue;
        c.transport.part_bytes = part_bytes;
        c.parallelism(lanes)
    })
    .await
}

/// As [`setup`], with the nodes' configuration made by `cfg`.
async fn setup_config(
    prefix: &str,
    cfg: impl Fn(maquis::Config) -> maquis::Config,
) -> (Vec<Node>, ActorRef<Msg>, Arrivals) {
    let nodes = cluster(prefix, 2, cfg).await;
    // Large messages go whole until the peer has announced its window for striped ones.
    until("the peer's window", Duration::from_secs(10), || async {
        nodes[0].status().peers[0].stripe_window_bytes.is_some()
    })
    .await;
    let (log, seen) = mpsc::unbounded_channel();
    let sink = nodes[1].spawn_fn(move |mut inbox: maquis::Inbox<Msg>| async move {
        while let Some(m) = inbox.recv().await {
            let entry = match m {
                Msg::Big(id, data) => (id, data.as_ref() == pattern()),
                Msg::Mid(id, data) => (id, data.as_ref() == &pattern()[..data.len()]),
                Msg::Small(id) => (id, true),
            };
            let _ = log.send(entry);
        }
    });
    nodes[1].register("sink", &sink).unwrap();
    let r = nodes[0].remote(&format!("{prefix}2"), "sink").unwrap();
    (nodes, r, seen)
}

async fn arrivals(seen: &mut Arrivals, n: usize) -> Vec<(u32, bool)> {
    let mut got = Vec::new();
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        while got.len() < n {
            match seen.recv().await {
                Some(entry) => got.push(entry),
                None => break,
            }
        }
    })
    .await;
    assert!(all.is_ok(), "arrived in 60 s: {got:?}");
    got
}

/// Sends a large message (id 1) and then a small one with another key (id 2); the order they
/// arrived in.
async fn send_large_then_small(r: &ActorRef<Msg>, seen: &mut Arrivals) -> Vec<(u32, bool)> {
    r.send_with(
        Msg::Big(1, pattern().into()),
        &SendOpts::default().partition(1),
    )
    .await
    .unwrap();
    r.send_with(Msg::Small(2), &SendOpts::default().partition(2))
        .await
        .unwrap();
    arrivals(seen, 2).await
}

/// [`send_large_then_small`] over lanes with parts of `part_bytes`; returns the order they arrived in, and the frames the sender dropped.
async fn large_then_small(prefix: &str, part_bytes: usize) -> (Vec<(u32, bool)>, u64) {
    let (nodes, r, mut seen) = setup(prefix, part_bytes).await;
    // The lane's queue (1 MiB) is full of the large message until its first parts are
    // written; the small message's send waits for that, not for the whole message.
    let order = send_large_then_small(&r, &mut seen).await;
    let dropped = dropped(&nodes[0]);
    for n in &nodes {
        n.shutdown().await;
    }
    (order, dropped)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_message_overtakes_a_large_one_on_its_lane() {
    let (order, dropped) = large_then_small("lmover", 1 << 20).await;
    assert_eq!(order, vec![(2, true), (1, true)]);
    assert_eq!(dropped, 0);
}

/// Sends large, small, large, small with one key and checks they arrive in that order, whole.
async fn large_small_large_small(r: &ActorRef<Msg>, seen: &mut Arrivals) {
    let opts = SendOpts::default().partition(1);
    for id in 1..=4u32 {
        let m = if id % 2 == 1 {
            Msg::Big(id, pattern().into())
        } else {
            Msg::Small(id)
        };
        r.send_with(m, &opts).await.unwrap();
    }
    assert_eq!(
        arrivals(seen, 4).await,
        vec![(1, true), (2, true), (3, true), (4, true)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_message_with_the_same_key_stays_behind() {
    let (nodes, r, mut seen) = setup("lmkeep", 1 << 20).await;
    large_small_large_small(&r, &mut seen).await;
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_part_size_is_a_setting() {
    // Parts of 4 KiB: four thousand of them make the message again, and the small message
    // still overtakes it.
    let (order, _) = large_then_small("lmsmall", 4096).await;
    assert_eq!(order, vec![(2, true), (1, true)]);
    // Parts larger than the message: it goes whole, and what is queued behind it waits.
    let (order, _) = large_then_small("lmwhole", 2 * BIG).await;
    assert_eq!(order, vec![(1, true), (2, true)]);
}

/// Frames the node's lanes to its first peer discarded.
fn dropped(node: &Node) -> u64 {
    node.status().peers[0].lanes.iter().map(|l| l.dropped).sum()
}

/// Bytes written on each lane of the default channel (the first is its ordering lane).
fn default_lanes_bytes(node: &Node) -> Vec<u64> {
    node.status().peers[0]
        .lanes
        .iter()
        .filter(|l| l.channel == "default")
        .map(|l| l.bytes_out)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn striped_messages_keep_their_order_and_take_the_spread_of_lanes() {
    let (nodes, r, mut seen) = setup_lanes("lmstripe", 1 << 20, 4, 1 << 20).await;
    // What each lane of the channel carries, as the status shows it: small messages on the
    // first (not widened), striped parts on the second (the spread on one host).
    let carries: Vec<(bool, bool)> = nodes[0].status().peers[0]
        .lanes
        .iter()
        .filter(|l| l.channel == "default")
        .map(|l| (l.small, l.striped))
        .collect();
    assert_eq!(
        carries,
        [(true, false), (false, true), (false, false), (false, false)]
    );
    large_small_large_small(&r, &mut seen).await;
    let bytes = default_lanes_bytes(&nodes[0]);
    assert_eq!(bytes.len(), 4);
    assert!(
        bytes[0] < 4096,
        "the ordering lane carried small frames and commits only: {bytes:?}"
    );
    // On one host the round trip is tens of µs: the channel's spread starts at one lane, the
    // first after the ordering lane (a trial may widen it if the writes wait long enough, not
    // before 100 ms have passed: it then takes the second half of the bytes at most).
    let parts: u64 = bytes[1..].iter().sum();
    assert!(parts >= 32 << 20, "both messages' parts: {bytes:?}");
    assert!(
        bytes[1] >= bytes[2] + bytes[3],
        "lane 1, the spread's first lane, carried most of the parts: {bytes:?}"
    );
    assert_eq!(dropped(&nodes[0]), 0);
    for n in &nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_message_overtakes_a_striped_one() {
    // Queues that take the whole message: the send returns before any part is written.
    let (nodes, r, mut seen) = setup_lanes("lmstover", 1 << 20, 4, 4 * BIG).await;
    // The large message's commit waits on the ordering lane until its 16 parts are written;
    // a small message of another key does not wait behind it.
    let order = send_large_then_small(&r, &mut seen).await;
    assert_eq!(order, vec![(2, true), (1, true)]);
    for n in &nodes {
        n.shutdown().await;
    }
}

/// More striped messages than a receiver's window holds (`transport.stripe_window_bytes`, 8 MiB
/// here) from one sender: the receiver announces a larger window as it hands them on, and
/// they all arrive, in order, whole; the sender shows the window the receiver announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn striped_messages_past_the_window_keep_coming() {
    let (nodes, r, mut seen) = setup_config("lmwindow", |mut c| {
        c.transport.lane_queue_bytes = 4 << 20;
        c.transport.part_bytes = 1 << 20;
        c.transport.max_frame_bytes = 4 << 20;
        c.transport.stripe_window_bytes = 8 << 20;
        c.parallelism(4)
    })
    .await;
    let opts = SendOpts::default().partition(1);
    const N: u32 = 40;
    let sent = tokio::time::timeout(Duration::from_secs(60), async {
        for id in 0..N {
            let m = Msg::Mid(id, pattern()[..MID].to_vec().into());
            r.send_with(m, &opts).await.unwrap();
        }
    })
    .await;
    assert!(sent.is_ok(), "sent in 60 s");
    let got = arrivals(&mut seen, N as usize).await;
    assert_eq!(got, (0..N).map(|id| (id, true)).collect::<Vec<_>>());
    let bytes = default_lanes_bytes(&nodes[0]);
    assert!(bytes[0] < 1 << 20, "striped, not whole: {bytes:?}");
    assert_eq!(dropped(&nodes[0]), 0);
    assert_eq!(
        nodes[0].status().peers[0].stripe_window_bytes,
        Some(8 << 20),
        "the receiver's window"
    );
    for n in &nodes {
        n.shutdown().await;
    }
}

/// A message of one part (256 KiB to `part_bytes`) goes whole on the channel's first lane while
/// that lane's socket takes its writes at once and its round trip is short (loopback); one of
/// several parts is striped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_part_message_goes_whole_while_the_first_lane_keeps_up() {
    let (nodes, r, mut seen) = setup_lanes("lmonepart", 1 << 20, 4, 8 << 20).await;
    let opts = SendOpts::default().partition(1);
    // A lane's first write may find its socket's readiness not known yet and wait a moment,
    // which counts as the lane falling behind: on a busy machine one message may then be
    // striped. Of a few sent one after the other, one goes whole at least.
    let one_part = pattern()[..300 << 10].to_vec();
    let mut whole = false;
    let mut bytes = default_lanes_bytes(&nodes[0]);
    for id in 1..=4 {
        let before = bytes.clone();
        r.send_with(Msg::Mid(id, one_part.clone().into()), &opts)
            .await
            .unwrap();
        assert_eq!(arrivals(&mut seen, 1).await, vec![(id, true)]);
        // A writer counts its bytes after its write returns, which may be after they arrived.
        let sent = before.iter().sum::<u64>() + (300 << 10);
        until(
            "the message's bytes counted",
            Duration::from_secs(10),
            || async { default_lanes_bytes(&nodes[0]).iter().sum::<u64>() >= sent },
        )
        .await;
        bytes = default_lanes_bytes(&nodes[0]);
        if bytes[0] - before[0] > 300 << 10 {
            let striped: u64 = (1..4).map(|l| bytes[l] - before[l]).sum();
            assert!(striped < 4096, "{before:?} -> {bytes:?}");
            whole = true;
            break;
        }
    }
    assert!(whole, "whole on the first lane: {bytes:?}");
    r.send_with(Msg::Mid(5, pattern()[..MID].to_vec().into()), &opts)
        .await
        .unwrap();
    assert_eq!(arrivals(&mut seen, 1).await, vec![(5, true)]);
    let sent = bytes.iter().sum::<u64>() + MID as u64;
    until(
        "the message's bytes counted",
        Duration::from_secs(10),
        || async { default_lanes_bytes(&nodes[0]).iter().sum::<u64>() >= sent },
    )
    .await;
    let after = default_lanes_bytes(&nodes[0]);
    assert!(after[0] - bytes[0] < 4096, "striped: {after:?}");
    for n in &nodes {
        n.shutdown().await;
    }
}
