//! One member of a group, as a state machine without I/O: it takes the requests the group
//! receives, the other members' confirmations and the group's membership, and says what to
//! send (answers to clients, confirmations, resends). [`crate::member`] drives it.
//!
//! # The protocol
//!
//! A client publishes each request to the group that owns its key; every member gets it. The
//! **responsible** member for a key is the one at `hash(key) mod n` in the sorted list of
//! the group's *ready* members (psaDB's partition of the group's keys among its members,
//! computed by each member from the membership instead of told by a master).
//!
//! - A **read** is answered by the responsible member from its copy; the others ignore it.
//! - A **write** is applied by every member (writes carry the client's [`Version`], so the
//!   order they arrive in does not matter: see [`crate::store`]). One member **coordinates**
//!   it ([`Replica::coordinator`]): a ready member on the client's own node when there is one
//!   (the driver says which members are near the client), else the key's responsible member.
//!   The others confirm the write to it ([`Out::Confirm`]), and it answers the client once
//!   every member of the group it knows of has confirmed. So an acknowledged write is on
//!   every member: one member's death loses none, whichever member coordinated. With the
//!   client's node's member coordinating, a write takes two hops in sequence (the publish,
//!   the confirmations) and its answer stays on the client's node.
//! - A member that has not confirmed within `resend_after` is sent the write again, directly
//!   ([`Out::Resend`]; a publish is best effort); after `give_up_after` the client is answered
//!   [`Answer::NotReplicated`] (the write was not acknowledged; it may or may not stay).
//!   A member that leaves the group is no longer waited for.
//!
//! Members that disagree on the membership for a moment may both answer (the client takes the
//! first answer) or neither (the client's request times out and it sends it again: requests
//! are idempotent). A member that disagrees on who coordinates a write confirms it to a member
//! that does not wait for it; the coordinator's resend then gets its confirmation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::store::{Full, Shown, Store, Version, Write};

/// A request's identity: the client's id and its sequence number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ReqId {
    /// The client.
    pub client: u64,
    /// Its request counter.
    pub seq: u64,
}

/// A read of one key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Read {
    /// `GET`.
    Get,
    /// `EXISTS`.
    Exists,
    /// `HGETALL`.
    HGetAll,
    /// `HMGET` / `HGET`.
    HMGet(Vec<Bytes>),
    /// The key's newest version (a client's clock catches up with it).
    Version,
    /// The keys showing a value from the request's key on, in byte order, at most this many
    /// (the member's part of a range scan: every group is asked and the answers merged).
    KeysFrom(u32),
}

/// What a request asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Read a key.
    Read(Read),
    /// Write a key at a version.
    Write(Write, Version),
}

/// A request to a group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Its identity.
    pub id: ReqId,
    /// The key.
    pub key: Bytes,
    /// What it asks.
    pub op: Op,
}

/// The answer to a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// `GET`: the string, if the key holds one.
    Value(Option<Bytes>),
    /// `EXISTS`.
    Exists(bool),
    /// `HGETALL`: the fields.
    Hash(Vec<(Bytes, Bytes)>),
    /// `HMGET`: each field's value.
    Fields(Vec<Option<Bytes>>),
    /// `KeysFrom`: the keys, in byte order.
    Keys(Vec<Bytes>),
    /// The key's newest version.
    Version(Version),
    /// The write is on every member. The count is what it removed as the coordinating member
    /// saw the key just before applying it: for `DEL` 1 if the key showed a value, for
    /// `HDEL` the fields it held; 0 for the other writes (and for a retry of a delete that
    /// was already applied).
    Written(u64),
    /// The key holds a value of the other kind.
    WrongType,
    /// The member holds as many keys as it may.
    Full,
    /// The member waits for confirmations of as many writes as it may.
    Busy,
    /// Not every member confirmed the write in time: it is not acknowledged.
    NotReplicated,
    /// A direct read reached a member that does not answer for the key in its view of the
    /// group (the client's view was older or newer): publish it instead.
    NotResponsible,
}

/// What the member must send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Out<M> {
    /// Answer the client that sent request `id`.
    Reply {
        /// The request.
        id: ReqId,
        /// The answer.
        answer: Answer,
    },
    /// Tell member `to` that this member applied request `id`.
    Confirm {
        /// The member.
        to: M,
        /// The request.
        id: ReqId,
    },
    /// Send member `to` a write it has not confirmed.
    Resend {
        /// The member.
        to: M,
        /// The write.
        req: Request,
    },
}

/// Limits and timings of a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Keys the member holds at most (tombstones included).
    pub max_keys: usize,
    /// Tombstones kept at most.
    pub max_tombstones: usize,
    /// Writes waiting for confirmations at most; a write beyond is answered [`Answer::Busy`].
    pub max_pending: usize,
    /// A member that has not confirmed a write in this time is sent it again.
    pub resend_after: Duration,
    /// A write not confirmed by every member in this time is answered
    /// [`Answer::NotReplicated`].
    pub give_up_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_keys: 1_000_000,
            max_tombstones: 100_000,
            max_pending: 10_000,
            resend_after: Duration::from_millis(200),
            give_up_after: Duration::from_secs(2),
        }
    }
}

struct Pending<M> {
    req: Request,
    /// What the write removed (see [`Answer::Written`]).
    removed: u64,
    /// Members that have not confirmed yet.
    waiting: BTreeSet<M>,
    since: Instant,
    resent: Instant,
}

/// One member of a group (see the module's documentation).
pub struct Replica<M> {
    me: M,
    /// Every member of the group, this one included once it has joined (sorted).
    members: Vec<M>,
    /// The members that answer for their share of the keys (sorted).
    ready: Vec<M>,
    store: Store,
    pending: BTreeMap<ReqId, Pending<M>>,
    /// Confirmations that came before their request (the publish and the confirmation travel
    /// different ways), with when they came: at most `max_pending`, kept `give_up_after`.
    early: BTreeMap<ReqId, (BTreeSet<M>, Instant)>,
    limits: Limits,
    out: Vec<Out<M>>,
}

/// A key's hash: FNV-1a, stable across processes and versions (members and clients must
/// agree on it).
pub fn hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Which of `n` ready members answers for `key` (the hash's low half; the group is chosen by
/// its high half: [`crate::client::group_of`]).
pub fn share_of(key: &[u8], n: usize) -> usize {
    ((hash(key) & 0xffff_ffff) % n.max(1) as u64) as usize
}

impl<M: Ord + Clone> Replica<M> {
    /// A member `me` with an empty store.
    pub fn new(me: M, limits: Limits) -> Self {
        Replica {
            me,
            members: Vec::new(),
            ready: Vec::new(),
            store: Store::new(limits.max_keys, limits.max_tombstones),
            pending: BTreeMap::new(),
            early: BTreeMap::new(),
            limits,
            out: Vec::new(),
        }
    }

    /// The member's copy of the keys.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Merges a snapshot (a joining member's catch-up); keys left out for lack of room.
    pub fn merge(&mut self, s: &crate::store::Snapshot) -> usize {
        self.store.merge(s)
    }

    /// Writes waiting for confirmations.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether write `id` waits for confirmations here.
    pub fn is_pending(&self, id: ReqId) -> bool {
        self.pending.contains_key(&id)
    }

    /// The member responsible for `key`, if any member is ready.
    pub fn responsible(&self, key: &[u8]) -> Option<&M> {
        if self.ready.is_empty() {
            return None;
        }
        self.ready.get(share_of(key, self.ready.len()))
    }

    /// The group's membership changed: `members` get the group's requests, `ready` answer
    /// for their share of the keys.
    pub fn set_members(&mut self, mut members: Vec<M>, mut ready: Vec<M>) {
        members.sort();
        members.dedup();
        ready.sort();
        ready.dedup();
        self.members = members;
        self.ready = ready;
        let members = &self.members;
        let mut done = Vec::new();
        for (id, p) in &mut self.pending {
            p.waiting.retain(|m| members.binary_search(m).is_ok());
            if p.waiting.is_empty() {
                done.push(*id);
            }
        }
        for id in done {
            if let Some(p) = self.pending.remove(&id) {
                self.out.push(Out::Reply {
                    id,
                    answer: Answer::Written(p.removed),
                });
            }
        }
    }

    /// The member that collects write confirmations and answers the client: the first ready
    /// member (in the members' order) that `near` accepts — the driver's test of whether a
    /// member is on the client's node —, else the key's responsible member. Members that see
    /// the same ready members pick the same one.
    pub fn coordinator(&self, key: &[u8], near: impl Fn(&M) -> bool) -> Option<&M> {
        self.ready
            .iter()
            .find(|m| near(m))
            .or_else(|| self.responsible(key))
    }

    /// A request published to the group; `near` tells the members on the client's node (see
    /// [`Replica::coordinator`]).
    pub fn handle_request(&mut self, req: Request, near: impl Fn(&M) -> bool, now: Instant) {
        match &req.op {
            Op::Read(r) => {
                if self.responsible(&req.key) == Some(&self.me) {
                    let answer = self.read(&req.key, r);
                    self.out.push(Out::Reply { id: req.id, answer });
                }
            }
            Op::Write(w, v) => {
                let coordinator = self.coordinator(&req.key, near).cloned();
                let mine = coordinator.as_ref() == Some(&self.me);
                let removed = if mine {
                    self.removed_by(&req.key, w)
                } else {
                    0
                };
                if let Err(Full) = self.store.apply(&req.key, w, *v) {
                    if mine {
                        self.out.push(Out::Reply {
                            id: req.id,
                            answer: Answer::Full,
                        });
                    }
                    return;
                }
                if !mine {
                    if let Some(c) = coordinator {
                        self.out.push(Out::Confirm { to: c, id: req.id });
                    }
                    return;
                }
                self.wait_for_others(req, removed, now);
            }
        }
    }

    /// What `w` would remove from `key` as this member holds it now.
    fn removed_by(&self, key: &[u8], w: &Write) -> u64 {
        if !matches!(w, Write::Del | Write::HDel(_)) {
            return 0;
        }
        match (w, self.store.get(key)) {
            (Write::Del, Shown::Nothing) => 0,
            (Write::Del, _) => 1,
            (Write::HDel(fields), Shown::Hash(h)) => {
                let mut present: Vec<&Bytes> = fields
                    .iter()
                    .filter(|f| h.iter().any(|(k, _)| k == *f))
                    .collect();
                present.sort_unstable();
                present.dedup();
                present.len() as u64
            }
            _ => 0,
        }
    }

    /// A read sent to this member alone, by a client that picked it as the key's responsible
    /// member from its own view of the ready members: answered if this member agrees, else
    /// [`Answer::NotResponsible`] (so a read is still answered by the responsible member only,
    /// whichever way it came). A write sent this way is refused the same way: writes are
    /// published, as every member applies them.
    pub fn handle_direct(&mut self, req: Request) {
        let answer = match &req.op {
            Op::Read(r) if self.responsible(&req.key) == Some(&self.me) => self.read(&req.key, r),
            _ => Answer::NotResponsible,
        };
        self.out.push(Out::Reply { id: req.id, answer });
    }

    fn wait_for_others(&mut self, req: Request, removed: u64, now: Instant) {
        let id = req.id;
        if self.pending.contains_key(&id) {
            return;
        }
        let confirmed = self.early.remove(&id).map(|(c, _)| c).unwrap_or_default();
        let waiting: BTreeSet<M> = self
            .members
            .iter()
            .filter(|m| **m != self.me && !confirmed.contains(*m))
            .cloned()
            .collect();
        if waiting.is_empty() {
            self.out.push(Out::Reply {
                id,
                answer: Answer::Written(removed),
            });
            return;
        }
        if self.pending.len() >= self.limits.max_pending {
            self.out.push(Out::Reply {
                id,
                answer: Answer::Busy,
            });
            return;
        }
        self.pending.insert(
            id,
            Pending {
                req,
                removed,
                waiting,
                since: now,
                resent: now,
            },
        );
    }

    /// A write sent again by member `from`, which waits for this member's confirmation.
    pub fn handle_resend(&mut self, from: M, req: Request) {
        if let Op::Write(w, v) = &req.op {
            if self.store.apply(&req.key, w, *v).is_ok() {
                self.out.push(Out::Confirm {
                    to: from,
                    id: req.id,
                });
            }
        }
    }

    /// Member `from` applied request `id`.
    pub fn handle_confirm(&mut self, from: M, id: ReqId, now: Instant) {
        let Some(p) = self.pending.get_mut(&id) else {
            // Before the request itself, perhaps: kept a while (a resend repairs one that
            // finds no room).
            if let Some((who, _)) = self.early.get_mut(&id) {
                who.insert(from);
            } else if self.early.len() < self.limits.max_pending {
                self.early.insert(id, (BTreeSet::from([from]), now));
            }
            return;
        };
        p.waiting.remove(&from);
        if p.waiting.is_empty() {
            let removed = p.removed;
            self.pending.remove(&id);
            self.out.push(Out::Reply {
                id,
                answer: Answer::Written(removed),
            });
        }
    }

    /// Resends and gives up what is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut given_up = Vec::new();
        for (id, p) in &mut self.pending {
            if now.duration_since(p.since) >= self.limits.give_up_after {
                given_up.push(*id);
            } else if now.duration_since(p.resent) >= self.limits.resend_after {
                p.resent = now;
                for m in &p.waiting {
                    self.out.push(Out::Resend {
                        to: m.clone(),
                        req: p.req.clone(),
                    });
                }
            }
        }
        for id in given_up {
            self.pending.remove(&id);
            self.out.push(Out::Reply {
                id,
                answer: Answer::NotReplicated,
            });
        }
        let keep = self.limits.give_up_after;
        self.early
            .retain(|_, (_, at)| now.duration_since(*at) < keep);
        self.store.prune();
    }

    /// When [`Replica::handle_timeout`] has something to do next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pending
            .values()
            .map(|p| (p.resent + self.limits.resend_after).min(p.since + self.limits.give_up_after))
            .min()
    }

    /// Everything to send, oldest first.
    pub fn drain_out(&mut self) -> std::vec::Drain<'_, Out<M>> {
        self.out.drain(..)
    }

    fn read(&self, key: &[u8], r: &Read) -> Answer {
        if let Read::KeysFrom(count) = r {
            return Answer::Keys(self.store.scan(key, *count as usize));
        }
        let shown = self.store.get(key);
        match (r, shown) {
            (Read::Version, _) => Answer::Version(self.store.version(key)),
            (Read::Exists, s) => Answer::Exists(!matches!(s, Shown::Nothing)),
            (Read::Get, Shown::Str(s)) => Answer::Value(Some(s)),
            (Read::Get, Shown::Nothing) => Answer::Value(None),
            (Read::HGetAll, Shown::Hash(h)) => Answer::Hash(h),
            (Read::HGetAll, Shown::Nothing) => Answer::Hash(Vec::new()),
            (Read::HMGet(fs), Shown::Hash(h)) => Answer::Fields(
                fs.iter()
                    .map(|f| h.iter().find(|(k, _)| k == f).map(|(_, v)| v.clone()))
                    .collect(),
            ),
            (Read::HMGet(fs), Shown::Nothing) => Answer::Fields(vec![None; fs.len()]),
            (Read::Get, Shown::Hash(_)) | (Read::HGetAll | Read::HMGet(_), Shown::Str(_)) => {
                Answer::WrongType
            }
            (Read::KeysFrom(_), _) => Answer::Keys(Vec::new()),
        }
    }
}
