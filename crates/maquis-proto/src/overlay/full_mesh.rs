//! Full mesh: every member connects to every other; membership spreads by gossip.
//!
//! The state is one entry per node name: (identity, version, left?). Entries merge by the larger
//! (incarnation, version), so a leave (a `left` entry with a higher version) spreads and is not
//! undone by stale gossip, and a rejoin (a new, higher version) supersedes the leave. A node
//! gossips its whole state to everyone when it changes and to one random peer every gossip
//! period. Failures are local: a node that is declared down is hidden from `members()` and
//! retried until it comes back or the cluster drops it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Effects, Overlay, Route, TimerId};
use crate::id::{NodeId, PeerId};

const GOSSIP: TimerId = TimerId(1);
const RETRY: TimerId = TimerId(2);

/// One node's membership record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry<P = NodeId> {
    /// The node.
    pub id: P,
    /// Bumped by every join, leave or removal of the node.
    pub version: u64,
    /// Whether the node has left (or was removed).
    pub left: bool,
}

impl<P: PeerId> Entry<P> {
    fn newer_than(&self, other: &Entry<P>) -> bool {
        (self.id.incarnation(), self.version) > (other.id.incarnation(), other.version)
    }
}

/// Full-mesh protocol messages.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Msg<P = NodeId> {
    /// The sender's whole membership state.
    State(Vec<Entry<P>>),
}

/// The full-mesh overlay.
#[derive(Debug)]
pub struct FullMesh<P: PeerId = NodeId> {
    me: P,
    entries: BTreeMap<P::Name, Entry<P>>,
    /// The incarnations declared down (a mark says nothing of a later incarnation).
    down: BTreeSet<P>,
    gossip_every: Duration,
    retry_every: Duration,
    tick: u64,
    /// Left or removed, and not joined since: gossip from the old cluster is ignored.
    alone: bool,
    /// Bumped by every handler that may change the entries, the down marks or `alone` (see
    /// `Overlay::epoch`): gossip that brings nothing new and the timers leave it.
    epoch: u64,
}

impl<P: PeerId> FullMesh<P> {
    /// A node alone, gossiping every `gossip_every` and retrying down peers every `retry_every`.
    pub fn new(me: P, gossip_every: Duration, retry_every: Duration) -> Self {
        let mut entries = BTreeMap::new();
        entries.insert(
            me.name().clone(),
            Entry {
                id: me.clone(),
                version: 1,
                left: false,
            },
        );
        FullMesh {
            me,
            entries,
            down: BTreeSet::new(),
            gossip_every,
            retry_every,
            tick: 0,
            alone: false,
            epoch: 0,
        }
    }

    fn alive_peers(&self) -> impl Iterator<Item = &P> {
        self.entries
            .values()
            .filter(|e| !e.left && e.id.name() != self.me.name())
            .map(|e| &e.id)
    }

    fn state(&self) -> Msg<P> {
        Msg::State(self.entries.values().cloned().collect())
    }

    fn gossip_all(&self, except: Option<&P>, fx: &mut Effects<Msg<P>, P>) {
        for p in self.alive_peers().filter(|p| Some(*p) != except) {
            fx.send(p.clone(), self.state());
        }
    }

    fn my_version(&self) -> u64 {
        self.entries
            .get(self.me.name())
            .map(|e| e.version)
            .unwrap_or(0)
    }

    /// Back to a cluster of one, alive with a version above everything said about us so far.
    fn reset(&mut self, above: u64) {
        self.entries.clear();
        self.down.clear();
        self.alone = true;
        let version = above.max(self.my_version()) + 1;
        self.entries.insert(
            self.me.name().clone(),
            Entry {
                id: self.me.clone(),
                version,
                left: false,
            },
        );
    }

    /// Merges a received state; returns whether ours changed.
    fn merge(&mut self, from: &P, theirs: Vec<Entry<P>>, fx: &mut Effects<Msg<P>, P>) -> bool {
        let mut changed = false;
        for e in theirs {
            if e.id.name() == self.me.name() {
                let mine = self.my_version();
                if e.id.incarnation() == self.me.incarnation() && e.left && e.version >= mine {
                    // Someone removed us: say goodbye to everyone and stand alone.
                    for p in self.alive_peers().cloned().collect::<Vec<_>>() {
                        fx.disconnect(p);
                    }
                    self.reset(e.version);
                    return true;
                }
                continue;
            }
            let newer = match self.entries.get(e.id.name()) {
                None => true,
                Some(m) => e.newer_than(m),
            };
            if !newer {
                continue;
            }
            changed = true;
            let old = self.entries.insert(e.id.name().clone(), e.clone());
            if let Some(old) = old.filter(|o| o.id != e.id) {
                self.down.remove(&old.id);
                if !old.left {
                    fx.disconnect(old.id);
                }
            }
            if e.left {
                self.down.remove(&e.id);
                fx.left(e.id.clone());
                fx.disconnect(e.id.clone());
            } else {
                if &e.id != from {
                    self.down.remove(&e.id);
                }
                fx.connect(e.id.clone());
            }
        }
        changed
    }
}

impl<P: PeerId> Overlay<P> for FullMesh<P> {
    type Msg = Msg<P>;

    fn name(&self) -> &'static str {
        "full-mesh"
    }

    fn on_start(&mut self, fx: &mut Effects<Msg<P>, P>) {
        fx.timer(GOSSIP, self.gossip_every);
    }

    fn on_join(&mut self, contact: &P, fx: &mut Effects<Msg<P>, P>) {
        self.epoch += 1;
        self.alone = false;
        // Known at once as a member; version 0 yields to anything the contact says of itself.
        if !self
            .entries
            .get(contact.name())
            .is_some_and(|e| e.id == *contact && !e.left)
        {
            let e = Entry {
                id: contact.clone(),
                version: 0,
                left: false,
            };
            self.entries.insert(contact.name().clone(), e);
        }
        self.down.retain(|d| d.name() != contact.name());
        fx.send(contact.clone(), self.state());
    }

    fn on_leave(&mut self, fx: &mut Effects<Msg<P>, P>) {
        self.epoch += 1;
        let version = self.my_version() + 1;
        self.entries.insert(
            self.me.name().clone(),
            Entry {
                id: self.me.clone(),
                version,
                left: true,
            },
        );
        self.gossip_all(None, fx);
        for p in self.alive_peers().cloned().collect::<Vec<_>>() {
            fx.left(p.clone());
            fx.disconnect(p);
        }
        self.reset(version);
    }

    fn on_remove(&mut self, node: &P::Name, fx: &mut Effects<Msg<P>, P>) {
        let Some(e) = self
            .entries
            .get_mut(node)
            .filter(|e| !e.left && e.id != self.me)
        else {
            return;
        };
        self.epoch += 1;
        e.version += 1;
        e.left = true;
        let id = e.id.clone();
        self.down.retain(|d| d.name() != node);
        fx.send(id.clone(), self.state());
        self.gossip_all(Some(&id), fx);
        fx.left(id.clone());
        fx.disconnect(id);
    }

    fn on_message(&mut self, from: &P, msg: Msg<P>, fx: &mut Effects<Msg<P>, P>) {
        let Msg::State(theirs) = msg;
        if self.alone {
            // Only a node joining through us (it knows us at version 0, or not at all) ends
            // our solitude; gossip from the cluster we left knows an older version of us.
            let stale = theirs
                .iter()
                .any(|e| e.id.name() == self.me.name() && e.version > 0);
            if stale {
                return;
            }
            self.alone = false;
            self.epoch += 1;
        }
        let they_know: BTreeMap<P::Name, Entry<P>> = theirs
            .iter()
            .map(|e| (e.id.name().clone(), e.clone()))
            .collect();
        if self.merge(from, theirs, fx) {
            self.epoch += 1;
            self.gossip_all(Some(from), fx);
        }
        let behind = self
            .entries
            .values()
            .any(|mine| match they_know.get(mine.id.name()) {
                None => true,
                Some(t) => mine.newer_than(t),
            });
        if behind && self.alive_peers().any(|p| p == from) {
            fx.send(from.clone(), self.state());
        }
    }

    fn on_connection(&mut self, peer: &P, up: bool, fx: &mut Effects<Msg<P>, P>) {
        self.epoch += 1;
        let known = self
            .entries
            .get(peer.name())
            .is_some_and(|e| e.id == *peer && !e.left);
        if up {
            self.down.remove(peer);
            if known {
                fx.send(peer.clone(), self.state());
            }
        } else if known {
            if self.down.is_empty() {
                fx.timer(RETRY, self.retry_every);
            }
            self.down.insert(peer.clone());
        }
    }

    fn on_timer(&mut self, timer: TimerId, fx: &mut Effects<Msg<P>, P>) {
        match timer {
            GOSSIP => {
                self.tick = self.tick.wrapping_add(1);
                let peers: Vec<P> = self
                    .alive_peers()
                    .filter(|p| !self.down.contains(*p))
                    .cloned()
                    .collect();
                if !peers.is_empty() {
                    let pick = peers[(self.tick as usize) % peers.len()].clone();
                    fx.send(pick, self.state());
                }
                fx.timer(GOSSIP, self.gossip_every);
            }
            RETRY => {
                for id in &self.down {
                    if let Some(e) = self
                        .entries
                        .get(id.name())
                        .filter(|e| !e.left && e.id == *id)
                    {
                        fx.connect(e.id.clone());
                    }
                }
                if !self.down.is_empty() {
                    fx.timer(RETRY, self.retry_every);
                }
            }
            _ => {}
        }
    }

    fn members(&self) -> Vec<P> {
        self.entries
            .values()
            .filter(|e| !e.left && !self.down.contains(&e.id))
            .map(|e| e.id.clone())
            .collect()
    }

    fn route(&self, dst: &P) -> Route<P> {
        match self.entries.get(dst.name()) {
            Some(e) if !e.left && e.id == *dst && !self.down.contains(dst) => Route::Direct,
            _ => Route::Unreachable,
        }
    }

    fn epoch(&self) -> Option<u64> {
        Some(self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: &str) -> NodeId {
        NodeId::new(n, "127.0.0.1:1".parse().unwrap(), 7)
    }

    fn mesh(n: &str) -> FullMesh {
        FullMesh::new(id(n), Duration::from_secs(1), Duration::from_secs(1))
    }

    fn names(m: &FullMesh) -> Vec<String> {
        m.members()
            .into_iter()
            .map(|n| n.name.to_string())
            .collect()
    }

    #[test]
    fn join_spreads_and_leave_spreads() {
        use crate::harness::{NetConfig, Network, NoObserver};
        use crate::membership::MembershipConfig;
        use crate::overlay::Erased;

        let mut net = Network::new(NetConfig::default(), NoObserver);
        let every = Duration::from_secs(1);
        for _ in 0..4 {
            let id = net.next_id();
            net.spawn(
                Box::new(Erased(FullMesh::new(id, every, every))),
                MembershipConfig::default(),
            );
        }
        let members = |net: &Network<NoObserver>, i: u32| -> Vec<u32> {
            net.node(i)
                .machine
                .members()
                .iter()
                .map(|m| m.index)
                .collect()
        };
        // 1, 2 and 3 each join through 0.
        for i in 1..4 {
            net.join(i, 0);
            net.run_for(Duration::from_millis(200));
        }
        net.run_for(Duration::from_millis(500));
        for i in 0..4 {
            assert_eq!(members(&net, i), vec![0, 1, 2, 3], "node {i}");
        }
        net.leave(3);
        assert_eq!(members(&net, 3), vec![3]);
        net.run_for(Duration::from_millis(500));
        for i in 0..3 {
            assert_eq!(members(&net, i), vec![0, 1, 2], "node {i}");
        }
        // 3 rejoins through 1: its new version supersedes the leave.
        net.join(3, 1);
        net.run_for(Duration::from_secs(1));
        for i in 0..4 {
            assert_eq!(members(&net, i), vec![0, 1, 2, 3], "node {i}");
        }
    }

    #[test]
    fn the_epoch_moves_with_changes_only() {
        let mut a = mesh("a");
        let mut fx = Effects::default();
        let b = |version| {
            Msg::State(vec![Entry {
                id: id("b"),
                version,
                left: false,
            }])
        };
        let e0 = a.epoch();
        a.on_message(&id("b"), b(1), &mut fx);
        let e1 = a.epoch();
        assert_ne!(e1, e0, "a new member");
        // The same state again, and the timers: nothing changes.
        a.on_message(&id("b"), b(1), &mut fx);
        a.on_timer(GOSSIP, &mut fx);
        a.on_timer(RETRY, &mut fx);
        assert_eq!(a.epoch(), e1);
        a.on_connection(&id("b"), false, &mut fx);
        assert_ne!(a.epoch(), e1, "a member down");
        let e2 = a.epoch();
        a.on_message(&id("b"), b(2), &mut fx);
        assert_ne!(a.epoch(), e2, "a newer version");
    }

    #[test]
    fn down_hides_and_up_restores() {
        let mut a = mesh("a");
        let mut fx = Effects::default();
        a.on_message(
            &id("b"),
            Msg::State(vec![Entry {
                id: id("b"),
                version: 1,
                left: false,
            }]),
            &mut fx,
        );
        assert_eq!(names(&a), vec!["a", "b"]);
        a.on_connection(&id("b"), false, &mut fx);
        assert_eq!(names(&a), vec!["a"]);
        assert_eq!(a.route(&id("b")), Route::Unreachable);
        a.on_connection(&id("b"), true, &mut fx);
        assert_eq!(a.route(&id("b")), Route::Direct);
    }

    #[test]
    fn a_late_down_of_the_old_incarnation_does_not_hide_the_new_one() {
        let mut a = mesh("a");
        let mut fx = Effects::default();
        let old = id("b");
        let new = NodeId::new("b", old.addr, old.incarnation + 1);
        let entry = |id: &NodeId| Entry {
            id: id.clone(),
            version: 1,
            left: false,
        };
        a.on_message(&old, Msg::State(vec![entry(&old)]), &mut fx);
        // b restarts; the new incarnation connects before the old one's loss is reported.
        a.on_connection(&new, true, &mut fx);
        a.on_connection(&old, false, &mut fx);
        assert_eq!(names(&a), vec!["a"]);
        // The mark is about the old incarnation; the new one's own state replaces its entry.
        a.on_message(&new, Msg::State(vec![entry(&new)]), &mut fx);
        assert_eq!(a.members(), vec![id("a"), new.clone()]);
        assert_eq!(a.route(&new), Route::Direct);
    }
}
