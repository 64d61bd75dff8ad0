//! Acknowledged delivery on this node: the driver of `maquis_proto::reliable`.
//!
//! Sending: one [`Outbox`] per receiving node holds the messages not yet acknowledged (their
//! encoded payload, kept for resending, and the sender waiting for the outcome), in a
//! *session* with a random id: numbers count from 1 in each session, so an outbox made anew
//! (after its node went away and came back) never reuses a number the receiver has seen. An
//! outbox stays while its node is a member, and is dropped once the node is gone and nothing
//! waits in it. A timer task ([`run_timers`]) resends what is due on the lane the first copy
//! took and gives up what reached its deadline. Receiving: one [`Seen`] per (sending node,
//! session) tells new numbers from duplicates; at most [`MAX_SENDERS`] are kept, the longest
//! unused forgotten first (a session forgotten while its sender still resends could have one
//! message handled twice: that takes more than 4096 sessions sending to this node at once).
//!
//! Limits per receiving node: [`OutboxLimits::default`] (numbers in flight span less than 1024;
//! 64 MiB of payloads kept); a send waits for room (within its `give_up_after`), a `try_send`
//! fails with `Backpressure`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use maquis_proto::reliable::{Due, Outbox, OutboxLimits, RetryConfig, Seen, Verdict};
use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use super::actors::Actors;
use crate::dispatch::{Acked, SendOpts};
use crate::error::SendError;
use crate::id::NodeId;
use crate::wire::frame::{ActorHeader, Dest, ReplyStatus};
use crate::wire::Body;

/// How many sending nodes' records a node keeps.
pub(crate) const MAX_SENDERS: usize = 4096;

/// A message kept until it is acknowledged.
struct Stored {
    to: Dest,
    incarnation: u64,
    ty: u64,
    payload: Body,
    opts: SendOpts,
    sender: u64,
    receiver: u64,
    give_up_after: Duration,
    /// The waiting sender; `None` for a `try_send` (a give-up is then counted and logged).
    done: Option<oneshot::Sender<Result<(), SendError>>>,
}

struct Out {
    session: u64,
    outbox: Outbox,
    msgs: HashMap<u64, Stored>,
}

#[derive(Default)]
struct SeenTable {
    by_node: HashMap<(NodeId, u64), (Seen, u64)>,
    clock: u64,
}

/// What an acknowledged send needs besides the message.
pub(crate) struct AckedSend<'a> {
    pub(crate) node: &'a NodeId,
    pub(crate) to: Dest,
    pub(crate) ty: u64,
    pub(crate) payload: Body,
    pub(crate) opts: &'a SendOpts,
    pub(crate) policy: Acked,
    pub(crate) sender: u64,
    pub(crate) receiver: u64,
}

/// The node's acknowledged-delivery state.
#[derive(Default)]
pub(crate) struct Reliable {
    out: Mutex<HashMap<NodeId, Out>>,
    seen: Mutex<SeenTable>,
    /// An acknowledgement or a give-up made room in some outbox.
    room: Notify,
    /// A message was opened: the timer task recomputes its next wake-up.
    timer: Notify,
}

fn retry_config(p: &Acked) -> RetryConfig {
    RetryConfig {
        first_retry_us: p.first_retry.as_micros() as u64,
        max_retry_us: p.max_retry.as_micros() as u64,
        give_up_after_us: p.give_up_after.as_micros() as u64,
    }
}

fn status_result(status: ReplyStatus) -> Result<(), SendError> {
    match status {
        ReplyStatus::Ok => Ok(()),
        ReplyStatus::NoProc => Err(SendError::NoProc),
        ReplyStatus::TypeMismatch => Err(SendError::TypeMismatch),
        ReplyStatus::Failed(why) => Err(SendError::Unreachable(why)),
    }
}

impl Reliable {
    fn lock_out(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, Out>> {
        self.out.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Judges an arriving number from `from`'s session `session`.
    pub(crate) fn check(&self, from: &NodeId, session: u64, seq: u64, floor: u64) -> Verdict {
        let mut t = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        t.clock += 1;
        let clock = t.clock;
        let key = (from.clone(), session);
        if !t.by_node.contains_key(&key) && t.by_node.len() >= MAX_SENDERS {
            let oldest = t
                .by_node
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(n, _)| n.clone());
            if let Some(n) = oldest {
                t.by_node.remove(&n);
            }
        }
        let (seen, used) = t
            .by_node
            .entry(key)
            .or_insert_with(|| (Seen::new(OutboxLimits::default().window), clock));
        *used = clock;
        seen.check(seq, floor)
    }

    /// A number judged new was not handled after all (no such actor, another type): forget
    /// it, so that a resend is judged again instead of acknowledged as handled.
    pub(crate) fn unsee(&self, from: &NodeId, session: u64, seq: u64) {
        let mut t = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, _)) = t.by_node.get_mut(&(from.clone(), session)) {
            seen.forget(seq);
        }
    }

    /// An acknowledgement from `from`.
    pub(crate) fn on_ack(&self, from: &NodeId, seq: u64, status: ReplyStatus) -> bool {
        let stored = {
            let mut out = self.lock_out();
            let Some(o) = out.get_mut(from) else {
                return false;
            };
            if !o.outbox.ack(seq) {
                return false;
            }
            o.msgs.remove(&seq)
        };
        self.room.notify_waiters();
        if let Some(tx) = stored.and_then(|s| s.done) {
            let _ = tx.send(status_result(status));
        }
        true
    }

    /// Fails every message waiting (the node stops).
    pub(crate) fn fail_all(&self) {
        let all: Vec<Out> = self.lock_out().drain().map(|(_, o)| o).collect();
        for o in all {
            for s in o.msgs.into_values() {
                if let Some(tx) = s.done {
                    let _ = tx.send(Err(SendError::NodeStopped));
                }
            }
        }
        self.room.notify_waiters();
    }

    /// Forgets message `seq` to `node` (its first send failed for good).
    fn forget(&self, node: &NodeId, seq: u64) {
        let mut out = self.lock_out();
        if let Some(o) = out.get_mut(node) {
            o.outbox.ack(seq);
            o.msgs.remove(&seq);
        }
        drop(out);
        self.room.notify_waiters();
    }

    /// `node` is gone: its outbox goes unless messages still wait in it (they are resent
    /// until their deadline, in case the node comes back).
    pub(crate) fn node_gone(&self, node: &NodeId) {
        let mut out = self.lock_out();
        if out.get(node).is_some_and(|o| o.outbox.is_empty()) {
            out.remove(node);
        }
    }

    /// Messages waiting for their acknowledgement, to every node.
    pub(crate) fn unacked(&self) -> usize {
        self.lock_out().values().map(|o| o.outbox.len()).sum()
    }
}

impl Actors {
    /// Sends a message for acknowledged delivery. With `wait`, waits for room and then for the
    /// outcome; without, fails with `Backpressure` when there is no room and returns once the
    /// message is queued.
    pub(crate) async fn send_acked(&self, m: AckedSend<'_>, wait: bool) -> Result<(), SendError> {
        let rel = &self.reliable;
        let retry = retry_config(&m.policy);
        let give_up_at = tokio::time::Instant::now() + m.policy.give_up_after;
        let (tx, rx) = oneshot::channel();
        let mut tx = Some(tx);
        let (session, seq, floor) = loop {
            let room = rel.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut out = rel.lock_out();
                if !out.contains_key(m.node) && out.len() >= MAX_SENDERS {
                    out.retain(|_, o| !o.outbox.is_empty());
                }
                let o = out.entry(m.node.clone()).or_insert_with(|| Out {
                    session: rand::random(),
                    outbox: Outbox::new(OutboxLimits::default()),
                    msgs: HashMap::new(),
                });
                if let Some(seq) = o.outbox.open(self.router.now_us(), m.payload.len(), &retry) {
                    o.msgs.insert(
                        seq,
                        Stored {
                            to: m.to.clone(),
                            incarnation: m.node.incarnation,
                            ty: m.ty,
                            payload: m.payload.clone(),
                            opts: m.opts.clone(),
                            sender: m.sender,
                            receiver: m.receiver,
                            give_up_after: m.policy.give_up_after,
                            done: if wait { tx.take() } else { None },
                        },
                    );
                    break (o.session, seq, o.outbox.floor());
                }
            }
            if !wait {
                return Err(SendError::Backpressure("acknowledged-delivery window"));
            }
            if tokio::time::timeout_at(give_up_at, room).await.is_err() {
                return Err(SendError::Unacknowledged {
                    after: m.policy.give_up_after,
                });
            }
        };
        rel.timer.notify_one();
        let header = ActorHeader::Reliable {
            to: m.to,
            incarnation: m.node.incarnation,
            ty: m.ty,
            session,
            seq,
            floor,
        };
        let sent = if wait {
            self.router
                .send_frame(m.node, m.opts, m.sender, m.receiver, header, m.payload)
                .await
        } else {
            self.router
                .try_send_frame(m.node, m.opts, m.sender, m.receiver, header, m.payload)
        };
        match sent {
            // Not reachable now, or no room: a resend will try again.
            Ok(()) | Err(SendError::Unreachable(_)) | Err(SendError::Backpressure(_)) => {}
            Err(e) => {
                rel.forget(m.node, seq);
                return Err(e);
            }
        }
        if !wait {
            return Ok(());
        }
        rx.await.unwrap_or(Err(SendError::NodeStopped))
    }

    /// Resends what is due and gives up what reached its deadline; when to come back.
    fn reliable_tick(&self) -> Option<u64> {
        let now = self.router.now_us();
        let mut resend = Vec::new();
        let mut failed = Vec::new();
        let next = {
            let mut out = self.reliable.lock_out();
            for (node, o) in out.iter_mut() {
                while let Some(due) = o.outbox.poll(now) {
                    match due {
                        Due::Resend(seq) => {
                            if let Some(s) = o.msgs.get(&seq) {
                                let header = ActorHeader::Reliable {
                                    to: s.to.clone(),
                                    incarnation: s.incarnation,
                                    ty: s.ty,
                                    session: o.session,
                                    seq,
                                    floor: o.outbox.floor(),
                                };
                                resend.push((node.clone(), seq, header, s.clone_frame()));
                            }
                        }
                        Due::GiveUp(seq) => {
                            if let Some(s) = o.msgs.remove(&seq) {
                                failed.push((node.clone(), s));
                            }
                        }
                    }
                }
            }
            out.values().filter_map(|o| o.outbox.next_due()).min()
        };
        if !failed.is_empty() {
            self.reliable.room.notify_waiters();
        }
        for (node, s) in failed {
            self.router.counters.acked_given_up.inc();
            let err = SendError::Unacknowledged {
                after: s.give_up_after,
            };
            match s.done {
                Some(tx) => {
                    let _ = tx.send(Err(err));
                }
                None => tracing::warn!(%node, error = %err, "acknowledged message given up"),
            }
        }
        for (node, seq, header, (opts, sender, receiver, payload)) in resend {
            self.router.counters.acked_resends.inc();
            match self
                .router
                .try_send_frame(&node, &opts, sender, receiver, header, payload)
            {
                Err(e @ SendError::StaleIncarnation { .. }) => {
                    // The node restarted: nothing sent to its old life can arrive.
                    let done = {
                        let mut out = self.reliable.lock_out();
                        out.get_mut(&node).and_then(|o| {
                            o.outbox.ack(seq);
                            o.msgs.remove(&seq).and_then(|s| s.done)
                        })
                    };
                    if let Some(tx) = done {
                        let _ = tx.send(Err(e));
                    }
                }
                Err(e) => tracing::debug!(%node, seq, error = %e, "resend not queued"),
                Ok(()) => {}
            }
        }
        next
    }
}

impl Stored {
    fn clone_frame(&self) -> (SendOpts, u64, u64, Body) {
        (
            self.opts.clone(),
            self.sender,
            self.receiver,
            self.payload.clone(),
        )
    }
}

/// Resends and gives up acknowledged messages until the node stops.
pub(crate) async fn run_timers(actors: Arc<Actors>, stop: CancellationToken) {
    let a = actors;
    loop {
        let timer = a.reliable.timer.notified();
        tokio::pin!(timer);
        timer.as_mut().enable();
        let next = a.reliable_tick();
        let wait = next.map(|t| Duration::from_micros(t.saturating_sub(a.router.now_us())));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = &mut timer => {}
            _ = async {
                match wait {
                    Some(w) => tokio::time::sleep(w).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }
}
