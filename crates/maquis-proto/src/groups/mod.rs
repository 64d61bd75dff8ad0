//! Process groups without I/O: named groups of actors across the cluster, as Erlang's `pg`.
//!
//! Every node owns its *local* memberships (which of its actors are in which groups) and
//! keeps a replica of every other member node's. A local change bumps the node's version and
//! goes to every member node as a delta ([`GroupMsg::Delta`]); a node that sees a version gap
//! asks for the whole state ([`GroupMsg::SyncReq`] → [`GroupMsg::Sync`]). When a node becomes
//! a member, each side sends the other its whole local state; when it leaves the members, its
//! actors leave every group at once. Every [`GroupsConfig::digest_every`] a node that has
//! memberships tells the others its version ([`GroupMsg::Digest`]), so that a lost last delta
//! is noticed and repaired.
//!
//! The machine is driven like the others of this crate: `handle_*` take `now`, the driver
//! takes [`GroupOutput`]s with [`Groups::poll_output`] and arms a timer for
//! [`Groups::poll_timeout`]. Members are `(node, actor, type)`: the actor is the runtime's
//! local id, the type its message type's fingerprint, both opaque here.
//!
//! # What it guarantees
//!
//! Eventual consistency: once changes stop and messages get through, every node sees the same
//! members of every group. A join is visible on its own node at once and on the others one
//! message later; a dead node's members disappear when the driver hands the new member list.
//! During a partition each side sees its own side's members; when it heals the states are
//! exchanged and the groups merge (there is nothing to conflict: a membership belongs to its
//! node).
//!
//! # Bounds
//!
//! A node keeps at most [`GroupsConfig::max_members`] memberships, its own and the replicas of
//! the others' together: a local join beyond is refused ([`JoinError::Full`]); a remote
//! membership beyond is dropped and counted ([`GroupStats::dropped`]), and that node's state is
//! asked for again at its next change or digest, so it comes in once there is room. Group
//! names have 1 to
//! [`MAX_GROUP_BYTES`] bytes.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::id::PeerId;

/// The longest group name, in bytes.
pub const MAX_GROUP_BYTES: usize = 255;

/// Settings of a [`Groups`] machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupsConfig {
    /// Memberships a node keeps at most (its own and the others' together). Default 1,048,576.
    pub max_members: usize,
    /// How often a node with memberships tells the others its version. Default 10 s.
    pub digest_every: Duration,
}

impl Default for GroupsConfig {
    fn default() -> Self {
        GroupsConfig {
            max_members: 1 << 20,
            digest_every: Duration::from_secs(10),
        }
    }
}

/// One actor in a group: its local id on its node and its message type's fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Actor {
    /// The actor's id on its node.
    pub id: u64,
    /// Its message type's fingerprint.
    pub ty: u64,
}

/// Why a local join was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    /// The node keeps as many memberships as it may.
    #[error("the node keeps as many group memberships as it may")]
    Full,
    /// The group name is empty or longer than [`MAX_GROUP_BYTES`].
    #[error("a group name has 1 to 255 bytes")]
    BadName,
}

/// A node's groups: group name → its actors in it.
pub type Local = BTreeMap<String, BTreeSet<Actor>>;

/// What one node's groups machine sends another.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupMsg {
    /// The sender's memberships changed: version `v` is version `v − 1` with these changes.
    Delta {
        /// The sender's version after the change.
        v: u64,
        /// Actors that joined a group.
        joined: Vec<(String, Actor)>,
        /// Actors that left a group.
        left: Vec<(String, Actor)>,
    },
    /// The sender's whole local state, at version `v`.
    Sync {
        /// Its version.
        v: u64,
        /// Its groups.
        groups: Local,
    },
    /// Send me your whole state.
    SyncReq,
    /// The sender's version (a receiver that knows less asks for the state).
    Digest {
        /// Its version.
        v: u64,
    },
}

/// What the machine asks of its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupOutput<P> {
    /// Send `msg` to member `to`.
    Send {
        /// The member.
        to: P,
        /// The message.
        msg: GroupMsg,
    },
}

/// Counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Memberships of this node's actors.
    pub local: usize,
    /// Memberships of other nodes' actors kept here.
    pub remote: usize,
    /// Remote memberships dropped because the table was full.
    pub dropped: u64,
    /// Whole states asked for after a gap.
    pub resyncs: u64,
    /// Whether this node has had the state of every other member node (until then
    /// [`Groups::members`] may miss the members of those it has not heard from yet: a node
    /// that just joined the cluster, for instance).
    pub synced: bool,
}

/// A replica of another node's groups.
#[derive(Default)]
struct View {
    v: u64,
    groups: Local,
}

/// The groups of one node (see the module docs).
pub struct Groups<P: PeerId> {
    me: P,
    cfg: GroupsConfig,
    members: Vec<P>,
    v: u64,
    local: Local,
    views: HashMap<P, View>,
    /// Memberships kept, local and remote.
    count: usize,
    digest_at: Option<Duration>,
    out: VecDeque<GroupOutput<P>>,
    stats: GroupStats,
    /// Increases whenever what [`Groups::members`] answers may have changed.
    changes: u64,
}

impl<P: PeerId> Groups<P> {
    /// The groups of node `me`, alone until [`Groups::handle_members`].
    pub fn new(me: P, cfg: GroupsConfig) -> Self {
        Groups {
            me,
            cfg,
            members: Vec::new(),
            v: 0,
            local: Local::new(),
            views: HashMap::new(),
            count: 0,
            digest_at: None,
            out: VecDeque::new(),
            stats: GroupStats::default(),
            changes: 0,
        }
    }

    /// A number that increases whenever what [`Groups::members`] answers may have changed
    /// (a join or leave here, a delta or state from a member, a member node added or gone):
    /// a driver tells the node's users to read the members again when it moves.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Takes the next thing to do.
    pub fn poll_output(&mut self) -> Option<GroupOutput<P>> {
        self.out.pop_front()
    }

    /// When [`Groups::handle_timeout`] should run next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.digest_at
    }

    /// Counters.
    pub fn stats(&self) -> GroupStats {
        let local = self.local.values().map(BTreeSet::len).sum();
        GroupStats {
            local,
            remote: self.count - local,
            synced: self.others().all(|m| self.views.contains_key(m)),
            ..self.stats.clone()
        }
    }

    fn others(&self) -> impl Iterator<Item = &P> + '_ {
        self.members.iter().filter(move |m| **m != self.me)
    }

    fn send_all(&mut self, msg: GroupMsg) {
        let to: Vec<P> = self.others().cloned().collect();
        for p in to {
            self.out.push_back(GroupOutput::Send {
                to: p,
                msg: msg.clone(),
            });
        }
    }

    /// Actor `a` of this node joins `group` (joining twice is one membership).
    pub fn join(&mut self, now: Duration, group: &str, a: Actor) -> Result<(), JoinError> {
        if group.is_empty() || group.len() > MAX_GROUP_BYTES {
            return Err(JoinError::BadName);
        }
        if self.local.get(group).is_some_and(|s| s.contains(&a)) {
            return Ok(());
        }
        if self.count >= self.cfg.max_members {
            return Err(JoinError::Full);
        }
        self.local.entry(group.to_string()).or_default().insert(a);
        self.count += 1;
        self.changed(now, vec![(group.to_string(), a)], Vec::new());
        Ok(())
    }

    /// Actor `a` of this node leaves `group`; whether it was in it.
    pub fn leave(&mut self, now: Duration, group: &str, a: Actor) -> bool {
        let Some(set) = self.local.get_mut(group) else {
            return false;
        };
        if !set.remove(&a) {
            return false;
        }
        if set.is_empty() {
            self.local.remove(group);
        }
        self.count -= 1;
        self.changed(now, Vec::new(), vec![(group.to_string(), a)]);
        true
    }

    /// Actor `id` of this node stopped: it leaves every group it was in.
    pub fn remove_actor(&mut self, now: Duration, id: u64) {
        let mut left = Vec::new();
        for (g, set) in &mut self.local {
            let gone: Vec<Actor> = set.iter().filter(|a| a.id == id).copied().collect();
            for a in gone {
                set.remove(&a);
                left.push((g.clone(), a));
            }
        }
        if left.is_empty() {
            return;
        }
        self.local.retain(|_, s| !s.is_empty());
        self.count -= left.len();
        self.changed(now, Vec::new(), left);
    }

    fn changed(&mut self, now: Duration, joined: Vec<(String, Actor)>, left: Vec<(String, Actor)>) {
        self.changes += 1;
        self.v += 1;
        let v = self.v;
        self.send_all(GroupMsg::Delta { v, joined, left });
        if self.digest_at.is_none() {
            self.digest_at = Some(now + self.cfg.digest_every);
        }
    }

    /// This node's own members of `group` (without a pass over the other nodes).
    pub fn local_members(&self, group: &str) -> impl Iterator<Item = Actor> + '_ {
        self.local.get(group).into_iter().flatten().copied()
    }

    /// The members of `group`, this node's first, each as (node, actor).
    pub fn members(&self, group: &str) -> Vec<(P, Actor)> {
        let mut out: Vec<(P, Actor)> = self
            .local
            .get(group)
            .into_iter()
            .flatten()
            .map(|a| (self.me.clone(), *a))
            .collect();
        for m in &self.members {
            if let Some(set) = self.views.get(m).and_then(|v| v.groups.get(group)) {
                out.extend(set.iter().map(|a| (m.clone(), *a)));
            }
        }
        out
    }

    /// The groups of this node's actor `id`.
    pub fn groups_of(&self, id: u64) -> Vec<String> {
        self.local
            .iter()
            .filter(|(_, s)| s.iter().any(|a| a.id == id))
            .map(|(g, _)| g.clone())
            .collect()
    }

    /// The members changed: the new ones get this node's state, the gone ones' actors leave
    /// every group.
    pub fn handle_members(&mut self, _now: Duration, members: &[P]) {
        let (added, gone) = crate::member_list::diff(&self.members, members, None);
        crate::member_list::apply(&mut self.members, &added, &gone, |_| {});
        let added: Vec<P> = added.into_iter().filter(|m| *m != self.me).collect();
        if !added.is_empty() || !gone.is_empty() {
            self.changes += 1;
        }
        for g in gone {
            if let Some(view) = self.views.remove(&g) {
                self.count -= view.groups.values().map(BTreeSet::len).sum::<usize>();
            }
        }
        for p in added {
            self.out.push_back(GroupOutput::Send {
                to: p,
                msg: GroupMsg::Sync {
                    v: self.v,
                    groups: self.local.clone(),
                },
            });
        }
    }

    /// A message from member `from` (from a node that is not a member: ignored).
    pub fn handle_message(&mut self, _now: Duration, from: P, msg: GroupMsg) {
        if from == self.me || self.members.binary_search(&from).is_err() {
            return;
        }
        match msg {
            GroupMsg::Delta { v, joined, left } => {
                let known = self.views.get(&from).map_or(0, |view| view.v);
                if v <= known {
                    return;
                }
                if v != known + 1 {
                    self.stats.resyncs += 1;
                    self.out.push_back(GroupOutput::Send {
                        to: from,
                        msg: GroupMsg::SyncReq,
                    });
                    return;
                }
                let max = self.cfg.max_members;
                self.changes += 1;
                let view = self.views.entry(from).or_default();
                view.v = v;
                for (g, a) in left {
                    if let Some(set) = view.groups.get_mut(&g) {
                        if set.remove(&a) {
                            self.count -= 1;
                        }
                        if set.is_empty() {
                            view.groups.remove(&g);
                        }
                    }
                }
                let mut dropped = false;
                for (g, a) in joined {
                    if g.is_empty() || g.len() > MAX_GROUP_BYTES {
                        continue;
                    }
                    if self.count >= max {
                        self.stats.dropped += 1;
                        dropped = true;
                        continue;
                    }
                    if view.groups.entry(g).or_default().insert(a) {
                        self.count += 1;
                    }
                }
                if dropped {
                    // Incomplete: the next delta or digest asks for the whole state again.
                    view.v = 0;
                }
            }
            GroupMsg::Sync { v, groups } => {
                let known = self.views.get(&from).map_or(0, |view| view.v);
                if v < known {
                    return;
                }
                if let Some(old) = self.views.remove(&from) {
                    self.count -= old.groups.values().map(BTreeSet::len).sum::<usize>();
                }
                self.changes += 1;
                let mut view = View {
                    v,
                    groups: Local::new(),
                };
                for (g, set) in groups {
                    if g.is_empty() || g.len() > MAX_GROUP_BYTES {
                        continue;
                    }
                    for a in set {
                        if self.count >= self.cfg.max_members {
                            self.stats.dropped += 1;
                            // Incomplete: asked for again at the next delta or digest.
                            view.v = 0;
                            continue;
                        }
                        if view.groups.entry(g.clone()).or_default().insert(a) {
                            self.count += 1;
                        }
                    }
                }
                self.views.insert(from, view);
            }
            GroupMsg::SyncReq => {
                self.out.push_back(GroupOutput::Send {
                    to: from,
                    msg: GroupMsg::Sync {
                        v: self.v,
                        groups: self.local.clone(),
                    },
                });
            }
            GroupMsg::Digest { v } => {
                let known = self.views.get(&from).map_or(0, |view| view.v);
                if v > known {
                    self.stats.resyncs += 1;
                    self.out.push_back(GroupOutput::Send {
                        to: from,
                        msg: GroupMsg::SyncReq,
                    });
                }
            }
        }
    }

    /// Sends the digest when it is time to.
    pub fn handle_timeout(&mut self, now: Duration) {
        let Some(at) = self.digest_at else {
            return;
        };
        if now < at {
            return;
        }
        if self.v > 0 {
            let v = self.v;
            self.send_all(GroupMsg::Digest { v });
            self.digest_at = Some(now + self.cfg.digest_every);
        } else {
            self.digest_at = None;
        }
    }
}

#[cfg(test)]
mod tests;
