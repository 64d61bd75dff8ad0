//! The table of local actors: mailboxes by id, names, and who watches whom.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use super::{ActorId, Message};
use crate::error::RegisterError;
use crate::id::NodeId;
use crate::wire::frame::DownReason;

/// A message that arrived from another node, still encoded.
pub(crate) struct RemoteMsg {
    pub payload: Bytes,
    pub from_node: NodeId,
    pub call: Option<u64>,
}

/// What a mailbox carries: a local value, or bytes the actor decodes itself.
pub(crate) enum Delivery<M> {
    Local(M),
    Remote(RemoteMsg),
}

/// An actor's mailbox: its sending end and the fingerprint of the type it takes.
pub(crate) struct Mailbox<M> {
    /// Where messages go.
    pub(crate) tx: mpsc::Sender<Delivery<M>>,
    /// The fingerprint of `M` (see `fingerprint`).
    pub(crate) ty: u64,
}

/// A mailbox seen without its message type (what the network reader needs).
pub(crate) trait ErasedMailbox: Send + Sync {
    /// Pushes an encoded message, waiting while the mailbox is full; `Err` if the actor stopped.
    fn push_remote(&self, msg: RemoteMsg) -> BoxFuture<'_, Result<(), ()>>;
    /// The fingerprint of the type the actor takes.
    fn ty(&self) -> u64;
    /// For typed local sends.
    fn as_any(&self) -> &dyn Any;
}

impl<M: Message> ErasedMailbox for Mailbox<M> {
    fn push_remote(&self, msg: RemoteMsg) -> BoxFuture<'_, Result<(), ()>> {
        Box::pin(async move { self.tx.send(Delivery::Remote(msg)).await.map_err(|_| ()) })
    }
    fn ty(&self) -> u64 {
        self.ty
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

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

struct Entry {
    mailbox: std::sync::Arc<dyn ErasedMailbox>,
    names: Vec<String>,
    watchers: Vec<Watcher>,
}

#[derive(Default)]
struct Tables {
    actors: HashMap<ActorId, Entry>,
    names: HashMap<String, ActorId>,
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

    pub(crate) fn insert(&self, id: ActorId, mailbox: std::sync::Arc<dyn ErasedMailbox>) {
        self.lock().actors.insert(
            id,
            Entry {
                mailbox,
                names: Vec::new(),
                watchers: Vec::new(),
            },
        );
    }

    /// Removes an actor and returns who watched it.
    pub(crate) fn remove(&self, id: ActorId) -> Vec<Watcher> {
        let mut t = self.lock();
        let Some(entry) = t.actors.remove(&id) else {
            return Vec::new();
        };
        for n in &entry.names {
            t.names.remove(n);
        }
        entry.watchers
    }

    /// Removes every actor (node shutdown): their mailboxes close and they stop.
    pub(crate) fn clear(&self) -> Vec<(ActorId, Vec<Watcher>)> {
        let mut t = self.lock();
        t.names.clear();
        t.actors.drain().map(|(id, e)| (id, e.watchers)).collect()
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
        entry.names.push(name.to_string());
        t.names.insert(name.to_string(), id);
        Ok(())
    }

    pub(crate) fn unregister(&self, name: &str) -> bool {
        let mut t = self.lock();
        let Some(id) = t.names.remove(name) else {
            return false;
        };
        if let Some(e) = t.actors.get_mut(&id) {
            e.names.retain(|n| n != name);
        }
        true
    }

    pub(crate) fn names(&self) -> usize {
        self.lock().names.len()
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().actors.len()
    }

    /// Adds a watcher; gives it back if the actor does not exist.
    pub(crate) fn watch(&self, id: ActorId, w: Watcher) -> Result<(), Watcher> {
        match self.lock().actors.get_mut(&id) {
            Some(e) => {
                e.watchers.push(w);
                Ok(())
            }
            None => Err(w),
        }
    }

    pub(crate) fn unwatch(&self, id: ActorId, watch: u64) {
        if let Some(e) = self.lock().actors.get_mut(&id) {
            e.watchers.retain(|w| match w {
                Watcher::Local { watch: x, .. } | Watcher::Remote { watch: x, .. } => *x != watch,
            });
        }
    }

    /// Watchers that live on other nodes.
    pub(crate) fn remote_watchers(&self) -> usize {
        let t = self.lock();
        t.actors
            .values()
            .map(|e| {
                e.watchers
                    .iter()
                    .filter(|w| matches!(w, Watcher::Remote { .. }))
                    .count()
            })
            .sum()
    }

    /// Forgets the watchers that live on a node that went away.
    pub(crate) fn forget_node(&self, node: &NodeId) {
        for e in self.lock().actors.values_mut() {
            e.watchers
                .retain(|w| !matches!(w, Watcher::Remote { node: n, .. } if n == node));
        }
    }
}
