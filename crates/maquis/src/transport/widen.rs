//! How many lanes of a channel carry its small frames.
//!
//! With striping on, a channel of several lanes starts with its small frames on one lane, its
//! first: batched as on a single connection, they cost the least CPU. One TCP connection
//! carries at most a window per round trip, though (the send buffer's 4 MiB by Linux's default
//! `tcp_wmem`: about 200 MB/s at 20 ms), and a stream of small messages over a long link
//! reaches that long before the CPU is busy. So the channel *widens*: the writer of its first
//! lane measures how long its writes and those of the other lanes carrying small frames wait
//! for the socket to take bytes (the window is full; a busy CPU does not make writes wait), and
//! when that is most of the time it doubles the lanes that carry small frames, each order key
//! then on lane `key mod width`. When they have not waited for a while it halves them again,
//! and undoes a halving at once when the fewer lanes' writes wait ([`Policy`], no I/O and no
//! clock of its own).
//!
//! The same policy, a second instance, sets how many of the channel's other lanes carry the
//! pieces of its striped frames (its *spread*, [`Widen::spread`]): every lane a striped
//! frame's bytes spread over costs CPU (its socket's buffers and acknowledgements, its
//! writer's and reader's wake-ups; a 512 KiB echo at 1 ms cost ~365 µs a request over two
//! lanes, ~470 µs over sixteen), and it pays only while a lane's window is what holds the
//! bytes up. The spread starts at one lane per [`SPREAD_RTT_US`] of the round trip the
//! channel's first connection measured when it was set up, and doubles on trial as the width
//! does. Pieces may go on any lane (their frame's commit keeps its place in the order), so a
//! change of spread needs no barrier.
//!
//! A key that moves to another lane must not overtake its frames still on the old one. A
//! change of width is therefore a barrier ([`Widen::switch`]): under a lock that sends take
//! shared, a [`Header::Barrier`] with a new epoch is queued on each lane of the old and the new
//! width, and the width changes; a send that picked its lane by the old width and queues after
//! it picks again. On each lane the barrier goes after every frame queued before it (the lane's
//! schedule lets nothing pass it either way), and the receiver hands on nothing behind a
//! barrier before every lane of it has arrived ([`BarriersIn`], the table in
//! [`maquis_proto::wire::barriers`]). A barrier is given up and counted only when a lane yet to
//! arrive stopped reading for the heartbeat timeout, or changed or lost a connection (which may
//! have taken the barrier with it): a lane that is merely behind, reading on, is waited for
//! (`AtBarrier` in `conn.rs`).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use maquis_proto::wire::{encode_head, Arrival, Barriers, Body, Header, WireError};
use tokio::sync::Notify;

use super::lane::Lane;
use super::stripe::Role;
use crate::error::SendError;

/// How often the widths are looked at.
const PERIOD: Duration = Duration::from_millis(100);
/// Writes waiting this share of the time (averaged over the lanes carrying small frames)
/// double the width, on trial.
const WIDEN_AT: f64 = 0.5;
/// How long a doubled width is tried, at least, and in round trips to the peer (new lanes may
/// have to connect, and new connections to grow their windows) ...
const TRIAL: Duration = Duration::from_millis(300);
const TRIAL_RTTS: u32 = 16;
/// ... and the bytes written per second it must bring in its second half, over those of the
/// last `BEFORE` looks at the width before (fewer if it changed since), or the width goes back.
const GAIN: f64 = 1.1;
const BEFORE: usize = 5;
/// After a trial that did not pay, no new one for this long, doubling with every further
/// one that does not, up to `MAX_HOLD_OFF`.
const HOLD_OFF: Duration = Duration::from_secs(2);
const MAX_HOLD_OFF: Duration = Duration::from_secs(60);
/// Writes waiting less than this share of the time ...
const CALM_BELOW: f64 = 0.1;
/// ... for this long halve it. A halving whose narrower width's writes wait most of the time
/// within this long is undone at once (the calm was the wider width's doing, not a sign that
/// fewer lanes would do), and the calm it takes to halve again doubles, up to `MAX_HOLD_OFF`;
/// a halving that stands this long brings it back to this.
const CALM_FOR: Duration = Duration::from_secs(2);
/// The spread starts at one lane per this much round trip (µs). One connection carries at
/// most its send buffer per round trip (4 MiB by Linux's default `tcp_wmem`): 840 MB/s at
/// 5 ms, about what one lane's writer copies on a core; longer links start with as many lanes
/// as keep that rate, and trials widen further where more bytes follow. (One lane per 2 ms,
/// ten at 20 ms, spread a 16-actor closed loop of 512 KiB over 11.6 lanes and did 7 % fewer
/// round trips, its median 2 ms later, at the same CPU.)
pub(crate) const SPREAD_RTT_US: u64 = 5_000;

/// The width of one channel to one peer, and its epoch: what sends pick lanes by.
pub(crate) struct Widen {
    /// `epoch << 16 | width`.
    state: AtomicU64,
    /// Taken shared by a send from the moment it checks the width to the moment its frame is
    /// queued, exclusively by a change of width.
    switch: RwLock<()>,
    lanes: usize,
    /// The lanes after the first that carry striped frames' pieces (1 ..= `lanes - 1`).
    spread: AtomicUsize,
}

/// The width as a send saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen(u64);

impl Seen {
    /// The lanes carrying small frames.
    pub(crate) fn width(self) -> usize {
        (self.0 & 0xffff) as usize
    }

    /// The index, within its channel, of the lane for order key `order`.
    pub(crate) fn index(self, order: u64) -> usize {
        (order % self.width().max(1) as u64) as usize
    }

    fn epoch(self) -> u64 {
        self.0 >> 16
    }
}

impl Widen {
    /// A channel of `lanes` lanes, its small frames on the first.
    pub(crate) fn new(lanes: usize) -> Self {
        Widen {
            state: AtomicU64::new(1),
            switch: RwLock::new(()),
            lanes,
            spread: AtomicUsize::new(1),
        }
    }

    /// How many lanes, counted from the second, carry striped frames' pieces now.
    pub(crate) fn spread(&self) -> usize {
        self.spread.load(Ordering::Relaxed)
    }

    /// Pieces go on `spread` lanes from now on (at least one, at most all but the first).
    pub(crate) fn set_spread(&self, spread: usize) {
        let spread = spread.clamp(1, self.lanes.saturating_sub(1).max(1));
        let old = self.spread.swap(spread, Ordering::Relaxed);
        if old != spread {
            tracing::debug!(
                lanes = self.lanes,
                from = old,
                to = spread,
                "striped pieces' lanes changed"
            );
        }
    }

    /// The channel's lanes.
    pub(crate) fn lanes(&self) -> usize {
        self.lanes
    }

    /// The width now.
    pub(crate) fn seen(&self) -> Seen {
        Seen(self.state.load(Ordering::Acquire))
    }

    /// Holds off changes of width while the guard lives, if the width is still `seen`; `None`
    /// when it changed (pick the lane again).
    pub(crate) fn hold(&self, seen: Seen) -> Option<RwLockReadGuard<'_, ()>> {
        let g = self.switch.read().unwrap_or_else(|e| e.into_inner());
        (self.seen() == seen).then_some(g)
    }

    /// Changes the width to `width` (1 ..= `lanes.len()`): a barrier on each lane of the old
    /// and the new width, then the new width.
    pub(crate) fn switch(&self, lanes: &[Arc<Lane>], width: usize) {
        let _g = self.switch.write().unwrap_or_else(|e| e.into_inner());
        let old = self.seen();
        let width = width.clamp(1, lanes.len());
        if width == old.width() {
            return;
        }
        let epoch = old.epoch() + 1;
        let n = old.width().max(width);
        let head = barrier_head(epoch, n as u16);
        for lane in &lanes[..n] {
            // Fails only on a closed lane, whose frames are lost with it.
            let _ = lane.push_small(head.clone(), None, Role::Barrier);
        }
        self.state
            .store(epoch << 16 | width as u64, Ordering::Release);
        tracing::debug!(lane = %lanes[0].id, epoch, from = old.width(), to = width, "small frames' lanes changed");
    }
}

fn barrier_head(epoch: u64, lanes: u16) -> Bytes {
    let mut buf = BytesMut::with_capacity(24);
    // A barrier is two integers and no payload: it always encodes.
    let _ = encode_head(&Header::Barrier { epoch, lanes }, 0, usize::MAX, &mut buf);
    buf.freeze()
}

/// Where a frame goes in its channel: a given lane, or the lane its order key takes at the
/// channel's width now.
pub(crate) enum Place<'a> {
    /// This lane.
    Lane(&'a Arc<Lane>),
    /// The lane of the key among `lanes` (the channel's) at `widen`'s width.
    Widened {
        /// The channel's width.
        widen: &'a Widen,
        /// The channel's lanes.
        lanes: &'a [Arc<Lane>],
    },
}

/// A frame [`Place::try_enqueue`] found no room for, given back.
pub(crate) struct Full {
    /// The frame's head and payload.
    pub(crate) frame: (Bytes, Body),
    /// `Backpressure`, naming the queue (the lane's, the node's) that had no room.
    pub(crate) why: SendError,
}

impl<'a> Place<'a> {
    /// Queues a frame with order key `order` (waiting for room when `wait`, else failing with
    /// `Backpressure`); the lane it went on.
    pub(crate) async fn enqueue(
        &self,
        frame: (Bytes, Body),
        order: u64,
        role: Role,
        wait: bool,
    ) -> Result<&'a Arc<Lane>, SendError> {
        let (head, payload) = frame;
        match *self {
            Place::Lane(lane) => {
                lane.enqueue_role(head, payload, Some(order), role, wait)
                    .await?;
                Ok(lane)
            }
            Place::Widened { widen, lanes } => {
                let len = head.len() + payload.len();
                loop {
                    let seen = widen.seen();
                    let lane = &lanes[seen.index(order)];
                    let room = lane.reserve(len, wait).await?;
                    // The width changed while waiting for room: pick again (the room goes back).
                    if let Some(_held) = widen.hold(seen) {
                        lane.push_reserved(head, payload, Some(order), role, room)?;
                        return Ok(lane);
                    }
                }
            }
        }
    }

    /// Queues a frame with order key `order` if its lane has room now: the lane it went on
    /// (or why it could not go); the frame back when there is no room (or the lane is
    /// closed: [`Place::enqueue`] tells which), with the queue that had none.
    pub(crate) fn try_enqueue(
        &self,
        frame: (Bytes, Body),
        order: u64,
        role: Role,
    ) -> Result<Result<&'a Arc<Lane>, SendError>, Full> {
        let (head, payload) = frame;
        let len = head.len() + payload.len();
        match *self {
            Place::Lane(lane) => match lane.try_reserve(len) {
                Ok(room) => Ok(lane
                    .push_reserved(head, payload, Some(order), role, room)
                    .map(|()| lane)),
                Err(why) => Err(Full {
                    frame: (head, payload),
                    why,
                }),
            },
            Place::Widened { widen, lanes } => loop {
                let seen = widen.seen();
                let lane = &lanes[seen.index(order)];
                let room = match lane.try_reserve(len) {
                    Ok(room) => room,
                    Err(why) => {
                        return Err(Full {
                            frame: (head, payload),
                            why,
                        })
                    }
                };
                // The width changed meanwhile: pick again (the room goes back).
                if let Some(_held) = widen.hold(seen) {
                    return Ok(lane
                        .push_reserved(head, payload, Some(order), role, room)
                        .map(|()| lane));
                }
            },
        }
    }

    /// Queues a frame of a few bytes ([`Lane::push_small`]) with order key `order`, whatever
    /// the room; the lane it went on.
    pub(crate) fn push_small(
        &self,
        head: Bytes,
        order: u64,
        role: Role,
    ) -> Result<&'a Arc<Lane>, SendError> {
        match *self {
            Place::Lane(lane) => lane.push_small(head, Some(order), role).map(|()| lane),
            Place::Widened { widen, lanes } => loop {
                let seen = widen.seen();
                let lane = &lanes[seen.index(order)];
                if let Some(_held) = widen.hold(seen) {
                    return lane.push_small(head, Some(order), role).map(|()| lane);
                }
            },
        }
    }
}

/// When to change a channel's width, from how long its lanes' writes waited for their sockets
/// and how many bytes they wrote.
///
/// Writes that wait most of the time mean a full window, or a busy link, or, on a machine
/// whose CPU is saturated, a peer that reads slowly. Only the first is cured by more lanes, so
/// a doubled width is a trial: it stays if the bytes written per second grew by [`GAIN`],
/// else the width goes back and no trial is made for a while.
#[derive(Debug)]
pub(crate) struct Policy {
    width: usize,
    /// It never halves below this.
    floor: usize,
    max: usize,
    last: Option<Instant>,
    /// Each lane's waiting time (ns, as counted) at the last look.
    before: Vec<u64>,
    /// Bytes written on all lanes at the last looks since the width last changed (at most
    /// `BEFORE` + 1), oldest first.
    history: std::collections::VecDeque<(Instant, u64)>,
    /// Since when the writes have waited little.
    calm_since: Option<Instant>,
    /// How long they must wait little before the width halves.
    calm_for: Duration,
    /// The last halving, while it may be undone: when, and the width before it.
    halved: Option<(Instant, usize)>,
    trial: Option<Trial>,
    /// No trial before this.
    hold_until: Option<Instant>,
    hold_off: Duration,
}

/// A doubled width on trial.
#[derive(Debug)]
struct Trial {
    since: Instant,
    length: Duration,
    from: usize,
    /// Bytes written per second in the period before it.
    rate_before: f64,
    /// When its second half began, and the bytes written on all lanes then.
    half: Option<(Instant, u64)>,
}

impl Policy {
    /// A channel of `lanes` lanes, at width 1.
    pub(crate) fn new(lanes: usize) -> Self {
        Policy {
            width: 1,
            floor: 1,
            max: lanes.max(1),
            last: None,
            before: vec![0; lanes.max(1)],
            history: std::collections::VecDeque::with_capacity(BEFORE + 1),
            calm_since: None,
            calm_for: CALM_FOR,
            halved: None,
            trial: None,
            hold_until: None,
            hold_off: HOLD_OFF,
        }
    }

    /// The width now.
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Whether a doubled width is on trial (a second policy over the same lanes waits: two
    /// trials at once would each take the other's bytes for their own).
    pub(crate) fn on_trial(&self) -> bool {
        self.trial.is_some()
    }

    /// Never below `floor` (at most all the lanes) from now on: the width rises to it now
    /// when below (the new width, if it changed).
    pub(crate) fn set_floor(&mut self, floor: usize) -> Option<usize> {
        self.floor = floor.clamp(1, self.max);
        (self.width < self.floor).then(|| {
            self.width = self.floor;
            self.trial = None;
            self.halved = None;
            self.width
        })
    }

    /// When it is next time to look again; `now` when it never looked.
    pub(crate) fn due_at(&self, now: Instant) -> Instant {
        self.last.map_or(now, |last| last + PERIOD)
    }

    /// Whether it is time to look again ([`Policy::tick`] does nothing before).
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.last
            .is_none_or(|last| now.saturating_duration_since(last) >= PERIOD)
    }

    /// Looks at the lanes' waiting times (ns waited so far, per lane) and the bytes written on
    /// all of them so far, at `now`, with round trips of `rtt` to the peer; the new width when
    /// it is to change.
    pub(crate) fn tick(
        &mut self,
        now: Instant,
        waited: &[u64],
        written: u64,
        rtt: Duration,
    ) -> Option<usize> {
        let Some(last) = self.last else {
            self.last = Some(now);
            self.before.copy_from_slice(&waited[..self.max]);
            self.history.push_back((now, written));
            return None;
        };
        let elapsed = now.saturating_duration_since(last);
        if elapsed < PERIOD {
            return None;
        }
        let w = self.width;
        let delta: u64 = (0..w)
            .map(|i| waited[i].saturating_sub(self.before[i]))
            .sum();
        let share = delta as f64 / (elapsed.as_nanos() as f64 * w as f64);
        if self.history.len() > BEFORE {
            self.history.pop_front();
        }
        let rate = match self.history.front() {
            Some(&(t, b)) if now > t => {
                written.saturating_sub(b) as f64 / now.saturating_duration_since(t).as_secs_f64()
            }
            _ => 0.0,
        };
        self.history.push_back((now, written));
        self.last = Some(now);
        self.before.copy_from_slice(&waited[..self.max]);
        if self
            .halved
            .is_some_and(|(at, _)| now.saturating_duration_since(at) >= CALM_FOR)
        {
            // The last halving stood.
            self.halved = None;
            self.calm_for = CALM_FOR;
        }
        let next = if let Some(t) = &mut self.trial {
            let tried = now.saturating_duration_since(t.since);
            let Some((half, written_at)) = t.half else {
                if tried >= t.length / 2 {
                    t.half = Some((now, written));
                }
                return None;
            };
            if tried < t.length {
                return None;
            }
            let rate_after = written.saturating_sub(written_at) as f64
                / now.saturating_duration_since(half).as_secs_f64();
            let from = t.from;
            let paid = rate_after >= t.rate_before * GAIN;
            self.trial = None;
            self.calm_since = None;
            if paid {
                self.hold_off = HOLD_OFF;
                w
            } else {
                self.hold_until = Some(now + self.hold_off);
                self.hold_off = (self.hold_off * 2).min(MAX_HOLD_OFF);
                from
            }
        } else if share >= WIDEN_AT {
            self.calm_since = None;
            if let Some((_, from)) = self.halved.take() {
                // Fewer lanes wait at once: back to the width that was calm, no trial needed.
                self.calm_for = (self.calm_for * 2).min(MAX_HOLD_OFF);
                return self.change(now, written, from);
            }
            let held = self.hold_until.is_some_and(|t| now < t);
            if w < self.max && !held {
                self.trial = Some(Trial {
                    since: now,
                    length: TRIAL.max(rtt * TRIAL_RTTS),
                    from: w,
                    rate_before: rate,
                    half: None,
                });
                (w * 2).min(self.max)
            } else {
                w
            }
        } else if share < CALM_BELOW {
            let since = *self.calm_since.get_or_insert(last);
            if now.saturating_duration_since(since) >= self.calm_for {
                self.calm_since = Some(now);
                let half = (w / 2).max(self.floor);
                if half < w {
                    self.halved = Some((now, w));
                }
                half
            } else {
                w
            }
        } else {
            self.calm_since = None;
            w
        };
        self.change(now, written, next)
    }

    /// The width becomes `next` at `now`, with `written` bytes written so far; `next` when
    /// that is a change.
    fn change(&mut self, now: Instant, written: u64, next: usize) -> Option<usize> {
        (next != self.width).then(|| {
            self.width = next;
            // Bytes per second at the old width say nothing of the new one.
            self.history.clear();
            self.history.push_back((now, written));
            next
        })
    }
}

/// What the writer of a widening channel's first lane keeps: the channel's lanes, its width
/// and spread, and their policies.
pub(crate) struct Driver {
    widen: Arc<Widen>,
    lanes: Vec<Arc<Lane>>,
    policy: Policy,
    /// The spread's, over the lanes after the first.
    spread: Policy,
    waited: Vec<u64>,
    /// The peer's round trip in µs, as its heartbeats measure it.
    rtt_us: Arc<AtomicU64>,
}

impl Driver {
    /// The driver of `widen` over `lanes` (the channel's, first one first).
    pub(crate) fn new(widen: Arc<Widen>, lanes: Vec<Arc<Lane>>, rtt_us: Arc<AtomicU64>) -> Self {
        let n = lanes.len();
        Driver {
            widen,
            lanes,
            policy: Policy::new(n),
            spread: Policy::new(n.saturating_sub(1)),
            waited: vec![0; n],
            rtt_us,
        }
    }

    /// When [`Driver::after_write`] next looks at the waiting times (`now` when it never did).
    pub(crate) fn due_at(&self, now: Instant) -> Instant {
        self.policy.due_at(now)
    }

    /// After a write: looks at the waiting times now and then, and changes the width or the
    /// spread when their policies say so (one on trial at a time).
    pub(crate) fn after_write(&mut self, now: Instant) {
        if !self.policy.due(now) {
            return;
        }
        let rtt = Duration::from_micros(self.rtt_us.load(Ordering::Relaxed));
        let mut written = 0;
        for (w, l) in self.waited.iter_mut().zip(&self.lanes) {
            *w = l.metrics.waited_ns.load(Ordering::Relaxed);
            written += l.metrics.bytes_out.load(Ordering::Relaxed);
        }
        if !self.spread.on_trial() {
            if let Some(width) = self.policy.tick(now, &self.waited, written, rtt) {
                self.widen.switch(&self.lanes, width);
            }
        }
        if self.lanes.len() < 2 {
            return;
        }
        // The round trip of the first lane's connection as it was set up (0 before).
        let base_us = self.lanes[0].metrics.round_trip_us.load(Ordering::Relaxed);
        let floor = base_us.div_ceil(SPREAD_RTT_US).max(1) as usize;
        let mut changed = self.spread.set_floor(floor);
        if !self.policy.on_trial() {
            changed = self
                .spread
                .tick(now, &self.waited[1..], written, rtt)
                .or(changed);
        }
        if changed.is_some() {
            self.widen.set_spread(self.spread.width());
        }
    }
}

/// The receiver's barriers for one peer: the table, and the wake-ups of the readers waiting at
/// one (a generation that moves with every release).
#[derive(Default)]
pub(crate) struct BarriersIn {
    table: Mutex<Barriers>,
    generation: AtomicU64,
    changed: Notify,
}

/// Where a lane is in its channel, for [`BarriersIn::arrive`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct LanePlace {
    /// The channel's first slot.
    pub channel: u16,
    /// The lane's index in it.
    pub index: u16,
    /// The channel's lanes.
    pub parallelism: u16,
}

impl BarriersIn {
    fn table(&self) -> std::sync::MutexGuard<'_, Barriers> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// The lane at `at` arrived at barrier `epoch` over `lanes` lanes; whether it may go on.
    pub(crate) fn arrive(&self, at: LanePlace, epoch: u64, lanes: u16) -> Result<bool, WireError> {
        let a = self
            .table()
            .arrive(at.channel, at.index, at.parallelism, epoch, lanes)?;
        if a == Arrival::Released {
            self.bump();
        }
        Ok(a == Arrival::Released)
    }

    /// Whether barrier `epoch` of `channel` is released.
    pub(crate) fn is_released(&self, channel: u16, epoch: u64) -> bool {
        self.table().is_released(channel, epoch)
    }

    /// Returns once barrier `epoch` of `channel` is released.
    pub(crate) async fn released(&self, channel: u16, epoch: u64) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.is_released(channel, epoch) {
                return;
            }
            changed.await;
        }
    }

    /// The lanes of barrier `epoch` of `channel` yet to arrive (a bit per lane index).
    pub(crate) fn missing(&self, channel: u16, epoch: u64) -> u128 {
        self.table().missing(channel, epoch)
    }

    /// The lanes of `channel` (a bit per lane index) stopped at a barrier before `epoch` that
    /// is still waited for.
    pub(crate) fn held_before(&self, channel: u16, epoch: u64) -> u128 {
        self.table().held_before(channel, epoch)
    }

    /// Barrier `epoch` of `channel` waited too long: it is let go.
    pub(crate) fn give_up(&self, channel: u16, epoch: u64) {
        self.table().give_up(channel, epoch);
        self.bump();
        tracing::debug!(
            channel,
            epoch,
            "lane barrier given up: a lane did not arrive"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    const MS: u64 = 1_000_000;

    /// A channel driven by its policy, looked at every 100 ms: `rate(width)` bytes written per
    /// second, and writes waiting `wait(width)` of the time on each lane carrying small frames.
    struct Sim {
        p: Policy,
        t0: Instant,
        t: u64,
        waited: Vec<u64>,
        bytes: u64,
        rtt: Duration,
    }

    impl Sim {
        fn new(lanes: usize, rtt_ms: u64) -> Self {
            let t0 = Instant::now();
            let mut p = Policy::new(lanes);
            assert_eq!(p.tick(t0, &vec![0; lanes], 0, Duration::ZERO), None);
            Sim {
                p,
                t0,
                t: 0,
                waited: vec![0; lanes],
                bytes: 0,
                rtt: Duration::from_millis(rtt_ms),
            }
        }

        /// Runs `ms` more; every width it changed to, with when.
        fn run(&mut self, ms: u64, rate: impl Fn(usize) -> u64, wait: f64) -> Vec<(u64, usize)> {
            self.run_with(ms, rate, |_| wait)
        }

        /// As [`Sim::run`], writes waiting `wait(width)` of the time.
        fn run_with(
            &mut self,
            ms: u64,
            rate: impl Fn(usize) -> u64,
            wait: impl Fn(usize) -> f64,
        ) -> Vec<(u64, usize)> {
            let mut changes = Vec::new();
            let end = self.t + ms;
            while self.t < end {
                self.t += 100;
                let w = self.p.width;
                for x in &mut self.waited[..w] {
                    *x += (100.0 * wait(w)) as u64 * MS;
                }
                self.bytes += rate(w) / 10;
                let now = at(self.t0, self.t);
                if let Some(n) = self.p.tick(now, &self.waited, self.bytes, self.rtt) {
                    changes.push((self.t, n));
                }
            }
            changes
        }
    }

    #[test]
    fn widens_while_wider_pays_and_narrows_when_calm() {
        let mut sim = Sim::new(4, 1);
        // A full window on every lane: two lanes write twice the bytes, four no more.
        let rate = |w: usize| 100_000_000 * w.min(2) as u64;
        let changes = sim.run(3_000, rate, 0.9);
        // Two at once, kept; four tried 300 ms later, given up 300 ms after that, tried
        // again once held off 2 s.
        assert_eq!(
            changes,
            vec![(100, 2), (500, 4), (800, 2), (2_800, 4)],
            "{:?}",
            sim.p
        );
        // Calm (the trial of four ends first, as it did not pay): halved after CALM_FOR.
        let changes = sim.run(6_000, rate, 0.0);
        assert_eq!(changes, vec![(3_100, 2), (5_100, 1)]);
    }

    #[test]
    fn a_halving_undone_at_once_is_made_ever_more_rarely() {
        let mut sim = Sim::new(8, 1);
        assert_eq!(sim.p.set_floor(8), Some(8));
        sim.p.floor = 1;
        // Eight lanes keep up; with four, writes wait most of the time.
        let wait = |w: usize| if w >= 8 { 0.0 } else { 0.9 };
        let changes = sim.run_with(20_000, |w| 100_000_000 * w as u64, wait);
        // Halved after 2 s of calm, back at the next look without a trial, then halved
        // after 4 s and 8 s of calm.
        assert_eq!(
            changes,
            vec![
                (2_000, 4),
                (2_100, 8),
                (6_100, 4),
                (6_200, 8),
                (14_200, 4),
                (14_300, 8)
            ],
            "{:?}",
            sim.p
        );
        assert!(!sim.p.on_trial());
        // Calm at four too: halved after 16 s, and once that halving stood, after 2 s again.
        let changes = sim.run(16_000, |w| 100_000_000 * w as u64, 0.0);
        assert_eq!(
            changes,
            vec![(30_300, 4), (32_300, 2), (34_300, 1)],
            "{:?}",
            sim.p
        );
    }

    #[test]
    fn trials_that_do_not_pay_are_made_ever_more_rarely() {
        let mut sim = Sim::new(2, 1);
        // Writes wait all the time, and the bytes per second never change.
        let changes = sim.run(20_000, |_| 10_000_000, 1.0);
        let trials: Vec<u64> = changes.iter().filter(|c| c.1 == 2).map(|c| c.0).collect();
        // Tried at once, then held off 2, 4 and 8 s from the end of the last trial (each
        // lasting 300 ms).
        assert_eq!(trials, vec![100, 2_400, 6_700, 15_000]);
    }

    #[test]
    fn a_trial_lasts_longer_over_a_long_link() {
        // 100 ms round trips: a trial lasts 16 of them.
        let mut sim = Sim::new(2, 100);
        let changes = sim.run(5_000, |_| 10_000_000, 1.0);
        assert_eq!(&changes[..2], &[(100, 2), (1_700, 1)]);
    }

    #[test]
    fn a_long_quiet_gap_counts_as_calm() {
        let mut sim = Sim::new(2, 1);
        let changes = sim.run(500, |w| 100_000_000 * w as u64, 0.9);
        assert_eq!(changes, vec![(100, 2)]);
        // Nothing written for ten seconds, then a write: back to one lane.
        let now = at(sim.t0, sim.t + 10_000);
        assert_eq!(sim.p.tick(now, &sim.waited, sim.bytes, sim.rtt), Some(1));
    }

    #[test]
    fn a_floor_raises_the_width_and_halving_stops_there() {
        let mut sim = Sim::new(8, 1);
        assert_eq!(sim.p.set_floor(3), Some(3));
        assert_eq!(sim.p.set_floor(3), None, "already there");
        // Writes wait, and six lanes write twice what three do: doubled at once, kept.
        let changes = sim.run(1_000, |w| 100_000_000 * w.min(6) as u64, 0.9);
        assert_eq!(changes.first(), Some(&(100, 6)), "{changes:?}");
        // Calm: halved to three, not below.
        let changes = sim.run(10_000, |w| 100_000_000 * w as u64, 0.0);
        assert_eq!(changes.last().map(|c| c.1), Some(3), "{changes:?}");
        assert_eq!(sim.p.width(), 3);
        // A floor above the lanes is all of them.
        assert_eq!(sim.p.set_floor(20), Some(8));
    }

    /// The spread of a channel's striped pieces starts at one lane per `SPREAD_RTT_US` of its
    /// first connection's round trip, and only the lanes after the first count.
    #[test]
    fn the_spread_starts_from_the_round_trip() {
        use crate::id::LaneId;
        let spread_at = |rtt_us: u64, lanes: u16| {
            let lanes: Vec<_> = (0..lanes)
                .map(|i| Lane::new(LaneId::new("default", i), 1 << 20).0)
                .collect();
            lanes[0]
                .metrics
                .round_trip_us
                .store(rtt_us, Ordering::Relaxed);
            let widen = Arc::new(Widen::new(lanes.len()));
            let mut d = Driver::new(widen.clone(), lanes, Arc::new(AtomicU64::new(0)));
            d.after_write(Instant::now());
            widen.spread()
        };
        assert_eq!(spread_at(0, 16), 1, "round trip not known yet");
        assert_eq!(spread_at(40, 16), 1, "one host");
        assert_eq!(spread_at(1_000, 16), 1);
        assert_eq!(spread_at(5_000, 16), 1);
        assert_eq!(spread_at(12_000, 16), 3);
        assert_eq!(spread_at(20_000, 16), 4);
        assert_eq!(spread_at(100_000, 16), 15, "every lane but the first");
        assert_eq!(spread_at(100_000, 2), 1);
    }

    /// Many keys streaming (one of them with striped messages among its small ones) while
    /// the width of their channel changes every few milliseconds: every key's messages arrive
    /// all, in order, and no barrier is given up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn keys_keep_their_order_while_the_width_changes() {
        use crate::{Config, Node, SendOpts};
        use serde::{Deserialize, Serialize};

        #[derive(Debug, Serialize, Deserialize)]
        struct Seq(u64, u32, crate::Payload);
        const KEYS: u64 = 8;
        const EACH: u32 = 1500;
        static BIG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
        let big: &'static [u8] = BIG.get_or_init(|| vec![7; 300 * 1024]);

        let config = |name: &str| {
            let mut c = Config::new(name).cookie("widen").parallelism(4);
            c.transport.heartbeat_interval_ms = 200;
            c.transport.heartbeat_timeout_ms = 5000;
            c
        };
        let a = Node::start(config("wda")).await.unwrap();
        let b = Node::start(config("wdb")).await.unwrap();
        a.join_wait(b.addr(), Duration::from_secs(10))
            .await
            .unwrap();
        let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
        let sink = b.spawn_fn(move |mut inbox: crate::Inbox<Seq>| async move {
            let mut next = vec![0u32; KEYS as usize];
            let mut got = vec![0u32; KEYS as usize];
            let mut wrong = Vec::new();
            while let Some(Seq(k, n, p)) = inbox.recv().await {
                let want = &mut next[k as usize];
                if n != *want || (n % 50 == 49 && k == 0 && p.len() != big.len()) {
                    wrong.push((k, n, *want));
                }
                *want = n + 1;
                got[k as usize] += 1;
                if got.iter().all(|&n| n == EACH) {
                    let _ = done_tx.send(wrong.clone());
                }
            }
        });
        b.register("sink", &sink).unwrap();
        let r = a.remote::<Seq>("wdb", "sink").unwrap();

        let peer = a.router().peer("wdb").unwrap();
        let slot = a.router().dispatch.slot_of("default", 0).unwrap();
        let widen = peer.widths[slot]
            .clone()
            .expect("the default channel widens");
        let lanes = peer.lanes[slot..slot + 4].to_vec();
        // The width changes every 200 messages sent (of 12,000), whatever the pace.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sent = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let progress = Arc::new(tokio::sync::Notify::new());
        let switcher = {
            let (stop, sent, progress) = (stop.clone(), sent.clone(), progress.clone());
            tokio::spawn(async move {
                let mut switches = 0;
                for w in [2, 4, 1, 3, 4, 2, 1, 4, 3, 1].iter().cycle() {
                    widen.switch(&lanes, *w);
                    switches += 1;
                    let until = sent.load(Ordering::Relaxed) + 200;
                    loop {
                        let more = progress.notified();
                        tokio::pin!(more);
                        more.as_mut().enable();
                        if stop.load(Ordering::Relaxed) || sent.load(Ordering::Relaxed) >= until {
                            break;
                        }
                        more.await;
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                switches
            })
        };
        let senders: Vec<_> = (0..KEYS)
            .map(|k| {
                let r = r.clone();
                let (sent, progress) = (sent.clone(), progress.clone());
                tokio::spawn(async move {
                    for n in 0..EACH {
                        let p: crate::Payload = if k == 0 && n % 50 == 49 {
                            big.into()
                        } else {
                            crate::Payload::from(&big[..16])
                        };
                        r.send_with(Seq(k, n, p), &SendOpts::default().partition(k))
                            .await
                            .unwrap();
                        if sent.fetch_add(1, Ordering::Relaxed) % 50 == 49 {
                            // A send that finds room never waits: let the switcher run.
                            progress.notify_waiters();
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for s in senders {
            s.await.unwrap();
        }
        let wrong = tokio::time::timeout(Duration::from_secs(60), done.recv())
            .await
            .expect("every message arrived")
            .unwrap();
        stop.store(true, Ordering::Relaxed);
        progress.notify_waiters();
        let switches = switcher.await.unwrap();
        assert!(switches > 10, "the width changed {switches} times");
        // A barrier given up (a lane not there within the heartbeat timeout) lets a key's
        // messages pass out of order once, as documented: say so when that is why.
        let given_up = b.counters().barriers_given_up.get();
        // And whether a connection ended under them (a barrier may be lost with it), or none
        // did (then a lane read nothing for the heartbeat timeout).
        let ended: u64 = b.router().peer("wda").map_or(0, |p| {
            p.lanes
                .iter()
                .map(|l| l.metrics.readers_ended.load(Ordering::Relaxed))
                .sum()
        });
        assert!(
            wrong.is_empty(),
            "out of order or damaged (barriers given up: {given_up}, readers ended: {ended}): \
             {wrong:?}"
        );
        assert_eq!(given_up, 0, "readers ended: {ended}");
        assert_eq!(b.counters().bad_frames.get(), 0);
        let bytes: Vec<u64> = peer.lanes[slot..slot + 4]
            .iter()
            .map(|l| l.metrics.bytes_out.load(Ordering::Relaxed))
            .collect();
        assert!(
            bytes.iter().all(|&b| b > 0),
            "every lane carried frames: {bytes:?}"
        );
        a.shutdown().await;
        b.shutdown().await;
    }

    #[test]
    fn seen_picks_lanes_by_key() {
        let s = Seen(3 << 16 | 4);
        assert_eq!((s.width(), s.epoch()), (4, 3));
        assert_eq!(s.index(9), 1);
        assert_eq!(Seen(1).index(9), 0);
    }
}
