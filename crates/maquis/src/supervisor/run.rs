//! A supervisor at work: starting children, watching them, restarting them by strategy and
//! intensity, and stopping them in reverse order.

use std::future::{poll_fn, Future};
use std::sync::Arc;
use std::task::Poll;

use thiserror::Error;
use tokio::sync::oneshot;

use super::intensity::Intensity;
use super::{ChildInfo, ChildSpec, Strategy, SupervisorMsg, SupervisorSpec};
use crate::actor::mailbox::Exit;
use crate::actor::{adopting, ActorRef, Actors, Adopted};
use crate::node::{Inbox, Node};
use crate::DownReason;

/// Why a supervisor could not start.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SuperviseError {
    /// Two children have the same id.
    #[error("two children are called {0:?}")]
    DuplicateChild(String),
    /// A child did not start; the children started before it were stopped again.
    #[error("child {child:?} did not start: {reason}")]
    Start {
        /// The child's id.
        child: String,
        /// Why.
        reason: String,
    },
    /// The node has stopped.
    #[error("the node has stopped")]
    Stopped,
}

/// A running start of a child: its actor and the watch that fires when it ends.
struct Running {
    id: u64,
    down: oneshot::Receiver<DownReason>,
}

struct Child {
    spec: ChildSpec,
    running: Option<Running>,
    restarts: u32,
}

struct Supervisor {
    node: Node,
    actors: Arc<Actors>,
    strategy: Strategy,
    intensity: Intensity,
    children: Vec<Child>,
}

impl Node {
    /// Starts a supervisor and its children, in order (see [`crate::supervisor`]). If a child
    /// does not start, those started before it are stopped again and the error says which.
    pub fn supervise(
        &self,
        spec: SupervisorSpec,
    ) -> Result<ActorRef<SupervisorMsg>, SuperviseError> {
        if self.is_stopped() {
            return Err(SuperviseError::Stopped);
        }
        let mut ids = std::collections::HashSet::new();
        if let Some(dup) = spec.children.iter().find(|c| !ids.insert(&c.id)) {
            return Err(SuperviseError::DuplicateChild(dup.id.clone()));
        }
        let mut sup = Supervisor {
            node: self.clone(),
            actors: self.actors().clone(),
            strategy: spec.strategy,
            intensity: Intensity::new(spec.max_restarts, spec.within),
            children: spec
                .children
                .into_iter()
                .map(|spec| Child {
                    spec,
                    running: None,
                    restarts: 0,
                })
                .collect(),
        };
        for i in 0..sup.children.len() {
            if let Err(reason) = sup.start(i) {
                let child = sup.children[i].spec.id.clone();
                // Nothing is awaited here: the children started so far are told to stop.
                for c in sup.children.iter_mut().rev() {
                    if let Some(r) = c.running.take() {
                        sup.actors.kill(r.id, DownReason::Shutdown);
                    }
                }
                return Err(SuperviseError::Start { child, reason });
            }
        }
        Ok(self.spawn_with_exit(move |inbox, exit| sup.run(inbox, exit)))
    }
}

impl Supervisor {
    async fn run(
        mut self,
        mut inbox: Inbox<SupervisorMsg>,
        mut exit: Exit<SupervisorMsg>,
    ) -> DownReason {
        loop {
            tokio::select! {
                biased;
                reason = &mut exit => {
                    self.stop_from(0).await;
                    return reason;
                }
                (i, reason) = self.next_down() => {
                    if let Err(why) = self.on_down(i, reason).await {
                        tracing::error!(%why, "supervisor gives up; its children stop");
                        self.stop_from(0).await;
                        return DownReason::Failed(why);
                    }
                }
                msg = inbox.recv() => match msg {
                    Some(SupervisorMsg::Children(reply)) => {
                        let _ = reply.send(self.info()).await;
                    }
                    None => {
                        self.stop_from(0).await;
                        return DownReason::Stopped;
                    }
                },
            }
        }
    }

    fn info(&self) -> Vec<ChildInfo> {
        self.children
            .iter()
            .map(|c| ChildInfo {
                id: c.spec.id.clone(),
                actor: c.running.as_ref().map(|r| r.id),
                restarts: c.restarts,
            })
            .collect()
    }

    /// The next child to go down and why. A watch that ends without a reason means the node
    /// is stopping: that child is only marked down.
    async fn next_down(&mut self) -> (usize, DownReason) {
        poll_fn(|cx| {
            for (i, c) in self.children.iter_mut().enumerate() {
                let Some(r) = c.running.as_mut() else {
                    continue;
                };
                if let Poll::Ready(res) = std::pin::Pin::new(&mut r.down).poll(cx) {
                    c.running = None;
                    if let Ok(reason) = res {
                        return Poll::Ready((i, reason));
                    }
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Child `i` went down: restart what the strategy says, within the intensity.
    async fn on_down(&mut self, i: usize, reason: DownReason) -> Result<(), String> {
        let child = &self.children[i];
        if !child.spec.restart.restarts_after(&reason) {
            tracing::info!(child = %child.spec.id, %reason, "child went down; not restarted");
            return Ok(());
        }
        tracing::warn!(child = %child.spec.id, %reason, "child went down; restarting");
        // The children to start again: `i`, and by the strategy those after or around it that
        // are running now (a temporary child that is stopped here stays down).
        let affected: Vec<usize> = match self.strategy {
            Strategy::OneForOne => vec![i],
            Strategy::OneForAll => (0..self.children.len()).collect(),
            Strategy::RestForOne => (i..self.children.len()).collect(),
        };
        let again: Vec<usize> = affected
            .iter()
            .copied()
            .filter(|&j| {
                j == i
                    || (self.children[j].running.is_some()
                        && self.children[j].spec.restart != super::Restart::Temporary)
            })
            .collect();
        for &j in affected.iter().rev() {
            self.stop(j).await;
        }
        let mut why = reason;
        for j in again {
            loop {
                if !self
                    .intensity
                    .record(tokio::time::Instant::now().into_std())
                {
                    return Err(format!(
                        "more than {} restarts within {:?}; the last: child {:?} ({why})",
                        self.intensity.max(),
                        self.intensity.within(),
                        self.children[j].spec.id,
                    ));
                }
                self.children[j].restarts += 1;
                match self.start(j) {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(child = %self.children[j].spec.id, error = %e, "child did not start");
                        why = DownReason::Failed(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Starts child `i` and watches it.
    fn start(&mut self, i: usize) -> Result<(), String> {
        let spec = &self.children[i].spec;
        let node = &self.node;
        let (started, adopted) = adopting(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (spec.start)(node)))
        });
        let started = match started {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err("its start function panicked".to_string()),
        };
        let id = started
            .id()
            .or_else(|| started.name().and_then(|n| self.actors.registry.resolve(n)));
        let mut watch = None;
        for Adopted {
            id: a,
            down,
            watch: w,
        } in adopted
        {
            if Some(a) == id && watch.is_none() {
                watch = Some(down);
            } else {
                // Spawned by the start function beside the child: not supervised.
                self.actors
                    .registry
                    .unwatch(a, &crate::actor::registry::WatchKey::Local(w));
            }
        }
        let (Some(id), Some(down)) = (id, watch) else {
            return Err("its start function returned an actor it did not spawn".to_string());
        };
        if let Some(name) = &spec.register_as {
            if let Err(e) = node.register(name, &started) {
                self.actors.kill(id, DownReason::Shutdown);
                return Err(e.to_string());
            }
        }
        self.children[i].running = Some(Running { id, down });
        Ok(())
    }

    /// Stops child `i` if it runs, and waits for its end up to its shutdown timeout.
    async fn stop(&mut self, i: usize) {
        let c = &mut self.children[i];
        let Some(mut r) = c.running.take() else {
            return;
        };
        self.actors.kill(r.id, DownReason::Shutdown);
        if tokio::time::timeout(c.spec.shutdown, &mut r.down)
            .await
            .is_err()
        {
            tracing::warn!(child = %c.spec.id, timeout = ?c.spec.shutdown, "child did not stop in time; going on without it");
        }
    }

    /// Stops children `from..`, last first.
    async fn stop_from(&mut self, from: usize) {
        for i in (from..self.children.len()).rev() {
            self.stop(i).await;
        }
    }
}
