//! The node's actors as one owner: the registry of mailboxes and names, the calls waiting for
//! a reply, the monitors of remote actors and nodes, and what happens to the application
//! frames (sends, replies, watch requests, down notices) that arrive for them.
//!
//! Every [`ActorRef`](super::ActorRef), [`ReplyTo`](super::ReplyTo) and
//! [`Monitor`](super::Monitor) holds a weak handle to this, never to the node: a send needs
//! the registry (local targets) and the [`Router`] (remote ones), nothing else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use maquis_proto::reliable::Verdict;

use super::call::{CallOutcome, PendingCalls};
use super::fingerprint::{compatible, fingerprint};
use super::mailbox::{ErasedMailbox, Exit, Mailbox, Receiver, RemoteMsg};
use super::monitor::{Monitors, WatchTarget};
use super::registry::{Link, LinkKey, LinkRefused, Registry, WatchKey, Watcher};
use super::reliable::Reliable;
use super::scope::current_actor;
use super::{ActorId, Message};
use crate::dispatch::{hash_of, SendOpts};
use crate::error::LinkError;
use crate::id::NodeId;
use crate::router::Router;
use crate::wire::frame::{ActorHeader, Dest, DownReason, ReplyStatus};

/// A new actor's parts, from [`Actors::add`].
pub(crate) struct NewActor<M> {
    pub(crate) id: ActorId,
    pub(crate) rx: Receiver<M>,
    /// The mailbox's sending side, for the actor's first ref.
    pub(crate) mailbox: Arc<dyn ErasedMailbox>,
    pub(crate) exit: Exit<M>,
}

/// The actors of one node and the state shared by their refs.
pub(crate) struct Actors {
    /// Where frames for other nodes go.
    pub(crate) router: Arc<Router>,
    /// Mailboxes and names.
    pub(crate) registry: Registry,
    /// Calls waiting for a reply.
    pub(crate) calls: PendingCalls,
    /// The deadlines of calls waiting for their reply.
    pub(crate) deadlines: Arc<super::deadline::Deadlines>,
    /// Watches of remote actors and nodes.
    pub(crate) monitors: Monitors,
    /// Acknowledged delivery: what waits for an acknowledgement, what was handled.
    pub(crate) reliable: Reliable,
    next_actor: AtomicU64,
    mailbox_capacity: usize,
    /// This node's identity, shared by the refs to its actors.
    pub(crate) node: Arc<NodeId>,
    /// Where a message for a missing name under the virtual actors' prefix goes (set once the
    /// node's virtual-actor host runs).
    pub(crate) unnamed: std::sync::OnceLock<Arc<dyn UnnamedSink>>,
}

/// Takes messages that arrived for a local name no actor holds, when the name is one it
/// serves (the virtual actors' host: it activates the actor they are for).
pub(crate) trait UnnamedSink: Send + Sync {
    /// Offers a message for `name` (no actor held it when it arrived).
    fn offer(&self, name: &str, msg: Unnamed) -> Offer;
}

/// A message that arrived for a name no actor holds.
pub(crate) struct Unnamed {
    /// The node it came from.
    pub from: NodeId,
    /// Its type's fingerprint.
    pub ty: u64,
    /// Its encoded value.
    pub payload: Bytes,
    /// The sender's call, if it was one.
    pub call: Option<u64>,
}

/// What became of an offered message.
pub(crate) enum Offer {
    /// Not a name the sink serves.
    NotMine(Unnamed),
    /// An actor holds the name now: deliver to it.
    Named(Unnamed),
    /// Taken: held until its actor runs, or refused and answered.
    Taken,
}

impl Actors {
    /// No actors yet; mailboxes will hold `node.mailbox_capacity` messages.
    pub(crate) fn new(router: Arc<Router>, mailbox_capacity: usize) -> Self {
        Actors {
            node: Arc::new(router.id.clone()),
            router,
            registry: Registry::default(),
            calls: PendingCalls::default(),
            deadlines: super::deadline::Deadlines::start(),
            monitors: Monitors::default(),
            reliable: Reliable::default(),
            next_actor: AtomicU64::new(0),
            mailbox_capacity,
            unnamed: std::sync::OnceLock::new(),
        }
    }

    /// This node.
    pub(crate) fn id(&self) -> &NodeId {
        &self.router.id
    }

    /// A new actor's id, its mailbox's two ends (the registry keeps another sending end) and
    /// the signal that tells its task to end (registered).
    pub(crate) fn add<M: Message>(&self) -> NewActor<M> {
        let id = self.next_actor.fetch_add(1, Ordering::Relaxed) + 1;
        let typed = Mailbox::<M>::new(self.mailbox_capacity, fingerprint::<M>());
        let rx = Receiver::new(typed.clone());
        let exit = Exit::new(typed.clone());
        let mailbox: Arc<dyn ErasedMailbox> = typed;
        self.registry.insert(id, mailbox.clone());
        NewActor {
            id,
            rx,
            mailbox,
            exit,
        }
    }

    /// An actor ended: it leaves the registry, its watchers hear why, and the other ends of its
    /// links stop too unless it ended normally (`Stopped`).
    pub(crate) fn remove(&self, id: ActorId, reason: DownReason) {
        let removed = self.registry.remove(id);
        // What linked actors are told: the first cause, not a chain of links.
        if !removed.links.is_empty() {
            self.tell_links(id, removed.links, &reason);
        }
        self.notify_stopped(id, removed.watchers, reason);
    }

    /// Tells the actors linked to the stopped actor `id` why it stopped.
    fn tell_links(&self, id: ActorId, links: Vec<Link>, reason: &DownReason) {
        let linked = match reason {
            DownReason::Linked(why) => DownReason::Linked(why.clone()),
            other => DownReason::Linked(format!("actor #{id} on {}: {other}", self.id())),
        };
        for link in links {
            match link {
                Link::Local(other) => {
                    if reason.propagates() {
                        self.registry.kill(other, linked.clone());
                    }
                }
                Link::Remote(key) => {
                    let header = ActorHeader::Exit {
                        link: key.link,
                        initiator: key.initiator_here,
                        reason: if reason.propagates() {
                            linked.clone()
                        } else {
                            DownReason::Stopped
                        },
                    };
                    self.send_link_frame(&key.node, key.link, header);
                }
            }
        }
    }

    /// Stops a local actor with `reason` (its task ends at its next await); false if there
    /// is no such actor or it is already stopping.
    pub(crate) fn kill(&self, id: ActorId, reason: DownReason) -> bool {
        self.registry.kill(id, reason)
    }

    /// Links local actor `a` with actor `b` (on this node when `b_node` is this node).
    pub(crate) fn link(&self, a: ActorId, b_node: &NodeId, b: &Dest) -> Result<(), LinkError> {
        if b_node == self.id() {
            let b = self.resolve(b).ok_or(LinkError::NoProc)?;
            return self.registry.link_local(a, b).map_err(|e| match e {
                LinkRefused::NoProc(_) => LinkError::NoProc,
                LinkRefused::Limit => LinkError::WatcherLimit,
            });
        }
        let link = self.monitors.next_id();
        let key = LinkKey {
            node: b_node.clone(),
            link,
            initiator_here: true,
        };
        self.registry
            .link_remote(a, key, b.clone())
            .map_err(|e| match e {
                LinkRefused::NoProc(_) => LinkError::NoProc,
                LinkRefused::Limit => LinkError::WatcherLimit,
            })?;
        let header = ActorHeader::Link {
            link,
            from: a,
            to: b.clone(),
        };
        self.send_link_frame(b_node, link, header);
        Ok(())
    }

    /// Removes the links between local actor `a` and actor `b`; whether there was one.
    pub(crate) fn unlink(&self, a: ActorId, b_node: &NodeId, b: &Dest) -> bool {
        if b_node == self.id() {
            return self
                .resolve(b)
                .is_some_and(|b| self.registry.unlink_local(a, b));
        }
        let keys = self.registry.remote_links_to(a, b_node, b);
        for key in &keys {
            self.registry.unlink_remote(key);
            let header = ActorHeader::Unlink {
                link: key.link,
                initiator: key.initiator_here,
            };
            self.send_link_frame(b_node, key.link, header);
        }
        !keys.is_empty()
    }

    /// Sends a link frame on the lane every frame of link `link` to `to` takes, so that a
    /// `Link` and the `Exit` or `Unlink` that follows it arrive in order.
    fn send_link_frame(&self, to: &NodeId, link: u64, header: ActorHeader) {
        self.router.send_ordered(to, link, link, header);
    }

    /// Every actor is gone and every call fails (the node stops).
    pub(crate) fn stop_all(&self) {
        for (id, watchers) in self.registry.clear() {
            self.notify_stopped(id, watchers, DownReason::Stopped);
        }
        self.calls.fail_all("the node stopped");
        self.reliable.fail_all();
    }

    /// Tells local and remote watchers that an actor stopped, and why.
    fn notify_stopped(&self, actor: ActorId, watchers: Vec<Watcher>, reason: DownReason) {
        for w in watchers {
            match w {
                Watcher::Local { tx, .. } => {
                    let _ = tx.send(reason.clone());
                }
                Watcher::Remote { node, watch } => {
                    self.router.send_down(&node, watch, actor, reason.clone());
                }
            }
        }
    }

    /// A node is down or gone: its monitors fire, its watchers are forgotten, calls to it fail,
    /// and the local actors linked with its actors stop.
    pub(crate) fn node_gone(&self, node: &NodeId) {
        self.monitors.node_down(node);
        for id in self.registry.forget_node(node) {
            self.registry
                .kill(id, DownReason::Linked(format!("node {node} went down")));
        }
        self.calls.fail_node(node);
        self.reliable.node_gone(node);
    }

    /// A call of this node whose actor does not exist fails with `NoProc` now.
    pub(crate) fn no_proc_call(&self, call: u64) {
        self.calls.complete(call, CallOutcome::NoProc);
    }

    /// A call of this node whose request could not be delivered fails with `why` now.
    pub(crate) fn fail_call(&self, call: u64, why: String) {
        self.calls.complete(call, CallOutcome::Failed(why));
    }

    /// Sends a watch request on the lane the current actor's messages to `target` take, so a
    /// monitor set up before a send is in place when that message arrives.
    pub(crate) fn send_monitor(&self, to: &NodeId, watch: u64, target: Dest) {
        let receiver = hash_of(&target);
        self.send_watch(to, receiver, ActorHeader::Monitor { watch, target });
    }

    /// `receiver`: the hash of the watched actor's `Dest`, which picks the lane its messages take.
    fn send_watch(&self, to: &NodeId, receiver: u64, header: ActorHeader) {
        self.router
            .send_ordered(to, current_actor(), receiver, header);
    }

    /// Cancels a watch.
    pub(crate) fn demonitor(&self, watch: u64, target: &WatchTarget) {
        match target {
            WatchTarget::Local(id) => self.registry.unwatch(*id, &WatchKey::Local(watch)),
            WatchTarget::Actor(node, target) => {
                if self.monitors.remove(watch).is_some() {
                    let header = ActorHeader::Demonitor {
                        watch,
                        target: target.clone(),
                    };
                    self.send_watch(node, hash_of(target), header);
                }
            }
            WatchTarget::Node(_) => {
                self.monitors.remove(watch);
            }
        }
    }

    /// The local actor a `Dest` names now.
    fn resolve(&self, to: &Dest) -> Option<ActorId> {
        match to {
            Dest::Id(id) => Some(*id),
            Dest::Name(n) => self.registry.resolve(n),
        }
    }

    /// Puts a message that arrived from `from` into its actor's mailbox (waiting for room):
    /// `Ok`, or why not — no such actor (`NoProc`, counted in `unknown_actor`), another type
    /// (`TypeMismatch`, counted and logged; refused before decoding).
    pub(crate) async fn push(
        &self,
        from: &NodeId,
        to: &Dest,
        ty: u64,
        payload: Bytes,
        call: Option<u64>,
    ) -> ReplyStatus {
        let counters = &self.router.counters;
        let resolve = || match to {
            Dest::Id(id) => self.registry.by_id(*id),
            Dest::Name(n) => self
                .registry
                .resolve(n)
                .and_then(|id| self.registry.by_id(id)),
        };
        let sink = match to {
            Dest::Name(n) => self.unnamed.get().map(|s| (n, s)),
            Dest::Id(_) => None,
        };
        let mut msg = RemoteMsg {
            payload,
            from_node: from.clone(),
            call,
        };
        // A name no actor holds, or whose actor closed its mailbox since it was looked up
        // (a virtual actor deactivating), goes to the sink that serves it, if one does.
        let mut offered = false;
        loop {
            let mailbox = resolve();
            let Some(mb) = mailbox else {
                let Some((n, sink)) = sink.filter(|_| !offered) else {
                    break;
                };
                offered = true;
                let unnamed = Unnamed {
                    from: msg.from_node,
                    ty,
                    payload: msg.payload,
                    call: msg.call,
                };
                let back = match sink.offer(n, unnamed) {
                    Offer::Taken => return ReplyStatus::Ok,
                    Offer::Named(m) | Offer::NotMine(m) => m,
                };
                msg = RemoteMsg {
                    payload: back.payload,
                    from_node: back.from,
                    call: back.call,
                };
                if resolve().is_none() {
                    break;
                }
                continue;
            };
            if !compatible(ty, mb.ty()) {
                let n = counters.type_mismatch.inc_get();
                if n.is_power_of_two() {
                    tracing::warn!(
                        %from,
                        actor = ?to,
                        sent = format_args!("{ty:016x}"),
                        takes = format_args!("{:016x}", mb.ty()),
                        refused_so_far = n,
                        "message of another type than the actor takes refused"
                    );
                }
                return ReplyStatus::TypeMismatch;
            }
            // Most pushes find room: taken at once, without the boxed future of a push that
            // waits in line (which a full mailbox, or one that has senders waiting, needs).
            let pushed = match mb.try_push_remote(msg) {
                Ok(()) => Ok(()),
                Err(back) => mb.push_remote(back).await,
            };
            match pushed {
                Ok(()) => return ReplyStatus::Ok,
                Err(back) => {
                    // Closed. A virtual actor's name goes before its mailbox closes: offered
                    // next time round if the name is gone now; any other actor's end is final.
                    msg = back;
                    if sink.is_none() || offered || resolve().is_some() {
                        break;
                    }
                }
            }
        }
        counters.unknown_actor.inc();
        ReplyStatus::NoProc
    }

    /// A routed frame whose destination is this node's name: delivered if it is for this
    /// incarnation, else dropped (a call gets `NoProc`).
    pub(crate) async fn handle_routed(
        &self,
        to: &NodeId,
        from: &NodeId,
        actor: ActorHeader,
        payload: Bytes,
    ) {
        if to.incarnation != self.id().incarnation {
            self.router.counters.stale_target.inc();
            if let ActorHeader::Send { call: Some(c), .. } = actor {
                self.router.reply_status(from, c, ReplyStatus::NoProc);
            }
            return;
        }
        self.handle_app(from, actor, payload).await
    }

    /// Application frames (sends, replies, monitors) from node `from`, direct or routed.
    pub(crate) async fn handle_app(&self, from: &NodeId, header: ActorHeader, payload: Bytes) {
        let counters = &self.router.counters;
        match header {
            ActorHeader::Send {
                to,
                incarnation,
                call,
                ty,
            } => {
                if incarnation != 0 && incarnation != self.id().incarnation {
                    counters.stale_target.inc();
                    if let Some(call) = call {
                        self.router.reply_status(from, call, ReplyStatus::NoProc);
                    }
                    return;
                }
                let status = self.push(from, &to, ty, payload, call).await;
                if let (Some(call), false) = (call, status == ReplyStatus::Ok) {
                    self.router.reply_status(from, call, status);
                }
            }
            ActorHeader::Reliable {
                to,
                incarnation,
                ty,
                session,
                seq,
                floor,
            } => {
                let status = if incarnation != 0 && incarnation != self.id().incarnation {
                    counters.stale_target.inc();
                    ReplyStatus::NoProc
                } else {
                    match self.reliable.check(from, session, seq, floor) {
                        Verdict::Invalid => {
                            counters.acked_invalid.inc();
                            return;
                        }
                        Verdict::Duplicate => {
                            counters.acked_duplicates.inc();
                            ReplyStatus::Ok
                        }
                        Verdict::New => {
                            let status = self.push(from, &to, ty, payload, None).await;
                            if status != ReplyStatus::Ok {
                                self.reliable.unsee(from, session, seq);
                            }
                            status
                        }
                    }
                };
                let header = ActorHeader::Ack { seq, status };
                if let Err(e) = self.router.try_send_frame(
                    from,
                    &SendOpts::default(),
                    0,
                    seq,
                    header,
                    crate::wire::Body::default(),
                ) {
                    tracing::debug!(%from, seq, error = %e, "acknowledgement dropped");
                }
            }
            ActorHeader::Ack { seq, status } => {
                self.reliable.on_ack(from, seq, status);
            }
            ActorHeader::Reply { call, status, ty } => {
                let outcome = match status {
                    ReplyStatus::Ok => CallOutcome::Remote { payload, ty },
                    ReplyStatus::NoProc => CallOutcome::NoProc,
                    ReplyStatus::Failed(why) => CallOutcome::Failed(why),
                    ReplyStatus::TypeMismatch => CallOutcome::TypeMismatch,
                };
                if !self.calls.complete(call, outcome) {
                    counters.late_replies.inc();
                }
            }
            ActorHeader::Monitor { watch, target } => {
                let w = Watcher::Remote {
                    node: from.clone(),
                    watch,
                };
                match self.resolve(&target) {
                    Some(id) => {
                        if let Err((_, reason)) = self.registry.watch(id, w) {
                            self.router.send_down(from, watch, id, reason);
                        }
                    }
                    None => self.router.send_down(from, watch, 0, DownReason::NoProc),
                }
            }
            ActorHeader::Demonitor { watch, target } => {
                if let Some(id) = self.resolve(&target) {
                    self.registry
                        .unwatch(id, &WatchKey::Remote(from.clone(), watch));
                }
            }
            ActorHeader::Down { watch, reason, .. } => self.monitors.fire(watch, reason),
            ActorHeader::Link {
                link,
                from: peer,
                to,
            } => {
                let key = LinkKey {
                    node: from.clone(),
                    link,
                    initiator_here: false,
                };
                let refused = match self.resolve(&to) {
                    Some(id) => match self.registry.link_remote(id, key, Dest::Id(peer)) {
                        Ok(()) => None,
                        Err(LinkRefused::NoProc(_)) => Some(DownReason::NoProc),
                        Err(LinkRefused::Limit) => Some(DownReason::WatcherLimit),
                    },
                    None => Some(DownReason::NoProc),
                };
                if let Some(reason) = refused {
                    let header = ActorHeader::Exit {
                        link,
                        initiator: false,
                        reason: DownReason::Linked(format!("{to:?} on {}: {reason}", self.id())),
                    };
                    self.send_link_frame(from, link, header);
                }
            }
            ActorHeader::Unlink { link, initiator } => {
                self.registry.unlink_remote(&LinkKey {
                    node: from.clone(),
                    link,
                    initiator_here: !initiator,
                });
            }
            ActorHeader::Exit {
                link,
                initiator,
                reason,
            } => {
                let key = LinkKey {
                    node: from.clone(),
                    link,
                    initiator_here: !initiator,
                };
                if let Some(id) = self.registry.unlink_remote(&key) {
                    if reason.propagates() {
                        let reason = match reason {
                            DownReason::Linked(why) => DownReason::Linked(why),
                            other => DownReason::Linked(format!("an actor on {from}: {other}")),
                        };
                        self.registry.kill(id, reason);
                    }
                }
            }
        }
    }
}
