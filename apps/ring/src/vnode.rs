//! Vnodes: one actor per partition, holding that partition's replicas.
//!
//! A vnode is registered as `vnode-<partition>` on the node that runs it, so any node reaches it
//! with `node.remote(owner, "vnode-17")`, and is addressed on the `vnode` channel with the
//! partition as partition key (all traffic of one partition shares one lane, in order).
//!
//! A vnode is in one of three modes:
//! - **serving**: reads and writes are answered from its store;
//! - **handing off** to a node: it still serves everything locally, and remembers the keys
//!   written since the handoff began so that the handoff resends them before finishing;
//! - **forwarding** to a node: its data has moved (every chunk acknowledged); it holds nothing
//!   and forwards each request, with the caller's reply handle, to the vnode of the same
//!   partition on the new node, which answers the caller directly.
//!
//! A vnode never waits on another node: forwards use `try_send` (a full lane answers the
//! caller `Unavailable` at once), replies wait only for room in the reply lane.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use maquis::{ActorRef, Inbox, Node, ReplyTo, SendOpts};
use serde::{Deserialize, Serialize};

use crate::node::Shared;
use crate::object::Object;

/// The channel carrying client requests to vnodes.
pub const VNODE_CHANNEL: &str = "vnode";

/// A forwarded request is forwarded again at most this many times (then served locally).
pub const MAX_HOPS: u8 = 3;

/// The registered name of the vnode of partition `p`.
pub fn vnode_name(p: u32) -> String {
    format!("vnode-{p}")
}

/// Send options of the traffic of partition `p` on the `vnode` channel.
pub fn vnode_opts(p: u32) -> SendOpts {
    SendOpts::on(VNODE_CHANNEL).partition(u64::from(p))
}

/// An entry moved by handoff: a key and its object (value or tombstone).
pub type Entry = (Bytes, Object);

/// What a vnode takes.
#[derive(Debug, Serialize, Deserialize)]
pub enum VnodeMsg {
    /// Echo service: send the payload back.
    Echo {
        /// The payload (shared with the received frame, not copied).
        #[serde(with = "maquis::payload::shared")]
        payload: Bytes,
        /// Where it goes back.
        reply: ReplyTo<maquis::Payload>,
    },
    /// Read one key.
    Get {
        /// The key.
        key: Bytes,
        /// How many times this request was forwarded already.
        hops: u8,
        /// Answered with [`VnodeReply::Value`].
        reply: ReplyTo<VnodeReply>,
    },
    /// Write one key (merge: the higher version wins).
    Put {
        /// The key.
        key: Bytes,
        /// The object (a tombstone for a delete).
        object: Object,
        /// How many times this request was forwarded already.
        hops: u8,
        /// Answered with [`VnodeReply::Stored`].
        reply: ReplyTo<VnodeReply>,
    },
    /// Read repair: merge an object, no reply.
    Repair {
        /// The key.
        key: Bytes,
        /// The newest object the coordinator saw.
        object: Object,
        /// How many times this request was forwarded already.
        hops: u8,
    },
    /// A handoff chunk from another node (on the `handoff` channel).
    Handoff {
        /// The sender's ring version: a receiver with an older ring asks it to retry.
        ring_version: u64,
        /// Entries to merge.
        entries: Vec<Entry>,
        /// Acknowledgement.
        reply: ReplyTo<HandoffAck>,
    },
    /// Local, from the handoff task: enter (or stay in) handing-off mode towards `to`, and
    /// return the next chunk of keys after `after`.
    TakeChunk {
        /// The receiving node.
        to: String,
        /// The last key already taken.
        after: Option<Bytes>,
        /// The chunk.
        reply: ReplyTo<Chunk>,
    },
    /// Local, from the handoff task once every chunk is acknowledged: return the keys written
    /// meanwhile, or switch to forwarding when there are none.
    FinishHandoff {
        /// The receiving node.
        to: String,
        /// The outcome.
        reply: ReplyTo<Finish>,
    },
    /// Local, from the manager or a failed handoff: go back to serving (a handoff was
    /// abandoned). With `only_to`, only if the vnode is handing off to that node.
    Resume {
        /// Resume only if the current handoff or forward goes to this node.
        only_to: Option<String>,
    },
    /// Local, from the manager (after it unregistered the name): serve what is queued, stop.
    Stop,
}

/// A vnode's answer to a read or a write.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum VnodeReply {
    /// The stored object (`None`: never written here).
    Value(Option<Object>),
    /// The write is stored; `had_live` tells whether a live value was there before.
    Stored {
        /// Whether the key held a live value before this write.
        had_live: bool,
    },
    /// The vnode could not serve the request (forwarding failed).
    Unavailable(String),
}

/// Acknowledgement of a handoff chunk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HandoffAck {
    /// Merged.
    Stored,
    /// The receiver's ring is older than the sender's (its version given): send the ring and
    /// retry.
    StaleRing(u64),
    /// The receiver has itself handed the partition off to this node: send there instead.
    Redirect(String),
}

/// A chunk taken for handoff.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Chunk {
    /// Entries, in key order.
    pub entries: Vec<Entry>,
    /// Whether keys remain after the last entry.
    pub more: bool,
    /// The vnode is not handing off to this node any more.
    pub aborted: bool,
}

/// The outcome of [`VnodeMsg::FinishHandoff`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Finish {
    /// Keys written during the handoff: send them, then ask again.
    More(Vec<Entry>),
    /// Done: the vnode now forwards to the receiver.
    Done,
    /// The vnode is not handing off to this node any more.
    Aborted,
}

/// A vnode's mode, as the manager sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Serving from its store.
    Serving,
    /// Handing off to a node.
    HandingOff(String),
    /// Data moved to a node, forwarding there since an instant.
    Forwarding(String, Instant),
}

/// What the manager can read of a vnode without messaging it.
#[derive(Debug)]
pub struct VnodeView {
    /// Keys stored (tombstones included).
    pub keys: AtomicUsize,
    /// Value bytes stored.
    pub bytes: AtomicUsize,
    /// Milliseconds (since the node's ring started) of the last client request.
    pub last_use_ms: AtomicU64,
    /// The mode.
    pub mode: Mutex<Mode>,
}

impl VnodeView {
    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.mode.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Copies a reply handle so that a request can be forwarded and still be answered if the
/// forward fails; once the forward is on its way the copy is let go with `ReplyTo::forget`.
fn dup_reply<R: maquis::Message>(node: &Node, reply: &ReplyTo<R>) -> Option<ReplyTo<R>> {
    maquis::encode(reply)
        .ok()
        .and_then(|b| node.decode::<ReplyTo<R>>(&b).ok())
}

struct Vnode {
    p: u32,
    name: String,
    shared: Arc<Shared>,
    view: Arc<VnodeView>,
    store: BTreeMap<Bytes, Object>,
    bytes: usize,
    mode: Mode,
    dirty: BTreeSet<Bytes>,
}

/// Starts the vnode of partition `p` and registers it as `vnode-<p>`.
pub(crate) fn spawn(shared: &Arc<Shared>, p: u32) -> (ActorRef<VnodeMsg>, Arc<VnodeView>) {
    let view = Arc::new(VnodeView {
        keys: AtomicUsize::new(0),
        bytes: AtomicUsize::new(0),
        last_use_ms: AtomicU64::new(shared.now_ms()),
        mode: Mutex::new(Mode::Serving),
    });
    let mut vnode = Vnode {
        p,
        name: vnode_name(p),
        shared: shared.clone(),
        view: view.clone(),
        store: BTreeMap::new(),
        bytes: 0,
        mode: Mode::Serving,
        dirty: BTreeSet::new(),
    };
    let actor = shared
        .node
        .spawn_fn(move |mut inbox: Inbox<VnodeMsg>| async move {
            while let Some(msg) = inbox.recv().await {
                if matches!(msg, VnodeMsg::Stop) {
                    // The name is gone: serve what is already queued, then stop.
                    while let Some(Some(msg)) = inbox.recv().now_or_never() {
                        vnode.handle(msg).await;
                    }
                    break;
                }
                vnode.handle(msg).await;
            }
            tracing::debug!(partition = vnode.p, "vnode stopped");
        });
    if let Err(e) = shared.node.register(&vnode_name(p), &actor) {
        tracing::error!(partition = p, error = %e, "cannot register vnode");
    }
    (actor, view)
}

impl Vnode {
    fn set_mode(&mut self, mode: Mode) {
        *self.view.mode.lock().unwrap_or_else(|e| e.into_inner()) = mode.clone();
        self.mode = mode;
    }

    fn publish_size(&self) {
        self.view.keys.store(self.store.len(), Ordering::Relaxed);
        self.view.bytes.store(self.bytes, Ordering::Relaxed);
    }

    fn touch(&self) {
        self.view
            .last_use_ms
            .store(self.shared.now_ms(), Ordering::Relaxed);
    }

    async fn delay(&self) {
        let d = self.shared.config.storage_delay;
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// Merges an object; returns whether a live value was there before.
    fn merge(&mut self, key: Bytes, object: Object) -> bool {
        self.shared.clock.observe(object.version.ts);
        if matches!(self.mode, Mode::HandingOff(_)) {
            self.dirty.insert(key.clone());
        }
        let had_live;
        match self.store.get_mut(&key) {
            Some(cur) => {
                had_live = cur.is_live();
                if object.version > cur.version {
                    self.bytes = self.bytes - cur.size() + object.size();
                    *cur = object;
                }
            }
            None => {
                had_live = false;
                self.bytes += object.size();
                self.store.insert(key, object);
            }
        }
        had_live
    }

    /// The node to forward to, when forwarding and the hop budget allows. A vnode whose
    /// forwarding target is no longer a live member serves again (it is then the natural
    /// fallback for that target's replicas, and hands them over when it returns).
    fn forward_target(&mut self, hops: u8) -> Option<String> {
        let Mode::Forwarding(to, _) = &self.mode else {
            return None;
        };
        if self.shared.node.member(to).is_none() {
            tracing::debug!(partition = self.p, to = %to, "forwarding target is down; serving");
            self.set_mode(Mode::Serving);
            return None;
        }
        (hops < MAX_HOPS && *to != self.shared.name).then(|| to.clone())
    }

    fn forward(&self, to: &str, msg: VnodeMsg) -> Result<(), String> {
        let target: ActorRef<VnodeMsg> = self
            .shared
            .node
            .remote(to, &self.name)
            .ok_or_else(|| format!("{to} is not a member"))?;
        target
            .try_send_with(msg, &vnode_opts(self.p))
            .map_err(|e| format!("forward to {to}: {e}"))
    }

    async fn handle(&mut self, msg: VnodeMsg) {
        match msg {
            VnodeMsg::Echo { payload, reply } => {
                self.touch();
                let _ = reply.send(payload.into()).await;
            }
            VnodeMsg::Get { key, hops, reply } => {
                self.touch();
                if let Some(to) = self.forward_target(hops) {
                    let backup = dup_reply(&self.shared.node, &reply);
                    let fwd = VnodeMsg::Get {
                        key,
                        hops: hops + 1,
                        reply,
                    };
                    match self.forward(&to, fwd) {
                        Err(e) => {
                            if let Some(r) = backup {
                                let _ = r.send(VnodeReply::Unavailable(e)).await;
                            }
                        }
                        Ok(()) => backup.into_iter().for_each(ReplyTo::forget),
                    }
                    return;
                }
                self.delay().await;
                let obj = self.store.get(&key).cloned();
                let _ = reply.send(VnodeReply::Value(obj)).await;
            }
            VnodeMsg::Put {
                key,
                object,
                hops,
                reply,
            } => {
                self.touch();
                if let Some(to) = self.forward_target(hops) {
                    let backup = dup_reply(&self.shared.node, &reply);
                    let fwd = VnodeMsg::Put {
                        key,
                        object,
                        hops: hops + 1,
                        reply,
                    };
                    match self.forward(&to, fwd) {
                        Err(e) => {
                            if let Some(r) = backup {
                                let _ = r.send(VnodeReply::Unavailable(e)).await;
                            }
                        }
                        Ok(()) => backup.into_iter().for_each(ReplyTo::forget),
                    }
                    return;
                }
                self.delay().await;
                let had_live = self.merge(key, object);
                self.publish_size();
                let _ = reply.send(VnodeReply::Stored { had_live }).await;
            }
            VnodeMsg::Repair { key, object, hops } => {
                if let Some(to) = self.forward_target(hops) {
                    let fwd = VnodeMsg::Repair {
                        key,
                        object,
                        hops: hops + 1,
                    };
                    if let Err(e) = self.forward(&to, fwd) {
                        tracing::debug!(partition = self.p, error = %e, "repair not forwarded");
                    }
                    return;
                }
                self.delay().await;
                self.merge(key, object);
                self.publish_size();
            }
            VnodeMsg::Handoff {
                ring_version,
                entries,
                reply,
            } => {
                let mine = self.shared.ring().version;
                let ack = if mine < ring_version {
                    HandoffAck::StaleRing(mine)
                } else if let Mode::Forwarding(to, _) = &self.mode {
                    HandoffAck::Redirect(to.clone())
                } else {
                    for (k, o) in entries {
                        self.merge(k, o);
                    }
                    self.publish_size();
                    HandoffAck::Stored
                };
                let _ = reply.send(ack).await;
            }
            VnodeMsg::TakeChunk { to, after, reply } => {
                let chunk = self.take_chunk(to, after);
                let _ = reply.send(chunk).await;
            }
            VnodeMsg::FinishHandoff { to, reply } => {
                let out = self.finish(to);
                let _ = reply.send(out).await;
            }
            VnodeMsg::Resume { only_to } => {
                let resume = match (&self.mode, &only_to) {
                    (Mode::Serving, _) => false,
                    (_, None) => true,
                    (Mode::HandingOff(t), Some(o)) => t == o,
                    // A finished handoff is not undone by a late failure report.
                    (Mode::Forwarding(..), Some(_)) => false,
                };
                if resume {
                    self.dirty.clear();
                    self.set_mode(Mode::Serving);
                }
            }
            VnodeMsg::Stop => {}
        }
    }

    fn limits(&self) -> (usize, usize) {
        let c = &self.shared.config;
        (c.handoff_chunk_entries, c.handoff_chunk_bytes)
    }

    fn take_chunk(&mut self, to: String, after: Option<Bytes>) -> Chunk {
        // A scan continues only while the vnode is still handing off to the same node; if it
        // was interrupted (resumed, or redirected to another node), writes made meanwhile
        // were not tracked, so the handoff must start over.
        match &self.mode {
            Mode::HandingOff(t) if *t == to => {}
            Mode::Serving | Mode::HandingOff(_) if after.is_none() => {
                self.dirty.clear();
                self.set_mode(Mode::HandingOff(to));
            }
            _ => {
                return Chunk {
                    aborted: true,
                    ..Chunk::default()
                }
            }
        }
        let (max_entries, max_bytes) = self.limits();
        let lower = match &after {
            Some(k) => Bound::Excluded(k.clone()),
            None => Bound::Unbounded,
        };
        let mut entries = Vec::new();
        let mut size = 0usize;
        let mut more = false;
        for (k, o) in self.store.range((lower, Bound::Unbounded)) {
            if entries.len() >= max_entries || (!entries.is_empty() && size + o.size() > max_bytes)
            {
                more = true;
                break;
            }
            size += o.size() + k.len();
            entries.push((k.clone(), o.clone()));
        }
        Chunk {
            entries,
            more,
            aborted: false,
        }
    }

    fn finish(&mut self, to: String) -> Finish {
        if self.mode != Mode::HandingOff(to.clone()) {
            return Finish::Aborted;
        }
        if !self.dirty.is_empty() {
            let (max_entries, max_bytes) = self.limits();
            let mut entries = Vec::new();
            let mut size = 0usize;
            while let Some(k) = self.dirty.first().cloned() {
                let Some(o) = self.store.get(&k) else {
                    self.dirty.remove(&k);
                    continue;
                };
                if entries.len() >= max_entries
                    || (!entries.is_empty() && size + o.size() > max_bytes)
                {
                    break;
                }
                size += o.size() + k.len();
                entries.push((k.clone(), o.clone()));
                self.dirty.remove(&k);
            }
            return Finish::More(entries);
        }
        self.store = BTreeMap::new();
        self.bytes = 0;
        self.publish_size();
        self.set_mode(Mode::Forwarding(to, Instant::now()));
        Finish::Done
    }
}

/// How long ago (in ms of the ring's clock) a vnode was last used.
pub(crate) fn idle_for(shared: &Shared, view: &VnodeView) -> Duration {
    Duration::from_millis(
        shared
            .now_ms()
            .saturating_sub(view.last_use_ms.load(Ordering::Relaxed)),
    )
}
