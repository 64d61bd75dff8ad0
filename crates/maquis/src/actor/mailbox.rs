//! An actor's mailbox: a bounded queue with one receiver (the actor's [`Inbox`]) and any
//! number of senders (its refs, the registry, the readers of the network).
//!
//! # Shape
//!
//! One allocation per actor holds everything: the queue, the receiver's waker, the senders
//! waiting for room, and the fingerprint of the message type. The queue is a `VecDeque` that
//! allocates on the first message and keeps its buffer, so an idle actor costs a few hundred
//! bytes. (Tokio's bounded channel allocates a cache-padded shared state and a first block of
//! 32 slots with every channel, about 1.3 KB an actor; `flume` allocates a hook for every
//! receive that waits and cannot be closed by its receiver and then drained, which a virtual
//! actor's hand-over needs.)
//!
//! # Rules
//!
//! - At most `capacity` messages are in the mailbox: in its queue, taken by the receiver and
//!   not yet handed to the actor (see [`Receiver`]), or granted to waiting senders (below).
//! - A sender that finds no room waits in line: each message taken hands its place to the
//!   oldest waiting sender (a *grant*), and while anyone waits, newcomers queue behind them
//!   (and [`Mailbox::try_send`] reports `Full`). A waiting send dropped after its grant passes
//!   the place on to the next in line. So the waiting senders are served in order and none
//!   waits forever while the actor takes messages.
//! - Closing (the receiver's [`Receiver::close`], or its drop) refuses every later send and
//!   every waiting one, with the message given back; what is in the queue can still be taken,
//!   and [`Receiver::recv`] returns `None` once it is empty.
//! - A receive spends the task's cooperative budget (as tokio's channels do), so an actor
//!   whose mailbox never empties still lets other tasks of its worker run.
//! - Wakers are woken after the lock is released; no user code runs under it.
//!
//! The mailbox also carries the actor's exit signal ([`Mailbox::kill`], [`Exit`]): the
//! reason the runtime tells the actor's task to end with, told once.
//!
//! [`Inbox`]: crate::Inbox

use std::any::Any;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll, Waker};

use bytes::Bytes;
use futures::future::BoxFuture;

use super::Message;
use crate::id::NodeId;
use crate::wire::frame::DownReason;

/// A message that arrived from another node, still encoded.
pub(crate) struct RemoteMsg {
    pub payload: Bytes,
    pub from_node: NodeId,
    pub call: Option<u64>,
}

/// What a mailbox carries: a local value, or bytes the actor decodes itself. The remote case is
/// boxed so that a place in the queue is the size of the message type.
pub(crate) enum Delivery<M> {
    Local(M),
    Remote(Box<RemoteMsg>),
}

/// Why a message was not put in a mailbox; the message comes back.
pub(crate) enum TrySendError<T> {
    /// No room now (or senders are waiting for it).
    Full(T),
    /// The actor closed its mailbox.
    Closed(T),
}

/// An actor's mailbox: the queue and everything waiting on it (see the module doc).
pub(crate) struct Mailbox<M> {
    state: Mutex<State<M>>,
    /// Whether the exit signal was given (read without the lock by [`Exit`]).
    exiting: AtomicBool,
    capacity: usize,
    /// The fingerprint of `M` (see `fingerprint`).
    ty: u64,
}

struct State<M> {
    queue: VecDeque<Delivery<M>>,
    /// The receiver, when it waits for a message.
    receiver: Option<Waker>,
    /// Senders waiting for room, oldest first, by ticket (increasing).
    waiting: VecDeque<(u64, Waker)>,
    next_ticket: u64,
    /// Places handed to waiting senders that have not used them yet.
    granted: usize,
    /// Messages the receiver took from the queue and has not handed out yet.
    taken: usize,
    closed: bool,
    exit: ExitState,
    /// The actor's task, when its [`Exit`] waits.
    exit_waker: Option<Waker>,
}

impl<M> State<M> {
    /// Queues `d`. The first message makes room for one only: most actors hold a message or
    /// none, and an idle actor keeps what its queue grew to (the queue grows as usual after).
    fn push(&mut self, d: Delivery<M>) {
        if self.queue.capacity() == 0 {
            self.queue.reserve_exact(1);
        }
        self.queue.push_back(d);
    }
}

/// Where the exit signal is.
enum ExitState {
    /// Not given.
    Running,
    /// Given, with the reason, not yet taken by the task.
    Told(DownReason),
    /// Taken by the task, or the task's [`Exit`] is gone: no later signal is given.
    Over,
}

impl<M> State<M> {
    /// Whether the sender holding `ticket` has been granted a place: grants go oldest first,
    /// so a ticket older than every one still waiting has had one.
    fn has_grant(&self, ticket: u64) -> bool {
        self.waiting.front().is_none_or(|(t, _)| *t > ticket)
    }

    /// A free place goes to the oldest waiting sender, if any.
    fn grant(&mut self) -> Option<Waker> {
        let (_, waker) = self.waiting.pop_front()?;
        self.granted += 1;
        Some(waker)
    }

    /// The receiver gives back the places of the `handed` messages it handed out: they go to
    /// the senders waiting first, whose wakers are returned.
    fn give_back(&mut self, handed: &mut usize, capacity: usize) -> Vec<Waker> {
        self.taken -= std::mem::take(handed);
        let mut woken = Vec::new();
        while self.queue.len() + self.taken + self.granted < capacity {
            match self.grant() {
                Some(w) => woken.push(w),
                None => break,
            }
        }
        woken
    }
}

impl<M> Mailbox<M> {
    /// An empty mailbox for `capacity` messages (at least one) of the type with fingerprint
    /// `ty`, and its receiver.
    pub(crate) fn new(capacity: usize, ty: u64) -> Arc<Self> {
        Arc::new(Mailbox {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                receiver: None,
                waiting: VecDeque::new(),
                next_ticket: 0,
                granted: 0,
                taken: 0,
                closed: false,
                exit: ExitState::Running,
                exit_waker: None,
            }),
            exiting: AtomicBool::new(false),
            capacity: capacity.max(1),
            ty,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State<M>> {
        // Nothing panics under the lock; a poisoned one still holds a consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `d` in the queue if there is room now and nobody waits for it.
    pub(crate) fn try_send(&self, d: Delivery<M>) -> Result<(), TrySendError<Delivery<M>>> {
        let mut s = self.lock();
        if s.closed {
            return Err(TrySendError::Closed(d));
        }
        if !s.waiting.is_empty() || s.queue.len() + s.taken + s.granted >= self.capacity {
            return Err(TrySendError::Full(d));
        }
        s.push(d);
        let receiver = s.receiver.take();
        drop(s);
        if let Some(w) = receiver {
            w.wake();
        }
        Ok(())
    }

    /// Puts `d` in the queue, waiting in line for room; `Err` with the message if the mailbox
    /// is closed first.
    pub(crate) fn send(&self, d: Delivery<M>) -> Push<'_, M> {
        Push {
            mailbox: self,
            msg: Some(d),
            ticket: None,
        }
    }

    /// Refuses every later and every waiting send; the queue can still be taken from.
    pub(crate) fn close(&self) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        s.closed = true;
        s.granted = 0;
        let waiting = std::mem::take(&mut s.waiting);
        let receiver = s.receiver.take();
        drop(s);
        for (_, w) in waiting {
            w.wake();
        }
        if let Some(w) = receiver {
            w.wake();
        }
    }

    /// Tells the actor's task to end with `reason` (its [`Exit`] completes); false if it was
    /// told already or its task has ended.
    pub(crate) fn kill(&self, reason: DownReason) -> bool {
        let mut s = self.lock();
        if !matches!(s.exit, ExitState::Running) {
            return false;
        }
        s.exit = ExitState::Told(reason);
        self.exiting.store(true, Ordering::Release);
        let waker = s.exit_waker.take();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// The mailbox behind an erased one, if it takes `M`.
    pub(crate) fn typed(mailbox: &dyn ErasedMailbox) -> Option<&Mailbox<M>>
    where
        M: Message,
    {
        mailbox.as_any().downcast_ref::<Mailbox<M>>()
    }
}

/// [`Mailbox::send`]'s future.
pub(crate) struct Push<'a, M> {
    mailbox: &'a Mailbox<M>,
    /// The message, until it is in the queue or given back.
    msg: Option<Delivery<M>>,
    /// Its place in line, while it waits.
    ticket: Option<u64>,
}

// The message is moved in and out, never pinned.
impl<M> Unpin for Push<'_, M> {}

impl<M> Future for Push<'_, M> {
    type Output = Result<(), Delivery<M>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(msg) = this.msg.take() else {
            panic!("a mailbox send polled after it completed");
        };
        let mut s = this.mailbox.lock();
        if s.closed {
            this.ticket = None;
            return Poll::Ready(Err(msg));
        }
        let room = match this.ticket {
            Some(t) if s.has_grant(t) => {
                s.granted -= 1;
                true
            }
            Some(t) => {
                if let Ok(i) = s.waiting.binary_search_by_key(&t, |(t, _)| *t) {
                    let w = &mut s.waiting[i].1;
                    if !w.will_wake(cx.waker()) {
                        *w = cx.waker().clone();
                    }
                }
                false
            }
            None => {
                if s.waiting.is_empty()
                    && s.queue.len() + s.taken + s.granted < this.mailbox.capacity
                {
                    true
                } else {
                    let t = s.next_ticket;
                    s.next_ticket += 1;
                    s.waiting.push_back((t, cx.waker().clone()));
                    this.ticket = Some(t);
                    false
                }
            }
        };
        if !room {
            this.msg = Some(msg);
            return Poll::Pending;
        }
        this.ticket = None;
        s.push(msg);
        let receiver = s.receiver.take();
        drop(s);
        if let Some(w) = receiver {
            w.wake();
        }
        Poll::Ready(Ok(()))
    }
}

impl<M> Drop for Push<'_, M> {
    /// A send dropped while in line leaves it; one dropped with a grant it has not used passes
    /// the place on to the next in line (or frees it).
    fn drop(&mut self) {
        let Some(t) = self.ticket else { return };
        let mut s = self.mailbox.lock();
        if s.closed {
            return;
        }
        let next = if s.has_grant(t) {
            let next = s.waiting.pop_front();
            if next.is_none() {
                s.granted -= 1;
            }
            next.map(|(_, w)| w)
        } else {
            if let Ok(i) = s.waiting.binary_search_by_key(&t, |(t, _)| *t) {
                s.waiting.remove(i);
            }
            None
        };
        drop(s);
        if let Some(w) = next {
            w.wake();
        }
    }
}

/// The actor's end of its mailbox. Dropping it closes the mailbox.
///
/// It takes the whole queue at once into a buffer of its own and hands the messages out from
/// there without the lock; they still count against the capacity (`State::taken`) until they
/// are handed out, and their places are given back to the senders every eighth of the
/// capacity handed out (every message, below a capacity of 16) and whenever the receiver finds
/// its buffer empty. So a sender and the actor
/// meet at the lock about once per batch, not once per message each.
pub(crate) struct Receiver<M> {
    mailbox: Arc<Mailbox<M>>,
    /// Taken from the queue, not yet handed out.
    buffer: VecDeque<Delivery<M>>,
    /// Handed out since places were last given back.
    handed: usize,
}

impl<M> Receiver<M> {
    /// The receiving end of `mailbox` (there is one per mailbox).
    pub(crate) fn new(mailbox: Arc<Mailbox<M>>) -> Self {
        Receiver {
            mailbox,
            buffer: VecDeque::new(),
            handed: 0,
        }
    }

    /// The next message: from the buffer, else the queue taken into the buffer. `None` with
    /// `Ready` once the mailbox is closed and empty; `Pending` (with `cx`'s waker kept) or
    /// `Ready(None)` (without `cx`) when it is empty.
    fn take(&mut self, cx: Option<&mut Context<'_>>) -> Poll<Option<Delivery<M>>> {
        if let Some(d) = self.buffer.pop_front() {
            self.handed += 1;
            if self.handed >= return_every(self.mailbox.capacity) {
                let woken = {
                    let mut s = self.mailbox.lock();
                    s.give_back(&mut self.handed, self.mailbox.capacity)
                };
                woken.into_iter().for_each(Waker::wake);
            }
            return Poll::Ready(Some(d));
        }
        let capacity = self.mailbox.capacity;
        let mut s = self.mailbox.lock();
        std::mem::swap(&mut s.queue, &mut self.buffer);
        s.taken += self.buffer.len();
        let first = self.buffer.pop_front();
        if first.is_some() {
            self.handed += 1;
        }
        let woken = if first.is_none() || self.handed >= return_every(capacity) {
            s.give_back(&mut self.handed, capacity)
        } else {
            Vec::new()
        };
        let out = match first {
            Some(d) => Poll::Ready(Some(d)),
            None if s.closed => Poll::Ready(None),
            None => match cx {
                None => Poll::Ready(None),
                Some(cx) => {
                    match &mut s.receiver {
                        Some(w) if w.will_wake(cx.waker()) => {}
                        slot => *slot = Some(cx.waker().clone()),
                    }
                    Poll::Pending
                }
            },
        };
        drop(s);
        woken.into_iter().for_each(Waker::wake);
        out
    }

    /// The next message, waiting for one; `None` once the mailbox is closed and empty.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Delivery<M>>> {
        let coop = ready!(tokio::task::coop::poll_proceed(cx));
        let out = ready!(self.take(Some(cx)));
        coop.made_progress();
        Poll::Ready(out)
    }

    /// [`Receiver::poll_recv`] as a future.
    pub(crate) async fn recv(&mut self) -> Option<Delivery<M>> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next message if there is one now.
    pub(crate) fn try_recv(&mut self) -> Option<Delivery<M>> {
        match self.take(None) {
            Poll::Ready(d) => d,
            Poll::Pending => None,
        }
    }

    /// Closes the mailbox (see [`Mailbox::close`]).
    pub(crate) fn close(&mut self) {
        self.mailbox.close();
    }
}

impl<M> Drop for Receiver<M> {
    fn drop(&mut self) {
        self.mailbox.close();
    }
}

/// The actor's exit signal: completes with the reason given to [`Mailbox::kill`]. Dropping it
/// ends the signal (later kills report false).
pub(crate) struct Exit<M> {
    mailbox: Arc<Mailbox<M>>,
    /// The waker last left with the mailbox: a poll with the same one needs no lock.
    waker: Option<Waker>,
}

impl<M> Exit<M> {
    /// The exit signal of `mailbox` (there is one per mailbox).
    pub(crate) fn new(mailbox: Arc<Mailbox<M>>) -> Self {
        Exit {
            mailbox,
            waker: None,
        }
    }
}

impl<M> Future for Exit<M> {
    type Output = DownReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<DownReason> {
        let this = &mut *self;
        let told = this.mailbox.exiting.load(Ordering::Acquire);
        if !told && this.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            return Poll::Pending;
        }
        let mut s = this.mailbox.lock();
        match std::mem::replace(&mut s.exit, ExitState::Over) {
            ExitState::Told(reason) => Poll::Ready(reason),
            ExitState::Running => {
                s.exit = ExitState::Running;
                s.exit_waker = Some(cx.waker().clone());
                this.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            ExitState::Over => Poll::Pending,
        }
    }
}

impl<M> Drop for Exit<M> {
    fn drop(&mut self) {
        let mut s = self.mailbox.lock();
        s.exit = ExitState::Over;
        s.exit_waker = None;
    }
}

/// How many messages a receiver hands out between two returns of their places to the senders:
/// an eighth of the capacity, so a full mailbox lets its senders in again long before the
/// actor has worked through what it took.
fn return_every(capacity: usize) -> usize {
    (capacity / 8).max(1)
}

/// A mailbox seen without its message type (what the network reader needs).
pub(crate) trait ErasedMailbox: Send + Sync {
    /// Pushes an encoded message, waiting while the mailbox is full; `Err` if the actor stopped.
    fn push_remote(&self, msg: RemoteMsg) -> BoxFuture<'_, Result<(), RemoteMsg>>;
    /// Pushes an encoded message if there is room now; gives it back if not (full or stopped).
    fn try_push_remote(&self, msg: RemoteMsg) -> Result<(), RemoteMsg>;
    /// The fingerprint of the type the actor takes.
    fn ty(&self) -> u64;
    /// For typed local sends.
    fn as_any(&self) -> &dyn Any;
    /// For typed local sends that keep the mailbox.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
    /// See [`Mailbox::kill`].
    fn kill(&self, reason: DownReason) -> bool;
    /// See [`Mailbox::close`].
    fn close(&self);
}

/// The message of a remote delivery given back.
fn unbox<M>(d: Delivery<M>) -> RemoteMsg {
    match d {
        Delivery::Remote(m) => *m,
        Delivery::Local(_) => unreachable!("a remote delivery was pushed"),
    }
}

impl<M: Message> ErasedMailbox for Mailbox<M> {
    fn push_remote(&self, msg: RemoteMsg) -> BoxFuture<'_, Result<(), RemoteMsg>> {
        Box::pin(async move {
            self.send(Delivery::Remote(Box::new(msg)))
                .await
                .map_err(unbox)
        })
    }
    fn try_push_remote(&self, msg: RemoteMsg) -> Result<(), RemoteMsg> {
        self.try_send(Delivery::Remote(Box::new(msg)))
            .map_err(|e| match e {
                TrySendError::Full(d) | TrySendError::Closed(d) => unbox(d),
            })
    }
    fn ty(&self) -> u64 {
        self.ty
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
    fn kill(&self, reason: DownReason) -> bool {
        Mailbox::kill(self, reason)
    }
    fn close(&self) {
        Mailbox::close(self);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::FutureExt;

    use super::*;

    fn local(d: Option<Delivery<u32>>) -> Option<u32> {
        match d? {
            Delivery::Local(x) => Some(x),
            Delivery::Remote(_) => None,
        }
    }

    /// A send of `v` that has had to wait in line.
    fn waiting(m: &Mailbox<u32>, v: u32) -> Pin<Box<Push<'_, u32>>> {
        let mut push = Box::pin(m.send(Delivery::Local(v)));
        assert!((&mut push).now_or_never().is_none(), "{v} waits");
        push
    }

    fn mailbox(capacity: usize) -> (Arc<Mailbox<u32>>, Receiver<u32>) {
        let m = Mailbox::new(capacity, 7);
        (m.clone(), Receiver::new(m))
    }

    #[test]
    fn it_holds_capacity_messages_and_then_refuses_without_waiting() {
        let (m, mut rx) = mailbox(2);
        assert!(m.try_send(Delivery::Local(1)).is_ok());
        assert!(m.try_send(Delivery::Local(2)).is_ok());
        assert!(matches!(
            m.try_send(Delivery::Local(3)),
            Err(TrySendError::Full(Delivery::Local(3)))
        ));
        assert_eq!(local(rx.try_recv()), Some(1));
        assert!(m.try_send(Delivery::Local(3)).is_ok());
        assert!(matches!(
            m.try_send(Delivery::Local(4)),
            Err(TrySendError::Full(_))
        ));
        assert_eq!(local(rx.try_recv()), Some(2));
        assert_eq!(local(rx.try_recv()), Some(3));
        assert!(rx.try_recv().is_none());
    }

    /// An actor that got one message holds room for one (an idle actor's memory); more
    /// messages grow the queue as usual, in order.
    #[test]
    fn the_first_message_makes_room_for_one_and_more_grow_the_queue() {
        let (m, mut rx) = mailbox(64);
        m.try_send(Delivery::Local(1)).ok().unwrap();
        assert_eq!(m.lock().queue.capacity(), 1);
        assert_eq!(local(rx.try_recv()), Some(1));
        // The receiver took the queue's buffer: the one it holds has room for one.
        assert_eq!(rx.buffer.capacity(), 1);
        for i in 0..40 {
            m.try_send(Delivery::Local(i)).ok().unwrap();
        }
        for i in 0..40 {
            assert_eq!(local(rx.try_recv()), Some(i));
        }
    }

    #[test]
    fn places_come_back_every_eighth_of_the_capacity_and_when_the_receiver_runs_dry() {
        let (m, mut rx) = mailbox(16);
        for i in 0..16 {
            m.try_send(Delivery::Local(i)).ok().unwrap();
        }
        // The receiver took all 16; the first one's place is not back yet.
        assert_eq!(local(rx.try_recv()), Some(0));
        assert!(matches!(
            m.try_send(Delivery::Local(99)),
            Err(TrySendError::Full(_))
        ));
        // The second is: two places.
        assert_eq!(local(rx.try_recv()), Some(1));
        assert!(m.try_send(Delivery::Local(16)).is_ok());
        assert!(m.try_send(Delivery::Local(17)).is_ok());
        assert!(matches!(
            m.try_send(Delivery::Local(99)),
            Err(TrySendError::Full(_))
        ));
        for i in 2..18 {
            assert_eq!(local(rx.try_recv()), Some(i));
        }
        // Empty: every place is back.
        assert!(rx.try_recv().is_none());
        for i in 0..16 {
            assert!(m.try_send(Delivery::Local(i)).is_ok(), "{i}");
        }
    }

    #[test]
    fn an_idle_mailbox_has_allocated_no_queue() {
        let (m, _rx) = mailbox(1024);
        assert_eq!(m.lock().queue.capacity(), 0);
        assert_eq!(m.lock().waiting.capacity(), 0);
    }

    #[tokio::test]
    async fn waiting_senders_are_served_in_order_and_newcomers_queue_behind_them() {
        let (m, mut rx) = mailbox(1);
        m.try_send(Delivery::Local(0)).ok().unwrap();
        let mut a = waiting(&m, 1);
        let mut b = waiting(&m, 2);
        // A place is freed: it is a's, not a newcomer's.
        assert_eq!(local(rx.try_recv()), Some(0));
        assert!(matches!(
            m.try_send(Delivery::Local(9)),
            Err(TrySendError::Full(_))
        ));
        let mut c = waiting(&m, 3);
        assert!((&mut b).now_or_never().is_none(), "b waits behind a");
        assert!(matches!((&mut a).now_or_never(), Some(Ok(()))));
        assert_eq!(local(rx.try_recv()), Some(1));
        assert!(matches!((&mut b).now_or_never(), Some(Ok(()))));
        assert_eq!(local(rx.try_recv()), Some(2));
        assert!(matches!((&mut c).now_or_never(), Some(Ok(()))));
        assert_eq!(local(rx.try_recv()), Some(3));
    }

    #[tokio::test]
    async fn a_waiting_send_dropped_after_its_grant_passes_the_place_on() {
        let (m, mut rx) = mailbox(1);
        m.try_send(Delivery::Local(0)).ok().unwrap();
        let a = waiting(&m, 1);
        let mut b = waiting(&m, 2);
        assert_eq!(local(rx.try_recv()), Some(0));
        drop(a);
        assert!(matches!((&mut b).now_or_never(), Some(Ok(()))));
        assert_eq!(local(rx.try_recv()), Some(2));
        // The last in line dropped with a grant frees the place.
        m.try_send(Delivery::Local(0)).ok().unwrap();
        let c = waiting(&m, 3);
        assert_eq!(local(rx.try_recv()), Some(0));
        drop(c);
        assert!(m.try_send(Delivery::Local(4)).is_ok());
        // A send dropped while still in line just leaves it.
        let d = waiting(&m, 5);
        drop(d);
        assert_eq!(local(rx.try_recv()), Some(4));
        assert!(m.try_send(Delivery::Local(6)).is_ok());
    }

    #[tokio::test]
    async fn closing_refuses_new_and_waiting_sends_and_leaves_the_queue_to_drain() {
        let (m, mut rx) = mailbox(1);
        m.try_send(Delivery::Local(1)).ok().unwrap();
        let mut a = waiting(&m, 2);
        rx.close();
        assert!(matches!(
            (&mut a).now_or_never(),
            Some(Err(Delivery::Local(2)))
        ));
        assert!(matches!(
            m.try_send(Delivery::Local(3)),
            Err(TrySendError::Closed(Delivery::Local(3)))
        ));
        assert_eq!(local(rx.recv().await), Some(1));
        assert!(rx.recv().await.is_none());
        let (m, rx) = mailbox(4);
        drop(rx);
        assert!(matches!(
            m.send(Delivery::Local(1)).await,
            Err(Delivery::Local(1))
        ));
    }

    #[tokio::test]
    async fn the_exit_signal_is_given_once_and_not_after_the_task_let_it_go() {
        let (m, _rx) = mailbox(1);
        let mut exit = Exit::new(m.clone());
        assert!((&mut exit).now_or_never().is_none());
        let waiting = tokio::spawn(exit);
        tokio::task::yield_now().await;
        assert!(m.kill(DownReason::Shutdown));
        assert!(!m.kill(DownReason::Stopped), "told once");
        let woken = tokio::time::timeout(std::time::Duration::from_secs(10), waiting).await;
        assert_eq!(
            woken.expect("kill wakes the task").unwrap(),
            DownReason::Shutdown
        );
        let (m, _rx) = mailbox(1);
        drop(Exit::new(m.clone()));
        assert!(!m.kill(DownReason::Shutdown), "nobody listens");
    }

    #[tokio::test]
    async fn a_receiver_waits_for_a_message_from_another_task() {
        let (m, mut rx) = mailbox(1);
        let sender = tokio::spawn(async move {
            for i in 0..1000 {
                m.send(Delivery::Local(i)).await.ok().unwrap();
            }
        });
        for i in 0..1000 {
            assert_eq!(local(rx.recv().await), Some(i));
        }
        sender.await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_receiver_that_always_finds_a_message_still_lets_other_tasks_run() {
        let (m, mut rx) = mailbox(10_000);
        for i in 0..10_000 {
            m.try_send(Delivery::Local(i)).ok().unwrap();
        }
        let taken = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let seen = {
            let taken = taken.clone();
            tokio::spawn(async move { taken.load(std::sync::atomic::Ordering::Relaxed) })
        };
        for n in 1..=10_000 {
            assert!(rx.recv().await.is_some());
            taken.store(n, std::sync::atomic::Ordering::Relaxed);
        }
        let at = seen.await.unwrap();
        assert!(
            at < 10_000,
            "the other task ran only after the mailbox was empty"
        );
    }
}
