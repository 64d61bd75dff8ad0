//! A probe actor: answers a ping with its node's name and the sender's.

use maquis::{ActorRef, Node, ReplyTo};
use serde::{Deserialize, Serialize};

/// What a probe answers.
#[derive(Debug, Serialize, Deserialize)]
pub enum Probe {
    /// Answered with "<node> got <from>".
    Ping {
        /// Who asks.
        from: String,
        /// Where the answer goes.
        reply: ReplyTo<String>,
    },
}

/// Spawns a probe on `node`, registered there as `probe`.
pub fn spawn_probe(node: &Node) -> ActorRef<Probe> {
    let me = node.id().name.to_string();
    let probe = node.spawn_fn(move |mut inbox| async move {
        while let Some(Probe::Ping { from, reply }) = inbox.recv().await {
            let _ = reply.send(format!("{me} got {from}")).await;
        }
    });
    node.register("probe", &probe).expect("register");
    probe
}
