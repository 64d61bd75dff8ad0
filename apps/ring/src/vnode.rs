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
//!
//! With a durable [`Storage`](crate::storage::Storage), a vnode loads its partition when it
//! starts (requests wait in its inbox meanwhile) and acknowledges a write (a put, a delete, a
//! handoff chunk) only once the backend has made it durable. It does not wait for that: it goes
//! on serving, collects the writes that arrive meanwhile, and hands them to the backend as one
//! batch when the previous batch is durable (at most one batch, plus one clear after a handoff,
//! in flight per vnode). Reads are served from memory at once, so a read may see a write that
//! is not yet acknowledged.

use std::collections::VecDeque;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt;
use maquis::{ActorRef, Inbox, Node, ReplyTo, SendOpts};
use serde::{Deserialize, Serialize};

use crate::aae::{segment_of, Tree};
use crate::hash::{key_hash, partition_of_hash};
use crate::node::Shared;
use crate::object::{Object, Version};
use crate::storage::{StorageError, Ticket};

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
    /// Anti-entropy: the tree of the keys held here whose primary partition is `q`.
    AaeTree {
        /// The primary partition.
        q: u32,
        /// The summary.
        reply: ReplyTo<TreeSummary>,
    },
    /// Anti-entropy: the keys of primary partition `q` held here in these segments, with
    /// their versions (at most [`AAE_MAX_KEYS`]).
    AaeKeys {
        /// The primary partition.
        q: u32,
        /// The segments.
        segments: Vec<u32>,
        /// The keys and versions.
        reply: ReplyTo<Vec<(Bytes, Version)>>,
    },
    /// Anti-entropy: the objects stored here for these keys (absent ones left out).
    AaeFetch {
        /// The keys.
        keys: Vec<Bytes>,
        /// The objects.
        reply: ReplyTo<Vec<Entry>>,
    },
    /// Anti-entropy: merge these objects; answered once they are stored (durable, with a
    /// durable backend).
    AaeMerge {
        /// The objects.
        entries: Vec<Entry>,
        /// `Stored` or `Failed`.
        reply: ReplyTo<HandoffAck>,
    },
    /// Local, from the manager: the vnode may hold less than its replicas (this node came
    /// back, or took the partition over without its data): a read of a key it does not hold
    /// is answered [`VnodeReply::NotAuthoritative`] until [`VnodeMsg::Trust`].
    Recover,
    /// Local, from the manager: anti-entropy has brought the vnode up to its replicas (or a
    /// handoff is filling it): its answers count again.
    Trust,
    /// Local, from the manager (after it unregistered the name): serve what is queued, stop.
    Stop,
}

/// Most keys an [`VnodeMsg::AaeKeys`] answer carries.
pub const AAE_MAX_KEYS: usize = 16_384;

/// A vnode's anti-entropy tree for one primary partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeSummary {
    /// The segment hashes ([`crate::aae::SEGMENTS`] of them).
    pub segments: Vec<u64>,
    /// Keys accounted for.
    pub keys: u64,
    /// Whether the vnode serves from its own store (not forwarding after a handoff).
    pub serving: bool,
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
        /// The timestamp of a newer version the vnode kept instead (the write lost to it):
        /// the coordinator writes again with a later version.
        newer: Option<u64>,
    },
    /// The vnode could not serve the request (forwarding failed, or its storage).
    Unavailable(String),
    /// The key is not here, but the vnode is recovering (it may hold less than its
    /// replicas): the coordinator does not count this as an answer.
    NotAuthoritative,
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
    /// The receiver could not store the chunk durably (its storage failed): retry later.
    Failed(String),
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
    /// Whether the vnode has loaded its stored objects (until then it holds nothing yet).
    pub loaded: AtomicBool,
    /// Whether it is recovering (see [`VnodeMsg::Recover`]).
    pub recovering: AtomicBool,
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

/// A reply that waits until the write it answers is durable.
enum Pending {
    Put(ReplyTo<VnodeReply>, bool, Option<u64>),
    Handoff(ReplyTo<HandoffAck>),
}

impl Pending {
    async fn answer(self, result: &Result<(), StorageError>) {
        match (self, result) {
            (Pending::Put(reply, had_live, newer), Ok(())) => {
                let _ = reply.send(VnodeReply::Stored { had_live, newer }).await;
            }
            (Pending::Put(reply, ..), Err(e)) => {
                let _ = reply.send(VnodeReply::Unavailable(e.to_string())).await;
            }
            (Pending::Handoff(reply), Ok(())) => {
                let _ = reply.send(HandoffAck::Stored).await;
            }
            (Pending::Handoff(reply), Err(e)) => {
                let _ = reply.send(HandoffAck::Failed(e.to_string())).await;
            }
        }
    }
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
    /// Whether writes wait for the storage (a durable backend).
    durable: bool,
    /// Writes merged here and not yet handed to the storage.
    unsynced: Vec<(Bytes, Object)>,
    /// The replies of those writes.
    waiting: Vec<Pending>,
    /// Operations handed to the storage, oldest first, with the replies that wait for them.
    inflight: VecDeque<(Ticket, Vec<Pending>)>,
    /// Anti-entropy trees, by primary partition.
    trees: BTreeMap<u32, Tree>,
    /// Not-found answers do not count (see [`VnodeMsg::Recover`]).
    recovering: bool,
}

/// Starts the vnode of partition `p` and registers it as `vnode-<p>`. With a durable
/// storage it loads the partition first. A vnode started `recovering` answers reads of keys it
/// does not hold with [`VnodeReply::NotAuthoritative`] until it is trusted.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    p: u32,
    recovering: bool,
) -> (ActorRef<VnodeMsg>, Arc<VnodeView>) {
    let view = Arc::new(VnodeView {
        keys: AtomicUsize::new(0),
        bytes: AtomicUsize::new(0),
        last_use_ms: AtomicU64::new(shared.now_ms()),
        mode: Mutex::new(Mode::Serving),
        loaded: AtomicBool::new(false),
        recovering: AtomicBool::new(recovering),
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
        durable: shared.storage.is_durable(),
        unsynced: Vec::new(),
        waiting: Vec::new(),
        inflight: VecDeque::new(),
        trees: BTreeMap::new(),
        recovering,
    };
    let actor = shared
        .node
        .spawn_fn(move |mut inbox: Inbox<VnodeMsg>| async move {
            vnode.load().await;
            loop {
                let next = tokio::select! {
                    biased;
                    result = next_durable(&mut vnode.inflight) => {
                        vnode.durable_done(result).await;
                        // The writes that arrived meanwhile go now, not with the next message.
                        vnode.sync();
                        continue;
                    }
                    msg = inbox.recv() => msg,
                };
                match next {
                    None => break,
                    Some(VnodeMsg::Stop) => {
                        // The name is gone: serve what is already queued, then stop.
                        while let Some(Some(msg)) = inbox.recv().now_or_never() {
                            vnode.handle(msg).await;
                            vnode.sync();
                        }
                        break;
                    }
                    Some(msg) => {
                        vnode.handle(msg).await;
                        vnode.sync();
                    }
                }
            }
            // Answer every write still waiting for the storage.
            vnode.sync();
            while !vnode.inflight.is_empty() {
                let result = next_durable(&mut vnode.inflight).await;
                vnode.durable_done(result).await;
                vnode.sync();
            }
            tracing::debug!(partition = vnode.p, "vnode stopped");
        });
    if let Err(e) = shared.node.register(&vnode_name(p), &actor) {
        tracing::error!(partition = p, error = %e, "cannot register vnode");
    }
    (actor, view)
}

/// Waits for the oldest storage operation in flight (never, if there is none).
async fn next_durable(inflight: &mut VecDeque<(Ticket, Vec<Pending>)>) -> Result<(), StorageError> {
    match inflight.front_mut() {
        Some((ticket, _)) => ticket.await,
        None => std::future::pending().await,
    }
}

impl Vnode {
    /// Loads the stored objects of the partition (nothing with a backend that keeps none).
    async fn load(&mut self) {
        if self.durable {
            let storage = self.shared.storage.clone();
            let p = self.p;
            let loaded = tokio::task::spawn_blocking(move || storage.load(p)).await;
            match loaded {
                Ok(Ok(entries)) => {
                    let n = entries.len();
                    for (key, object) in entries {
                        self.shared.clock.observe(object.version.ts);
                        self.bytes += object.size();
                        self.account(&key, None, Some(&object.version));
                        self.store.insert(key, object);
                    }
                    if n > 0 {
                        tracing::debug!(partition = p, objects = n, "vnode loaded from storage");
                    }
                }
                Ok(Err(e)) => {
                    tracing::error!(partition = p, error = %e, "vnode cannot load its objects");
                }
                Err(e) => {
                    tracing::error!(partition = p, error = %e, "vnode load task failed");
                }
            }
            self.publish_size();
        }
        self.view.loaded.store(true, Ordering::Relaxed);
    }

    /// Answers a write now (a backend that keeps nothing) or once `key`'s object (if any) and
    /// every write before it are durable.
    async fn acknowledge(&mut self, key: Option<&Bytes>, pending: Pending) {
        if !self.durable {
            return pending.answer(&Ok(())).await;
        }
        if let Some(key) = key {
            self.persist(key);
        }
        self.waiting.push(pending);
    }

    /// Records a write for the storage (a read repair's, a handoff entry's, or a put's).
    fn persist(&mut self, key: &Bytes) {
        if self.durable {
            if let Some(object) = self.store.get(key) {
                self.unsynced.push((key.clone(), object.clone()));
            }
        }
    }

    /// Hands the collected writes to the storage, unless a batch is already in flight.
    fn sync(&mut self) {
        if !self.durable || !self.inflight.is_empty() {
            return;
        }
        if self.unsynced.is_empty() && self.waiting.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut self.unsynced);
        let replies = std::mem::take(&mut self.waiting);
        let ticket = self.shared.storage.write(self.p, entries);
        self.inflight.push_back((ticket, replies));
    }

    /// The oldest storage operation completed: answer its writes.
    async fn durable_done(&mut self, result: Result<(), StorageError>) {
        let Some((_, replies)) = self.inflight.pop_front() else {
            return;
        };
        if let Err(e) = &result {
            tracing::error!(partition = self.p, error = %e, writes = replies.len(), "writes not durable");
        }
        for r in replies {
            r.answer(&result).await;
        }
    }

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
        let mut changed = None;
        match self.store.get_mut(&key) {
            Some(cur) => {
                had_live = cur.is_live();
                if object.version > cur.version {
                    self.bytes = self.bytes - cur.size() + object.size();
                    changed = Some((Some(cur.version), object.version));
                    *cur = object;
                }
            }
            None => {
                had_live = false;
                self.bytes += object.size();
                changed = Some((None, object.version));
                self.store.insert(key.clone(), object);
            }
        }
        if let Some((old, new)) = changed {
            self.account(&key, old.as_ref(), Some(&new));
        }
        had_live
    }

    /// Updates the anti-entropy tree of the key's primary partition.
    fn account(&mut self, key: &[u8], old: Option<&Version>, new: Option<&Version>) {
        let hash = key_hash(key);
        let q = partition_of_hash(hash, self.shared.config.partitions);
        self.trees.entry(q).or_default().update(hash, old, new);
    }

    /// The keys held for primary partition `q` in these segments, with their versions.
    fn aae_keys(&self, q: u32, segments: &[u32]) -> Vec<(Bytes, Version)> {
        let wanted: BTreeSet<u32> = segments.iter().copied().collect();
        let partitions = self.shared.config.partitions;
        let mut out = Vec::new();
        if !self.trees.contains_key(&q) {
            return out;
        }
        for (k, o) in &self.store {
            let hash = key_hash(k);
            if partition_of_hash(hash, partitions) == q
                && wanted.contains(&(segment_of(hash) as u32))
            {
                out.push((k.clone(), o.version));
                if out.len() >= AAE_MAX_KEYS {
                    break;
                }
            }
        }
        out
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
                let answer = match self.store.get(&key) {
                    None if self.recovering => VnodeReply::NotAuthoritative,
                    obj => VnodeReply::Value(obj.cloned()),
                };
                let _ = reply.send(answer).await;
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
                let version = object.version;
                let had_live = self.merge(key.clone(), object);
                let newer = self
                    .store
                    .get(&key)
                    .map(|cur| cur.version)
                    .filter(|v| *v > version)
                    .map(|v| v.ts);
                self.publish_size();
                self.acknowledge(Some(&key), Pending::Put(reply, had_live, newer))
                    .await;
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
                self.merge(key.clone(), object);
                self.persist(&key);
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
                        self.merge(k.clone(), o);
                        self.persist(&k);
                    }
                    self.publish_size();
                    return self.acknowledge(None, Pending::Handoff(reply)).await;
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
            VnodeMsg::AaeTree { q, reply } => {
                let tree = self.trees.get(&q).cloned().unwrap_or_default();
                let summary = TreeSummary {
                    segments: tree.segments().to_vec(),
                    keys: tree.keys(),
                    serving: !matches!(self.mode, Mode::Forwarding(..)),
                };
                let _ = reply.send(summary).await;
            }
            VnodeMsg::AaeKeys { q, segments, reply } => {
                let keys = self.aae_keys(q, &segments);
                let _ = reply.send(keys).await;
            }
            VnodeMsg::AaeFetch { keys, reply } => {
                let found = keys
                    .into_iter()
                    .filter_map(|k| self.store.get(&k).cloned().map(|o| (k, o)))
                    .collect();
                let _ = reply.send(found).await;
            }
            VnodeMsg::AaeMerge { entries, reply } => {
                if let Mode::Forwarding(to, _) = &self.mode {
                    let _ = reply.send(HandoffAck::Redirect(to.clone())).await;
                    return;
                }
                for (k, o) in entries {
                    self.merge(k.clone(), o);
                    self.persist(&k);
                }
                self.publish_size();
                self.acknowledge(None, Pending::Handoff(reply)).await;
            }
            VnodeMsg::Recover => self.set_recovering(true),
            VnodeMsg::Trust => self.set_recovering(false),
            VnodeMsg::Stop => {}
        }
    }

    fn set_recovering(&mut self, on: bool) {
        if self.recovering != on {
            tracing::debug!(
                partition = self.p,
                recovering = on,
                "vnode authority changed"
            );
        }
        self.recovering = on;
        self.view.recovering.store(on, Ordering::Relaxed);
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
        self.trees = BTreeMap::new();
        self.bytes = 0;
        self.publish_size();
        if self.durable {
            // Everything is at the receiver (durable there: chunks are acknowledged once they
            // are): the partition's objects go from this node's storage, after the writes
            // already handed to it. Writes not yet handed over are not written at all; their
            // replies wait for the clear.
            self.unsynced.clear();
            let replies = std::mem::take(&mut self.waiting);
            let ticket = self.shared.storage.clear(self.p);
            self.inflight.push_back((ticket, replies));
        }
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
