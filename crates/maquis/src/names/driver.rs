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
use crate::actor::Message;
use crate::id::NodeId;
use crate::node::{Inner, Node};
use crate::service::{send_to, Service, Watches};
use maquis_proto::names::{DirOutput, Directory, Entry, ReqId, Whereis};

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
    let driver = Driver {
        dir: Directory::new(inner.router.id.clone(), inner.config.services.directory()),
        inner,
        registering: HashMap::new(),
        looking: HashMap::new(),
        watched: HashMap::new(),
        holder: HashMap::new(),
        watches: Watches::default(),
        lost,
    };
    crate::service::spawn(node, SERVICE, driver, cmds);
}

/// Milliseconds of wall clock: the stamp that decides which of two registrations of one name
/// made during a partition wins (the older).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Service for Driver {
    type Msg = Envelope;
    type Cmd = Cmd;

    fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    fn watches(&mut self) -> &mut Watches {
        &mut self.watches
    }

    fn next_timeout(&self) -> Option<Duration> {
        self.dir.poll_timeout()
    }

    fn on_members(&mut self, now: Duration, members: &[NodeId]) {
        self.dir.handle_members(now, members);
    }

    async fn on_message(&mut self, now: Duration, Envelope { from, msg }: Envelope) {
        self.dir.handle_message(now, from, msg);
    }

    async fn on_command(&mut self, now: Duration, c: Cmd) {
        self.command(now, c);
    }

    fn on_actor_down(&mut self, _now: Duration, id: u64) {
        self.actor_down(id);
    }

    fn on_timeout(&mut self, now: Duration) {
        self.dir.handle_timeout(now);
    }

    /// Carries out what the machine produced.
    fn flush(&mut self) {
        while let Some(out) = self.dir.poll_output() {
            match out {
                DirOutput::Send { to, msg } => {
                    let from = self.inner.router.id.clone();
                    let failed = &self.inner.router.counters.names_send_failed;
                    send_to(&self.inner, to, SERVICE, Envelope { from, msg }, failed);
                }
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
}

impl Driver {
    fn command(&mut self, now: Duration, c: Cmd) {
        match c {
            Cmd::Register {
                name,
                actor,
                target,
                replaces,
                reply,
            } => {
                let req = match replaces {
                    Some(from) => self
                        .dir
                        .register_replacing(now, &name, target, wall_ms(), from),
                    None => self.dir.register(now, &name, target, wall_ms()),
                };
                self.registering.insert(req, (name, actor, reply));
            }
            Cmd::Unregister { name, reply } => {
                let held = self.dir.unregister(&name);
                self.forget(&name);
                let _ = reply.send(held);
            }
            Cmd::HandOver { name, reply } => {
                let held = self.dir.hand_over(&name);
                self.forget(&name);
                let _ = reply.send(held);
            }
            Cmd::ReleaseIfLeft { name } => self.dir.release_if_left(&name),
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
