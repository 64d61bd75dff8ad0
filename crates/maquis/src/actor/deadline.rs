//! Calls' deadlines: one table per node, swept by one task, instead of a tokio timer per call.
//!
//! A timer in tokio's wheel is registered when its call first waits and removed when the call
//! ends; for a local call that was a fifth of its CPU. Here a call that waits takes a slot in
//! the node's table (one short lock on its thread's shard) and gives it back when it ends
//! (another); one sweeper task sleeps until the earliest deadline and wakes the calls whose
//! deadline passed.
//!
//! Calls with the same timeout reach their deadlines in the order they start, so each distinct
//! timeout keeps a queue in that order and the sweeper looks only at the queues' fronts. A call
//! that ends leaves its entry behind (a slot's generation tells it from a newer call in the
//! same slot); entries that ended are dropped when they reach the front, and a queue is
//! compacted once it holds more than twice its waiting calls plus [`SLACK`].
//!
//! Bounds and what happens beyond them: the slots are the calls waiting at once (each call
//! holds one while it waits); at most [`MAX_TIMEOUTS`] distinct timeouts have queues in a
//! shard, and a
//! call with another timeout once they are taken waits on a tokio timer of its own, as it does
//! when the sweeper is gone (its runtime shut down). A deadline passes no earlier than asked;
//! the sweeper wakes its call as soon as it runs after it (two calls whose deadlines were
//! computed in one order and queued in the other can delay the earlier one by that gap).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// Distinct timeouts with a queue of their own, per shard.
const MAX_TIMEOUTS: usize = 16;
/// Ended entries a queue may hold beyond twice its waiting calls before it is compacted.
const SLACK: usize = 64;
/// Tables a node's calls are spread over, one per thread (threads share them round robin): a
/// call takes and gives back its slot on its thread's shard, so calls on two workers rarely
/// meet on a lock.
const SHARDS: usize = 8;
/// [`Deadlines::sweep_at`] while the sweeper waits to be told.
const IDLE: u64 = u64::MAX;
/// [`Deadlines::sweep_at`] while the sweeper looks at the shards: a call that registers then
/// tells it to look again.
const SWEEPING: u64 = 0;

/// A node's table of waiting calls' deadlines.
pub(crate) struct Deadlines {
    shards: Box<[Shard]>,
    /// When the sweeper looks next, in nanoseconds after `base` ([`IDLE`], [`SWEEPING`]).
    sweep_at: AtomicU64,
    base: Instant,
    /// Tells the sweeper of a deadline earlier than the one it sleeps until, or that the
    /// table is gone.
    sweeper: Arc<Notify>,
}

/// One shard, on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<Table>);

#[derive(Default)]
struct Table {
    slots: Vec<Slot>,
    free: Vec<u32>,
    queues: Vec<Queue>,
    /// The sweeper ended (its runtime shut down): calls use their own timers.
    orphaned: bool,
}

#[derive(Default)]
struct Slot {
    gen: u32,
    state: SlotState,
}

#[derive(Default)]
enum SlotState {
    #[default]
    Free,
    Waiting(Waker),
    Passed,
}

struct Queue {
    timeout: Duration,
    /// Entries whose call still waits.
    waiting: usize,
    entries: VecDeque<Entry>,
}

#[derive(Clone, Copy)]
struct Entry {
    at: Instant,
    slot: u32,
    gen: u32,
}

/// A waiting call's place in the table.
#[derive(Clone, Copy, Debug)]
struct Key {
    shard: u8,
    queue: u8,
    slot: u32,
    gen: u32,
}

/// This thread's shard.
fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, SeqCst) % SHARDS;
    }
    SHARD.with(|s| *s)
}

impl Table {
    fn waiting(&self, e: &Entry) -> bool {
        let s = &self.slots[e.slot as usize];
        s.gen == e.gen && matches!(s.state, SlotState::Waiting(_))
    }

    /// Drops the ended entries at the front of queue `q`.
    fn trim(&mut self, q: usize) {
        while let Some(e) = self.queues[q].entries.front() {
            if self.waiting(e) {
                break;
            }
            self.queues[q].entries.pop_front();
        }
    }

    /// Takes a slot for a call waiting until `at`: its queue and slot, or `None` when it must
    /// use a timer of its own.
    fn register(
        &mut self,
        timeout: Duration,
        at: Instant,
        waker: &Waker,
    ) -> Option<(u8, u32, u32)> {
        if self.orphaned {
            return None;
        }
        let q = match self.queues.iter().position(|q| q.timeout == timeout) {
            Some(q) => q,
            None if self.queues.len() < MAX_TIMEOUTS => {
                self.queues.push(Queue {
                    timeout,
                    waiting: 0,
                    entries: VecDeque::new(),
                });
                self.queues.len() - 1
            }
            None => return None,
        };
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[slot as usize];
        s.state = SlotState::Waiting(waker.clone());
        let gen = s.gen;
        let queue = &mut self.queues[q];
        queue.entries.push_back(Entry { at, slot, gen });
        queue.waiting += 1;
        Some((q as u8, slot, gen))
    }

    /// Gives back a slot (see [`Deadlines::release`]).
    fn release(&mut self, key: Key) {
        let s = &mut self.slots[key.slot as usize];
        if s.gen != key.gen {
            return;
        }
        let was_waiting = matches!(s.state, SlotState::Waiting(_));
        s.state = SlotState::Free;
        s.gen = s.gen.wrapping_add(1);
        self.free.push(key.slot);
        if !was_waiting {
            // Past its deadline: the sweeper took its entry out.
            return;
        }
        let q = key.queue as usize;
        self.queues[q].waiting -= 1;
        self.trim(q);
        if self.queues[q].entries.len() > 2 * self.queues[q].waiting + SLACK {
            let mut entries = std::mem::take(&mut self.queues[q].entries);
            entries.retain(|e| self.waiting(e));
            self.queues[q].entries = entries;
        }
    }

    /// Marks the calls whose deadline is `now` or earlier as past it (their wakers into
    /// `woken`); the earliest deadline still ahead.
    fn sweep(&mut self, now: Instant, woken: &mut Vec<Waker>) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for q in 0..self.queues.len() {
            while let Some(&e) = self.queues[q].entries.front() {
                if e.at > now {
                    break;
                }
                self.queues[q].entries.pop_front();
                if self.waiting(&e) {
                    let s = &mut self.slots[e.slot as usize];
                    if let SlotState::Waiting(w) =
                        std::mem::replace(&mut s.state, SlotState::Passed)
                    {
                        woken.push(w);
                    }
                    self.queues[q].waiting -= 1;
                }
            }
            self.trim(q);
            if let Some(e) = self.queues[q].entries.front() {
                next = Some(next.map_or(e.at, |n| n.min(e.at)));
            }
        }
        next
    }
}

impl Deadlines {
    /// An empty table and its sweeper, a task on the current runtime that ends when the
    /// table is dropped.
    pub(crate) fn start() -> Arc<Deadlines> {
        let sweeper = Arc::new(Notify::new());
        let table = Arc::new(Deadlines {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            sweep_at: AtomicU64::new(IDLE),
            base: Instant::now(),
            sweeper: sweeper.clone(),
        });
        // The guard is an argument, so a task dropped before its first poll drops it too.
        tokio::spawn(sweep(SweeperGuard(Arc::downgrade(&table)), sweeper));
        table
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Table> {
        self.shards[shard]
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// `at` in nanoseconds after `base`, never [`SWEEPING`] nor [`IDLE`].
    fn nanos(&self, at: Instant) -> u64 {
        let n = at.saturating_duration_since(self.base).as_nanos();
        n.clamp(1, u128::from(IDLE - 1)) as u64
    }

    /// `fut` for at most `timeout` from now: `None` once that passed.
    pub(crate) fn until<F: Future>(&self, timeout: Duration, fut: F) -> Until<'_, F> {
        Until {
            fut,
            wait: Wait {
                table: self,
                timeout,
                at: Instant::now() + timeout,
                state: WaitState::New,
            },
        }
    }

    /// Takes a slot for a call waiting until `at`; `None` when it must use a timer of its own.
    fn register(&self, timeout: Duration, at: Instant, waker: &Waker) -> Option<Key> {
        let shard = shard_index();
        let (queue, slot, gen) = self.lock(shard).register(timeout, at, waker)?;
        // The sweeper sleeps until an earlier time than this deadline (the usual case), or
        // must be told.
        let n = self.nanos(at);
        let sweep_at = self.sweep_at.load(SeqCst);
        if sweep_at == SWEEPING || n < sweep_at {
            let before = self.sweep_at.fetch_min(n, SeqCst);
            if before == SWEEPING || n < before {
                self.sweeper.notify_one();
            }
        }
        Some(Key {
            shard: shard as u8,
            queue,
            slot,
            gen,
        })
    }

    /// Whether the deadline of `key` passed; if not, the call is woken by `cx` when it does.
    fn poll(&self, key: Key, cx: &mut Context<'_>) -> Poll<()> {
        let mut t = self.lock(key.shard as usize);
        let s = &mut t.slots[key.slot as usize];
        match &mut s.state {
            SlotState::Waiting(w) if s.gen == key.gen => {
                if !w.will_wake(cx.waker()) {
                    *w = cx.waker().clone();
                }
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }

    /// Gives back the slot of a call that ended (answered, failed, or past its deadline).
    fn release(&self, key: Key) {
        self.lock(key.shard as usize).release(key);
    }

    /// Wakes the calls whose deadline passed; when to look next.
    fn sweep_now(&self, woken: &mut Vec<Waker>) -> Option<Instant> {
        self.sweep_at.store(SWEEPING, SeqCst);
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        for shard in 0..SHARDS {
            if let Some(at) = self.lock(shard).sweep(now, woken) {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        // A call that registered while the shards were read saw `SWEEPING` and told the
        // sweeper: it looks again at once.
        self.sweep_at
            .store(next.map_or(IDLE, |at| self.nanos(at)), SeqCst);
        next
    }

    /// The sweeper ended: every call waiting in the table is woken to wait on a timer of its
    /// own, and later calls take one.
    fn orphan(&self) {
        let mut woken = Vec::new();
        for shard in 0..SHARDS {
            let mut t = self.lock(shard);
            t.orphaned = true;
            for s in t.slots.iter_mut() {
                if let SlotState::Waiting(w) = &s.state {
                    woken.push(w.clone());
                    s.state = SlotState::Passed;
                }
            }
            for q in &mut t.queues {
                q.entries.clear();
                q.waiting = 0;
            }
        }
        woken.into_iter().for_each(Waker::wake);
    }

    /// Calls waiting in the table, and queue entries (theirs and ended ones not yet dropped).
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize) {
        (0..SHARDS).fold((0, 0), |(w, e), shard| {
            let t = self.lock(shard);
            let waiting = t
                .slots
                .iter()
                .filter(|s| matches!(s.state, SlotState::Waiting(_)));
            (
                w + waiting.count(),
                e + t.queues.iter().map(|q| q.entries.len()).sum::<usize>(),
            )
        })
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        self.sweeper.notify_one();
    }
}

/// Ends with the table: marks it orphaned if the task is dropped while the table lives (its
/// runtime shut down).
struct SweeperGuard(Weak<Deadlines>);

impl Drop for SweeperGuard {
    fn drop(&mut self) {
        if let Some(d) = self.0.upgrade() {
            d.orphan();
        }
    }
}

async fn sweep(guard: SweeperGuard, told: Arc<Notify>) {
    let mut woken = Vec::new();
    loop {
        let next = match guard.0.upgrade() {
            Some(d) => d.sweep_now(&mut woken),
            None => return,
        };
        woken.drain(..).for_each(Waker::wake);
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = told.notified() => {}
                }
            }
            None => told.notified().await,
        }
    }
}

pin_project_lite::pin_project! {
    /// A future under a deadline ([`Deadlines::until`]): its output, or `None` once the
    /// deadline passed.
    pub(crate) struct Until<'a, F> {
        #[pin]
        fut: F,
        wait: Wait<'a>,
    }
}

impl<F: Future> Future for Until<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(v) = this.fut.poll(cx) {
            return Poll::Ready(Some(v));
        }
        this.wait.poll(cx).map(|()| None)
    }
}

struct Wait<'a> {
    table: &'a Deadlines,
    timeout: Duration,
    at: Instant,
    state: WaitState,
}

enum WaitState {
    /// Not waited yet: most calls that end at their first poll never take a slot.
    New,
    Table(Key),
    /// The table could not take it.
    Timer(Pin<Box<Sleep>>),
}

impl Wait<'_> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match &mut self.state {
                WaitState::New => match self.table.register(self.timeout, self.at, cx.waker()) {
                    Some(key) => {
                        self.state = WaitState::Table(key);
                        return Poll::Pending;
                    }
                    None => {
                        self.state = WaitState::Timer(Box::pin(tokio::time::sleep_until(self.at)))
                    }
                },
                WaitState::Table(key) => {
                    let key = *key;
                    if self.table.poll(key, cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.table.release(key);
                    // Past its deadline, or the sweeper is gone: which one, the clock says.
                    if Instant::now() >= self.at {
                        self.state = WaitState::New;
                        return Poll::Ready(());
                    }
                    self.state = WaitState::Timer(Box::pin(tokio::time::sleep_until(self.at)));
                }
                WaitState::Timer(sleep) => return sleep.as_mut().poll(cx),
            }
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if let WaitState::Table(key) = self.state {
            self.table.release(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn a_deadline_passes_at_its_time_not_before() {
        let d = Deadlines::start();
        let at = Instant::now() + T;
        let mut call = Box::pin(d.until(T, std::future::pending::<()>()));
        assert!(futures::poll!(call.as_mut()).is_pending());
        tokio::time::sleep_until(at - Duration::from_millis(1)).await;
        assert!(futures::poll!(call.as_mut()).is_pending());
        assert_eq!(call.await, None);
        assert!(Instant::now() >= at);
        assert_eq!(d.sizes(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_ends_first_gives_its_output_and_its_slot_back() {
        let d = Deadlines::start();
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let mut call = Box::pin(d.until(T, rx));
        assert!(futures::poll!(call.as_mut()).is_pending());
        assert_eq!(d.sizes(), (1, 1));
        tx.send(7).unwrap();
        assert_eq!(call.await, Some(Ok(7)));
        assert_eq!(d.sizes(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_timeout_after_a_longer_one_passes_first() {
        let d = Deadlines::start();
        let now = Instant::now();
        let long = d.until(T, std::future::pending::<()>());
        let short_t = Duration::from_millis(5);
        let short = d.until(short_t, std::future::pending::<()>());
        let mut long = Box::pin(long);
        assert!(futures::poll!(long.as_mut()).is_pending());
        assert_eq!(short.await, None);
        assert_eq!(Instant::now(), now + short_t);
        assert!(futures::poll!(long.as_mut()).is_pending());
    }

    #[tokio::test(start_paused = true)]
    async fn calls_that_end_behind_a_waiting_one_leave_a_bounded_queue() {
        let d = Deadlines::start();
        let mut first = Box::pin(d.until(T, std::future::pending::<()>()));
        assert!(futures::poll!(first.as_mut()).is_pending());
        for _ in 0..10_000 {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let mut call = Box::pin(d.until(T, rx));
            assert!(futures::poll!(call.as_mut()).is_pending());
            tx.send(()).unwrap();
            assert_eq!(call.await, Some(Ok(())));
            let (waiting, entries) = d.sizes();
            assert_eq!(waiting, 1);
            assert!(
                entries <= 2 + SLACK + 1,
                "{entries} entries for one waiting call"
            );
        }
        assert_eq!(first.await, None);
        assert_eq!(d.sizes(), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_beyond_the_queues_use_timers_of_their_own() {
        let d = Deadlines::start();
        let now = Instant::now();
        let mut calls: Vec<_> = (1..=MAX_TIMEOUTS as u64 + 4)
            .map(|ms| {
                let t = Duration::from_millis(ms);
                Box::pin(d.until(t, std::future::pending::<()>()))
            })
            .collect();
        for c in &mut calls {
            assert!(futures::poll!(c.as_mut()).is_pending());
        }
        // All on this thread's shard.
        assert_eq!(d.sizes().0, MAX_TIMEOUTS);
        for (i, c) in calls.into_iter().enumerate() {
            assert_eq!(c.await, None);
            assert_eq!(Instant::now(), now + Duration::from_millis(i as u64 + 1));
        }
    }

    #[test]
    fn calls_waiting_when_the_sweeper_stops_still_time_out() {
        let paused = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        let rt = paused();
        let (d, at) = rt.block_on(async { (Deadlines::start(), Instant::now() + T) });
        let mut before = Box::pin(d.until(T, std::future::pending::<()>()));
        rt.block_on(async {
            assert!(futures::poll!(before.as_mut()).is_pending());
        });
        assert_eq!(d.sizes(), (1, 1));
        // The runtime ends, and its sweeper with it.
        drop(rt);
        assert_eq!(d.sizes(), (0, 0));
        paused().block_on(async {
            let after = d.until(T, std::future::pending::<()>());
            assert_eq!(before.await, None);
            assert!(Instant::now() >= at);
            assert_eq!(after.await, None);
        });
    }
}
