//! A lane: the persistent outbound queue of one (peer, channel, index) and the writer task that
//! moves it onto whichever TCP connection currently serves the lane.
//!
//! The queue is bounded in bytes by a semaphore: a frame holds permits for its size (capped at
//! the lane's capacity, so one frame larger than the queue still goes, alone) until it has been
//! written. `try_send` fails with `Backpressure` when the permits are not there; `send` waits.
//! Frames queued while the lane is disconnected wait for the next connection. When the peer is
//! dropped, the frames never written go back to the router through the writer's [`UnsentSink`]
//! (on overlays with routes, where another way may exist), or are discarded and counted in
//! `dropped`.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, AcquireError, Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::direct::{Direct, Offered, Rest};
use super::schedule::{Round, Schedule};
use super::stream::WriteHalf;
use super::stripe::{Losses, Role};
use super::watch::{Tokens, Watch, CANCELLED, CLOSING, ENDED};
use super::widen::Driver;
use crate::error::SendError;
use crate::id::{LaneId, NodeId};
use crate::wire::Body;

/// Buffers up to this size are copied next to their header so that a batch of small frames
/// becomes one buffer; larger ones (large payloads, pieces of parts) are written from their own
/// buffer (never copied).
const INLINE_PAYLOAD: usize = 16 * 1024;
/// Most frames taken off the queue for one vectored write.
const BATCH_FRAMES: usize = 256;
/// Bytes after which a lane's writer lets the other tasks of its worker thread run, and the
/// most it hands a socket that keeps up in one call: over loopback or a fast link a writer
/// would otherwise copy a large frame's megabytes in one go and hold its thread for
/// milliseconds, delaying the small frames of every other lane (and the actors) behind it.
const YIELD_AFTER: usize = 256 * 1024;
/// A round trip (µs, the kernel's for a lane's connection when it connected) from which a lane's
/// writer does not pace its writes ([`YIELD_AFTER`]). A connection carries at most its send buffer
/// (4 MiB by Linux's default `tcp_wmem`) a round trip, and a write stops at what the window
/// and `transport.unsent_bytes` let the socket take, so over long round trips an unpaced
/// writer holds its worker for short spells only, while cutting each large frame into quanta
/// and yields cost another write and another wake-up: at 20 ms, 512 KiB, 16 actors a fifth of
/// the CPU of a round trip, at 10 ms a fifth of the rate of 8 MiB transfers beside small calls,
/// whose p99 was the same either way. Over shorter round trips the socket takes bytes about as
/// fast as they are copied, and pacing is what lets small calls through beside bulk transfers
/// (without it, at 5 ms the calls' p99 beside one transfer rose from 1.5× to 1.7–2.0× their p99
/// alone; at 1 ms their rate beside four transfers halved).
pub(crate) const UNPACED_ROUND_TRIP_US: u64 = 10_000;
/// Most buffers handed to one `writev`.
const MAX_IOVECS: usize = 64;

/// One frame waiting to be written.
pub(crate) struct OutFrame {
    /// Length prefix and encoded header.
    pub head: Bytes,
    /// The payload, written as is (one buffer or several back to back).
    pub payload: Body,
    /// Its order key: frames with the same key are written in the order they were queued
    /// even when one of them goes in parts; `None` (the runtime's own frames) is in no order
    /// with large frames. See [`super::schedule`].
    pub order: Option<u64>,
    /// Whether it is a piece or the commit of a striped frame ([`super::stripe`]).
    pub role: Role,
    permit: OwnedSemaphorePermit,
    node_permit: OwnedSemaphorePermit,
}

impl OutFrame {
    /// Gives back the queue room of `bytes` of it (written, as parts of it): a frame in parts
    /// holds room only for what is still to be written, so frames can be queued behind it.
    pub(crate) fn release(&mut self, bytes: usize) {
        for p in [&mut self.permit, &mut self.node_permit] {
            drop(p.split(bytes.min(p.num_permits())));
        }
    }

    /// The frame went out whole, on a connection of the lane whose losses are `on`: a piece
    /// of a striped frame tells its gate.
    pub(crate) fn written(&mut self, on: &Arc<Losses>) {
        if let Role::Part(g) = &mut self.role {
            g.written(on);
        }
    }

    /// Whether it is a piece or commit of a striped frame, or a barrier: such frames make
    /// sense to their peer only.
    pub(crate) fn is_peer_only(&self) -> bool {
        !matches!(self.role, Role::Whole)
    }
}

/// Frames a lane's writer ended with and never wrote (its peer was dropped), still holding
/// their queue permits: the router sends them another way.
pub(crate) struct Unsent {
    /// The peer they were queued for.
    pub peer: NodeId,
    /// The lane slot they were queued on.
    pub slot: usize,
    /// The frames, in queue order.
    pub frames: Vec<OutFrame>,
}

/// Where a lane's writer hands the frames it could not write. Bounded: when it is full the
/// frames are discarded and counted in the lane's `dropped`.
#[derive(Clone)]
pub(crate) struct UnsentSink {
    /// The lane's peer.
    pub peer: NodeId,
    /// The lane's slot.
    pub slot: usize,
    /// The router's queue of unsent frames.
    pub tx: mpsc::Sender<Unsent>,
}

/// The bytes all the lanes of a node may hold queued together (`transport.node_queue_bytes`): every
/// frame takes permits from its lane's budget and from this one, and gives both back once it
/// is written or dropped. It bounds the outbound memory of a node whatever its number of peers.
#[derive(Clone, Debug)]
pub(crate) struct QueueBudget {
    sem: Arc<Semaphore>,
    capacity: u32,
}

impl QueueBudget {
    /// A budget of `bytes` (at most 4 GiB).
    pub(crate) fn new(bytes: usize) -> Self {
        let capacity = bytes.clamp(1, u32::MAX as usize) as u32;
        QueueBudget {
            sem: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
        }
    }

    /// Bytes queued on all the lanes that share it.
    pub(crate) fn queued_bytes(&self) -> u64 {
        (self.capacity as u64).saturating_sub(self.sem.available_permits() as u64)
    }

    fn size(&self, len: usize) -> u32 {
        len.clamp(1, self.capacity as usize) as u32
    }
}

/// What the node's lanes that are gone carried: a lane adds its counts when it is dropped
/// (after its last write), so that the node's totals outlive its peers.
#[derive(Debug, Default)]
pub(crate) struct Retired {
    /// Bytes written.
    pub bytes_out: AtomicU64,
    /// Bytes read.
    pub bytes_in: AtomicU64,
}

/// Counters of one lane, exported at `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct LaneMetrics {
    /// Frames written.
    pub msgs_out: AtomicU64,
    /// Of those, the frames their senders wrote themselves while the writer waited
    /// ([`super::direct`]).
    pub direct_out: AtomicU64,
    /// Bytes written.
    pub bytes_out: AtomicU64,
    /// Frames read.
    pub msgs_in: AtomicU64,
    /// Bytes read.
    pub bytes_in: AtomicU64,
    /// Connections of the lane whose reader ended, however (lost, closed, replaced).
    pub readers_ended: AtomicU64,
    /// Frames discarded (connection lost mid-write, or the peer dropped with frames queued).
    pub dropped: AtomicU64,
    /// Nanoseconds writes waited for the socket to take bytes (its window full).
    pub waited_ns: AtomicU64,
    /// Whether the socket did not take the last write whole at once (it made the writer wait,
    /// or took part of it; a sender's own write counts too): the connection, not the CPU, is
    /// what holds the lane's bytes up.
    pub behind: AtomicBool,
    /// The round trip of the lane's connection in µs, the smallest the kernel measured on it
    /// by the time it was installed (0: not known).
    pub round_trip_us: AtomicU64,
}

/// The connection that serves a lane now.
#[derive(Debug, Clone)]
pub(crate) struct ConnInfo {
    /// Unique id of the connection.
    pub id: u64,
    /// Whether this node dialed it.
    pub dialed_by_me: bool,
    /// Cancelling it closes the connection (reader and writer).
    pub cancel: CancellationToken,
    /// Cancelled when the other end has finished writing (a clean end of stream): the writer
    /// finishes the write in progress, then lets the connection go.
    pub ended: CancellationToken,
}

impl ConnInfo {
    /// A connection's info; `cancel` closes it.
    pub(crate) fn new(id: u64, dialed_by_me: bool, cancel: CancellationToken) -> Self {
        ConnInfo {
            id,
            dialed_by_me,
            cancel,
            ended: CancellationToken::new(),
        }
    }
}

/// Connection state of a lane, guarded by a mutex; see [`Lane::offer_incoming`].
#[derive(Debug, Default)]
pub(crate) struct LaneState {
    /// The live connection, if any.
    pub conn: Option<ConnInfo>,
    /// A dial of ours is in flight.
    pub dialing: bool,
    /// Connections authenticated for it and about to be installed ([`super::peer::Arriving`]).
    pub arriving: usize,
}

/// `n` permits of `sem`, waiting for them when there are not enough. Most sends find room:
/// they take it without the waiting machinery (a waiter's node, its wake-up). Waiters keep
/// their turn: permits given back go to them first, so a sender that does not wait cannot
/// take what a waiting one needs.
async fn acquire(sem: &Arc<Semaphore>, n: u32) -> Result<OwnedSemaphorePermit, AcquireError> {
    match sem.clone().try_acquire_many_owned(n) {
        Ok(permit) => Ok(permit),
        Err(_) => sem.clone().acquire_many_owned(n).await,
    }
}

/// A write half handed to the lane's writer.
pub(crate) struct ConnHandle {
    /// Where frames are written (`None` while the writer lends it to senders, see
    /// [`super::direct`]).
    pub writer: Option<WriteHalf>,
    /// Fires when the connection dies (either half).
    pub cancel: CancellationToken,
    /// Fires when the other end has finished writing (see [`ConnInfo::ended`]).
    pub ended: CancellationToken,
    /// The largest frame the other end accepts (from the handshake).
    pub max_frame: usize,
}

/// Room taken in a lane's queue (and the node's budget) for one frame.
pub(crate) struct Room {
    permit: OwnedSemaphorePermit,
    node_permit: OwnedSemaphorePermit,
}

/// Outcome of an incoming connection offered to a lane.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Offer {
    /// Take it (closing the connection it replaces, if any).
    Accept,
    /// Refuse it: our connection (or dial) wins the tie.
    Reject(&'static str),
}

/// One lane of a peer.
pub(crate) struct Lane {
    /// (channel, index).
    pub id: LaneId,
    /// Counters.
    pub metrics: LaneMetrics,
    /// Connection state.
    pub state: Mutex<LaneState>,
    connected: AtomicBool,
    /// Signalled when a frame is queued while the lane has no connection (a dialer that dials
    /// on demand waits for it).
    demand: Notify,
    /// Raised, and the writer woken, when the gate of a striped frame's commit queued here
    /// opens.
    gate_open: AtomicBool,
    /// Wakes the writer: a gate opened, or a sender's direct write left the rest of its frame.
    gates: Notify,
    /// The write half the idle writer lends to senders of small frames.
    direct: Direct,
    tx: mpsc::UnboundedSender<OutFrame>,
    budget: Arc<Semaphore>,
    capacity: u32,
    node: QueueBudget,
    conn_tx: mpsc::Sender<ConnHandle>,
    /// Where its counts go when it is dropped.
    retired: Arc<Retired>,
    /// The connections its writer lost (pieces of striped frames written on one may not have
    /// arrived: their commits say so).
    losses: Arc<Losses>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        let m = &self.metrics;
        self.retired
            .bytes_out
            .fetch_add(m.bytes_out.load(Ordering::Relaxed), Ordering::Relaxed);
        self.retired
            .bytes_in
            .fetch_add(m.bytes_in.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The receiving ends a lane's writer task owns.
pub(crate) struct LaneTask {
    /// Queued frames.
    pub rx: mpsc::UnboundedReceiver<OutFrame>,
    /// New connections.
    pub conn_rx: mpsc::Receiver<ConnHandle>,
}

impl Lane {
    /// A new, disconnected lane with a queue of `capacity` bytes and no node-wide budget
    /// beyond it.
    #[cfg(test)]
    pub(crate) fn new(id: LaneId, capacity: usize) -> (Arc<Lane>, LaneTask) {
        Lane::with_budget(id, capacity, QueueBudget::new(capacity), Default::default())
    }

    /// A new, disconnected lane with a queue of `capacity` bytes that also draws on the
    /// node-wide `node` budget; its byte counts go to `retired` when it is dropped.
    pub(crate) fn with_budget(
        id: LaneId,
        capacity: usize,
        node: QueueBudget,
        retired: Arc<Retired>,
    ) -> (Arc<Lane>, LaneTask) {
        let capacity = capacity.clamp(1, u32::MAX as usize) as u32;
        // Unbounded in count, bounded in bytes: every frame holds at least one permit.
        let (tx, rx) = mpsc::unbounded_channel();
        let (conn_tx, conn_rx) = mpsc::channel(4);
        let lane = Arc::new(Lane {
            id,
            metrics: LaneMetrics::default(),
            state: Mutex::new(LaneState::default()),
            connected: AtomicBool::new(false),
            demand: Notify::new(),
            gate_open: AtomicBool::new(false),
            gates: Notify::new(),
            direct: Direct::default(),
            tx,
            budget: Arc::new(Semaphore::new(capacity as usize)),
            capacity,
            node,
            conn_tx,
            retired,
            losses: Arc::default(),
        });
        (lane, LaneTask { rx, conn_rx })
    }

    /// Whether a connection serves the lane now.
    pub(crate) fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Whether the lane is connected, or a connection for it is about to be installed: its
    /// dialer waits.
    pub(crate) fn is_served(&self) -> bool {
        self.is_connected()
            || self
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .arriving
                > 0
    }

    /// Whether the lane takes no more frames: its peer was dropped (closed or aborted).
    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Marks the lane (dis)connected.
    pub(crate) fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::Release);
    }

    /// Bytes queued and not yet written.
    pub(crate) fn queued_bytes(&self) -> u64 {
        (self.capacity as u64).saturating_sub(self.budget.available_permits() as u64)
    }

    /// A striped frame's commit queued here may go: wakes the writer.
    pub(crate) fn gate_opened(&self) {
        self.gate_open.store(true, Ordering::Release);
        self.gates.notify_one();
    }

    /// Waits until the lane has a connection or a frame waiting for one.
    pub(crate) async fn wanted(&self) {
        loop {
            let demand = self.demand.notified();
            tokio::pin!(demand);
            demand.as_mut().enable();
            if self.is_connected() || self.queued_bytes() > 0 {
                return;
            }
            demand.await;
        }
    }

    /// Queues a frame, waiting for room (in the lane, then in the node's budget); see
    /// [`Lane::try_enqueue`] for the variant that fails with `Backpressure` instead.
    pub(crate) async fn enqueue(
        &self,
        head: Bytes,
        payload: impl Into<Body>,
        order: Option<u64>,
    ) -> Result<(), SendError> {
        self.enqueue_role(head, payload, order, Role::Whole, true)
            .await
    }

    /// Queues a piece or commit of a striped frame, waiting for room when `wait`, else failing
    /// with `Backpressure`.
    pub(crate) async fn enqueue_role(
        &self,
        head: Bytes,
        payload: impl Into<Body>,
        order: Option<u64>,
        role: Role,
        wait: bool,
    ) -> Result<(), SendError> {
        let payload = payload.into();
        let room = self.reserve(head.len() + payload.len(), wait).await?;
        self.push_reserved(head, payload, order, role, room)
    }

    /// Takes room for a frame of `len` bytes if there is some now (else `Backpressure`, also
    /// when the lane is closed); [`Lane::push_reserved`] queues the frame in it.
    pub(crate) fn try_reserve(&self, len: usize) -> Result<Room, SendError> {
        let (permit, node_permit) = self.try_permits(len)?;
        Ok(Room {
            permit,
            node_permit,
        })
    }

    /// Takes room for a frame of `len` bytes, waiting for it when `wait`, else failing with
    /// `Backpressure`; [`Lane::push_reserved`] queues the frame in it.
    pub(crate) async fn reserve(&self, len: usize, wait: bool) -> Result<Room, SendError> {
        let size = len.clamp(1, self.capacity as usize) as u32;
        let (permit, node_permit) = if wait {
            let closed = |_| SendError::Unreachable(self.id.to_string());
            let permit = acquire(&self.budget, size).await.map_err(closed)?;
            let node_permit = acquire(&self.node.sem, self.node.size(len))
                .await
                .map_err(closed)?;
            (permit, node_permit)
        } else {
            return self.try_reserve(len);
        };
        Ok(Room {
            permit,
            node_permit,
        })
    }

    /// Queues a frame in room taken by [`Lane::reserve`].
    pub(crate) fn push_reserved(
        &self,
        head: Bytes,
        payload: impl Into<Body>,
        order: Option<u64>,
        role: Role,
        room: Room,
    ) -> Result<(), SendError> {
        self.push(
            head,
            payload.into(),
            order,
            role,
            room.permit,
            room.node_permit,
        )
    }

    /// Queues a frame of a few bytes and no payload, a barrier ([`super::widen`]) or a striped
    /// frame's commit ([`super::stripe`]), whatever the room: barriers are queued only when a
    /// channel changes width, and a peer has at most
    /// [`MAX_UNCOMMITTED`](super::stripe::MAX_UNCOMMITTED) commits unwritten, so the queue's
    /// bound is passed by at most that many heads. It takes a byte of room when there is one,
    /// so that a lane dialed on demand connects for it.
    pub(crate) fn push_small(
        &self,
        head: Bytes,
        order: Option<u64>,
        role: Role,
    ) -> Result<(), SendError> {
        let take = |sem: &Arc<Semaphore>| {
            sem.clone()
                .try_acquire_many_owned(1)
                .or_else(|_| sem.clone().try_acquire_many_owned(0))
        };
        match (take(&self.budget), take(&self.node.sem)) {
            (Ok(permit), Ok(node_permit)) => {
                self.push(head, Body::default(), order, role, permit, node_permit)
            }
            _ => Err(SendError::Unreachable(format!("lane {} closed", self.id))),
        }
    }

    fn try_permits(
        &self,
        len: usize,
    ) -> Result<(OwnedSemaphorePermit, OwnedSemaphorePermit), SendError> {
        let size = len.clamp(1, self.capacity as usize) as u32;
        let permit = self
            .budget
            .clone()
            .try_acquire_many_owned(size)
            .map_err(|_| SendError::Backpressure("lane queue"))?;
        let node_permit = self
            .node
            .sem
            .clone()
            .try_acquire_many_owned(self.node.size(len))
            .map_err(|_| SendError::Backpressure("node queue"))?;
        Ok((permit, node_permit))
    }

    /// Queues a frame without waiting; used by protocol traffic that must never block.
    pub(crate) fn try_enqueue(
        &self,
        head: Bytes,
        payload: impl Into<Body>,
        order: Option<u64>,
    ) -> Result<(), SendError> {
        let payload = payload.into();
        let (permit, node_permit) = self.try_permits(head.len() + payload.len())?;
        self.push(head, payload, order, Role::Whole, permit, node_permit)
    }

    fn push(
        &self,
        head: Bytes,
        payload: Body,
        order: Option<u64>,
        role: Role,
        permit: OwnedSemaphorePermit,
        node_permit: OwnedSemaphorePermit,
    ) -> Result<(), SendError> {
        let whole = matches!(role, Role::Whole);
        let queued = |head, payload| {
            self.tx
                .send(OutFrame {
                    head,
                    payload,
                    order,
                    role,
                    permit,
                    node_permit,
                })
                .is_ok()
        };
        match self
            .direct
            .offer(head, payload, whole, std::time::Instant::now, queued)
        {
            Offered::Written(bytes) => {
                self.metrics.msgs_out.fetch_add(1, Ordering::Relaxed);
                self.metrics.direct_out.fetch_add(1, Ordering::Relaxed);
                self.metrics
                    .bytes_out
                    .fetch_add(bytes as u64, Ordering::Relaxed);
                // The socket took the whole frame at once: the lane keeps up.
                self.metrics.behind.store(false, Ordering::Relaxed);
            }
            Offered::Begun(bytes) => {
                self.metrics
                    .bytes_out
                    .fetch_add(bytes as u64, Ordering::Relaxed);
                self.metrics.behind.store(true, Ordering::Relaxed);
                self.gates.notify_one();
            }
            Offered::Queued(false) => {
                return Err(SendError::Unreachable(format!("lane {} closed", self.id)));
            }
            Offered::Queued(true) => {
                if !self.is_connected() {
                    self.demand.notify_one();
                }
            }
        }
        Ok(())
    }

    /// Decides on an authenticated incoming connection (the lane's tie-break rule): with no
    /// connection, accept; while our own dial is in flight, or when the live connection is ours,
    /// the connection dialed by the tie winner survives; a connection the peer dialed before is
    /// replaced (the peer would not dial again unless it lost it).
    pub(crate) fn offer_incoming(&self, peer_wins_tie: bool) -> Offer {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match (&st.conn, st.dialing) {
            (None, false) => Offer::Accept,
            (Some(c), _) if !c.dialed_by_me => Offer::Accept,
            _ if peer_wins_tie => Offer::Accept,
            _ => Offer::Reject("a connection dialed by the tie winner serves this lane"),
        }
    }

    /// Makes `conn` the lane's connection and hands its write half to the writer task, with the
    /// largest frame the other end accepts. Returns the replaced connection's id, if any (it is
    /// closed).
    ///
    /// The dialer's side of the tie-break: a connection this node dialed does not replace a
    /// live one the peer dialed when the peer wins the tie (`peer_wins_tie`); its write half
    /// is handed back (`Err`) to be closed. The peer, whose acceptor took both, keeps its own
    /// too, so both ends keep the same connection.
    pub(crate) fn install(
        &self,
        info: ConnInfo,
        writer: WriteHalf,
        max_frame: usize,
        peer_wins_tie: bool,
    ) -> Result<Option<u64>, WriteHalf> {
        let old = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let theirs = st.conn.as_ref().is_some_and(|c| !c.dialed_by_me);
            if info.dialed_by_me && theirs && peer_wins_tie {
                return Err(writer);
            }
            st.conn.replace(info.clone())
        };
        if let Some(old) = &old {
            old.cancel.cancel();
        }
        self.set_connected(true);
        let handle = ConnHandle {
            writer: Some(writer),
            cancel: info.cancel,
            ended: info.ended,
            max_frame,
        };
        match self.conn_tx.try_send(handle) {
            Ok(()) => {}
            // The writer is gone: the peer was closed while this connection was being set up.
            // This end writes nothing on it: its write side is shut, and its reader goes on
            // until the other end has done the same (or the peer is cut), so that what the
            // other end wrote on it is read.
            Err(mpsc::error::TrySendError::Closed(handle)) => {
                if let Some(mut writer) = handle.writer {
                    tokio::spawn(async move {
                        let _ = writer.shutdown().await;
                    });
                }
            }
            // The writer lags by several connections: this one is closed (its dialer tries
            // again).
            Err(mpsc::error::TrySendError::Full(handle)) => handle.cancel.cancel(),
        }
        Ok(old.map(|o| o.id))
    }

    /// The id of its connection now, if it has one.
    pub(crate) fn conn_id(&self) -> Option<u64> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .conn
            .as_ref()
            .map(|c| c.id)
    }

    /// Clears the connection if it is still `conn_id`; returns whether it was.
    pub(crate) fn clear(&self, conn_id: u64) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.conn.as_ref().map(|c| c.id) == Some(conn_id) {
            st.conn = None;
            self.set_connected(false);
            true
        } else {
            false
        }
    }
}

/// The writer lets its connection go (it cancels it): a loss unless the other end closed it
/// on purpose (then it reads what was written before).
fn let_go(lane: &Lane, c: &ConnHandle) {
    if !c.ended.is_cancelled() {
        lane.losses.lost();
    }
    c.cancel.cancel();
}

/// The writer loop of one lane. Runs until `abort` fires or `close` fires (frames left are
/// written first if the lane has a connection, then the connection is shut down). Frames it
/// ends with unwritten go to `unsent` if there is one, else are dropped and counted. Large
/// frames go in parts, with other frames between them ([`super::schedule`]).
pub(crate) async fn run_writer(
    lane: Arc<Lane>,
    mut task: LaneTask,
    abort: CancellationToken,
    close: CancellationToken,
    unsent: Option<UnsentSink>,
    part_bytes: usize,
    mut widen: Option<Driver>,
) {
    let mut incoming: Vec<OutFrame> = Vec::with_capacity(BATCH_FRAMES);
    let mut schedule = Schedule::new(part_bytes);
    let mut round = Round::default();
    let mut bufs = WriteBufs::default();
    let mut conn: Option<(ConnHandle, Watch)> = None;
    let mut closing = false;
    // Frames in the last write: when it carried several, frames come in bursts and are
    // better written together by this writer than one by one by their senders.
    let mut last_round = 0;
    // The connection's end, the other end's end of writing and the peer's close, as flags.
    let watched = |c: ConnHandle| {
        let watch = Watch::start(Tokens {
            cancel: c.cancel.clone(),
            abort: abort.clone(),
            ended: c.ended.clone(),
            close: close.clone(),
        });
        (c, watch)
    };
    loop {
        let Some((c, watch)) = conn.as_mut() else {
            if closing {
                break;
            }
            // A connection handed over is taken before the close is looked at: the peer is
            // often closed as soon as its connection is up (the overlay wanted it only for a
            // reply), and what was queued for it, that reply and the goodbye, is written first.
            tokio::select! {
                biased;
                _ = abort.cancelled() => break,
                next = task.conn_rx.recv() => match next {
                    Some(c) => conn = Some(watched(c)),
                    None => break,
                },
                _ = close.cancelled() => { closing = true; continue }
            }
            continue;
        };
        // The flags are raised by another task, a moment after the tokens fire: a connection
        // cancelled or ended in that moment must not take another batch (it would be written
        // where nobody reads it), so the tokens themselves are looked at first.
        if c.cancel.is_cancelled() || c.ended.is_cancelled() {
            let_go(&lane, c);
            conn = None;
            schedule.lost(None);
            continue;
        }
        let mask = CANCELLED | ENDED | if closing { 0 } else { CLOSING };
        let raised = if schedule.busy() {
            // Parts to write, or frames let go: what is queued now joins them, without waiting.
            match watch.now(mask) {
                0 => {
                    if let Ok(next) = task.conn_rx.try_recv() {
                        let_go(&lane, c);
                        conn = Some(watched(next));
                        schedule.lost(None);
                        continue;
                    }
                    while incoming.len() < BATCH_FRAMES {
                        match task.rx.try_recv() {
                            Ok(f) => incoming.push(f),
                            Err(_) => break,
                        }
                    }
                    0
                }
                raised => raised,
            }
        } else {
            // Nothing to write: senders of small frames may write them themselves until
            // something wakes this writer ([`super::direct`]).
            let lent = !closing
                && last_round <= 1
                && incoming.is_empty()
                && schedule.is_empty()
                && lane.direct.lend(
                    &mut c.writer,
                    [&c.cancel, &c.ended],
                    INLINE_PAYLOAD.min(part_bytes).min(c.max_frame),
                    widen.as_ref().map(|d| d.due_at(std::time::Instant::now())),
                    || task.rx.is_empty(),
                );
            let woke = tokio::select! {
                biased;
                raised = watch.raised(mask) => Woke::Raised(raised),
                _ = lane.gates.notified() => Woke::Raised(0),
                next = task.conn_rx.recv() => Woke::Conn(next),
                n = task.rx.recv_many(&mut incoming, BATCH_FRAMES) => Woke::Frames(n),
            };
            let rest = if lent {
                lane.direct.reclaim(&mut c.writer)
            } else {
                None
            };
            let mut raised = match woke {
                Woke::Raised(r) => r,
                _ => 0,
            };
            if let Some(rest) = rest {
                if raised & (CANCELLED | ENDED) != 0 || matches!(woke, Woke::Conn(_)) {
                    // It goes with its connection, as a frame cut mid-write does.
                    lane.metrics.dropped.fetch_add(1, Ordering::Relaxed);
                } else if let Err(e) = write_rest(c, watch, rest, &lane.metrics).await {
                    tracing::debug!(lane = %lane.id, error = %e, "lane write failed");
                    lane.metrics.dropped.fetch_add(1, Ordering::Relaxed);
                    raised |= CANCELLED;
                }
            }
            match woke {
                Woke::Conn(next) => {
                    let_go(&lane, c);
                    conn = next.map(watched);
                    schedule.lost(None);
                    continue;
                }
                Woke::Frames(0) => {
                    // Closed and drained: this end is done writing. The reader goes on
                    // until the other end is done too (or the peer is cut), so that what
                    // it still sends, replies among it, is read.
                    if raised & CANCELLED != 0 {
                        let_go(&lane, c);
                    } else if let Some(w) = c.writer.as_mut() {
                        let _ = w.shutdown().await;
                    }
                    conn = None;
                    break;
                }
                _ => raised,
            }
        };
        if raised & (CANCELLED | ENDED) != 0 {
            // Cancelled: replaced, failed, or the peer aborted (then the wait above ends the
            // loop). Ended: the other end stopped writing, it is closing this connection; what
            // was written before is read, the frames still queued wait for another connection
            // (or go another way if the peer is dropped).
            let_go(&lane, c);
            conn = None;
            schedule.lost(None);
            continue;
        } else if raised != 0 {
            closing = true;
            task.rx.close();
            continue;
        }
        // A write to a peer that stopped reading may never finish: the connection's end
        // (replaced, or the peer dropped) must still end it, or the write half would keep the
        // socket open with the peer's unread data in it.
        let ConnHandle {
            writer, max_frame, ..
        } = c;
        let Some(writer) = writer.as_mut() else {
            // Never: the write half is lent only while the writer waits.
            let_go(&lane, c);
            conn = None;
            schedule.lost(None);
            continue;
        };
        drop_too_large(&lane, &mut incoming, *max_frame);
        let opened = lane.gate_open.swap(false, Ordering::AcqRel);
        schedule.fill(&mut incoming, &mut round, opened);
        if round.is_empty() {
            continue;
        }
        let n = round.frames.len() as u64;
        let written = tokio::select! {
            biased;
            r = write_round(writer, &round, &mut bufs, &lane.metrics) => r,
            _ = watch.raised(CANCELLED) => {
                Err(std::io::Error::other("connection closed or peer dropped"))
            }
        };
        match written {
            Ok(bytes) => {
                last_round = round.frames.len();
                for f in round.frames.iter_mut() {
                    f.written(&lane.losses);
                }
                let done = schedule.written(&round).map_or(0, |_| 1);
                lane.metrics.msgs_out.fetch_add(n + done, Ordering::Relaxed);
                lane.metrics
                    .bytes_out
                    .fetch_add(bytes as u64, Ordering::Relaxed);
                if let Some(d) = widen.as_mut() {
                    d.after_write(std::time::Instant::now());
                }
            }
            Err(e) => {
                tracing::debug!(lane = %lane.id, error = %e, "lane write failed");
                let lost = schedule.lost(Some(&round)).map_or(0, |_| 1);
                lane.metrics.dropped.fetch_add(n + lost, Ordering::Relaxed);
                // A failed write is a loss even after an orderly close began: what was written
                // before it may not have been read.
                lane.losses.lost();
                c.cancel.cancel();
                conn = None;
            }
        }
        round.clear();
    }
    task.rx.close();
    let mut left = schedule.take_all();
    left.append(&mut incoming);
    while let Ok(f) = task.rx.try_recv() {
        left.push(f);
    }
    // Pieces and commits of striped frames make sense to this peer only.
    let before = left.len();
    left.retain(|f| !f.is_peer_only());
    lane.metrics
        .dropped
        .fetch_add((before - left.len()) as u64, Ordering::Relaxed);
    let n = left.len() as u64;
    if n > 0 {
        let handed = unsent.is_some_and(|sink| {
            let frames = Unsent {
                peer: sink.peer,
                slot: sink.slot,
                frames: left,
            };
            sink.tx.try_send(frames).is_ok()
        });
        if !handed {
            tracing::debug!(lane = %lane.id, frames = n, "unwritten frames dropped");
            lane.metrics.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }
    if let Some((c, _)) = conn {
        c.cancel.cancel();
    }
    lane.set_connected(false);
}

/// What woke an idle writer.
enum Woke {
    /// Flags of its connection or peer (none: a gate opened, or a sender left a rest).
    Raised(u8),
    /// A new connection (or the end of new ones).
    Conn(Option<ConnHandle>),
    /// That many frames queued (none: the queue is closed and drained).
    Frames(usize),
}

/// Writes the rest of a frame a sender began on this connection ([`super::direct`]), unless
/// the connection ends first.
async fn write_rest(
    c: &mut ConnHandle,
    watch: &mut Watch,
    mut rest: Rest,
    metrics: &LaneMetrics,
) -> std::io::Result<()> {
    let Some(w) = c.writer.as_mut() else {
        return Err(std::io::Error::other("no write half"));
    };
    let bytes: usize = rest.chunks.iter().map(Bytes::len).sum();
    tokio::select! {
        biased;
        r = write_all_vectored(w, &mut rest.chunks, metrics, None) => r?,
        _ = watch.raised(CANCELLED) => {
            return Err(std::io::Error::other("connection closed or peer dropped"));
        }
    }
    metrics.msgs_out.fetch_add(1, Ordering::Relaxed);
    metrics.bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
    Ok(())
}

/// Drops (and counts) the frames larger than the other end accepts: frames queued before its
/// handshake told this node its limit. Sends after it fail at the sender instead (`TooLarge`).
fn drop_too_large(lane: &Lane, batch: &mut Vec<OutFrame>, max_frame: usize) {
    let before = batch.len();
    // The frame's length field counts everything after itself.
    batch.retain(|f| f.head.len().saturating_sub(4) + f.payload.len() <= max_frame);
    let dropped = before - batch.len();
    if dropped > 0 {
        lane.metrics
            .dropped
            .fetch_add(dropped as u64, Ordering::Relaxed);
        tracing::warn!(
            lane = %lane.id,
            dropped,
            max_frame,
            "frames larger than the peer accepts dropped (queued before its limit was known)"
        );
    }
}

/// The buffers a lane's writer keeps from one write to the next: the list of chunks, and
/// the block small frames are copied into (reclaimed once the write that used it is done);
/// and how the writer paces its writes.
#[derive(Default)]
struct WriteBufs {
    chunks: Vec<Bytes>,
    small: BytesMut,
    pace: Pace,
}

/// How a lane's writer shares its thread ([`YIELD_AFTER`]).
struct Pace {
    /// Bytes written since the writer last let other tasks run.
    unyielded: usize,
    /// Whether the socket took the whole of the last write at once. While it keeps up, a
    /// call hands it at most [`YIELD_AFTER`] bytes; one that makes the writer wait (a window
    /// that is full) gets all it will take in one call: cut into quanta there, a connection
    /// at 20 ms carried about a tenth fewer 8 MiB messages, for up to a quarter more CPU
    /// each. (A lane whose round trip is [`UNPACED_ROUND_TRIP_US`] or more is not paced.)
    keeps_up: bool,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            unyielded: 0,
            keeps_up: true,
        }
    }
}

/// Writes a round (whole frames, then a part) with as few syscalls as possible; returns the
/// bytes written.
async fn write_round<W: AsyncWrite + Unpin>(
    w: &mut W,
    round: &Round,
    bufs: &mut WriteBufs,
    metrics: &LaneMetrics,
) -> std::io::Result<usize> {
    let WriteBufs {
        chunks,
        small,
        pace,
    } = bufs;
    chunks.clear();
    let mut total = 0;
    // Only a round with large buffers (payloads or parts) is paced: one of small frames is at
    // most `BATCH_FRAMES` of them, and pacing it cost a one-way stream of 1 KiB messages 5 to
    // 20 % of its rate. Nor is a lane of long round trips (`UNPACED_ROUND_TRIP_US`).
    let mut large = false;
    let pieces = round
        .frames
        .iter()
        .flat_map(|f| std::iter::once(&f.head).chain(f.payload.bufs()))
        .chain(round.part.iter());
    for b in pieces {
        total += b.len();
        if b.len() <= INLINE_PAYLOAD {
            small.extend_from_slice(b);
        } else {
            large = true;
            if !small.is_empty() {
                chunks.push(small.split().freeze());
            }
            chunks.push(b.clone());
        }
    }
    if !small.is_empty() {
        chunks.push(small.split().freeze());
    }
    let paced = large && metrics.round_trip_us.load(Ordering::Relaxed) < UNPACED_ROUND_TRIP_US;
    let pace = if paced { Some(pace) } else { None };
    let written = write_all_vectored(w, chunks, metrics, pace).await;
    // The chunks go, so the block they shared is this writer's alone again and is reused.
    chunks.clear();
    written?;
    // TLS keeps the records it could not hand to the socket yet; they must go now, not with
    // the next batch (plain TCP has nothing to flush).
    w.flush().await?;
    Ok(total)
}

/// Writes all of `chunks`, paced by `pace` if there is one: then at most [`YIELD_AFTER`] bytes
/// a call while the socket keeps up (up to a quarter more when that finishes the write),
/// letting the other tasks run each time that many have been written since the writer last
/// did. The time spent waiting for the socket to take bytes (a write that did not complete at
/// once) is added to the lane's `waited_ns`, and whether the last call was taken whole at
/// once is its `behind`.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    chunks: &mut [Bytes],
    metrics: &LaneMetrics,
    mut pace: Option<&mut Pace>,
) -> std::io::Result<()> {
    let mut first = 0;
    // Bytes still to write.
    let mut left: usize = chunks.iter().map(Bytes::len).sum();
    while first < chunks.len() {
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
        let mut n = 0;
        // A short rest goes with the quantum: cut off, it would be a call (and a packet) of
        // its own, as the head of a frame just over a quantum would.
        let quantum = pace
            .as_ref()
            .is_some_and(|p| p.keeps_up && left > YIELD_AFTER + YIELD_AFTER / 4);
        let mut room = if quantum { YIELD_AFTER } else { usize::MAX };
        let mut offered = 0;
        for (slot, c) in slices.iter_mut().zip(&chunks[first..]) {
            let take = c.len().min(room);
            *slot = IoSlice::new(&c[..take]);
            n += 1;
            offered += take;
            room -= take;
            if room == 0 {
                break;
            }
        }
        let write = w.write_vectored(&slices[..n]);
        tokio::pin!(write);
        let mut at_once = true;
        let mut n = match futures::poll!(write.as_mut()) {
            std::task::Poll::Ready(r) => r?,
            std::task::Poll::Pending => {
                at_once = false;
                let since = std::time::Instant::now();
                let r = write.await;
                let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
                metrics.waited_ns.fetch_add(ns, Ordering::Relaxed);
                r?
            }
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        left = left.saturating_sub(n);
        metrics
            .behind
            .store(!(at_once && n == offered), Ordering::Relaxed);
        let mut yields = false;
        if let Some(p) = pace.as_deref_mut() {
            p.keeps_up = at_once && n == offered;
            p.unyielded += n;
            if p.unyielded >= YIELD_AFTER {
                p.unyielded = 0;
                yields = true;
            }
        }
        while n > 0 && first < chunks.len() {
            let len = chunks[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                chunks[first].advance(n);
                n = 0;
            }
        }
        if yields {
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// Frames for the tests of the lane and its schedule.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A frame of a 6-byte head and `len` bytes of payload (at least one) whose first byte
    /// is `id`, with order key `order`; it holds permits of a semaphore of its own.
    pub(crate) fn frame(id: u8, order: Option<u64>, len: usize) -> OutFrame {
        let sem = Arc::new(Semaphore::new(2));
        let mut payload = vec![0u8; len.max(1)];
        payload[0] = id;
        OutFrame {
            head: Bytes::from_static(&[0, 0, 0, 0, 0, 0]),
            payload: Bytes::from(payload).into(),
            order,
            role: Role::Whole,
            permit: sem.clone().try_acquire_owned().expect("a fresh semaphore"),
            node_permit: sem.try_acquire_owned().expect("a fresh semaphore"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::PART_BYTES;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A socket that takes at most `takes` bytes a call (all it is handed if `None`) at once,
    /// after making the first `waits` calls wait, and keeps them, and what each call offered
    /// and it took.
    #[derive(Default)]
    struct Socket {
        takes: Option<usize>,
        waits: usize,
        data: Vec<u8>,
        calls: Vec<(usize, usize)>,
    }

    impl AsyncWrite for Socket {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            if self.waits > 0 {
                self.waits -= 1;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let offered = bufs.iter().map(|b| b.len()).sum();
            let mut left = self.takes.unwrap_or(usize::MAX).min(offered);
            let taken = left;
            for b in bufs {
                let n = b.len().min(left);
                self.data.extend_from_slice(&b[..n]);
                left -= n;
            }
            self.calls.push((offered, taken));
            Poll::Ready(Ok(taken))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// Writes 8 MiB of large payloads between small frames (as a round of the writer hands
    /// them) to `socket`; returns the bytes in order and how often the write let other tasks
    /// run (answered `Pending` with the socket still taking bytes).
    /// The bytes offered, the turns the writer gave the other tasks, and whether the lane was
    /// left `behind`.
    fn write_paced(socket: &mut Socket) -> (Vec<u8>, usize, bool) {
        let mut chunks = Vec::new();
        let mut expected = Vec::new();
        for i in 0..8u8 {
            let small = Bytes::from(vec![i; 100]);
            let large = Bytes::from(vec![i.wrapping_add(100); PART_BYTES]);
            expected.extend_from_slice(&small);
            expected.extend_from_slice(&large);
            chunks.push(small);
            chunks.push(large);
        }
        let waited = LaneMetrics::default();
        let mut pace = Pace::default();
        let write = write_all_vectored(socket, &mut chunks, &waited, Some(&mut pace));
        let (written, yields) = poll_counting(write);
        written.expect("the socket takes every byte");
        (expected, yields, waited.behind.load(Ordering::Relaxed))
    }

    /// Polls `f` to its end with a waker that does nothing; returns its output and how often
    /// it answered `Pending` (here: let the other tasks run, as the sockets never make it wait).
    fn poll_counting<F: Future>(f: F) -> (F::Output, usize) {
        let mut f = Box::pin(f);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut pending = 0;
        loop {
            match f.as_mut().poll(&mut cx) {
                Poll::Pending => pending += 1,
                Poll::Ready(out) => return (out, pending),
            }
        }
    }

    #[test]
    fn only_rounds_with_large_buffers_over_short_round_trips_are_paced() {
        // 600 frames of 1 KiB, about 600 KiB: one call, and the writer goes on.
        let mut round = Round::default();
        for i in 0..600 {
            round.frames.push(testing::frame(i as u8, None, 1024));
        }
        let waited = LaneMetrics::default();
        let mut bufs = WriteBufs::default();
        let mut socket = Socket::default();
        let (written, yields) = poll_counting(write_round(&mut socket, &round, &mut bufs, &waited));
        let small = written.expect("written");
        assert_eq!((socket.calls.len(), yields), (1, 0));
        // The same frames and a part of 1 MiB: in quanta, letting the others run.
        round.part.push(Bytes::from(vec![7u8; PART_BYTES]));
        let mut socket = Socket::default();
        let (written, yields) = poll_counting(write_round(&mut socket, &round, &mut bufs, &waited));
        assert_eq!(written.expect("written"), small + PART_BYTES);
        assert_eq!(socket.data.len(), small + PART_BYTES);
        assert!(socket.calls.len() > 1, "{:?}", socket.calls);
        assert_eq!(yields, (small + PART_BYTES) / YIELD_AFTER);
        // Over a long round trip, in one call and without a yield.
        waited
            .round_trip_us
            .store(UNPACED_ROUND_TRIP_US, Ordering::Relaxed);
        let mut socket = Socket::default();
        let (written, yields) = poll_counting(write_round(&mut socket, &round, &mut bufs, &waited));
        assert_eq!(written.expect("written"), small + PART_BYTES);
        assert_eq!((socket.calls.len(), yields), (1, 0));
        // Just under it, paced again.
        waited
            .round_trip_us
            .store(UNPACED_ROUND_TRIP_US - 1, Ordering::Relaxed);
        let mut socket = Socket::default();
        let (_, yields) = poll_counting(write_round(&mut socket, &round, &mut bufs, &waited));
        assert_eq!(yields, (small + PART_BYTES) / YIELD_AFTER);
    }

    #[test]
    fn a_writer_over_a_socket_that_keeps_up_lets_other_tasks_run() {
        let mut socket = Socket::default();
        let (expected, yields, behind) = write_paced(&mut socket);
        assert_eq!(socket.data, expected, "every byte, in order");
        assert!(!behind, "every call was taken whole at once");
        assert!(
            socket
                .calls
                .iter()
                .all(|&(offered, _)| offered <= YIELD_AFTER + YIELD_AFTER / 4),
            "at most a quantum and a short rest a call: {:?}",
            socket.calls
        );
        assert_eq!(yields, expected.len() / YIELD_AFTER);
    }

    #[test]
    fn a_socket_that_falls_behind_is_offered_all_at_once() {
        let mut socket = Socket {
            takes: Some(64 * 1024),
            ..Socket::default()
        };
        let (expected, yields, _) = write_paced(&mut socket);
        assert_eq!(socket.data, expected, "every byte, in order");
        // The first call is a quantum; the socket took less, so the next offers all the rest.
        assert_eq!(socket.calls[0], (YIELD_AFTER, 64 * 1024));
        assert_eq!(socket.calls[1].0, expected.len() - 64 * 1024);
        // The writer still lets the others run after each quantum written.
        assert_eq!(yields, expected.len() / YIELD_AFTER);
    }

    /// A lane is `behind` after a write its socket made wait or took in part, and no longer
    /// after one it took whole at once.
    #[test]
    fn a_lane_is_behind_while_its_socket_makes_writes_wait() {
        let metrics = LaneMetrics::default();
        let write = |socket: &mut Socket| {
            let mut chunks = vec![Bytes::from(vec![1u8; 1000])];
            let (r, _) = poll_counting(write_all_vectored(socket, &mut chunks, &metrics, None));
            r.expect("written");
            metrics.behind.load(Ordering::Relaxed)
        };
        let waits = |waits, takes| Socket {
            waits,
            takes,
            ..Socket::default()
        };
        assert!(write(&mut waits(1, None)), "made to wait");
        assert!(!write(&mut waits(0, None)), "taken at once");
        // Taken in part, the rest at once: the last call was whole.
        assert!(!write(&mut waits(0, Some(600))));
    }

    #[tokio::test]
    async fn queue_is_bounded_in_bytes() {
        let (lane, _task) = Lane::new(LaneId::new("default", 0), 1024);
        lane.try_enqueue(
            Bytes::from_static(b"hd"),
            Bytes::from(vec![0u8; 1000]),
            None,
        )
        .unwrap();
        assert_eq!(lane.queued_bytes(), 1002);
        let err = lane.try_enqueue(Bytes::from_static(b"hd"), Bytes::from(vec![0u8; 100]), None);
        assert_eq!(err, Err(SendError::Backpressure("lane queue")));
        // A frame larger than the whole queue still goes once the queue is empty.
        let (big, _t) = Lane::new(LaneId::new("default", 0), 1024);
        big.try_enqueue(Bytes::new(), Bytes::from(vec![0u8; 4096]), None)
            .unwrap();
        assert_eq!(big.queued_bytes(), 1024);
    }

    #[tokio::test]
    async fn a_barrier_goes_whatever_the_room_and_asks_for_a_connection() {
        let (lane, mut task) = Lane::new(LaneId::new("default", 1), 1024);
        // An idle lane without a connection waits to be wanted; a barrier wants it.
        use futures::FutureExt;
        assert!(
            lane.wanted().now_or_never().is_none(),
            "nothing queued: not wanted"
        );
        lane.push_small(Bytes::from_static(b"barrier"), None, Role::Barrier)
            .unwrap();
        assert!(lane.wanted().now_or_never().is_some());
        assert_eq!(lane.queued_bytes(), 1, "a byte of room taken");
        // A full queue still takes it.
        lane.try_enqueue(Bytes::new(), Bytes::from(vec![0u8; 1023]), None)
            .unwrap();
        lane.push_small(Bytes::from_static(b"barrier"), None, Role::Barrier)
            .unwrap();
        let mut roles = Vec::new();
        while let Ok(f) = task.rx.try_recv() {
            roles.push(matches!(f.role, Role::Barrier));
        }
        assert_eq!(roles, vec![true, false, true]);
    }

    #[tokio::test]
    async fn lanes_share_the_node_budget() {
        let node = QueueBudget::new(1500);
        let retired = Arc::new(Retired::default());
        let (a, _ta) = Lane::with_budget(
            LaneId::new("default", 0),
            1024,
            node.clone(),
            retired.clone(),
        );
        let (b, _tb) = Lane::with_budget(LaneId::new("default", 1), 1024, node.clone(), retired);
        a.try_enqueue(Bytes::new(), Bytes::from(vec![0u8; 1000]), None)
            .unwrap();
        assert_eq!(node.queued_bytes(), 1000);
        // Room in lane b, not in the node.
        let err = b.try_enqueue(Bytes::new(), Bytes::from(vec![0u8; 600]), None);
        assert_eq!(err, Err(SendError::Backpressure("node queue")));
        assert_eq!(b.queued_bytes(), 0, "the lane's permits went back");
        b.try_enqueue(Bytes::new(), Bytes::from(vec![0u8; 500]), None)
            .unwrap();
        assert_eq!(node.queued_bytes(), 1500);
        // A waiting send waits for the node's room.
        let waiting = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            b.enqueue(Bytes::new(), Bytes::from(vec![0u8; 10]), None),
        )
        .await;
        assert!(waiting.is_err(), "waits while the node budget is spent");
        drop(_ta);
        drop(a);
        drop(_tb);
        drop(b);
        assert_eq!(
            node.queued_bytes(),
            0,
            "dropped frames give their bytes back"
        );
    }

    #[test]
    fn tie_break_rules() {
        let (lane, _task) = Lane::new(LaneId::new("default", 0), 1024);
        assert_eq!(lane.offer_incoming(false), Offer::Accept);
        lane.state.lock().unwrap().dialing = true;
        assert!(matches!(lane.offer_incoming(false), Offer::Reject(_)));
        assert_eq!(lane.offer_incoming(true), Offer::Accept);
        let mut st = lane.state.lock().unwrap();
        st.dialing = false;
        st.conn = Some(ConnInfo::new(1, false, CancellationToken::new()));
        drop(st);
        assert_eq!(lane.offer_incoming(false), Offer::Accept);
        lane.state
            .lock()
            .unwrap()
            .conn
            .as_mut()
            .unwrap()
            .dialed_by_me = true;
        assert!(matches!(lane.offer_incoming(false), Offer::Reject(_)));
        assert_eq!(lane.offer_incoming(true), Offer::Accept);
    }

    /// The dialer's side: its own connection replaces a live one the peer dialed only when
    /// it wins the tie.
    #[tokio::test]
    async fn a_dialed_connection_yields_to_the_tie_winners() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let write_half = || async {
            let c = tokio::net::TcpStream::connect(addr).await.unwrap();
            let _ = listener.accept().await.unwrap();
            WriteHalf::from(c.into_split().1)
        };
        let (lane, _task) = Lane::new(LaneId::new("default", 0), 1024);
        let conn = |id, mine| ConnInfo::new(id, mine, CancellationToken::new());
        let theirs = conn(1, false);
        assert_eq!(
            lane.install(theirs.clone(), write_half().await, 100, true)
                .ok(),
            Some(None)
        );
        // Ours, the peer winning: theirs stays.
        assert!(lane
            .install(conn(2, true), write_half().await, 100, true)
            .is_err());
        assert!(!theirs.cancel.is_cancelled());
        assert_eq!(
            lane.state.lock().unwrap().conn.as_ref().map(|c| c.id),
            Some(1)
        );
        // Ours, this node winning: ours replaces theirs.
        let replaced = lane.install(conn(3, true), write_half().await, 100, false);
        assert_eq!(replaced.ok(), Some(Some(1)));
        assert!(theirs.cancel.is_cancelled());
        // A connection the peer dialed replaces one of ours (the acceptor already decided).
        let replaced = lane.install(conn(4, false), write_half().await, 100, true);
        assert_eq!(replaced.ok(), Some(Some(3)));
    }

    /// A frame queued before the peer's handshake said it takes less is dropped and counted by
    /// the writer, and the frames behind it still go out.
    #[tokio::test]
    async fn frames_larger_than_the_peer_takes_are_dropped_by_the_writer() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let (_read_half, write_half) = client.into_split();
        let (lane, task) = Lane::new(LaneId::new("default", 0), 1 << 20);
        // Queued while the lane is down: one frame of 2 + 1,000 bytes, one of 2 + 10.
        let head = |len: usize| Bytes::from([&(len as u32).to_be_bytes()[..], b"hd"].concat());
        lane.try_enqueue(head(1002), Bytes::from(vec![1u8; 1000]), None)
            .unwrap();
        lane.try_enqueue(head(12), Bytes::from(vec![2u8; 10]), None)
            .unwrap();
        let writer = tokio::spawn(run_writer(
            lane.clone(),
            task,
            CancellationToken::new(),
            CancellationToken::new(),
            None,
            PART_BYTES,
            None,
        ));
        let info = ConnInfo::new(1, true, CancellationToken::new());
        assert!(lane.install(info, write_half.into(), 100, false).is_ok());
        let mut got = [0u8; 16];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..6], &[0, 0, 0, 12, b'h', b'd']);
        assert_eq!(&got[6..], &[2u8; 10]);
        // Counted before the write began, so before the bytes above arrived.
        assert_eq!(lane.metrics.dropped.load(Ordering::Relaxed), 1);
        writer.abort();
    }

    /// A lane closed while it has no connection hands its frames, in order and with their
    /// queue permits, to its sink; without a sink they are dropped and counted. A frame queued
    /// while disconnected is the demand an on-demand dialer waits for.
    #[tokio::test]
    async fn frames_left_unwritten_go_to_the_sink() {
        let node = NodeId::new("b", ([127, 0, 0, 1], 1).into(), 1);
        let (tx, mut rx) = mpsc::channel(4);
        let (lane, task) = Lane::new(LaneId::new("default", 0), 1 << 20);
        let wanted = tokio::spawn({
            let lane = lane.clone();
            async move { lane.wanted().await }
        });
        tokio::task::yield_now().await;
        assert!(!wanted.is_finished(), "nothing queued, nothing connected");
        for i in 0..3u8 {
            lane.try_enqueue(Bytes::from(vec![i]), Bytes::new(), None)
                .unwrap();
        }
        wanted.await.unwrap();
        let close = CancellationToken::new();
        let sink = UnsentSink {
            peer: node.clone(),
            slot: 2,
            tx,
        };
        let writer = tokio::spawn(run_writer(
            lane.clone(),
            task,
            CancellationToken::new(),
            close.clone(),
            Some(sink),
            PART_BYTES,
            None,
        ));
        close.cancel();
        writer.await.unwrap();
        let unsent = rx.recv().await.unwrap();
        assert_eq!((&unsent.peer, unsent.slot), (&node, 2));
        let heads: Vec<u8> = unsent.frames.iter().map(|f| f.head[0]).collect();
        assert_eq!(heads, [0, 1, 2]);
        assert_eq!(
            lane.queued_bytes(),
            3,
            "the frames still hold their permits"
        );
        drop(unsent);
        assert_eq!(lane.queued_bytes(), 0);
        assert_eq!(lane.metrics.dropped.load(Ordering::Relaxed), 0);

        let (lane, task) = Lane::new(LaneId::new("default", 0), 1 << 20);
        lane.try_enqueue(Bytes::from_static(b"x"), Bytes::new(), None)
            .unwrap();
        let abort = CancellationToken::new();
        abort.cancel();
        run_writer(
            lane.clone(),
            task,
            abort,
            CancellationToken::new(),
            None,
            PART_BYTES,
            None,
        )
        .await;
        assert_eq!(lane.metrics.dropped.load(Ordering::Relaxed), 1);
    }

    /// A peer closed the moment its connection is up (the overlay wanted it only to send a
    /// reply) gets what was queued for it before the close, then the end of the stream: the
    /// writer takes the connection handed to it before it looks at the close. Both wake it at
    /// once; with no order between them, half the rounds ended without writing.
    #[tokio::test]
    async fn a_lane_closed_as_it_connects_writes_its_frames_first() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        for round in 0..20 {
            let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (mut server, _) = listener.accept().await.unwrap();
            let (_read_half, write_half) = client.into_split();
            let (lane, task) = Lane::new(LaneId::new("membership", 0), 1 << 20);
            let close = CancellationToken::new();
            let writer = tokio::spawn(run_writer(
                lane.clone(),
                task,
                CancellationToken::new(),
                close.clone(),
                None,
                PART_BYTES,
                None,
            ));
            // The writer waits for a connection.
            tokio::task::yield_now().await;
            lane.try_enqueue(Bytes::from_static(b"reply"), Bytes::new(), None)
                .unwrap();
            let info = ConnInfo::new(1, true, CancellationToken::new());
            assert!(lane.install(info, write_half.into(), 100, false).is_ok());
            close.cancel();
            writer.await.unwrap();
            let mut got = Vec::new();
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                server.read_to_end(&mut got),
            )
            .await;
            assert!(read.is_ok(), "round {round}: the stream was not ended");
            assert_eq!(got, b"reply", "round {round}");
            assert_eq!(lane.metrics.dropped.load(Ordering::Relaxed), 0);
        }
    }

    /// A connection that ends while its writer is blocked in a write (the peer stopped
    /// reading) ends the write too: the socket closes instead of holding the peer's data.
    /// The frame being written, in parts, waits for the next connection.
    #[tokio::test]
    async fn a_closed_connection_ends_a_blocked_write() {
        use tokio::io::AsyncReadExt;
        const BIG: usize = 32 << 20;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let (read_half, write_half) = client.into_split();
        let (lane, task) = Lane::new(LaneId::new("default", 0), 1 << 20);
        let cancel = CancellationToken::new();
        let info = ConnInfo::new(1, true, cancel.clone());
        assert!(lane
            .install(info, write_half.into(), usize::MAX, false)
            .is_ok());
        let writer = tokio::spawn(run_writer(
            lane.clone(),
            task,
            CancellationToken::new(),
            CancellationToken::new(),
            None,
            PART_BYTES,
            None,
        ));
        lane.try_enqueue(Bytes::from_static(b"hd"), Bytes::from(vec![1u8; BIG]), None)
            .unwrap();
        // The write has begun once the first byte arrives; the rest cannot fit in the
        // socket buffers while nobody reads.
        let mut first = [0u8; 1];
        server.read_exact(&mut first).await.unwrap();
        cancel.cancel();
        drop(read_half);
        let mut got = 1usize;
        let mut buf = vec![0u8; 1 << 16];
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                match server.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "the socket stayed open");
        assert!(
            got < BIG,
            "the whole frame was written after the connection ended"
        );
        // The frame went in parts and its last part was never written: the other end has
        // only part of it, so it is kept, and goes whole on the next connection.
        assert_eq!(lane.metrics.dropped.load(Ordering::Relaxed), 0);
        let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let (_read_half, write_half) = client.into_split();
        let info = ConnInfo::new(2, true, CancellationToken::new());
        assert!(lane
            .install(info, write_half.into(), usize::MAX, false)
            .is_ok());
        let mut again = 0usize;
        let whole = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while again < BIG + 2 {
                match server.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => again += n,
                }
            }
        })
        .await;
        assert!(whole.is_ok() && again >= BIG + 2, "{again} bytes again");
        assert_eq!(lane.metrics.dropped.load(Ordering::Relaxed), 0);
        drop(lane);
        writer.abort();
    }
}
