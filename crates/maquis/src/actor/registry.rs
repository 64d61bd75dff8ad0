//! The table of local actors: mailboxes by id, names, who watches whom, and links.
//!
//! One actor keeps at most [`MAX_WATCHERS_PER_ACTOR`] watchers and links together: past that
//! a new watch or link is refused (`DownReason::WatcherLimit`), so that no peer can grow an
//! actor's entry without bound.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::mailbox::ErasedMailbox;
use super::ActorId;
use crate::error::RegisterError;
use crate::id::NodeId;
use crate::wire::frame::{Dest, DownReason};

/// Someone to tell when an actor stops.
pub(crate) enum Watcher {
    Local {
        watch: u64,
        tx: oneshot::Sender<DownReason>,
    },
    Remote {
        node: NodeId,
        watch: u64,
    },
}

/// How many watchers and links one actor can have (local and remote together).
pub(crate) const MAX_WATCHERS_PER_ACTOR: usize = 65_536;

/// One end of a link with an actor on another node: the other node, the link's id on the node
/// that made it, and whether that is this node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LinkKey {
    pub(crate) node: NodeId,
    pub(crate) link: u64,
    pub(crate) initiator_here: bool,
}

/// The other end of one of an actor's links.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Link {
    /// An actor of this node.
    Local(ActorId),
    /// An actor on another node.
    Remote(LinkKey),
}

/// A watcher's identity: a local monitor's watch id, or another node's and its watch id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WatchKey {
    Local(u64),
    Remote(NodeId, u64),
}

/// What an actor left behind when it was removed.
#[derive(Default)]
pub(crate) struct Removed {
    pub(crate) watchers: Vec<Watcher>,
    pub(crate) links: Vec<Link>,
}

/// Why a link could not be made.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LinkRefused {
    /// No such actor (the named one).
    NoProc(ActorId),
    /// An actor has too many watchers and links.
    Limit,
}

impl Watcher {
    fn key(&self) -> WatchKey {
        match self {
            Watcher::Local { watch, .. } => WatchKey::Local(*watch),
            Watcher::Remote { node, watch } => WatchKey::Remote(node.clone(), *watch),
        }
    }
}

struct Entry {
    /// The actor's mailbox, which also carries its exit signal.
    mailbox: std::sync::Arc<dyn ErasedMailbox>,
    /// Names, watchers and links, made on first use: most actors have none, and an entry of
    /// the table is as large as its largest.
    more: Option<Box<More>>,
}

/// What only some actors have.
#[derive(Default)]
struct More {
    names: Vec<String>,
    watchers: HashMap<WatchKey, Watcher>,
    /// The other ends, with a remote one's name as it was given when linking.
    links: HashMap<Link, Option<Dest>>,
}

impl Entry {
    fn full(&self) -> bool {
        self.more
            .as_deref()
            .is_some_and(|m| m.watchers.len() + m.links.len() >= MAX_WATCHERS_PER_ACTOR)
    }

    fn more(&mut self) -> &mut More {
        self.more.get_or_insert_with(Box::default)
    }

    fn has_link(&self, link: &Link) -> bool {
        self.more
            .as_deref()
            .is_some_and(|m| m.links.contains_key(link))
    }

    /// Forgets a link; whether there was one.
    fn unlink(&mut self, link: &Link) -> bool {
        self.more
            .as_deref_mut()
            .is_some_and(|m| m.links.remove(link).is_some())
    }
}

#[derive(Default)]
struct Tables {
    actors: HashMap<ActorId, Entry>,
    names: HashMap<String, ActorId>,
    /// The local end of every link with another node's actor.
    remote_links: HashMap<LinkKey, ActorId>,
}

/// Local actors by id and by name.
#[derive(Default)]
pub(crate) struct Registry {
    tables: Mutex<Tables>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds an actor (its mailbox tells its task to end: `ErasedMailbox::kill`).
    pub(crate) fn insert(&self, id: ActorId, mailbox: std::sync::Arc<dyn ErasedMailbox>) {
        self.lock().actors.insert(
            id,
            Entry {
                mailbox,
                more: None,
            },
        );
    }

    /// Removes an actor and returns who watched it and what it was linked with (the other
    /// local ends of its links forget it; the caller tells them and the remote ends).
    pub(crate) fn remove(&self, id: ActorId) -> Removed {
        let mut t = self.lock();
        let Some(entry) = t.actors.remove(&id) else {
            return Removed::default();
        };
        let more = entry.more.map(|m| *m).unwrap_or_default();
        for n in &more.names {
            t.names.remove(n);
        }
        for link in more.links.keys() {
            match link {
                Link::Local(other) => {
                    if let Some(e) = t.actors.get_mut(other) {
                        e.unlink(&Link::Local(id));
                    }
                }
                Link::Remote(key) => {
                    t.remote_links.remove(key);
                }
            }
        }
        Removed {
            watchers: more.watchers.into_values().collect(),
            links: more.links.into_keys().collect(),
        }
    }

    /// Removes every actor (node shutdown): their mailboxes close and they are told to stop
    /// (`Stopped`).
    pub(crate) fn clear(&self) -> Vec<(ActorId, Vec<Watcher>)> {
        let entries: Vec<_> = {
            let mut t = self.lock();
            t.names.clear();
            t.remote_links.clear();
            t.actors.drain().collect()
        };
        entries
            .into_iter()
            .map(|(id, e)| {
                e.mailbox.close();
                e.mailbox.kill(DownReason::Stopped);
                let watchers = e.more.map(|m| m.watchers.into_values().collect());
                (id, watchers.unwrap_or_default())
            })
            .collect()
    }

    /// Tells an actor's task to end with `reason`; false if there is no such actor or it was
    /// already told.
    pub(crate) fn kill(&self, id: ActorId, reason: DownReason) -> bool {
        let mailbox = self.lock().actors.get(&id).map(|e| e.mailbox.clone());
        mailbox.is_some_and(|m| m.kill(reason))
    }

    /// Links two local actors (again: nothing changes).
    pub(crate) fn link_local(&self, a: ActorId, b: ActorId) -> Result<(), LinkRefused> {
        let mut t = self.lock();
        for x in [a, b] {
            let e = t.actors.get(&x).ok_or(LinkRefused::NoProc(x))?;
            if e.has_link(&Link::Local(if x == a { b } else { a })) {
                return Ok(());
            }
            if e.full() {
                return Err(LinkRefused::Limit);
            }
        }
        if a == b {
            return Ok(());
        }
        for (x, y) in [(a, b), (b, a)] {
            if let Some(e) = t.actors.get_mut(&x) {
                e.more().links.insert(Link::Local(y), None);
            }
        }
        Ok(())
    }

    /// Removes the link between two local actors; whether there was one.
    pub(crate) fn unlink_local(&self, a: ActorId, b: ActorId) -> bool {
        let mut t = self.lock();
        let mut found = false;
        for (x, y) in [(a, b), (b, a)] {
            if let Some(e) = t.actors.get_mut(&x) {
                found |= e.unlink(&Link::Local(y));
            }
        }
        found
    }

    /// Records the local end (actor `id`) of a link with another node's actor `peer`.
    pub(crate) fn link_remote(
        &self,
        id: ActorId,
        key: LinkKey,
        peer: Dest,
    ) -> Result<(), LinkRefused> {
        let mut t = self.lock();
        let e = t.actors.get_mut(&id).ok_or(LinkRefused::NoProc(id))?;
        if e.full() {
            return Err(LinkRefused::Limit);
        }
        e.more().links.insert(Link::Remote(key.clone()), Some(peer));
        t.remote_links.insert(key, id);
        Ok(())
    }

    /// Forgets the local end of a link with another node's actor; the actor it belonged to.
    pub(crate) fn unlink_remote(&self, key: &LinkKey) -> Option<ActorId> {
        let mut t = self.lock();
        let id = t.remote_links.remove(key)?;
        if let Some(e) = t.actors.get_mut(&id) {
            e.unlink(&Link::Remote(key.clone()));
        }
        Some(id)
    }

    /// The links of actor `id` with actor `peer` on `node` (as it was named when linking).
    pub(crate) fn remote_links_to(&self, id: ActorId, node: &NodeId, peer: &Dest) -> Vec<LinkKey> {
        let t = self.lock();
        let Some(m) = t.actors.get(&id).and_then(|e| e.more.as_deref()) else {
            return Vec::new();
        };
        m.links
            .iter()
            .filter_map(|(l, p)| match l {
                Link::Remote(key) if &key.node == node && p.as_ref() == Some(peer) => {
                    Some(key.clone())
                }
                _ => None,
            })
            .collect()
    }

    pub(crate) fn by_id(&self, id: ActorId) -> Option<std::sync::Arc<dyn ErasedMailbox>> {
        self.lock().actors.get(&id).map(|e| e.mailbox.clone())
    }

    pub(crate) fn resolve(&self, name: &str) -> Option<ActorId> {
        self.lock().names.get(name).copied()
    }

    pub(crate) fn register(&self, name: &str, id: ActorId) -> Result<(), RegisterError> {
        let mut t = self.lock();
        if let Some(&holder) = t.names.get(name) {
            return if holder == id {
                Ok(())
            } else {
                Err(RegisterError::Taken(name.into()))
            };
        }
        let entry = t.actors.get_mut(&id).ok_or(RegisterError::NotLocal)?;
        entry.more().names.push(name.to_string());
        t.names.insert(name.to_string(), id);
        Ok(())
    }

    pub(crate) fn unregister(&self, name: &str) -> bool {
        let mut t = self.lock();
        let Some(id) = t.names.remove(name) else {
            return false;
        };
        if let Some(m) = t.actors.get_mut(&id).and_then(|e| e.more.as_deref_mut()) {
            m.names.retain(|n| n != name);
        }
        true
    }

    pub(crate) fn names(&self) -> usize {
        self.lock().names.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().actors.len()
    }

    /// Adds a watcher; gives it back with the reason if the actor does not exist (`NoProc`)
    /// or has too many (`WatcherLimit`).
    pub(crate) fn watch(&self, id: ActorId, w: Watcher) -> Result<(), (Watcher, DownReason)> {
        match self.lock().actors.get_mut(&id) {
            Some(e) if e.full() => Err((w, DownReason::WatcherLimit)),
            Some(e) => {
                e.more().watchers.insert(w.key(), w);
                Ok(())
            }
            None => Err((w, DownReason::NoProc)),
        }
    }

    /// Removes a watcher.
    pub(crate) fn unwatch(&self, id: ActorId, key: &WatchKey) {
        let mut t = self.lock();
        if let Some(m) = t.actors.get_mut(&id).and_then(|e| e.more.as_deref_mut()) {
            m.watchers.remove(key);
        }
    }

    /// Watchers that live on other nodes.
    pub(crate) fn remote_watchers(&self) -> usize {
        let t = self.lock();
        t.actors
            .values()
            .filter_map(|e| e.more.as_deref())
            .map(|m| {
                m.watchers
                    .keys()
                    .filter(|w| matches!(w, WatchKey::Remote(..)))
                    .count()
            })
            .sum()
    }

    /// Links between local actors and other nodes' actors.
    pub(crate) fn remote_links(&self) -> usize {
        self.lock().remote_links.len()
    }

    /// Forgets the watchers and links that live on a node that went away; returns the local
    /// actors that were linked with an actor there.
    pub(crate) fn forget_node(&self, node: &NodeId) -> Vec<ActorId> {
        let mut t = self.lock();
        let mut linked = Vec::new();
        for (id, e) in t.actors.iter_mut() {
            let Some(m) = e.more.as_deref_mut() else {
                continue;
            };
            m.watchers
                .retain(|w, _| !matches!(w, WatchKey::Remote(n, _) if n == node));
            let before = m.links.len();
            m.links
                .retain(|l, _| !matches!(l, Link::Remote(key) if &key.node == node));
            if m.links.len() != before {
                linked.push(*id);
            }
        }
        t.remote_links.retain(|k, _| &k.node != node);
        linked
    }
}
