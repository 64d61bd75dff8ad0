//! Monitors: a future that resolves when a watched actor stops or a watched node goes away.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Weak};
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::actors::Actors;
use super::ActorId;
use crate::id::NodeId;
use crate::wire::frame::{Dest, DownReason};

/// What a remote (or node) monitor watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WatchTarget {
    /// A whole node.
    Node(NodeId),
    /// An actor on another node, by id or by name.
    Actor(NodeId, Dest),
    /// A local actor (its watcher sits in the registry).
    Local(ActorId),
}

impl WatchTarget {
    fn node(&self) -> Option<&NodeId> {
        match self {
            WatchTarget::Node(n) | WatchTarget::Actor(n, _) => Some(n),
            WatchTarget::Local(_) => None,
        }
    }
}

/// Monitors of remote actors and nodes, by watch id.
#[derive(Default)]
pub(crate) struct Monitors {
    next: AtomicU64,
    remote: Mutex<HashMap<u64, (WatchTarget, oneshot::Sender<DownReason>)>>,
}

impl Monitors {
    pub(crate) fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn add(&self, watch: u64, target: WatchTarget, tx: oneshot::Sender<DownReason>) {
        self.remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(watch, (target, tx));
    }

    pub(crate) fn remove(&self, watch: u64) -> Option<WatchTarget> {
        self.remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&watch)
            .map(|(t, _)| t)
    }

    /// Fires one monitor (a `Down` arrived).
    pub(crate) fn fire(&self, watch: u64, reason: DownReason) {
        if let Some((_, tx)) = self
            .remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&watch)
        {
            let _ = tx.send(reason);
        }
    }

    /// Fires every monitor of anything on `node` (name and incarnation).
    pub(crate) fn node_down(&self, node: &NodeId) {
        let mut map = self.remote.lock().unwrap_or_else(|e| e.into_inner());
        let hit: Vec<u64> = map
            .iter()
            .filter(|(_, (t, _))| t.node() == Some(node))
            .map(|(w, _)| *w)
            .collect();
        for w in hit {
            if let Some((_, tx)) = map.remove(&w) {
                let _ = tx.send(DownReason::NodeDown);
            }
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.remote.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// Resolves with the reason once the watched actor stops or its node goes down. Dropping it
/// cancels the watch.
pub struct Monitor {
    pub(crate) rx: oneshot::Receiver<DownReason>,
    pub(crate) watch: u64,
    pub(crate) target: WatchTarget,
    pub(crate) rt: Weak<Actors>,
    pub(crate) done: bool,
}

impl Future for Monitor {
    type Output = DownReason;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<DownReason> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(r) => {
                self.done = true;
                // A dropped sender means the node itself stopped.
                Poll::Ready(r.unwrap_or(DownReason::NodeDown))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(actors) = self.rt.upgrade() {
            actors.demonitor(self.watch, &self.target);
        }
    }
}
