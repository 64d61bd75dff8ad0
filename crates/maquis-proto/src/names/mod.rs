//! Global names without I/O: a directory of cluster-wide names, partitioned over the members.
//!
//! Each name has a *home*: the member with the highest rendezvous weight for it
//! ([`hrw`]), and `replicas − 1` more members after it that keep copies. A registration is
//! one request to the home and one copy to each replica, whatever the size of the cluster:
//! no node locks the others (Erlang's `global` locks every node). A lookup is answered from
//! the node's cache when it can, else by one request to the home, whose answer is cached.
//!
//! The machine is driven like the membership machine: `handle_*` and the request methods take
//! `now`, and the driver takes what they produced with [`Directory::poll_output`] (messages to
//! send to other members, answers to requests, names lost to a conflict) and arms a timer for
//! [`Directory::poll_timeout`]. What a name points at is opaque to it ([`Entry::target`]:
//! the runtime stores an encoded actor reference and its message type there).
//!
//! # What it guarantees
//!
//! - In a connected cluster whose members agree on the member list, a name has at most one
//!   registration: the home grants it once, and refuses it to anyone else until it is
//!   released.
//! - A registration goes away when its owner releases it, or when its owner node leaves the
//!   member list (down or left): every node drops the entries and cache lines of that node when
//!   the driver hands it the new list ([`Directory::handle_members`]).
//! - During a partition each side has its own homes, so both sides may register the same name;
//!   a lookup returns what its side (or its cache) knows. When the sides meet again, every node
//!   asserts those of its own registrations whose home is now on the other side to that home
//!   (the home of a name over both sides is the home of one of them), and a home that holds two
//!   registrations of one name keeps the one with the smaller [`Entry::stamp`] (then the
//!   smaller owner): the same winner on every node, whatever the order in which they meet. The
//!   loser's node is told ([`DirOutput::Lost`]) and drops it.
//! - A lookup may return an entry that was released or replaced a moment ago (a cache line, or
//!   an answer overtaken by a registration); the driver calls [`Directory::invalidate`] when a
//!   send to it fails, and the next lookup asks the home.
//!
//! # Bounds
//!
//! A node stores at most [`DirectoryConfig::max_names`] names as home or replica (a
//! registration that would exceed it is refused with [`RegisterError::Full`]; a copy that
//! would is dropped and counted), caches at most [`DirectoryConfig::cache_capacity`] lookups
//! (the oldest is evicted), and has at most [`DirectoryConfig::max_pending`] requests waiting
//! for an answer (more fail at once with [`RegisterError::Busy`] / [`LookupError::Busy`]); a
//! request not answered within [`DirectoryConfig::request_timeout`] fails.

mod cache;
pub mod hrw;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use self::cache::Cache;
use crate::id::PeerId;
use crate::membership::timers::Timers;

/// Settings of a [`Directory`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryConfig {
    /// Members that keep each name, the home included. Default 3.
    pub replicas: usize,
    /// Names this node stores at most, as home or replica. Default 1,048,576.
    pub max_names: usize,
    /// Lookups cached at most. Default 65,536.
    pub cache_capacity: usize,
    /// Requests waiting for an answer at most. Default 65,536.
    pub max_pending: usize,
    /// How long a request waits for its answer. Default 5 s.
    pub request_timeout: Duration,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            replicas: 3,
            max_names: 1 << 20,
            cache_capacity: 1 << 16,
            max_pending: 1 << 16,
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// A registration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry<P> {
    /// The node that registered it.
    pub owner: P,
    /// What the name points at (opaque to the directory).
    pub target: Bytes,
    /// When it was registered, on a clock the nodes share (the runtime: milliseconds of wall
    /// clock); decides conflicts, the smaller winning.
    pub stamp: u64,
}

impl<P: Ord> Entry<P> {
    /// Whether `self` wins against `other` (another registration of the same name).
    fn beats(&self, other: &Entry<P>) -> bool {
        (self.stamp, &self.owner) < (other.stamp, &other.owner)
    }
}

/// Why a registration failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RegisterError<P> {
    /// Another registration holds the name.
    #[error("the name is registered by another node")]
    Taken(Entry<P>),
    /// The home holds as many names as it may.
    #[error("the name's home holds as many names as it may")]
    Full,
    /// Too many requests wait for an answer on this node.
    #[error("too many directory requests in flight")]
    Busy,
    /// No answer came in time.
    #[error("the name's home did not answer in time")]
    Timeout,
}

/// Why a lookup failed (a name that is not registered is not a failure: `Ok(None)`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// Too many requests wait for an answer on this node.
    #[error("too many directory requests in flight")]
    Busy,
    /// No answer came in time.
    #[error("the name's home did not answer in time")]
    Timeout,
}

/// A request, as the driver tracks it.
pub type ReqId = u64;

/// A name and its entry as [`DirMsg::Copy`] carries it (`None`: deleted).
pub type Copied<P> = (String, Option<Entry<P>>);

/// What one directory sends another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DirMsg<P> {
    /// Register `name` (to its home).
    Claim {
        /// The requester's request.
        req: ReqId,
        /// The name.
        name: String,
        /// The registration.
        entry: Entry<P>,
    },
    /// The home's answer to a claim.
    Claimed {
        /// The request.
        req: ReqId,
        /// Granted, or why not.
        result: Result<(), RegisterError<P>>,
    },
    /// The owner releases `name` (to its home, which tells the replicas).
    Release {
        /// The name.
        name: String,
        /// The releasing node (a release by anyone else is ignored).
        owner: P,
    },
    /// Who holds `name`? (to its home)
    Lookup {
        /// The requester's request.
        req: ReqId,
        /// The name.
        name: String,
    },
    /// The home's answer to a lookup.
    Found {
        /// The request.
        req: ReqId,
        /// The registration, if any.
        entry: Option<Entry<P>>,
    },
    /// Copies from a home (or a node handing names to their new homes): set each name to its
    /// entry (a conflict is settled as at the home), or delete it (`None`, only for the
    /// entry's own owner).
    Copy {
        /// Names and entries.
        names: Vec<Copied<P>>,
    },
    /// A registration of the receiver lost a conflict to `winner`.
    Lost {
        /// The name.
        name: String,
        /// The registration that kept it.
        winner: Entry<P>,
    },
}

/// What the directory asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DirOutput<P> {
    /// Send `msg` to member `to`.
    Send {
        /// The member.
        to: P,
        /// The message.
        msg: DirMsg<P>,
    },
    /// The answer to [`Directory::register`].
    Registered {
        /// The request.
        req: ReqId,
        /// Granted, or why not.
        result: Result<(), RegisterError<P>>,
    },
    /// The answer to a [`Directory::whereis`] that was not answered at once.
    Found {
        /// The request.
        req: ReqId,
        /// The registration, if any, or why there is no answer.
        result: Result<Option<Entry<P>>, LookupError>,
    },
    /// One of this node's registrations lost a conflict after a partition healed: the name is
    /// `winner`'s now.
    Lost {
        /// The name.
        name: String,
        /// The registration that kept it.
        winner: Entry<P>,
    },
}

/// The answer to [`Directory::whereis`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Whereis<P> {
    /// Known here (cache, a copy, or this node is the home).
    Now(Option<Entry<P>>),
    /// Asked the home; the answer comes as [`DirOutput::Found`] with this request.
    Asked(ReqId),
    /// Could not ask.
    Failed(LookupError),
}

/// Counters of a directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirStats {
    /// Names stored here (home or replica).
    pub stored: usize,
    /// Names this node registered.
    pub own: usize,
    /// Lookups cached.
    pub cached: usize,
    /// Cache lines evicted to make room.
    pub cache_evictions: u64,
    /// Lookups answered without a message.
    pub local_lookups: u64,
    /// Lookups sent to a home.
    pub remote_lookups: u64,
    /// Copies dropped because the table was full.
    pub copies_dropped: u64,
    /// Conflicts settled here.
    pub conflicts: u64,
    /// Requests that timed out.
    pub timeouts: u64,
}

enum Pending<P> {
    Register { name: String, entry: Entry<P> },
    Lookup { name: String },
}

/// The directory of one node (see the module docs).
pub struct Directory<P: PeerId> {
    me: P,
    cfg: DirectoryConfig,
    /// The members, sorted, and their names' bytes (for the hash).
    members: Vec<P>,
    member_keys: Vec<Vec<u8>>,
    /// Names stored here, as home or replica.
    table: BTreeMap<String, Entry<P>>,
    /// This node's own registrations.
    own: BTreeMap<String, Entry<P>>,
    cache: Cache<Entry<P>>,
    pending: HashMap<ReqId, Pending<P>>,
    timers: Timers<ReqId>,
    next_req: ReqId,
    out: VecDeque<DirOutput<P>>,
    stats: DirStats,
}

impl<P: PeerId> Directory<P> {
    /// A directory on node `me`, alone until [`Directory::handle_members`].
    pub fn new(me: P, cfg: DirectoryConfig) -> Self {
        let mut d = Directory {
            me: me.clone(),
            cache: Cache::new(cfg.cache_capacity),
            cfg,
            members: Vec::new(),
            member_keys: Vec::new(),
            table: BTreeMap::new(),
            own: BTreeMap::new(),
            pending: HashMap::new(),
            timers: Timers::default(),
            next_req: 1,
            out: VecDeque::new(),
            stats: DirStats::default(),
        };
        d.set_members(vec![me]);
        d
    }

    fn set_members(&mut self, mut members: Vec<P>) {
        if !members.contains(&self.me) {
            members.push(self.me.clone());
        }
        members.sort();
        members.dedup();
        self.member_keys = members
            .iter()
            .map(|m| crate::encode(m.name()).unwrap_or_default())
            .collect();
        self.members = members;
    }

    /// The members that keep `name`, its home first.
    pub fn replicas(&self, name: &str) -> Vec<P> {
        hrw::top(name, &self.member_keys, self.cfg.replicas.max(1))
            .into_iter()
            .map(|i| self.members[i].clone())
            .collect()
    }

    fn home(&self, name: &str) -> P {
        hrw::top(name, &self.member_keys, 1)
            .first()
            .map(|&i| self.members[i].clone())
            .unwrap_or_else(|| self.me.clone())
    }

    fn is_member(&self, p: &P) -> bool {
        self.members.binary_search(p).is_ok()
    }

    fn send(&mut self, to: P, msg: DirMsg<P>) {
        self.out.push_back(DirOutput::Send { to, msg });
    }

    /// Takes the next thing to do.
    pub fn poll_output(&mut self) -> Option<DirOutput<P>> {
        self.out.pop_front()
    }

    /// When [`Directory::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.timers.next()
    }

    /// Counters.
    pub fn stats(&self) -> DirStats {
        DirStats {
            stored: self.table.len(),
            own: self.own.len(),
            cached: self.cache.len(),
            cache_evictions: self.cache.evicted(),
            ..self.stats.clone()
        }
    }

    fn track(&mut self, now: Duration, p: Pending<P>) -> Option<ReqId> {
        if self.pending.len() >= self.cfg.max_pending {
            return None;
        }
        let req = self.next_req;
        self.next_req += 1;
        self.pending.insert(req, p);
        self.timers.set(req, now + self.cfg.request_timeout);
        Some(req)
    }

    /// Registers `name` for `target`, stamped `stamp` (see [`Entry::stamp`]); the answer comes
    /// as [`DirOutput::Registered`] with the returned request (at once when this node is the
    /// home). Registering a name this node holds again replaces its target.
    pub fn register(&mut self, now: Duration, name: &str, target: Bytes, stamp: u64) -> ReqId {
        let entry = Entry {
            owner: self.me.clone(),
            target,
            stamp,
        };
        let Some(req) = self.track(
            now,
            Pending::Register {
                name: name.to_string(),
                entry: entry.clone(),
            },
        ) else {
            let req = self.next_req;
            self.next_req += 1;
            self.out.push_back(DirOutput::Registered {
                req,
                result: Err(RegisterError::Busy),
            });
            return req;
        };
        let home = self.home(name);
        if home == self.me {
            let result = self.claim(name, entry);
            self.answer_register(req, result);
        } else {
            self.send(
                home,
                DirMsg::Claim {
                    req,
                    name: name.to_string(),
                    entry,
                },
            );
        }
        req
    }

    /// Releases `name` if this node holds it; returns whether it did.
    pub fn unregister(&mut self, name: &str) -> bool {
        if self.own.remove(name).is_none() {
            return false;
        }
        self.cache.remove(name);
        let home = self.home(name);
        let me = self.me.clone();
        if home == me {
            self.release(name, &me);
        } else {
            let name = name.to_string();
            self.send(home, DirMsg::Release { name, owner: me });
        }
        true
    }

    /// Who holds `name`: from the cache, a copy or this node's own table when it can, else by
    /// asking its home.
    pub fn whereis(&mut self, now: Duration, name: &str) -> Whereis<P> {
        if let Some(e) = self.own.get(name) {
            self.stats.local_lookups += 1;
            return Whereis::Now(Some(e.clone()));
        }
        if let Some(e) = self.cache.get(name) {
            self.stats.local_lookups += 1;
            return Whereis::Now(Some(e.clone()));
        }
        let home = self.home(name);
        if home == self.me || self.table.contains_key(name) {
            self.stats.local_lookups += 1;
            return Whereis::Now(self.table.get(name).cloned());
        }
        match self.track(
            now,
            Pending::Lookup {
                name: name.to_string(),
            },
        ) {
            None => Whereis::Failed(LookupError::Busy),
            Some(req) => {
                self.stats.remote_lookups += 1;
                self.send(
                    home,
                    DirMsg::Lookup {
                        req,
                        name: name.to_string(),
                    },
                );
                Whereis::Asked(req)
            }
        }
    }

    /// Forgets the cached entry of `name` (a send to it failed).
    pub fn invalidate(&mut self, name: &str) {
        self.cache.remove(name);
    }

    /// The members changed (the list includes or omits this node; either is fine). Entries of
    /// nodes that are gone are dropped; names that gained replicas are copied to them; and this
    /// node asserts its own registrations whose home is a newly added member to that home
    /// (after a partition heals, that is how two registrations of a name meet).
    pub fn handle_members(&mut self, _now: Duration, members: &[P]) {
        let before = std::mem::take(&mut self.members);
        let before_keys = std::mem::take(&mut self.member_keys);
        self.set_members(members.to_vec());
        let added = self
            .members
            .iter()
            .any(|m| before.binary_search(m).is_err());
        let gone: Vec<P> = before
            .iter()
            .filter(|m| !self.is_member(m))
            .cloned()
            .collect();
        if !gone.is_empty() {
            self.table.retain(|_, e| !gone.contains(&e.owner));
            self.cache.retain(|e| !gone.contains(&e.owner));
        }
        // Copies to the replicas a stored name has gained (only those: the others have it);
        // names this node no longer keeps are handed over and dropped.
        let mut batches: BTreeMap<P, Vec<Copied<P>>> = BTreeMap::new();
        let mut drop = Vec::new();
        for (name, e) in &self.table {
            let reps = self.replicas(name);
            let had: Vec<&P> = hrw::top(name, &before_keys, self.cfg.replicas.max(1))
                .into_iter()
                .map(|i| &before[i])
                .collect();
            for r in reps.iter().filter(|r| **r != self.me && !had.contains(r)) {
                batches
                    .entry(r.clone())
                    .or_default()
                    .push((name.clone(), Some(e.clone())));
            }
            if !reps.contains(&self.me) {
                drop.push(name.clone());
            }
        }
        for name in drop {
            self.table.remove(&name);
        }
        // This node's own registrations whose home is now a member that was not one before
        // (a node joined, or the other side of a partition came back) are asserted to it:
        // that is where two registrations of one name from the two sides meet.
        if added {
            let own: Vec<(String, Entry<P>)> = self
                .own
                .iter()
                .filter(|(name, _)| {
                    let home = self.home(name);
                    before.binary_search(&home).is_err()
                })
                .map(|(n, e)| (n.clone(), e.clone()))
                .collect();
            for (name, e) in own {
                let home = self.home(&name);
                if home == self.me {
                    self.merge(name, e);
                } else {
                    batches.entry(home).or_default().push((name, Some(e)));
                }
            }
        }
        for (to, names) in batches {
            self.send(to, DirMsg::Copy { names });
        }
    }

    /// A message from member `from`.
    pub fn handle_message(&mut self, _now: Duration, from: P, msg: DirMsg<P>) {
        match msg {
            DirMsg::Claim { req, name, entry } => {
                // The claimant is who sent it: an entry naming another owner is refused.
                let result = if entry.owner != from {
                    Err(RegisterError::Taken(entry))
                } else {
                    self.claim(&name, entry)
                };
                self.send(from, DirMsg::Claimed { req, result });
            }
            DirMsg::Claimed { req, result } => self.answer_register(req, result),
            DirMsg::Release { name, owner } => {
                if owner == from {
                    self.release(&name, &owner);
                }
            }
            DirMsg::Lookup { req, name } => {
                let entry = self.table.get(&name).cloned();
                self.send(from, DirMsg::Found { req, entry });
            }
            DirMsg::Found { req, entry } => {
                if let Some(Pending::Lookup { name }) = self.pending.remove(&req) {
                    self.timers.cancel(&req);
                    if let Some(e) = &entry {
                        self.cache.insert(name, e.clone());
                    }
                    self.out.push_back(DirOutput::Found {
                        req,
                        result: Ok(entry),
                    });
                }
            }
            DirMsg::Copy { names } => {
                for (name, entry) in names {
                    match entry {
                        Some(e) if self.is_member(&e.owner) => self.merge(name, e),
                        Some(_) => {}
                        None => {
                            if self.table.get(&name).is_some_and(|e| e.owner == from) {
                                self.table.remove(&name);
                            }
                        }
                    }
                }
            }
            DirMsg::Lost { name, winner } => {
                if self.own.get(&name).is_some_and(|mine| winner.beats(mine)) {
                    self.own.remove(&name);
                    self.cache.insert(name.clone(), winner.clone());
                    self.out.push_back(DirOutput::Lost { name, winner });
                }
            }
        }
    }

    /// Fails the requests whose time is up.
    pub fn handle_timeout(&mut self, now: Duration) {
        while let Some(req) = self.timers.expired(now) {
            match self.pending.remove(&req) {
                Some(Pending::Register { .. }) => {
                    self.stats.timeouts += 1;
                    self.out.push_back(DirOutput::Registered {
                        req,
                        result: Err(RegisterError::Timeout),
                    });
                }
                Some(Pending::Lookup { .. }) => {
                    self.stats.timeouts += 1;
                    self.out.push_back(DirOutput::Found {
                        req,
                        result: Err(LookupError::Timeout),
                    });
                }
                None => {}
            }
        }
    }

    /// The home's decision on a claim.
    fn claim(&mut self, name: &str, entry: Entry<P>) -> Result<(), RegisterError<P>> {
        match self.table.get(name) {
            Some(held) if held.owner != entry.owner => {
                return Err(RegisterError::Taken(held.clone()));
            }
            None if self.table.len() >= self.cfg.max_names => return Err(RegisterError::Full),
            _ => {}
        }
        self.table.insert(name.to_string(), entry.clone());
        self.copy_to_replicas(name, Some(entry));
        Ok(())
    }

    fn release(&mut self, name: &str, owner: &P) {
        if self.table.get(name).is_some_and(|e| e.owner == *owner) {
            self.table.remove(name);
            self.copy_to_replicas(name, None);
        }
    }

    fn copy_to_replicas(&mut self, name: &str, entry: Option<Entry<P>>) {
        for r in self.replicas(name) {
            if r != self.me {
                self.send(
                    r,
                    DirMsg::Copy {
                        names: vec![(name.to_string(), entry.clone())],
                    },
                );
            }
        }
    }

    /// Takes in another node's registration of `name`; two registrations of one name are
    /// settled (the loser's owner is told) and the winner copied to the replicas.
    fn merge(&mut self, name: String, e: Entry<P>) {
        match self.table.get(&name) {
            None => {
                if self.table.len() >= self.cfg.max_names {
                    self.stats.copies_dropped += 1;
                    return;
                }
                self.table.insert(name, e);
            }
            Some(held) if held.owner == e.owner => {
                if held != &e {
                    self.table.insert(name, e);
                }
            }
            Some(held) => {
                self.stats.conflicts += 1;
                let (winner, loser) = if e.beats(held) {
                    (e, held.clone())
                } else {
                    (held.clone(), e)
                };
                self.table.insert(name.clone(), winner.clone());
                let at_home = self.home(&name) == self.me;
                if loser.owner == self.me {
                    self.handle_message(
                        Duration::ZERO,
                        self.me.clone(),
                        DirMsg::Lost {
                            name: name.clone(),
                            winner: winner.clone(),
                        },
                    );
                } else {
                    self.send(
                        loser.owner,
                        DirMsg::Lost {
                            name: name.clone(),
                            winner: winner.clone(),
                        },
                    );
                }
                if at_home {
                    self.copy_to_replicas(&name, Some(winner));
                }
            }
        }
    }

    fn answer_register(&mut self, req: ReqId, result: Result<(), RegisterError<P>>) {
        let Some(Pending::Register { name, entry }) = self.pending.remove(&req) else {
            return;
        };
        self.timers.cancel(&req);
        if result.is_ok() {
            self.own.insert(name, entry);
        }
        self.out.push_back(DirOutput::Registered { req, result });
    }
}

#[cfg(test)]
mod tests;
