//! Broadcast subscriptions: per topic, the local subscribers and their bounded queues.
//!
//! Delivery never waits: a subscriber's queue holds `broadcast.subscription_capacity` messages, and
//! when it is full the oldest message is dropped to make room (counted in [`Subscription::dropped`]
//! and the node's `subscription_drops` counter). A slow subscriber loses old messages; it never
//! slows broadcast down for the node or the cluster.

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use tokio::sync::Notify;

use super::inner::Inner;
use crate::actor::{compatible, fingerprint, Actors, Message};
use crate::broadcast::Topic;
use crate::throttle::Throttle;

/// One subscriber's queue.
pub(crate) struct SubQueue {
    items: Mutex<VecDeque<Bytes>>,
    capacity: usize,
    dropped: AtomicU64,
    closed: AtomicBool,
    ready: Notify,
}

impl SubQueue {
    fn new(capacity: usize) -> Self {
        SubQueue {
            items: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            ready: Notify::new(),
        }
    }

    /// Appends a message, dropping the oldest when full; returns whether one was dropped.
    fn push(&self, payload: Bytes) -> bool {
        let evicted = {
            let mut q = self.items.lock().unwrap_or_else(|e| e.into_inner());
            let evicted = if q.len() >= self.capacity {
                q.pop_front().is_some()
            } else {
                false
            };
            q.push_back(payload);
            evicted
        };
        if evicted {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.ready.notify_one();
        evicted
    }

    fn pop(&self) -> Option<Bytes> {
        self.items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.ready.notify_one();
    }
}

/// The local subscribers of every topic.
#[derive(Default)]
pub(crate) struct Topics {
    subs: Mutex<HashMap<Topic, Vec<Arc<SubQueue>>>>,
}

impl Topics {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Topic, Vec<Arc<SubQueue>>>> {
        self.subs.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn add(&self, topic: Topic, capacity: usize) -> Arc<SubQueue> {
        let q = Arc::new(SubQueue::new(capacity));
        self.lock().entry(topic).or_default().push(q.clone());
        q
    }

    fn remove(&self, topic: &Topic, q: &Arc<SubQueue>) {
        let mut subs = self.lock();
        if let Some(list) = subs.get_mut(topic) {
            list.retain(|x| !Arc::ptr_eq(x, q));
            if list.is_empty() {
                subs.remove(topic);
            }
        }
    }

    /// Hands a broadcast to every subscriber of its topic; returns how many old messages were
    /// dropped to make room.
    pub(crate) fn deliver(&self, topic: &Topic, payload: &Bytes) -> u64 {
        let subs: Vec<Arc<SubQueue>> = match self.lock().get(topic) {
            Some(list) => list.clone(),
            None => return 0,
        };
        subs.iter()
            .map(|q| u64::from(q.push(payload.clone())))
            .sum()
    }

    /// Ends every subscription (the node stopped).
    pub(crate) fn close_all(&self) {
        for list in self.lock().drain().map(|(_, l)| l) {
            for q in list {
                q.close();
            }
        }
    }
}

/// A subscription to one broadcast topic, made by [`crate::Node::subscribe_topic`]: yields the
/// messages broadcast on the topic from then on, by any member (this node included), each once.
///
/// It buffers up to `broadcast.subscription_capacity` messages. When a message arrives and the
/// buffer is full, the oldest buffered message is dropped and counted ([`Subscription::dropped`]),
/// so a slow subscriber never holds broadcast up. Dropping the subscription unsubscribes.
pub struct Subscription<M> {
    pub(crate) topic: Topic,
    pub(crate) queue: Arc<SubQueue>,
    pub(crate) node: Weak<Inner>,
    /// The node's actors, which refs in a message bind to.
    pub(crate) actors: Weak<Actors>,
    pub(crate) _m: PhantomData<fn() -> M>,
}

impl<M> std::fmt::Debug for Subscription<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Subscription({})", self.topic)
    }
}

impl<M: Message> Subscription<M> {
    /// The topic.
    pub fn topic(&self) -> &Topic {
        &self.topic
    }

    /// The next message; `None` once the node has stopped. A payload that does not decode as
    /// `M` is skipped (counted in the node's `decode_errors`).
    pub async fn recv(&mut self) -> Option<M> {
        let queue = self.queue.clone();
        loop {
            let ready = queue.ready.notified();
            if let Some(m) = self.try_recv() {
                return Some(m);
            }
            if queue.closed.load(Ordering::Acquire) || self.node.strong_count() == 0 {
                return None;
            }
            ready.await;
        }
    }

    /// The next message if one is buffered, without waiting.
    pub fn try_recv(&mut self) -> Option<M> {
        while let Some(bytes) = self.queue.pop() {
            // The sender's type fingerprint, then the message.
            let sent = bytes
                .get(..8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_le_bytes);
            match sent {
                Some(ty) if compatible(ty, fingerprint::<M>()) => {}
                _ => {
                    static WARN: Throttle = Throttle::new(std::time::Duration::from_secs(1));
                    if let Some(actors) = self.actors.upgrade() {
                        actors.router.counters.type_mismatch.inc();
                    }
                    if let Some(held) = WARN.allow() {
                        tracing::warn!(topic = %self.topic, more_since_last = held, "broadcast of another type than the subscription takes; skipped");
                    }
                    continue;
                }
            }
            let bytes = bytes.slice(8..);
            match crate::actor::decode_frame_in::<M>(&self.actors, &bytes) {
                Ok(m) => return Some(m),
                Err(e) => {
                    if let Some(actors) = self.actors.upgrade() {
                        actors.router.counters.decode_errors.inc();
                    }
                    tracing::warn!(topic = %self.topic, error = %e, "broadcast does not decode; skipped");
                }
            }
        }
        None
    }

    /// Messages buffered and not received yet.
    pub fn len(&self) -> usize {
        self.queue
            .items
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether no message is buffered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Messages dropped because the buffer was full (the oldest go first).
    pub fn dropped(&self) -> u64 {
        self.queue.dropped.load(Ordering::Relaxed)
    }
}

impl<M> Drop for Subscription<M> {
    fn drop(&mut self) {
        if let Some(inner) = self.node.upgrade() {
            inner.topics.remove(&self.topic, &self.queue);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts() {
        let topics = Topics::default();
        let t = Topic::from("t");
        let q = topics.add(t.clone(), 2);
        let mut dropped = 0;
        for i in 0..5u8 {
            dropped += topics.deliver(&t, &Bytes::from(vec![i]));
        }
        assert_eq!(dropped, 3);
        assert_eq!(q.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(q.pop(), Some(Bytes::from(vec![3])));
        assert_eq!(q.pop(), Some(Bytes::from(vec![4])));
        assert_eq!(q.pop(), None);
        assert_eq!(topics.deliver(&Topic::from("other"), &Bytes::new()), 0);
        topics.remove(&t, &q);
        assert_eq!(topics.deliver(&t, &Bytes::new()), 0);
        assert!(q.pop().is_none(), "unsubscribed");
    }
}
