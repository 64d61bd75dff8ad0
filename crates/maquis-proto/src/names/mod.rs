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
//! - The owner is the source of truth. When the members change (a join, a death, a healed
//!   partition), each node, [`DirectoryConfig::resync_after`] later, asserts those of its own
//!   registrations whose home moved to the new home ([`DirMsg::Assert`], answered, sent again
//!   until it is, asserted again at the next resync if it never is). So a home that took over
//!   from a dead one, or a home that missed a copy while routes were changing, learns every
//!   name it should hold.
//! - During a partition each side has its own homes, so both sides may register the same name;
//!   a lookup returns what its side (or its cache) knows. When the sides meet again the owners'
//!   assertions bring two registrations of one name to the same home, which keeps the one with
//!   the smaller [`Entry::stamp`] (then the smaller owner): the same winner on every node,
//!   whatever the order in which they meet. The loser's node is told ([`DirMsg::Lost`], sent
//!   until acknowledged, or in the answer to its own assertion), drops the name and reports
//!   [`DirOutput::Lost`].
//! - A name can be handed from its owner to another node without ever being free: the owner
//!   stops holding it without releasing it ([`Directory::hand_over`]); the home goes on
//!   naming the old owner until the new one's [`Directory::register_replacing`] replaces the
//!   entry, which the home grants only while the entry is still the old owner's (or there is
//!   none), and the replicas apply as a replacement, not a conflict. The old owner's
//!   [`Directory::release_if_left`] clears an entry no one took over.
//! - A lookup is answered by the home (or this node's cache, or this node when it is the
//!   home); replicas only keep copies for the home's successor. A lookup may return an entry
//!   that was released or replaced a moment ago (a cache line, or an answer overtaken by a
//!   registration); the driver calls [`Directory::invalidate`] when a send to it fails, and
//!   the next lookup asks the home. When members are added (a join, a healed partition) every
//!   cache line is dropped, so that a registration that lost a conflict is not served from a
//!   cache afterwards.
//! - Messages may be lost (routes change under them): requests (claims, lookups, assertions,
//!   loss notices) are sent again every quarter of [`DirectoryConfig::request_timeout`] until
//!   answered or timed out; copies to replicas are not (the owners' assertions repair them).
//!
//! # Bounds
//!
//! A node stores at most [`DirectoryConfig::max_names`] names as home or replica (a
//! registration that would exceed it is refused with [`RegisterError::Full`]; a copy that
//! would is dropped and counted), caches at most [`DirectoryConfig::cache_capacity`] lookups
//! (the oldest is evicted), and has at most [`DirectoryConfig::max_pending`] requests waiting
//! for an answer (more fail at once with [`RegisterError::Busy`] / [`LookupError::Busy`]; an
//! assertion that finds no room waits for the next resync); a request not answered within
//! [`DirectoryConfig::request_timeout`] fails. Names have 1 to [`MAX_NAME_BYTES`] bytes; a copy
//! or an assertion carries at most [`COPY_BATCH`] names.

mod cache;
pub mod hrw;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use self::cache::Cache;
use crate::id::PeerId;
use crate::member_list::Edit;
use crate::membership::timers::Timers;

/// Settings of a [`Directory`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryConfig {
    /// Members that keep each name, the home included. Default 3.
    pub replicas: usize,
    /// Names this node stores at most, as home or replica, and registers at most itself.
    /// Default 1,048,576.
    pub max_names: usize,
    /// Lookups cached at most. Default 65,536.
    pub cache_capacity: usize,
    /// Requests waiting for an answer at most. Default 65,536.
    pub max_pending: usize,
    /// How long a request waits for its answer. Default 5 s.
    pub request_timeout: Duration,
    /// How long after a change of the members this node asserts its own registrations to
    /// their homes again (the changes of one burst share one resync). Default 1 s.
    pub resync_after: Duration,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        DirectoryConfig {
            replicas: 3,
            max_names: 1 << 20,
            cache_capacity: 1 << 16,
            max_pending: 1 << 16,
            request_timeout: Duration::from_secs(5),
            resync_after: Duration::from_secs(1),
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

/// The longest name, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// Names in one [`DirMsg::Copy`] at most (more go in several messages).
pub const COPY_BATCH: usize = 256;

/// Why a registration failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RegisterError<P> {
    /// Another registration holds the name.
    #[error("the name is registered by another node")]
    Taken(Entry<P>),
    /// The name's home holds as many names as it may, or this node registered as many as it
    /// may.
    #[error("the directory holds as many names as it may")]
    Full,
    /// Too many requests wait for an answer on this node.
    #[error("too many directory requests in flight")]
    Busy,
    /// No answer came in time.
    #[error("the name's home did not answer in time")]
    Timeout,
    /// The name is empty or longer than [`MAX_NAME_BYTES`].
    #[error("a name has 1 to 255 bytes")]
    BadName,
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

/// A change to one name, as [`DirMsg::Copy`] carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change<P> {
    /// The name is this registration's (a conflict is settled as at the home).
    Set(Entry<P>),
    /// The name passed from `from`'s registration to this one (a hand-over): it replaces a
    /// registration of `from`, and is otherwise set as [`Change::Set`] is.
    Replace {
        /// The previous holder.
        from: P,
        /// The new registration.
        entry: Entry<P>,
    },
    /// The registration of `owner` stamped `stamp` (or earlier) is gone.
    Delete {
        /// Whose registration.
        owner: P,
        /// Its stamp.
        stamp: u64,
    },
}

/// A name and its change.
pub type Copied<P> = (String, Change<P>);

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
        /// The holder this registration takes the name from, if it is a hand-over: granted
        /// while the name is that holder's (or nobody's).
        replaces: Option<P>,
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
    /// Copies from a home to the replicas, from a node to the names' new replicas, or from an
    /// owner to the homes of its registrations (a resync): apply each change.
    Copy {
        /// Names and entries.
        names: Vec<Copied<P>>,
    },
    /// An owner asserts its registrations to their home (after the members changed); the
    /// home takes them in, settling conflicts, and answers with [`DirMsg::Asserted`].
    Assert {
        /// The owner's request.
        req: ReqId,
        /// The names and their registrations (all the sender's own).
        names: Vec<(String, Entry<P>)>,
    },
    /// The home's answer to an assertion: the names the asserting owner lost, and to whom.
    Asserted {
        /// The request.
        req: ReqId,
        /// The names the sender no longer holds, with the registration that kept each.
        lost: Vec<(String, Entry<P>)>,
    },
    /// A registration of the receiver lost a conflict to `winner` (answered with
    /// [`DirMsg::Ack`]; sent again until it is).
    Lost {
        /// The sender's request.
        req: ReqId,
        /// The name.
        name: String,
        /// The registration that kept it.
        winner: Entry<P>,
    },
    /// A [`DirMsg::Lost`] arrived.
    Ack {
        /// Its request.
        req: ReqId,
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
    /// Requests sent again because no answer came.
    pub retries: u64,
}

/// What a timer is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Timer {
    /// A request's deadline.
    Req(ReqId),
    /// Assert this node's registrations to their homes again.
    Resync,
}

enum Pending<P> {
    Register {
        name: String,
        entry: Entry<P>,
        replaces: Option<P>,
    },
    Lookup {
        name: String,
    },
    /// This node's registrations asserted to `to`, their home.
    Assert {
        to: P,
        names: Vec<String>,
    },
    /// Telling `to` that its registration of `name` lost to `winner`.
    Tell {
        to: P,
        name: String,
        winner: Entry<P>,
    },
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
    /// This node's own registrations, and the home each was last asserted to.
    own: BTreeMap<String, (Entry<P>, Option<P>)>,
    cache: Cache<Entry<P>>,
    /// Requests waiting for an answer, and when they give up.
    pending: HashMap<ReqId, (Pending<P>, Duration)>,
    timers: Timers<Timer>,
    next_req: ReqId,
    out: VecDeque<DirOutput<P>>,
    stats: DirStats,
}

/// A member's name as the rendezvous hash reads it.
fn member_key<P: PeerId>(p: &P) -> Vec<u8> {
    crate::encode(p.name()).unwrap_or_default()
}

impl<P: PeerId> Directory<P> {
    /// A directory on node `me`, alone until [`Directory::handle_members`].
    pub fn new(me: P, cfg: DirectoryConfig) -> Self {
        Directory {
            member_keys: vec![member_key(&me)],
            members: vec![me.clone()],
            me,
            cache: Cache::new(cfg.cache_capacity),
            cfg,
            table: BTreeMap::new(),
            own: BTreeMap::new(),
            pending: HashMap::new(),
            timers: Timers::default(),
            next_req: 1,
            out: VecDeque::new(),
            stats: DirStats::default(),
        }
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

    /// The registration of `name` this node stores as its home or a replica.
    pub fn stored(&self, name: &str) -> Option<&Entry<P>> {
        self.table.get(name)
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
        self.pending
            .insert(req, (p, now + self.cfg.request_timeout));
        self.timers.set(Timer::Req(req), now + self.retry_every());
        Some(req)
    }

    /// How long a request waits before it is sent again (a message may be lost while routes
    /// change): a quarter of the request timeout.
    fn retry_every(&self) -> Duration {
        self.cfg.request_timeout / 4
    }

    /// Sends a waiting request (again) to the name's home, as it is now.
    fn ask(&mut self, req: ReqId) {
        let me = self.me.clone();
        let Some((what, _)) = self.pending.get(&req) else {
            return;
        };
        match what {
            Pending::Register {
                name,
                entry,
                replaces,
            } => {
                let (name, entry, replaces) = (name.clone(), entry.clone(), replaces.clone());
                let home = self.home(&name);
                if home == me {
                    let result = self.claim(&name, entry, replaces.as_ref());
                    self.answer_register(req, result);
                } else {
                    self.send(
                        home,
                        DirMsg::Claim {
                            req,
                            name,
                            entry,
                            replaces,
                        },
                    );
                }
            }
            Pending::Assert { to, names } => {
                let to = to.clone();
                let names = names
                    .iter()
                    .filter_map(|n| self.own.get(n).map(|(e, _)| (n.clone(), e.clone())))
                    .collect();
                self.send(to, DirMsg::Assert { req, names });
            }
            Pending::Tell { to, name, winner } => {
                let (to, name, winner) = (to.clone(), name.clone(), winner.clone());
                self.send(to, DirMsg::Lost { req, name, winner });
            }
            Pending::Lookup { name } => {
                let name = name.clone();
                let home = self.home(&name);
                if home == me {
                    self.pending.remove(&req);
                    self.timers.cancel(&Timer::Req(req));
                    let entry = self.table.get(&name).cloned();
                    self.out.push_back(DirOutput::Found {
                        req,
                        result: Ok(entry),
                    });
                } else {
                    self.send(home, DirMsg::Lookup { req, name });
                }
            }
        }
    }

    /// Registers `name` for `target`, stamped `stamp` (see [`Entry::stamp`]); the answer comes
    /// as [`DirOutput::Registered`] with the returned request (at once when this node is the
    /// home). Registering a name this node holds again replaces its target.
    pub fn register(&mut self, now: Duration, name: &str, target: Bytes, stamp: u64) -> ReqId {
        self.register_as(now, name, target, stamp, None)
    }

    /// Registers `name` as [`Directory::register`] does, taking it over from `from` — the node
    /// that handed it to this one ([`Directory::hand_over`]): the home grants it while the name
    /// is `from`'s or nobody's, so that lookups find `from` until this registration replaces
    /// its entry, and never find the name free in between.
    pub fn register_replacing(
        &mut self,
        now: Duration,
        name: &str,
        target: Bytes,
        stamp: u64,
        from: P,
    ) -> ReqId {
        self.register_as(now, name, target, stamp, Some(from))
    }

    fn register_as(
        &mut self,
        now: Duration,
        name: &str,
        target: Bytes,
        stamp: u64,
        replaces: Option<P>,
    ) -> ReqId {
        let refused = if name.is_empty() || name.len() > MAX_NAME_BYTES {
            Some(RegisterError::BadName)
        } else if self.own.len() >= self.cfg.max_names && !self.own.contains_key(name) {
            Some(RegisterError::Full)
        } else {
            None
        };
        if let Some(e) = refused {
            let req = self.next_req;
            self.next_req += 1;
            self.out.push_back(DirOutput::Registered {
                req,
                result: Err(e),
            });
            return req;
        }
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
                replaces,
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
        self.ask(req);
        req
    }

    /// Releases `name` if this node holds it; returns whether it did.
    pub fn unregister(&mut self, name: &str) -> bool {
        if self.own.remove(name).is_none() {
            return false;
        }
        self.cache.remove(name);
        self.release_mine(name);
        true
    }

    /// Releases this node's registration of `name` at its home (no-op there if the entry is
    /// another node's).
    fn release_mine(&mut self, name: &str) {
        let home = self.home(name);
        let me = self.me.clone();
        if home == me {
            self.release(name, &me);
        } else {
            let name = name.to_string();
            self.send(home, DirMsg::Release { name, owner: me });
        }
    }

    /// Hands `name` on: this node stops holding it without releasing it, so that its home
    /// keeps pointing at this node (which passes messages on) until the next holder's
    /// [`Directory::register_replacing`] replaces the entry. Returns whether it held the name.
    /// [`Directory::release_if_left`] later clears the entry if no one took it over.
    pub fn hand_over(&mut self, name: &str) -> bool {
        self.cache.remove(name);
        self.own.remove(name).is_some()
    }

    /// Releases a name this node handed over ([`Directory::hand_over`]) if its home still
    /// names this node (the next holder never took it); nothing if this node holds the name
    /// again.
    pub fn release_if_left(&mut self, name: &str) {
        if !self.own.contains_key(name) {
            self.release_mine(name);
        }
    }

    /// Who holds `name`: from this node's own registrations, its cache, or its table when it is
    /// the name's home, else by asking the home.
    pub fn whereis(&mut self, now: Duration, name: &str) -> Whereis<P> {
        if let Some((e, _)) = self.own.get(name) {
            self.stats.local_lookups += 1;
            return Whereis::Now(Some(e.clone()));
        }
        if let Some(e) = self.cache.get(name) {
            self.stats.local_lookups += 1;
            return Whereis::Now(Some(e.clone()));
        }
        // Only the home answers from its table: a replica's copy may be out of date.
        let home = self.home(name);
        if home == self.me {
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
                self.ask(req);
                Whereis::Asked(req)
            }
        }
    }

    /// Forgets the cached entry of `name` (a send to it failed).
    pub fn invalidate(&mut self, name: &str) {
        self.cache.remove(name);
    }

    /// The members changed (the list includes or omits this node; either is fine). Entries of
    /// nodes that are gone are dropped; names that gained replicas are copied to them; and
    /// [`DirectoryConfig::resync_after`] later this node asserts its own registrations to
    /// their homes (after a partition heals, that is how two registrations of a name meet;
    /// it also repairs a home that missed a copy).
    pub fn handle_members(&mut self, now: Duration, members: &[P]) {
        // This node is always a member of its own directory, whatever the list says.
        let (came, gone) = crate::member_list::diff(&self.members, members, Some(&self.me));
        if came.is_empty() && gone.is_empty() {
            return;
        }
        let added = !came.is_empty();
        if !gone.is_empty() {
            self.table
                .retain(|_, e| gone.binary_search(&e.owner).is_err());
            self.cache.retain(|e| gone.binary_search(&e.owner).is_err());
        }
        // The replicas every stored name had, before the members move.
        let had: Vec<Vec<P>> = self.table.keys().map(|name| self.replicas(name)).collect();
        let keys = &mut self.member_keys;
        let mut rebuilt = false;
        crate::member_list::apply(&mut self.members, &came, &gone, |edit| match edit {
            Edit::Inserted(i, p) => keys.insert(i, member_key(p)),
            Edit::Removed(i) => {
                keys.remove(i);
            }
            Edit::Rebuilt => rebuilt = true,
        });
        if rebuilt {
            self.member_keys = self.members.iter().map(member_key).collect();
        }
        if self.timers.next_of(&Timer::Resync).is_none() {
            self.timers.set(Timer::Resync, now + self.cfg.resync_after);
        }
        // New members may bring registrations that win against cached ones (a partition
        // healed): the cache starts afresh.
        if added {
            self.cache.retain(|_| false);
        }
        // Copies to the replicas a stored name has gained (only those: the others have it);
        // names this node no longer keeps are handed over and dropped.
        let mut batches: BTreeMap<P, Vec<Copied<P>>> = BTreeMap::new();
        let mut drop = Vec::new();
        for ((name, e), had) in self.table.iter().zip(&had) {
            let reps = self.replicas(name);
            for r in reps.iter().filter(|r| **r != self.me && !had.contains(r)) {
                batches
                    .entry(r.clone())
                    .or_default()
                    .push((name.clone(), Change::Set(e.clone())));
            }
            if !reps.contains(&self.me) {
                drop.push(name.clone());
            }
        }
        for name in drop {
            self.table.remove(&name);
        }
        self.send_batches(batches);
    }

    /// Sends copies, at most [`COPY_BATCH`] names a message.
    fn send_batches(&mut self, batches: BTreeMap<P, Vec<Copied<P>>>) {
        for (to, mut names) in batches {
            while names.len() > COPY_BATCH {
                let rest = names.split_off(COPY_BATCH);
                let chunk = std::mem::replace(&mut names, rest);
                self.send(to.clone(), DirMsg::Copy { names: chunk });
            }
            self.send(to, DirMsg::Copy { names });
        }
    }

    /// Asserts this node's registrations whose home changed since they were last asserted to
    /// their new homes: a home that lacks one takes it, a home that holds another registration
    /// of the name settles the conflict.
    fn resync(&mut self, now: Duration) {
        let mut batches: BTreeMap<P, Vec<String>> = BTreeMap::new();
        let mut moved = Vec::new();
        for (name, (e, asserted)) in &self.own {
            let home = self.home(name);
            if asserted.as_ref() != Some(&home) {
                moved.push((name.clone(), e.clone(), home));
            }
        }
        for (name, e, home) in moved {
            if home == self.me {
                if let Some(own) = self.own.get_mut(&name) {
                    own.1 = Some(home);
                }
                self.merge(name, e);
            } else {
                batches.entry(home).or_default().push(name);
            }
        }
        for (to, mut names) in batches {
            while !names.is_empty() {
                let rest = names.split_off(names.len().min(COPY_BATCH));
                let chunk = std::mem::replace(&mut names, rest);
                let what = Pending::Assert {
                    to: to.clone(),
                    names: chunk.clone(),
                };
                if self.track(now, what).is_none() {
                    // Too many requests in flight: the next resync asserts the rest.
                    self.timers.set(Timer::Resync, now + self.cfg.resync_after);
                    return;
                }
                for n in &chunk {
                    if let Some(own) = self.own.get_mut(n) {
                        own.1 = Some(to.clone());
                    }
                }
                let req = self.next_req - 1;
                self.ask(req);
            }
        }
    }

    /// Tells `loser`'s node that its registration of `name` lost to `winner` (or this node's
    /// driver, when it is this node's).
    fn tell_loser(&mut self, now: Duration, name: String, loser: P, winner: Entry<P>) {
        if loser == self.me {
            self.lose(name, winner);
            return;
        }
        let what = Pending::Tell {
            to: loser,
            name,
            winner,
        };
        if let Some(req) = self.track(now, what) {
            self.ask(req);
        }
    }

    /// This node's registration of `name` lost to `winner`, if it still holds one that does.
    fn lose(&mut self, name: String, winner: Entry<P>) {
        if self
            .own
            .get(&name)
            .is_some_and(|(mine, _)| winner.beats(mine))
        {
            self.own.remove(&name);
            self.cache.insert(name.clone(), winner.clone());
            self.out.push_back(DirOutput::Lost { name, winner });
        }
    }

    /// A message from member `from`.
    pub fn handle_message(&mut self, now: Duration, from: P, msg: DirMsg<P>) {
        match msg {
            DirMsg::Claim {
                req,
                name,
                entry,
                replaces,
            } => {
                // The claimant is who sent it: an entry naming another owner is refused.
                let result = if entry.owner != from {
                    Err(RegisterError::Taken(entry))
                } else {
                    self.claim(&name, entry, replaces.as_ref())
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
                if let Some((Pending::Lookup { name }, _)) = self.pending.remove(&req) {
                    self.timers.cancel(&Timer::Req(req));
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
                for (name, change) in names {
                    match change {
                        Change::Set(e) if self.is_member(&e.owner) => {
                            if let Some((loser, winner)) = self.merge(name.clone(), e) {
                                self.tell_loser(now, name, loser, winner);
                            }
                        }
                        Change::Replace { from, entry } if self.is_member(&entry.owner) => {
                            if self.table.get(&name).is_some_and(|e| e.owner == from) {
                                self.table.insert(name, entry);
                            } else if let Some((loser, winner)) = self.merge(name.clone(), entry) {
                                self.tell_loser(now, name, loser, winner);
                            }
                        }
                        Change::Set(_) | Change::Replace { .. } => {}
                        Change::Delete { owner, stamp } => {
                            if self
                                .table
                                .get(&name)
                                .is_some_and(|e| e.owner == owner && e.stamp <= stamp)
                            {
                                self.table.remove(&name);
                            }
                        }
                    }
                }
            }
            DirMsg::Assert { req, names } => {
                let mut lost = Vec::new();
                for (name, e) in names {
                    // Only the sender's own registrations, and only of members.
                    if e.owner != from || !self.is_member(&from) {
                        continue;
                    }
                    if let Some((loser, winner)) = self.merge(name.clone(), e) {
                        if loser == from {
                            lost.push((name, winner));
                        } else {
                            self.tell_loser(now, name, loser, winner);
                        }
                    }
                }
                self.send(from, DirMsg::Asserted { req, lost });
            }
            DirMsg::Asserted { req, lost } => {
                if matches!(self.pending.get(&req), Some((Pending::Assert { .. }, _))) {
                    self.pending.remove(&req);
                    self.timers.cancel(&Timer::Req(req));
                    for (name, winner) in lost {
                        self.lose(name, winner);
                    }
                }
            }
            DirMsg::Lost { req, name, winner } => {
                self.send(from, DirMsg::Ack { req });
                self.lose(name, winner);
            }
            DirMsg::Ack { req } => {
                if matches!(self.pending.get(&req), Some((Pending::Tell { .. }, _))) {
                    self.pending.remove(&req);
                    self.timers.cancel(&Timer::Req(req));
                }
            }
        }
    }

    /// Fails the requests whose time is up; resyncs when it is time to.
    pub fn handle_timeout(&mut self, now: Duration) {
        while let Some(timer) = self.timers.expired(now) {
            let req = match timer {
                Timer::Resync => {
                    self.resync(now);
                    continue;
                }
                Timer::Req(req) => req,
            };
            let deadline = match self.pending.get(&req) {
                Some((_, deadline)) => *deadline,
                None => continue,
            };
            if now < deadline {
                self.stats.retries += 1;
                self.timers
                    .set(Timer::Req(req), (now + self.retry_every()).min(deadline));
                self.ask(req);
                continue;
            }
            match self.pending.remove(&req).map(|(what, _)| what) {
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
                Some(Pending::Assert { names, .. }) => {
                    // The home did not answer: assert these again at the next resync.
                    self.stats.timeouts += 1;
                    for n in names {
                        if let Some(own) = self.own.get_mut(&n) {
                            own.1 = None;
                        }
                    }
                    self.timers.set(Timer::Resync, now + self.cfg.resync_after);
                }
                Some(Pending::Tell { .. }) => self.stats.timeouts += 1,
                None => {}
            }
        }
    }

    /// The home's decision on a claim (taking the name over from `replaces`, if given).
    fn claim(
        &mut self,
        name: &str,
        entry: Entry<P>,
        replaces: Option<&P>,
    ) -> Result<(), RegisterError<P>> {
        let change = match self.table.get(name) {
            Some(held) if held.owner == entry.owner => Change::Set(entry.clone()),
            Some(held) if Some(&held.owner) == replaces => Change::Replace {
                from: held.owner.clone(),
                entry: entry.clone(),
            },
            Some(held) => return Err(RegisterError::Taken(held.clone())),
            None if self.table.len() >= self.cfg.max_names => return Err(RegisterError::Full),
            None => Change::Set(entry.clone()),
        };
        self.table.insert(name.to_string(), entry);
        self.copy_to_replicas(name, change);
        Ok(())
    }

    fn release(&mut self, name: &str, owner: &P) {
        if let Some(held) = self.table.get(name).filter(|e| e.owner == *owner) {
            let change = Change::Delete {
                owner: owner.clone(),
                stamp: held.stamp,
            };
            self.table.remove(name);
            self.copy_to_replicas(name, change);
        }
    }

    fn copy_to_replicas(&mut self, name: &str, change: Change<P>) {
        for r in self.replicas(name) {
            if r != self.me {
                self.send(
                    r,
                    DirMsg::Copy {
                        names: vec![(name.to_string(), change.clone())],
                    },
                );
            }
        }
    }

    /// Takes in a registration of `name`; of two registrations of one name the winner is kept
    /// (and copied to the replicas when this node is the home), and the loser's owner and the
    /// winner are returned, for the caller to tell the loser.
    fn merge(&mut self, name: String, e: Entry<P>) -> Option<(P, Entry<P>)> {
        match self.table.get(&name) {
            None => {
                if self.table.len() >= self.cfg.max_names {
                    self.stats.copies_dropped += 1;
                    return None;
                }
                self.table.insert(name, e);
                None
            }
            Some(held) if held.owner == e.owner => {
                if held != &e {
                    self.table.insert(name, e);
                }
                None
            }
            Some(held) => {
                self.stats.conflicts += 1;
                let (winner, loser) = if e.beats(held) {
                    (e, held.clone())
                } else {
                    (held.clone(), e)
                };
                self.table.insert(name.clone(), winner.clone());
                if self.home(&name) == self.me {
                    self.copy_to_replicas(&name, Change::Set(winner.clone()));
                }
                Some((loser.owner, winner))
            }
        }
    }

    fn answer_register(&mut self, req: ReqId, result: Result<(), RegisterError<P>>) {
        let Some((Pending::Register { name, entry, .. }, _)) = self.pending.remove(&req) else {
            return;
        };
        self.timers.cancel(&Timer::Req(req));
        if result.is_ok() {
            let home = self.home(&name);
            self.own.insert(name, (entry, Some(home)));
        }
        self.out.push_back(DirOutput::Registered { req, result });
    }
}

#[cfg(test)]
mod tests;
