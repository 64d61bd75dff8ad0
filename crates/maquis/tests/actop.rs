//! ActOp in running nodes: pairs of virtual actors that talk, each pair split over two nodes,
//! end up side by side once the nodes exchange actors, with the nodes kept in balance and no
//! message lost on the way.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use maquis::virtual_actors::Placement;
use maquis::{Actor, Context, Node};
use serde::{Deserialize, Serialize};

const PAIRS: usize = 16;

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    /// From the test to an `a`: ask your `b`.
    Tick,
    /// From an `a` to its `b`.
    Ping,
    /// From a `b` to its `a`.
    Pong,
}

/// One side of a pair: `a` pings its `b` on a tick, `b` answers.
struct Side {
    partner: (&'static str, String),
    pongs: Arc<AtomicU64>,
}

impl Actor for Side {
    type Msg = Msg;
    async fn handle(&mut self, msg: Msg, ctx: &mut Context<Msg>) {
        let (kind, key) = &self.partner;
        let reply = match msg {
            Msg::Tick => Msg::Ping,
            Msg::Ping => Msg::Pong,
            Msg::Pong => {
                self.pongs.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let to = ctx.node().virtual_ref::<Msg>(kind, key).expect("address");
        to.send(reply).await.expect("sent to the partner");
    }
}

fn count(nodes: &[Node], k: &str) -> u64 {
    nodes.iter().map(|n| n.counters().snapshot()[k]).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn talking_pairs_split_over_two_nodes_end_up_side_by_side() {
    let nodes = cluster("ao", 2, |mut c| {
        c.services.actop_interval_ms = 500;
        c.services.actop_imbalance = 4;
        c
    })
    .await;
    let pongs = Arc::new(AtomicU64::new(0));
    for n in &nodes {
        let p = pongs.clone();
        n.register_virtual("a", move |key: &str| Side {
            partner: ("b", key.to_string()),
            pongs: p.clone(),
        })
        .expect("kind a");
        let p = pongs.clone();
        n.register_virtual("b", move |key: &str| Side {
            partner: ("a", key.to_string()),
            pongs: p.clone(),
        })
        .expect("kind b");
    }
    // Every a on the first node, every b on the second.
    let keys: Vec<String> = (0..PAIRS).map(|i| format!("p{i}")).collect();
    for (n, kind) in [(&nodes[0], "a"), (&nodes[1], "b")] {
        for k in &keys {
            n.virtual_ref::<Msg>(kind, k)
                .expect("address")
                .placement(Placement::Local)
                .send(Msg::Pong)
                .await
                .expect("activated");
        }
    }
    until("split placement", Duration::from_secs(10), || async {
        nodes[0].activations() == PAIRS && nodes[1].activations() == PAIRS
    })
    .await;
    let ticks: Vec<_> = keys
        .iter()
        .map(|k| nodes[0].virtual_ref::<Msg>("a", k).expect("address"))
        .collect();
    // Traffic: every pair once per 10 ms. Each window's remote share is read from the
    // counters; ActOp runs every 500 ms.
    let mut sent = 0u64;
    let mut shares = Vec::new();
    let mut window = (
        count(&nodes, "virtual_sent_local"),
        count(&nodes, "virtual_sent_remote"),
    );
    for step in 0..600 {
        for t in &ticks {
            t.send(Msg::Tick).await.expect("tick");
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        if step % 10 == 9 {
            let now = (
                count(&nodes, "virtual_sent_local"),
                count(&nodes, "virtual_sent_remote"),
            );
            let (l, r) = (now.0 - window.0, now.1 - window.1);
            shares.push(r as f64 / (l + r).max(1) as f64);
            window = now;
            if shares.len() >= 3 && shares[shares.len() - 1] <= 0.2 {
                break;
            }
        }
    }
    let first = shares[0];
    let last = *shares.last().expect("a window");
    assert!(
        first > 0.8,
        "split at first: remote share {first:.2} ({shares:?})"
    );
    assert!(
        last <= 0.2,
        "side by side after: remote share {last:.2} ({shares:?})"
    );
    let (a, b) = (nodes[0].activations(), nodes[1].activations());
    assert!(a.abs_diff(b) <= 4, "balanced: {a} and {b}");
    assert!(count(&nodes, "virtual_migrations") > 0);
    // Every tick's round trip completes: nothing lost while the actors moved.
    until("every pong", Duration::from_secs(10), || async {
        pongs.load(Ordering::Relaxed) == sent + 2 * PAIRS as u64
    })
    .await;
    assert_eq!(count(&nodes, "virtual_refused"), 0);
    // `/status` (and `/metrics`) show what ActOp did: some node moved actors, each is within
    // the imbalance of its last peer, and the remote share falls as it does above.
    until(
        "the gauges show the exchange",
        Duration::from_secs(10),
        || async {
            let g: Vec<_> = nodes.iter().map(|n| n.status().gauges).collect();
            g.iter().all(|g| {
                g.contains_key("actop_moves_per_min")
                    && g["actop_imbalance"] <= 4
                    && g["actop_remote_permille"] <= 200
            })
        },
    )
    .await;
    let metrics = maquis::admin::render_metrics(&nodes[0].status());
    assert!(
        metrics.contains("maquis_actop_remote_permille "),
        "{metrics}"
    );
    let plain = start("ao-off").await;
    assert!(!plain.status().gauges.contains_key("actop_imbalance"));
    plain.shutdown().await;
}
