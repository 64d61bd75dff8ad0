//! The directory service: the actor that drives a node's [`Directory`] machine.
//!
//! It feeds the machine the members the control loop publishes (on every membership event,
//! or after falling behind them), the directory messages other nodes' services send it, the
//! API's requests and its timers, and carries out what the machine produces: messages to
//! other services (ordinary actor sends, routed where there is no connection), answers to
//! the waiting callers, lost names. It watches every local actor that holds a global name
//! and unregisters its names when it stops.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, mpsc, oneshot};

use super::{Cmd, Envelope, GlobalNameError, NameLost, SERVICE};
use crate::actor::{ActorRef, Message};
use crate::id::NodeId;
use crate::node::{Inbox, Inner, Node};
use crate::service::{deadline, sleep_until, Watches};
use crate::wire::frame::Dest;
use maquis_proto::names::{DirMsg, DirOutput, Directory, Entry, ReqId, Whereis};

type Lookup = oneshot::Sender<Result<Option<Entry<NodeId>>, GlobalNameError>>;

/// A registration waiting for the home: the name, the actor, the caller.
type Registering = (String, u64, oneshot::Sender<Result<(), GlobalNameError>>);

struct Driver {
    inner: Arc<Inner>,
    dir: Directory<NodeId>,
    /// Registrations waiting for the home.
    registering: HashMap<ReqId, Registering>,
    /// Lookups waiting for the home.
    looking: HashMap<ReqId, Lookup>,
    /// Local actors that hold global names (watched), and which actor holds each name.
    watched: HashMap<u64, BTreeSet<String>>,
    holder: HashMap<String, u64>,
    watches: Watches,
    lost: broadcast::Sender<NameLost>,
}

/// Starts the service on `node`: registers it as [`SERVICE`] and returns at once.
pub(crate) fn spawn(
    node: &Node,
    inner: Arc<Inner>,
    cmds: mpsc::Receiver<Cmd>,
    lost: broadcast::Sender<NameLost>,
) {
    let me = inner.router.id.clone();
    let cfg = inner.config.services.directory();
    let events = inner.events.subscribe();
    let service = node.spawn_fn(move |inbox: Inbox<Envelope>| {
        let mut d = Driver {
            dir: Directory::new(me, cfg),
            inner,
            registering: HashMap::new(),
            looking: HashMap::new(),
            watched: HashMap::new(),
            holder: HashMap::new(),
            watches: Watches::default(),
            lost,
        };
        async move { d.run(inbox, cmds, events).await }
    });
    node.register_system(SERVICE, &service);
}

/// Milliseconds of wall clock: the stamp that decides which of two registrations of one name
/// made during a partition wins (the older).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Driver {
    fn now(&self) -> Duration {
        self.inner.router.started().elapsed()
    }

    async fn run(
        &mut self,
        mut inbox: Inbox<Envelope>,
        mut cmds: mpsc::Receiver<Cmd>,
        mut events: broadcast::Receiver<crate::MembershipEvent>,
    ) {
        let members = self.inner.members_now();
        self.dir.handle_members(self.now(), &members);
        self.flush();
        let shutdown = self.inner.router.shutdown.clone();
        loop {
            let at = deadline(&self.inner, self.dir.poll_timeout());
            tokio::select! {
                _ = shutdown.cancelled() => return,
                m = inbox.recv() => match m {
                    Some(Envelope { from, msg }) => {
                        let now = self.now();
                        self.dir.handle_message(now, from, msg);
                    }
                    None => return,
                },
                c = cmds.recv() => match c {
                    Some(c) => self.command(c),
                    None => return,
                },
                e = events.recv() => match e {
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        let members = self.inner.members_now();
                        let now = self.now();
                        self.dir.handle_members(now, &members);
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                id = self.watches.next() => self.actor_down(id),
                () = sleep_until(at) => {
                    let now = self.now();
                    self.dir.handle_timeout(now);
                }
            }
            self.flush();
        }
    }

    fn command(&mut self, c: Cmd) {
        let now = self.now();
        match c {
            Cmd::Register {
                name,
                actor,
                target,
                reply,
            } => {
                let req = self.dir.register(now, &name, target, wall_ms());
                self.registering.insert(req, (name, actor, reply));
            }
            Cmd::Unregister { name, reply } => {
                let held = self.dir.unregister(&name);
                self.forget(&name);
                let _ = reply.send(held);
            }
            Cmd::Whereis { name, reply } => match self.dir.whereis(now, &name) {
                Whereis::Now(e) => {
                    let _ = reply.send(Ok(e));
                }
                Whereis::Asked(req) => {
                    self.looking.insert(req, reply);
                }
                Whereis::Failed(e) => {
                    let _ = reply.send(Err(GlobalNameError::from_lookup(e)));
                }
            },
            Cmd::Invalidate { name } => self.dir.invalidate(&name),
            Cmd::Stats { reply } => {
                let _ = reply.send(self.dir.stats());
            }
        }
    }

    /// Carries out what the machine produced.
    fn flush(&mut self) {
        while let Some(out) = self.dir.poll_output() {
            match out {
                DirOutput::Send { to, msg } => self.send(to, msg),
                DirOutput::Registered { req, result } => {
                    let Some((name, actor, reply)) = self.registering.remove(&req) else {
                        continue;
                    };
                    let result = match result {
                        Ok(()) => {
                            self.watch(&name, actor);
                            Ok(())
                        }
                        Err(e) => Err(GlobalNameError::from_register(&name, e)),
                    };
                    let _ = reply.send(result);
                }
                DirOutput::Found { req, result } => {
                    if let Some(reply) = self.looking.remove(&req) {
                        let _ = reply.send(result.map_err(GlobalNameError::from_lookup));
                    }
                }
                DirOutput::Lost { name, winner } => {
                    self.forget(&name);
                    let lost = NameLost {
                        name,
                        winner: winner.owner,
                    };
                    tracing::warn!(%lost, "a global name lost a conflict after a partition");
                    self.inner.router.counters.names_lost.inc();
                    let _ = self.lost.send(lost);
                }
            }
        }
    }

    /// Sends a directory message to `to`'s service.
    fn send(&self, to: NodeId, msg: DirMsg<NodeId>) {
        let actors = Arc::downgrade(&self.inner.actors);
        let service: ActorRef<Envelope> = ActorRef::new(to, Dest::Name(SERVICE.into()), actors);
        let from = self.inner.router.id.clone();
        if let Err(e) = service.try_send(Envelope { from, msg }) {
            // Requests are sent again until answered; a copy to a replica is repaired by the
            // owner's next assertion.
            self.inner.router.counters.names_send_failed.inc();
            tracing::debug!(error = %e, to = %service.node(), "directory message not sent");
        }
    }

    /// Watches the actor that now holds `name`.
    fn watch(&mut self, name: &str, actor: u64) {
        if let Some(old) = self.holder.insert(name.to_string(), actor) {
            if old != actor {
                self.unwatch(old, name);
            }
        }
        self.watched
            .entry(actor)
            .or_default()
            .insert(name.to_string());
        self.watches.watch(&self.inner, actor);
    }

    /// `name` is no longer this node's.
    fn forget(&mut self, name: &str) {
        if let Some(actor) = self.holder.remove(name) {
            self.unwatch(actor, name);
        }
    }

    fn unwatch(&mut self, actor: u64, name: &str) {
        if let Some(names) = self.watched.get_mut(&actor) {
            names.remove(name);
            if names.is_empty() {
                self.watches.unwatch(actor);
                self.watched.remove(&actor);
            }
        }
    }

    /// A local actor with global names stopped: its names go.
    fn actor_down(&mut self, actor: u64) {
        let Some(names) = self.watched.remove(&actor) else {
            return;
        };
        for name in names {
            self.holder.remove(&name);
            self.dir.unregister(&name);
        }
    }
}

/// The message type of a registration: its fingerprint and name.
pub(crate) fn type_of<M: Message>() -> (u64, String) {
    (
        crate::actor::fingerprint::<M>(),
        crate::remote::short_type_name::<M>(),
    )
}
