//! An overlay of your own, written against the public API only, started with
//! `Node::start_with_overlay`.
//!
//! `Introductions` is a minimal full mesh: a node that joins through a contact sends it the
//! names it knows; whoever learns of a node it does not know connects to it and tells the
//! others. Members are this node and every peer whose connection is up; a lost connection is
//! a node down (`Liveness::Connection`, the default).
//!
//! `cargo run -p maquis --example custom_overlay` starts four nodes in one process, joins them
//! in a line (each through the previous one), and exits once every node sees all four.

use std::collections::BTreeSet;
use std::time::Duration;

use maquis::overlay::{Effects, Overlay, Route, TimerId};
use maquis::{Config, Node, NodeId};
use serde::{Deserialize, Serialize};

/// The overlay's one message: the nodes the sender knows.
#[derive(Serialize, Deserialize)]
pub struct Known(pub Vec<NodeId>);

/// Introductions: every node tells its peers whom it knows.
pub struct Introductions {
    me: NodeId,
    /// Every node heard of, this one excluded.
    known: BTreeSet<NodeId>,
    /// Those whose connection is up.
    up: BTreeSet<NodeId>,
}

impl Introductions {
    /// A node that knows nobody yet.
    pub fn new(me: NodeId) -> Self {
        Introductions {
            me,
            known: BTreeSet::new(),
            up: BTreeSet::new(),
        }
    }

    fn tell(&self, to: &NodeId, fx: &mut Effects<Known>) {
        let mut all: Vec<NodeId> = self.known.iter().cloned().collect();
        all.push(self.me.clone());
        fx.send(to.clone(), Known(all));
    }

    /// Learns of a node; returns whether it was new.
    fn learn(&mut self, n: NodeId, fx: &mut Effects<Known>) -> bool {
        if n == self.me || !self.known.insert(n.clone()) {
            return false;
        }
        fx.connect(n);
        true
    }
}

impl Overlay for Introductions {
    type Msg = Known;

    fn name(&self) -> &'static str {
        "introductions"
    }

    fn on_join(&mut self, contact: &NodeId, fx: &mut Effects<Known>) {
        self.learn(contact.clone(), fx);
        self.tell(contact, fx);
    }

    fn on_leave(&mut self, fx: &mut Effects<Known>) {
        for n in std::mem::take(&mut self.known) {
            fx.left(n.clone());
            fx.disconnect(n);
        }
        self.up.clear();
    }

    fn on_message(&mut self, from: &NodeId, msg: Known, fx: &mut Effects<Known>) {
        let mut news = self.learn(from.clone(), fx);
        for n in msg.0 {
            news |= self.learn(n, fx);
        }
        if news {
            for peer in self.up.clone() {
                self.tell(&peer, fx);
            }
        }
    }

    fn on_connection(&mut self, peer: &NodeId, up: bool, fx: &mut Effects<Known>) {
        if up {
            self.known.insert(peer.clone());
            self.up.insert(peer.clone());
            self.tell(peer, fx);
        } else {
            self.up.remove(peer);
            self.known.remove(peer);
        }
    }

    fn on_timer(&mut self, _timer: TimerId, _fx: &mut Effects<Known>) {}

    fn members(&self) -> Vec<NodeId> {
        let mut all: Vec<NodeId> = self.up.iter().cloned().collect();
        all.push(self.me.clone());
        all
    }

    fn route(&self, dst: &NodeId) -> Route {
        if self.up.contains(dst) {
            Route::Direct
        } else {
            Route::Unreachable
        }
    }
}

/// Starts `n` nodes with the overlay, joins them in a line, and waits (at most `limit`) until
/// every node sees all of them; returns the nodes.
pub async fn line_of(n: usize, limit: Duration) -> Result<Vec<Node>, String> {
    let mut nodes: Vec<Node> = Vec::new();
    for i in 0..n {
        let config = Config::new(format!("intro{i}")).listen("127.0.0.1:0".parse().unwrap());
        let node = Node::start_with_overlay(config, |id, _| Introductions::new(id))
            .await
            .map_err(|e| e.to_string())?;
        if let Some(prev) = nodes.last() {
            node.join_wait(prev.addr(), limit)
                .await
                .map_err(|e| e.to_string())?;
        }
        nodes.push(node);
    }
    let deadline = tokio::time::Instant::now() + limit;
    let mut events: Vec<_> = nodes.iter().map(|n| n.subscribe()).collect();
    loop {
        if nodes.iter().all(|node| node.members().len() == n) {
            return Ok(nodes);
        }
        // Wake on the next membership event of any node.
        let next = futures::future::select_all(events.iter_mut().map(|e| Box::pin(e.recv())));
        if tokio::time::timeout_at(deadline, next).await.is_err() {
            let seen: Vec<usize> = nodes.iter().map(|n| n.members().len()).collect();
            return Err(format!("members seen after {limit:?}: {seen:?}"));
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let nodes = line_of(4, Duration::from_secs(10)).await?;
    for node in &nodes {
        let names: Vec<String> = node
            .members()
            .into_iter()
            .map(|m| m.name.to_string())
            .collect();
        println!("{}: {}", node.id().name, names.join(", "));
    }
    for node in &nodes {
        node.shutdown().await;
    }
    Ok(())
}
