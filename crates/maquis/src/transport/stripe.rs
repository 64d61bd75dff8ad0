//! Large frames striped over a channel's lanes: the sender's pieces and commits, and the
//! receiver's table (the wire and the table's rules: [`maquis_proto::wire::stripes`]).
//!
//! The sender ([`send`]) queues each piece on the least loaded of the channel's other lanes
//! that its spread takes (as many as the round trip and the bytes written ask for), then the
//! frame's commit on the lane its order key takes among those carrying the channel's small
//! frames (its *ordering lane*; both: see [`super::widen`]), where it holds the
//! place of its order key (the lane's [`super::schedule`] keeps it, and the frames of its key
//! behind it, until its [`Gate`] opens). Every piece carries a [`PartGuard`]: written, or
//! dropped unwritten, it tells the gate; when all have, the gate opens and the ordering lane's
//! writer is woken to write the commit (`ok: false` if a piece was dropped, so the receiver
//! drops the frame). The commit comes last so that a change of width never falls between a
//! commit and its pieces the wrong way: the receiver's ordering lane cannot pass a barrier
//! before the commit ahead of it is handed on, and would wait for ever for pieces queued
//! behind the same barrier on another lane (whose reader stops there).
//! At most [`MAX_UNCOMMITTED`] striped frames per peer have their commit unwritten, and at
//! most [`WINDOW`] frames and the bytes the receiver allows (its
//! `transport.stripe_window_bytes`) are out, numbered below the limit the receiver
//! last announced (its
//! [window](maquis_proto::wire::stripes#the-window)); more senders wait (or get
//! `Backpressure`).
//!
//! The receiver ([`StripesIn`]) keeps the pieces per peer, every one that arrives (the window
//! bounds them), each in its place in its frame's memory (the lanes' readers read them there,
//! [`PeerRooms`]), and announces the window as frames are handed on ([`announce`]) and on every
//! heartbeat tick ([`StripesIn::tick`]). A reader whose commit's pieces are not all in waits
//! for the table to change, for its connection to end, or at most the heartbeat timeout.
//!
//! A lost connection loses the pieces in flight on it, not those still queued for it (they go
//! on its successor): each lane's writer counts the connections it loses ([`Losses`]), a piece
//! written notes the count, and a commit written after the count moved says `ok: false`; the
//! reader of a lost connection tells the table which piece it was in the middle of
//! ([`StripesIn::lane_lost`]; the table's rules:
//! [losses](maquis_proto::wire::stripes#losses)). When the receiver makes a new table (it
//! dropped this node, which kept it), the frames numbered for the old one none of whose pieces
//! has gone to be written are numbered again for the new one ([`StripesOut::grant`]): a
//! piece's head is encoded anew as it starts ([`PartGuard::start`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::{Bytes, BytesMut};
use maquis_proto::wire::{
    encode_head, lane_bit, Assembled, Body, CommitOutcome, Header, PartOutcome, PieceRooms,
    PiecesOn, StripeLimits, Stripes, Tick, Window, WireError,
};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::lane::Lane;
use super::peer::Peer;
use super::widen::{LanePlace, Place};
use crate::counters::Counters;
use crate::error::SendError;

/// Striped frames per peer whose commit is not written yet; more wait.
pub(crate) const MAX_UNCOMMITTED: usize = 16;
/// Striped frames per peer sent and not yet handed on or dropped by the receiver; more wait
/// for it to announce a larger window.
pub(crate) const WINDOW: u64 = 4096;

/// What a queued frame is to striping and to the lanes' width ([`super::widen`]).
#[derive(Default)]
pub(crate) enum Role {
    /// A frame of its own.
    #[default]
    Whole,
    /// A barrier across the lanes carrying a channel's small frames: written after every frame
    /// queued before it and before every frame queued after it.
    Barrier,
    /// A piece of a striped frame.
    Part(PartGuard),
    /// The commit of a striped frame: written when its gate opens. Held until then, its
    /// permit counts among the peer's uncommitted frames.
    Commit {
        /// Opens when the pieces are out.
        gate: Arc<Gate>,
        /// Given back when the commit is written or dropped.
        _permit: OwnedSemaphorePermit,
    },
}

/// Opens when every piece of a striped frame has been written or dropped.
pub(crate) struct Gate {
    /// Its number; changed while no piece has started, when the receiver made a new table.
    ids: Mutex<Numbered>,
    /// The frame's bytes.
    total: u64,
    /// Pieces not yet written or dropped, plus one held by the sender until it has queued
    /// them all.
    left: AtomicUsize,
    failed: AtomicBool,
    hold: Option<u64>,
    /// The lane of the commit, woken when the gate opens (set once the commit is queued,
    /// before the gate can open).
    lane: OnceLock<Arc<Lane>>,
    /// The lanes its pieces were written on, and how many connections each had lost then:
    /// if one has lost another since, the piece may not have arrived.
    written_on: Mutex<Vec<(Arc<Losses>, u64)>>,
    /// The lanes its pieces were queued on ([`lane_bit`] of their indices), for its commit:
    /// the receiver drops a frame whose commit waits when one of them loses a connection.
    lanes: AtomicU64,
}

/// The connections a lane has lost, not closed on purpose (counted by its writer): what was
/// written on a connection that is then lost may not have arrived. A connection closed on
/// purpose loses nothing (its other end reads what was written before the close).
#[derive(Debug, Default)]
pub(crate) struct Losses(AtomicU64);

impl Losses {
    /// How many so far.
    pub(crate) fn count(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// One more: the writer let its connection go without an orderly close.
    pub(crate) fn lost(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// What a striped frame is numbered for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Numbered {
    /// The receiver's table.
    session: u64,
    /// The frame's id in it.
    id: u64,
    /// A piece has gone to be written: the number holds from then on.
    started: bool,
}

impl Gate {
    fn numbered(&self) -> std::sync::MutexGuard<'_, Numbered> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The receiver made a new table: the frame is numbered `next` in it (`None`: its window
    /// has no room) if no piece has started; otherwise (its pieces went for the old table,
    /// which the receiver no longer has), or without room, it fails.
    fn renumber(&self, next: impl FnOnce(u64) -> Option<(u64, u64)>) {
        let mut n = self.numbered();
        let renumbered = if n.started { None } else { next(self.total) };
        match renumbered {
            Some((session, id)) => {
                n.session = session;
                n.id = id;
            }
            None => self.failed.store(true, Ordering::Release),
        }
    }

    /// Whether every piece has been written or dropped.
    pub(crate) fn is_open(&self) -> bool {
        self.left.load(Ordering::Acquire) == 0
    }

    fn piece_done(&self, written: bool) {
        if !written {
            self.failed.store(true, Ordering::Release);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(lane) = self.lane.get() {
                lane.gate_opened();
            }
        }
    }

    /// Whether a piece was dropped unwritten, or written on a connection lost since.
    fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
            || self
                .written_on
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|(losses, then)| losses.count() != *then)
    }

    /// The commit's frame head, once the gate is open: `ok` unless a piece was dropped, or
    /// written on a connection that was lost before the commit was written.
    pub(crate) fn commit_head(&self) -> Bytes {
        let n = *self.numbered();
        let header = Header::Commit {
            session: n.session,
            id: n.id,
            ok: !self.failed(),
            hold: self.hold,
            lanes: self.lanes.load(Ordering::Acquire),
        };
        let mut buf = BytesMut::with_capacity(32);
        // A commit is a few integers and no payload: it always encodes.
        let _ = encode_head(&header, 0, usize::MAX, &mut buf);
        buf.freeze()
    }
}

/// A piece's hold on its gate: released as written by [`PartGuard::written`], else as dropped
/// when the piece is dropped unwritten.
pub(crate) struct PartGuard {
    gate: Arc<Gate>,
    written: bool,
    /// The piece: where it lies in the frame, its length, and the frame's head it carries
    /// (the first piece only), to number its head again.
    offset: u64,
    len: usize,
    inner: Bytes,
    /// The session and id its head was encoded with.
    encoded: (u64, u64),
}

/// A piece's frame head: its [`Header::Stripe`] and what it carries of the frame's head.
fn piece_head(
    numbered: (u64, u64),
    offset: u64,
    total: u64,
    len: usize,
    inner: &Bytes,
) -> Result<Bytes, WireError> {
    let header = Header::Stripe {
        session: numbered.0,
        id: numbered.1,
        offset,
        total,
    };
    let mut h = BytesMut::with_capacity(32 + inner.len());
    encode_head(&header, len, usize::MAX, &mut h)?;
    h.extend_from_slice(inner);
    Ok(h.freeze())
}

impl PartGuard {
    /// The piece goes to be written: its frame's number holds from now on. Its head anew if
    /// the frame was numbered again since it was encoded.
    pub(crate) fn start(&mut self) -> Option<Bytes> {
        let mut n = self.gate.numbered();
        n.started = true;
        let now = (n.session, n.id);
        drop(n);
        if now == self.encoded {
            return None;
        }
        // The same integers as before, other values: it encodes as it did.
        let head = piece_head(now, self.offset, self.gate.total, self.len, &self.inner).ok()?;
        self.encoded = now;
        Some(head)
    }

    /// The piece went out whole, on a connection of the lane whose losses are `on`.
    pub(crate) fn written(&mut self, on: &Arc<Losses>) {
        self.written = true;
        self.gate
            .written_on
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((on.clone(), on.count()));
    }
}

impl Drop for PartGuard {
    fn drop(&mut self) {
        self.gate.piece_done(self.written);
    }
}

/// Where a sender is in its peer's window.
#[derive(Default)]
struct OutWindow {
    /// The receiver's table, once it has announced it.
    session: Option<u64>,
    /// The next frame's id.
    next: u64,
    /// Ids below this may be sent.
    limit: u64,
    /// The frames from the announced `low` on may hold this many bytes.
    bytes: u64,
    /// The frames sent from the announced `low` on: id and length.
    out: VecDeque<(u64, u64)>,
    /// Their lengths together.
    out_bytes: u64,
    /// The connections of the peer's first lane, still up, on which the receiver announced
    /// this table's window (a few at most: two while a tie between dials is settled). With
    /// none, frames go whole and none is numbered: after a lost connection the receiver may
    /// have a new table (it dropped this node, which kept it) until it says which.
    heard_on: Vec<u64>,
    /// The connections of the peer's first lane so far (see [`StripesOut::connected`]).
    conns: u64,
    /// The gates of the frames numbered, oldest first, while they live (until their commit
    /// and pieces are written or dropped: a few more than [`MAX_UNCOMMITTED`]).
    gates: Vec<std::sync::Weak<Gate>>,
}

impl OutWindow {
    /// Takes the next id for a frame of `total` bytes, if the window has been heard on a
    /// connection still up and has room for it.
    fn take(&mut self, total: u64) -> Option<(u64, u64)> {
        if self.heard_on.is_empty() {
            return None;
        }
        self.number(total)
    }

    /// Takes the next id for a frame of `total` bytes, if the window has room for it.
    fn number(&mut self, total: u64) -> Option<(u64, u64)> {
        let session = self.session?;
        let fits = self.out_bytes.saturating_add(total) <= self.bytes;
        if self.next >= self.limit || !fits {
            return None;
        }
        let id = self.next;
        self.next += 1;
        self.out.push_back((id, total));
        self.out_bytes += total;
        Some((session, id))
    }

    /// The receiver has handed on or dropped every frame below `low`.
    fn release(&mut self, low: u64) {
        while let Some(&(id, total)) = self.out.front() {
            if id >= low {
                break;
            }
            self.out.pop_front();
            self.out_bytes -= total;
        }
    }
}

/// The sender's striping state for one peer.
pub(crate) struct StripesOut {
    window: Mutex<OutWindow>,
    /// Woken when the window grows.
    granted: Notify,
    /// Cancelled when the peer is dropped: senders waiting for the window give up.
    closed: CancellationToken,
    uncommitted: Arc<Semaphore>,
    turn: AtomicUsize,
}

impl StripesOut {
    /// The state for a peer whose dropping cancels `closed`.
    pub(crate) fn new(closed: CancellationToken) -> Self {
        StripesOut {
            window: Mutex::default(),
            granted: Notify::new(),
            closed,
            uncommitted: Arc::new(Semaphore::new(MAX_UNCOMMITTED)),
            turn: AtomicUsize::new(0),
        }
    }

    fn window(&self) -> std::sync::MutexGuard<'_, OutWindow> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a frame of `len` bytes may be striped: once the receiver has announced its
    /// window on the peer's current connection (until then frames go whole), and if it is not
    /// larger than the window's bytes.
    pub(crate) fn fits(&self, len: usize) -> bool {
        let w = self.window();
        w.session.is_some() && !w.heard_on.is_empty() && (len as u64) < w.bytes
    }

    /// The peer's first lane has a new connection (the peer announces its window on it as it
    /// starts): its number, for [`StripesOut::grant`] and [`StripesOut::lost`].
    pub(crate) fn connected(&self) -> u64 {
        let mut w = self.window();
        w.conns += 1;
        w.conns
    }

    /// The connection numbered `conn` of the peer's first lane is lost: if no other
    /// connection still up brought the window, frames go whole until the peer announces it on
    /// the next.
    pub(crate) fn lost(&self, conn: u64) {
        self.window().heard_on.retain(|&c| c != conn);
    }

    /// The bytes of striped frames the receiver lets this node have out (its window's), once it
    /// has announced them on a connection of its first lane that is still up.
    pub(crate) fn window_bytes(&self) -> Option<u64> {
        let w = self.window();
        w.session
            .filter(|_| !w.heard_on.is_empty())
            .map(|_| w.bytes)
    }

    /// The receiver announced its window ([`Header::StripeWindow`]) on the connection
    /// numbered `conn` of its first lane (`None`: on another lane, which tells nothing of the
    /// connection): a smaller limit than before (late, or repeated) changes nothing; a new
    /// session (the receiver made a new table, or this is the first) starts the numbering
    /// again at its `low`, with the frames numbered for the old table none of whose pieces has
    /// started (the others fail).
    pub(crate) fn grant(&self, window: Window, conn: Option<u64>) {
        let mut w = self.window();
        let grew = if w.session == Some(window.session) {
            let before = (w.limit, w.out_bytes, w.heard_on.len());
            w.limit = w.limit.max(window.limit);
            w.release(window.low);
            if let Some(c) = conn.filter(|c| !w.heard_on.contains(c)) {
                w.heard_on.push(c);
            }
            (w.limit, w.out_bytes, w.heard_on.len()) != before
        } else {
            let gates = std::mem::take(&mut w.gates);
            *w = OutWindow {
                session: Some(window.session),
                next: window.low,
                limit: window.limit,
                bytes: window.bytes,
                out: VecDeque::new(),
                out_bytes: 0,
                heard_on: conn.into_iter().collect(),
                conns: w.conns,
                gates: Vec::with_capacity(gates.len()),
            };
            // The frames numbered for the old table none of whose pieces has started are
            // numbered for the new one, in their order; the others fail.
            for gate in gates.iter().filter_map(std::sync::Weak::upgrade) {
                gate.renumber(|total| w.number(total));
                w.gates.push(Arc::downgrade(&gate));
            }
            true
        };
        drop(w);
        if grew {
            self.granted.notify_waiters();
        }
    }

    /// The session and id of the next frame, of `total` bytes, once the window has room for
    /// it (`Backpressure` without `wait`).
    #[cfg(test)]
    async fn take_id(&self, total: usize, wait: bool) -> Result<(u64, u64), SendError> {
        let gate = self.open_gate(total, None, wait).await?;
        let n = *gate.numbered();
        Ok((n.session, n.id))
    }

    /// The gate of the next frame, of `total` bytes, if the window has room for it now.
    fn number_gate(&self, total: u64, hold: Option<u64>) -> Option<Arc<Gate>> {
        let mut w = self.window();
        let (session, id) = w.take(total)?;
        let gate = Arc::new(Gate {
            ids: Mutex::new(Numbered {
                session,
                id,
                started: false,
            }),
            total,
            // One for the sender until it has queued the pieces (they add theirs).
            left: AtomicUsize::new(1),
            failed: AtomicBool::new(false),
            hold,
            lane: OnceLock::new(),
            written_on: Mutex::default(),
            lanes: AtomicU64::new(0),
        });
        w.gates.retain(|g| g.strong_count() > 0);
        w.gates.push(Arc::downgrade(&gate));
        Some(gate)
    }

    /// The gate of the next frame, of `total` bytes, numbered once the window has room for
    /// it (`Backpressure` without `wait`); with the hold key `hold` on its commit. Numbered
    /// again if the receiver makes a new table before a piece has started.
    async fn open_gate(
        &self,
        total: usize,
        hold: Option<u64>,
        wait: bool,
    ) -> Result<Arc<Gate>, SendError> {
        loop {
            let granted = self.granted.notified();
            tokio::pin!(granted);
            granted.as_mut().enable();
            if let Some(gate) = self.number_gate(total as u64, hold) {
                return Ok(gate);
            }
            if !wait {
                return Err(SendError::Backpressure("striped frames"));
            }
            tokio::select! {
                _ = granted => {}
                _ = self.closed.cancelled() => {
                    return Err(SendError::Unreachable("peer closed".into()));
                }
            }
        }
    }
}

/// Sends the frame `head` + `payload` striped: its commit at `ordering` with order key
/// `order` and hold key `hold` ([`maquis_proto::wire::hold_key`] of its header), its pieces of
/// at most `piece` bytes over `data` (over the first [`Widen::spread`](super::widen::Widen::spread)
/// of them, as it is when each piece is queued, when `ordering` is a widening channel's).
/// Waits for room when `wait`, else
/// fails with `Backpressure` (pieces already queued are then dropped, and so is the frame).
pub(crate) async fn send(
    out: &StripesOut,
    ordering: Place<'_>,
    data: &[Arc<Lane>],
    frame: (Bytes, Body),
    keys: (u64, Option<u64>),
    piece: usize,
    wait: bool,
) -> Result<(), SendError> {
    let (head, payload) = frame;
    let (order, hold) = keys;
    // The lanes a piece may take, looked at as it is queued: a sender that waited for room
    // takes the spread as it is by then.
    let widen = match ordering {
        Place::Widened { widen, .. } => Some(widen),
        Place::Lane(_) => None,
    };
    let spread = || match widen {
        Some(widen) => &data[..widen.spread().min(data.len())],
        None => data,
    };
    let permit = if wait {
        out.uncommitted
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| SendError::Unreachable("peer closed".into()))?
    } else {
        out.uncommitted
            .clone()
            .try_acquire_owned()
            .map_err(|_| SendError::Backpressure("striped frames"))?
    };
    let total = head.len() + payload.len();
    let gate = out.open_gate(total, hold, wait).await?;
    let piece = piece.max(head.len() + 1);
    let n = total.div_ceil(piece);
    // One hold per piece besides the sender's own: the gate cannot open before every piece
    // is queued.
    gate.left.fetch_add(n, Ordering::AcqRel);
    // From here on the frame has its number: its commit goes out however this ends.
    let mut commit = Committer {
        ordering,
        order,
        gate: gate.clone(),
        permit: Some(permit),
        mine: Some(PartGuard {
            gate: gate.clone(),
            written: true,
            offset: 0,
            len: 0,
            inner: Bytes::new(),
            encoded: (0, 0),
        }),
        unqueued: n,
    };
    let mut sent = Ok(());
    for i in 0..n {
        let start = i * piece;
        let end = (start + piece).min(total);
        // The first piece carries the frame's head; the others are slices of its payload.
        let (inner, body) = if start == 0 {
            (head.clone(), payload.slice(0..end - head.len()))
        } else {
            (
                Bytes::new(),
                payload.slice(start - head.len()..end - head.len()),
            )
        };
        let numbered = {
            let n = gate.numbered();
            (n.session, n.id)
        };
        let Ok(h) = piece_head(numbered, start as u64, total as u64, end - start, &inner) else {
            sent = Err(SendError::TooLarge {
                len: end - start,
                max: piece,
            });
            break;
        };
        let guard = PartGuard {
            gate: gate.clone(),
            written: false,
            offset: start as u64,
            len: end - start,
            inner,
            encoded: numbered,
        };
        commit.unqueued -= 1;
        let lane = least_loaded(out, spread());
        gate.lanes
            .fetch_or(lane_bit(lane.id.index), Ordering::AcqRel);
        if let Err(e) = lane
            .enqueue_role(h, body, None, Role::Part(guard), wait)
            .await
        {
            sent = Err(e);
            break;
        }
    }
    commit.queue()?;
    sent
}

/// The commit of a numbered striped frame, queued once its sender is done with the pieces, or
/// when the sending is dropped part-way (a caller's timeout, a `select!`, a call whose quorum
/// came first): the receiver hands on its frames in the order of their numbers, so an id
/// that never got its commit would hold its window, and every striped frame to the peer after
/// it, for good.
struct Committer<'a> {
    ordering: Place<'a>,
    order: u64,
    gate: Arc<Gate>,
    /// Bounds the frames whose commits are unwritten; the commit holds it.
    permit: Option<OwnedSemaphorePermit>,
    /// The sender's own hold on the gate, given up once the commit is queued.
    mine: Option<PartGuard>,
    /// Pieces not handed to a lane: dropped when the commit goes, which then says so.
    unqueued: usize,
}

impl Committer<'_> {
    /// Queues the commit (at most once) after every piece queued, whatever the room (its
    /// permit bounds them): a barrier queued before it is then queued before its pieces too.
    fn queue(&mut self) -> Result<(), SendError> {
        let Some(permit) = self.permit.take() else {
            return Ok(());
        };
        for _ in 0..std::mem::take(&mut self.unqueued) {
            self.gate.piece_done(false);
        }
        let commit = Role::Commit {
            gate: self.gate.clone(),
            _permit: permit,
        };
        let queued = self.ordering.push_small(Bytes::new(), self.order, commit);
        if let Ok(lane) = &queued {
            // Before the sender's hold goes: the gate cannot open before it knows its lane.
            let _ = self.gate.lane.set(Arc::clone(lane));
        }
        self.mine = None;
        queued.map(|_| ())
    }
}

impl Drop for Committer<'_> {
    fn drop(&mut self) {
        // Only a lane closed with its peer refuses it; the frame goes with the peer then.
        let _ = self.queue();
    }
}

/// The data lane with the fewest bytes queued, looking from a turn that moves on each time
/// (ties go round).
fn least_loaded<'a>(out: &StripesOut, data: &'a [Arc<Lane>]) -> &'a Arc<Lane> {
    let start = out.turn.fetch_add(1, Ordering::Relaxed);
    let n = data.len();
    (0..n)
        .map(|i| &data[(start + i) % n])
        .min_by_key(|l| l.queued_bytes())
        .expect("a striped channel has data lanes")
}

/// The receiver's striping state for one peer: the table, and the wake-ups of the readers
/// waiting on it (a generation that moves with every change that may let one go on).
pub(crate) struct StripesIn {
    table: Mutex<Stripes>,
    generation: AtomicU64,
    changed: Notify,
}

/// What a commit tried now came to.
pub(crate) enum Tried {
    /// The frame's pieces, end to end in its memory, to be handed on.
    Ready(Assembled),
    /// The frame was dropped (its sender lost a piece, or a connection was lost).
    Dropped,
    /// Pieces are missing: try again once the table has changed.
    Pending,
}

impl StripesIn {
    /// A table for frames of at most `max_frame` bytes, holding at most `bytes` of them open
    /// (at least twice `max_frame`, so that any frame fits; the configuration checks it), of a
    /// session picked at random.
    pub(crate) fn new(max_frame: usize, bytes: usize) -> Self {
        let limits = StripeLimits {
            max_frame,
            window: WINDOW,
            bytes: bytes.max(max_frame.saturating_mul(2)),
        };
        StripesIn {
            table: Mutex::new(Stripes::new(limits, rand::random())),
            generation: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }
    fn table(&self) -> std::sync::MutexGuard<'_, Stripes> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// The table's generation now: read it before trying, then wait with
    /// [`StripesIn::changed_since`].
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Returns once the table has changed since generation `seen`.
    pub(crate) async fn changed_since(&self, seen: u64) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.generation() != seen {
                return;
            }
            changed.await;
        }
    }

    /// Room for a piece to be read into (see [`Stripes::lend`]).
    pub(crate) fn lend(
        &self,
        session: u64,
        id: u64,
        offset: u64,
        total: u64,
        len: usize,
    ) -> Result<Option<BytesMut>, WireError> {
        self.table().lend(session, id, offset, total, len)
    }

    /// Takes back the room lent for a piece, filled (see [`Stripes::placed`]).
    pub(crate) fn placed(
        &self,
        session: u64,
        id: u64,
        offset: u64,
        room: BytesMut,
    ) -> Result<(), WireError> {
        let out = self.table().placed(session, id, offset, room)?;
        if out == PartOutcome::Complete {
            self.bump();
        }
        Ok(())
    }

    /// Takes in a piece (the window bounds what a sender may have open: it never waits).
    pub(crate) fn part(
        &self,
        session: u64,
        id: u64,
        offset: u64,
        total: u64,
        piece: Bytes,
    ) -> Result<(), WireError> {
        let out = self.table().part(session, id, offset, total, piece)?;
        if out == PartOutcome::Complete {
            self.bump();
        }
        Ok(())
    }

    /// Tries a commit now (see [`Tried`]); its pieces were queued where `on` says.
    pub(crate) fn try_commit(
        &self,
        session: u64,
        id: u64,
        ok: bool,
        on: PiecesOn,
    ) -> Result<Tried, WireError> {
        let out = self.table().commit(session, id, ok, on)?;
        Ok(match out {
            CommitOutcome::Deliver(a) => Tried::Ready(a),
            CommitOutcome::Dropped => Tried::Dropped,
            CommitOutcome::Pending => Tried::Pending,
        })
    }

    /// The wait for frame `id`'s pieces is over: it is dropped.
    pub(crate) fn give_up(&self, id: u64) {
        self.table().give_up(id);
        tracing::debug!(id, "striped frame dropped: its pieces did not come");
    }

    /// A connection of the peer ended without an orderly close, its reader in the middle of
    /// the piece `reading` (session and id), if it was: that frame is dropped, and if its lane
    /// (`place`) is one of a channel of several (where pieces and commits travel), so are the
    /// frames whose commits wait for pieces and name that lane of that channel
    /// ([`Stripes::lane_lost`]). They are counted when their commits are taken in.
    pub(crate) fn lane_lost(&self, reading: Option<(u64, u64)>, place: LanePlace) {
        let mut table = self.table();
        if let Some((session, id)) = reading {
            table.piece_lost(session, id);
        }
        if place.parallelism > 1 {
            table.lane_lost(place.channel, place.index);
        }
        drop(table);
        self.bump();
    }

    /// The window, when it has moved enough to be announced.
    pub(crate) fn take_window(&self) -> Option<Window> {
        self.table().take_window()
    }

    /// The window now (announced when the peer's membership lane connects).
    pub(crate) fn window(&self) -> Window {
        self.table().window()
    }

    /// A heartbeat tick at `now_us`: drops a frame that has held the window for
    /// `patience_us` after a lost connection (see [`Stripes::tick`]); returns whether one with
    /// pieces was (a dropped frame to count), and the window to announce again (an
    /// announcement may have been dropped or lost) on the ticks after it moved.
    pub(crate) fn tick(&self, now_us: u64, patience_us: u64) -> Tick {
        let tick = self.table().tick(now_us, patience_us);
        if tick.dropped {
            self.bump();
        }
        tick
    }
}

/// A peer's table as the place one lane's decoder puts the pieces it reads
/// ([`FrameDecoder::pieces_into`](crate::wire::frame::FrameDecoder::pieces_into)), one per
/// connection: it keeps the piece being read, whose frame is lost if the connection is.
pub(crate) struct PeerRooms {
    peer: Arc<Peer>,
    /// The session and id of the frame whose piece is being read into its room.
    reading: Mutex<Option<(u64, u64)>>,
}

impl PeerRooms {
    /// The rooms of `peer`'s frames, for one connection's reader.
    pub(crate) fn new(peer: Arc<Peer>) -> Self {
        PeerRooms {
            peer,
            reading: Mutex::new(None),
        }
    }

    /// The frame whose piece is being read now, if one is.
    pub(crate) fn reading(&self) -> Option<(u64, u64)> {
        *self.reading.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_reading(&self, now: Option<(u64, u64)>) {
        *self.reading.lock().unwrap_or_else(|e| e.into_inner()) = now;
    }
}

impl std::fmt::Debug for PeerRooms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PeerRooms")
            .field(&self.peer.id.name)
            .finish()
    }
}

impl PieceRooms for PeerRooms {
    fn lend(
        &self,
        session: u64,
        id: u64,
        offset: u64,
        total: u64,
        len: usize,
    ) -> Result<Option<BytesMut>, WireError> {
        let room = self.peer.stripes_in.lend(session, id, offset, total, len)?;
        if room.is_some() {
            self.set_reading(Some((session, id)));
        }
        Ok(room)
    }

    fn filled(&self, session: u64, id: u64, offset: u64, room: BytesMut) -> Result<(), WireError> {
        self.set_reading(None);
        self.peer.stripes_in.placed(session, id, offset, room)
    }
}

/// Announces `window` to `peer` on its lane `slot`, without waiting: an announcement that
/// finds no room is dropped and counted (`control_drops`), and the next heartbeat ticks
/// announce it again.
pub(crate) fn announce(peer: &Peer, slot: usize, window: Window, counters: &Counters) {
    let mut head = BytesMut::with_capacity(32);
    // A few integers and no payload: it always encodes.
    let _ = encode_head(&window.header(), 0, usize::MAX, &mut head);
    if peer.lanes[slot]
        .try_enqueue(head.freeze(), Bytes::new(), None)
        .is_err()
    {
        counters.control_drops.inc();
    }
}

/// Gates and commits for the tests of the lane's schedule.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A gate of `pieces` pieces for the ordering lane `lane`, and the pieces' guards.
    pub(crate) fn gate(id: u64, pieces: usize, lane: &Arc<Lane>) -> (Arc<Gate>, Vec<PartGuard>) {
        let gate = Arc::new(Gate {
            ids: Mutex::new(Numbered {
                session: 0,
                id,
                started: false,
            }),
            total: 100 * pieces as u64,
            left: AtomicUsize::new(pieces),
            failed: AtomicBool::new(false),
            hold: None,
            lane: OnceLock::from(lane.clone()),
            written_on: Mutex::default(),
            lanes: AtomicU64::new(0),
        });
        let guards = (0..pieces)
            .map(|i| PartGuard {
                gate: gate.clone(),
                written: false,
                offset: 100 * i as u64,
                len: 100,
                inner: Bytes::new(),
                encoded: (0, id),
            })
            .collect();
        (gate, guards)
    }

    /// The commit role of `gate`.
    pub(crate) fn commit(gate: &Arc<Gate>) -> Role {
        let permit = Arc::new(Semaphore::new(1))
            .try_acquire_owned()
            .expect("a fresh semaphore");
        Role::Commit {
            gate: gate.clone(),
            _permit: permit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use maquis_proto::wire::{encode_frame, ActorHeader, Dest};
    use std::time::Duration;

    fn frame(n: usize) -> Bytes {
        let header = Header::Actor(ActorHeader::Send {
            to: Dest::Id(3),
            incarnation: 0,
            call: None,
            ty: 0,
        });
        let bytes = encode_frame(&header, &vec![7u8; n], usize::MAX).unwrap();
        Bytes::from(bytes.to_vec())
    }

    /// Waits for a commit as an ordering lane's reader does: tries, and waits for the table
    /// to change, up to `patience`.
    async fn commit(
        s: &StripesIn,
        id: u64,
        patience: Duration,
    ) -> Option<crate::wire::frame::Frame> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let seen = s.generation();
            match s
                .try_commit(
                    s.window().session,
                    id,
                    true,
                    PiecesOn {
                        channel: 0,
                        lanes: u64::MAX,
                    },
                )
                .unwrap()
            {
                Tried::Ready(a) => return Some(a.into_frame().unwrap()),
                Tried::Dropped => return None,
                Tried::Pending => {}
            }
            tokio::select! {
                _ = s.changed_since(seen) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    s.give_up(id);
                    return None;
                }
            }
        }
    }

    /// A change of width while a striped frame's pieces wait for room: the commit goes on
    /// its ordering lane after the barrier, as the pieces do on theirs (a commit ahead of a
    /// barrier whose pieces are behind one would hold up the receiver's lanes).
    #[tokio::test]
    async fn a_barrier_never_falls_between_a_commit_and_its_pieces() {
        use super::super::widen::Widen;
        use crate::id::LaneId;
        let lanes: Vec<_> = (0..2)
            .map(|i| Lane::new(LaneId::new("default", i), 100))
            .collect();
        let (lanes, mut tasks): (Vec<_>, Vec<_>) = lanes.into_iter().unzip();
        for l in &lanes {
            l.try_enqueue(Bytes::new(), Bytes::from(vec![0u8; 80]), Some(1))
                .unwrap();
        }
        let widen = Widen::new(2);
        let out = StripesOut::new(CancellationToken::new());
        out.grant(window(1, 0, WINDOW), Some(1));
        let place = Place::Widened {
            widen: &widen,
            lanes: &lanes,
        };
        let mut sending = Box::pin(send(
            &out,
            place,
            &lanes,
            (
                Bytes::from_static(b"head"),
                Body::from(Bytes::from(vec![0u8; 90])),
            ),
            (0, None),
            50,
            true,
        ));
        assert!(futures::poll!(sending.as_mut()).is_pending(), "no room");
        widen.switch(&lanes, 2);
        let mut roles: Vec<Vec<&str>> = vec![Vec::new(), Vec::new()];
        let mut drain = |tasks: &mut Vec<super::super::lane::LaneTask>| {
            for (t, seen) in tasks.iter_mut().zip(&mut roles) {
                while let Ok(f) = t.rx.try_recv() {
                    seen.push(match f.role {
                        Role::Whole => "whole",
                        Role::Barrier => "barrier",
                        Role::Part(_) => "piece",
                        Role::Commit { .. } => "commit",
                    });
                }
            }
        };
        // Taking the queued frames gives their room back (the pieces take the first lane,
        // the channel's spread being one lane here: room for one piece at a time).
        loop {
            drain(&mut tasks);
            if let std::task::Poll::Ready(sent) = futures::poll!(sending.as_mut()) {
                sent.unwrap();
                break;
            }
        }
        drain(&mut tasks);
        let at = |lane: &[&str], role| lane.iter().position(|r| *r == role);
        assert_eq!(roles[0][..2], ["whole", "barrier"]);
        assert_eq!(roles[1][..2], ["whole", "barrier"]);
        assert!(
            at(&roles[0], "commit") > at(&roles[0], "barrier"),
            "{roles:?}"
        );
        assert_eq!(
            roles.iter().flatten().filter(|r| **r == "piece").count(),
            2,
            "{roles:?}"
        );
    }

    /// A sending dropped while a piece waits for room (a caller's timeout) still queues its
    /// frame's commit, saying the frame failed: the receiver's window moves past its number
    /// instead of waiting for that commit for ever, and the commit's permit comes back.
    #[tokio::test]
    async fn a_sending_dropped_part_way_still_commits_its_number() {
        use crate::id::LaneId;
        use maquis_proto::wire::decode_head;
        let (lanes, mut tasks): (Vec<_>, Vec<_>) = (0..2)
            .map(|i| Lane::new(LaneId::new("default", i), 100))
            .unzip();
        lanes[1]
            .try_enqueue(Bytes::new(), Bytes::from(vec![0u8; 80]), None)
            .unwrap();
        let out = StripesOut::new(CancellationToken::new());
        out.grant(window(1, 0, WINDOW), Some(1));
        let mut sending = Box::pin(send(
            &out,
            Place::Lane(&lanes[0]),
            &lanes[1..],
            (
                Bytes::from_static(b"head"),
                Body::from(Bytes::from(vec![0u8; 96])),
            ),
            (0, None),
            50,
            true,
        ));
        assert!(futures::poll!(sending.as_mut()).is_pending(), "no room");
        assert_eq!(out.uncommitted.available_permits(), MAX_UNCOMMITTED - 1);
        drop(sending);
        let mut commits = Vec::new();
        while let Ok(f) = tasks[0].rx.try_recv() {
            if let Role::Commit { gate, .. } = &f.role {
                assert!(gate.is_open(), "no piece is left to wait for");
                commits.push(decode_head(&gate.commit_head()).unwrap());
            }
        }
        match commits[..] {
            [Header::Commit { id, ok, .. }] => assert_eq!((id, ok), (0, false)),
            _ => panic!("one commit for frame 0 on the ordering lane: {commits:?}"),
        }
        // The commit taken off the queue gave its permit back.
        assert_eq!(out.uncommitted.available_permits(), MAX_UNCOMMITTED);
        // The piece never queued: only the frame that filled the data lane is there.
        assert_eq!(pieces_queued(&mut tasks), [0; 4]);
    }

    /// A channel of four lanes of 1 MiB each, their tasks, and a sender's striping state
    /// with a window of `WINDOW` frames.
    fn four_lanes() -> (
        Vec<Arc<Lane>>,
        Vec<super::super::lane::LaneTask>,
        StripesOut,
    ) {
        use crate::id::LaneId;
        let (lanes, tasks) = (0..4)
            .map(|i| Lane::new(LaneId::new("default", i), 1 << 20))
            .unzip();
        let out = StripesOut::new(CancellationToken::new());
        out.grant(window(1, 0, WINDOW), Some(1));
        (lanes, tasks, out)
    }

    /// Sends a frame of six pieces of 100 bytes at `place`, its pieces over `lanes[1..]`.
    fn send_six_pieces<'a>(
        out: &'a StripesOut,
        place: Place<'a>,
        lanes: &'a [Arc<Lane>],
        wait: bool,
    ) -> impl std::future::Future<Output = Result<(), SendError>> + 'a {
        send(
            out,
            place,
            &lanes[1..],
            (
                Bytes::from_static(b"head"),
                Body::from(Bytes::from(vec![0u8; 596])),
            ),
            (0, None),
            100,
            wait,
        )
    }

    /// The pieces queued on each lane since the last look (taken off the queues).
    fn pieces_queued(tasks: &mut [super::super::lane::LaneTask]) -> [usize; 4] {
        let mut on = [0; 4];
        for (i, t) in tasks.iter_mut().enumerate() {
            while let Ok(f) = t.rx.try_recv() {
                if let Role::Part(_) = f.role {
                    on[i] += 1;
                }
            }
        }
        on
    }

    /// A commit names the lanes its frame's pieces were queued on (for the receiver, which
    /// drops a frame whose commit waits only when one of those loses a connection).
    #[tokio::test]
    async fn a_commit_names_the_lanes_of_its_pieces() {
        use maquis_proto::wire::decode_head;
        let (lanes, mut tasks, out) = four_lanes();
        // Two pieces of 100 bytes, over lanes 2 and 3 (the least loaded, in turn).
        send(
            &out,
            Place::Lane(&lanes[0]),
            &lanes[2..],
            (
                Bytes::from_static(b"head"),
                Body::from(Bytes::from(vec![0u8; 196])),
            ),
            (0, None),
            100,
            false,
        )
        .await
        .unwrap();
        let mut pieces_on = 0;
        let mut gate = None;
        for (i, t) in tasks.iter_mut().enumerate() {
            while let Ok(f) = t.rx.try_recv() {
                match &f.role {
                    Role::Part(_) => pieces_on |= lane_bit(i as u16),
                    Role::Commit { gate: g, .. } => gate = Some(g.clone()),
                    _ => {}
                }
            }
        }
        assert_eq!(pieces_on, lane_bit(2) | lane_bit(3));
        // The pieces were taken (dropped unwritten): the gate is open.
        let gate = gate.expect("a commit on lane 0");
        match decode_head(&gate.commit_head()).unwrap() {
            Header::Commit { lanes, ok, .. } => assert_eq!((lanes, ok), (pieces_on, false)),
            other => panic!("not a commit: {other:?}"),
        }
    }

    /// A widening channel's pieces go on the first lanes of its spread only.
    #[tokio::test]
    async fn pieces_keep_to_the_spread() {
        use super::super::widen::Widen;
        use futures::FutureExt;
        let (lanes, mut tasks, out) = four_lanes();
        let widen = Widen::new(4);
        let mut pieces_on = |spread: usize| {
            widen.set_spread(spread);
            let place = Place::Widened {
                widen: &widen,
                lanes: &lanes,
            };
            send_six_pieces(&out, place, &lanes, false)
                .now_or_never()
                .expect("room")
                .unwrap();
            pieces_queued(&mut tasks)
        };
        assert_eq!(pieces_on(1), [0, 6, 0, 0]);
        assert_eq!(pieces_on(2), [0, 3, 3, 0]);
        assert_eq!(pieces_on(3), [0, 2, 2, 2]);
        assert_eq!(
            pieces_on(9),
            [0, 2, 2, 2],
            "at most every lane but the first"
        );
    }

    /// A sender that waited for room takes the spread as it is when it queues its pieces, not
    /// as it was when it began: a spread that widened while many senders waited reaches them
    /// at once.
    #[tokio::test]
    async fn pieces_take_the_spread_as_it_is_when_they_are_queued() {
        use super::super::widen::Widen;
        let (lanes, mut tasks, out) = four_lanes();
        let widen = Widen::new(4);
        widen.set_spread(1);
        let held = out
            .uncommitted
            .clone()
            .acquire_many_owned(MAX_UNCOMMITTED as u32)
            .await
            .unwrap();
        let place = Place::Widened {
            widen: &widen,
            lanes: &lanes,
        };
        // Waiting for a striped frame's turn.
        let sending = send_six_pieces(&out, place, &lanes, true);
        tokio::pin!(sending);
        assert!(futures::poll!(sending.as_mut()).is_pending());
        widen.set_spread(3);
        drop(held);
        sending.await.unwrap();
        assert_eq!(pieces_queued(&mut tasks), [0, 2, 2, 2]);
    }

    /// A commit read before its pieces waits for them, then hands the frame on.
    #[tokio::test]
    async fn a_commit_waits_for_its_last_piece() {
        let s = Arc::new(StripesIn::new(1 << 20, 2 << 20));
        let whole = frame(1000);
        let total = whole.len() as u64;
        s.part(s.window().session, 1, 0, total, whole.slice(..100))
            .unwrap();
        let waiting = tokio::spawn({
            let s = s.clone();
            async move { commit(&s, 1, Duration::from_secs(60)).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        s.part(s.window().session, 1, 100, total, whole.slice(100..))
            .unwrap();
        let f = waiting.await.unwrap().expect("delivered");
        assert_eq!(f.payload.len(), 1000);
    }

    /// A commit whose pieces never come is dropped after the patience given, and a waiting
    /// reader yields meanwhile (with time paused, a reader that spun would stop the clock and
    /// this test would never end).
    #[tokio::test(start_paused = true)]
    async fn a_commit_gives_up_on_pieces_that_never_come() {
        let s = StripesIn::new(1 << 20, 2 << 20);
        let whole = frame(1000);
        s.part(
            s.window().session,
            4,
            0,
            whole.len() as u64,
            whole.slice(..100),
        )
        .unwrap();
        let started = tokio::time::Instant::now();
        assert!(commit(&s, 4, Duration::from_secs(3)).await.is_none());
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        // Its late piece is dropped, and the table is empty.
        s.part(
            s.window().session,
            4,
            100,
            whole.len() as u64,
            whole.slice(100..),
        )
        .unwrap();
        assert_eq!(s.table().open(), 0);
    }

    fn window(session: u64, low: u64, limit: u64) -> Window {
        Window {
            session,
            low,
            limit,
            bytes: 1 << 20,
        }
    }

    /// A sender numbers its striped frames within the receiver's window: past it, a send
    /// that may wait waits for a larger one (or for its peer to be dropped), one that may
    /// not fails.
    #[tokio::test]
    async fn senders_keep_to_the_window() {
        let closed = CancellationToken::new();
        let out = Arc::new(StripesOut::new(closed.clone()));
        assert!(!out.fits(10));
        assert!(matches!(
            out.take_id(10, false).await,
            Err(SendError::Backpressure(_))
        ));
        out.grant(window(5, 0, WINDOW), Some(1));
        assert!(out.fits(10) && !out.fits(1 << 20));
        for id in 0..WINDOW {
            assert_eq!(out.take_id(10, false).await.unwrap(), (5, id));
        }
        assert!(matches!(
            out.take_id(10, false).await,
            Err(SendError::Backpressure(_))
        ));
        let waiting = tokio::spawn({
            let out = out.clone();
            async move { out.take_id(10, true).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        out.grant(window(5, 0, WINDOW - 1), Some(1));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a smaller limit changes nothing");
        out.grant(window(5, 0, WINDOW + 1), Some(1));
        assert_eq!(waiting.await.unwrap().unwrap(), (5, WINDOW));
        // Another table (the receiver dropped the peer and made a new one, or this end did and
        // hears of the receiver's for the first time): numbering starts again at its `low`.
        out.grant(window(6, 10, 10 + WINDOW), Some(1));
        assert_eq!(out.take_id(10, false).await.unwrap(), (6, 10));
        for _ in 1..WINDOW {
            out.take_id(10, false).await.unwrap();
        }
        let waiting = tokio::spawn({
            let out = out.clone();
            async move { out.take_id(10, true).await }
        });
        tokio::task::yield_now().await;
        closed.cancel();
        assert!(matches!(
            waiting.await.unwrap(),
            Err(SendError::Unreachable(_))
        ));
    }

    /// After the peer's first lane lost its connection, a sender numbers no frame until the
    /// receiver has announced its window on a new one: the same table goes on where it was, a
    /// new one (the receiver dropped this node meanwhile) from its `low`.
    #[tokio::test]
    async fn after_a_lost_connection_senders_wait_to_hear_the_window_again() {
        let out = Arc::new(StripesOut::new(CancellationToken::new()));
        let first = out.connected();
        out.grant(window(5, 0, WINDOW), Some(first));
        assert_eq!(out.take_id(10, false).await.unwrap(), (5, 0));
        // A second connection (a tie between dials) that brings the window and goes again
        // leaves the first one's.
        let second = out.connected();
        out.grant(window(5, 0, WINDOW), Some(second));
        out.lost(second);
        assert!(out.fits(10));
        out.lost(first);
        assert!(!out.fits(10), "whole until it is heard");
        assert!(matches!(
            out.take_id(10, false).await,
            Err(SendError::Backpressure(_))
        ));
        let waiting = tokio::spawn({
            let out = out.clone();
            async move { out.take_id(10, true).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // A window that came on no connection of the first lane says nothing of it.
        out.grant(window(5, 0, WINDOW), None);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        // The same table, on a new connection: numbering goes on.
        let third = out.connected();
        out.grant(window(5, 0, WINDOW), Some(third));
        assert_eq!(waiting.await.unwrap().unwrap(), (5, 1));
        out.lost(third);
        // A new table.
        let fourth = out.connected();
        out.grant(window(9, 0, WINDOW), Some(fourth));
        assert_eq!(out.take_id(10, false).await.unwrap(), (9, 0));
    }

    /// A large message of the tests below: its number and 2 MiB of 7s.
    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Big(u32, crate::Payload);

    /// What a sink logs of a [`Big`]: its number, and whether its payload is 2 MiB of 7s.
    type Logged = tokio::sync::mpsc::UnboundedReceiver<(u32, bool)>;

    /// Nodes `a` and `b` of `config` (by name), joined, a sink registered on `b` as "sink",
    /// and a ref to it from `a`.
    async fn sink_pair(
        names: (&str, &str),
        config: impl Fn(&str) -> crate::Config,
    ) -> (crate::Node, crate::Node, crate::ActorRef<Big>, Logged) {
        let a = crate::Node::start(config(names.0)).await.unwrap();
        let b = crate::Node::start(config(names.1)).await.unwrap();
        a.join_wait(b.addr(), Duration::from_secs(10))
            .await
            .unwrap();
        let (log, seen) = tokio::sync::mpsc::unbounded_channel();
        let sink = b.spawn_fn(move |mut inbox: crate::Inbox<Big>| async move {
            while let Some(Big(id, data)) = inbox.recv().await {
                let _ = log.send((id, data.len() == 2 << 20 && data.iter().all(|&x| x == 7)));
            }
        });
        b.register("sink", &sink).unwrap();
        let r = a.remote::<Big>(names.1, "sink").unwrap();
        (a, b, r, seen)
    }

    /// A lane that connected knows its connection's round trip (what decides whether a frame of
    /// one part is striped), on both ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn connected_lanes_know_their_round_trip() {
        use std::sync::atomic::Ordering::Relaxed;
        let config = |name: &str| {
            let mut c = crate::Config::new(name).cookie("rtt").parallelism(4);
            c.transport.max_frame_bytes = 4 << 20;
            c
        };
        let (a, b, r, mut seen) = sink_pair(("rta", "rtb"), config).await;
        r.send_with(
            Big(1, crate::Payload::from(vec![7u8; 2 << 20])),
            &crate::SendOpts::default().partition(1),
        )
        .await
        .unwrap();
        assert_eq!(seen.recv().await, Some((1, true)));
        for (node, peer) in [(&a, "rtb"), (&b, "rta")] {
            let peer = node.router().peer(peer).unwrap();
            let used: Vec<_> = (peer.lanes.iter())
                .filter(|l| {
                    l.metrics.bytes_in.load(Relaxed) + l.metrics.bytes_out.load(Relaxed) > 0
                })
                .collect();
            assert!(used.len() >= 2, "the commit's lane and a part's");
            for lane in used {
                assert!(lane.metrics.round_trip_us.load(Relaxed) > 0, "{}", lane.id);
            }
        }
        a.shutdown().await;
        b.shutdown().await;
    }

    /// One node drops its peer (as after a heartbeat timeout on its side alone) while the
    /// peer keeps it and connects again: the peer hears of the new table and numbers its
    /// striped frames from its start, and they keep coming. (With a window of 8 MiB, a sender
    /// that went on counting the frames the old table handed on would soon wait for ever.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn striped_frames_keep_coming_after_the_receiver_alone_dropped_the_sender() {
        use crate::node::control::Control;
        use crate::{Config, MembershipEvent, SendOpts};

        /// Sends six messages from `from` on, and what arrived of them.
        async fn batch(
            r: &crate::ActorRef<Big>,
            seen: &mut tokio::sync::mpsc::UnboundedReceiver<(u32, bool)>,
            data: &crate::Payload,
            from: u32,
        ) -> Vec<(u32, bool)> {
            let opts = SendOpts::default().partition(1);
            for id in from..from + 6 {
                r.send_with(Big(id, data.clone()), &opts).await.unwrap();
            }
            let mut got = Vec::new();
            for _ in 0..6 {
                got.push(seen.recv().await.unwrap());
            }
            got
        }
        let config = |name: &str| {
            let mut c = Config::new(name).cookie("asym").parallelism(4);
            c.transport.max_frame_bytes = 4 << 20;
            c.transport.stripe_window_bytes = 8 << 20;
            c
        };
        let (a, b, r, mut seen) = sink_pair(("asa", "asb"), config).await;
        let data = crate::Payload::from(vec![7u8; 2 << 20]);
        let ids = |from: u32| (from..from + 6).map(|id| (id, true)).collect::<Vec<_>>();
        let all = tokio::time::timeout(Duration::from_secs(60), async {
            assert_eq!(batch(&r, &mut seen, &data, 0).await, ids(0));
            let old = b.router().peer("asa").unwrap().stripes_in.window().session;
            // `b` alone drops `a`; `a` connects again.
            let mut events = b.subscribe();
            let id = a.router().id.clone();
            b.inner()
                .control
                .send(Control::PeerDown {
                    peer: id.clone(),
                    reason: "test".into(),
                })
                .await
                .unwrap();
            loop {
                if let MembershipEvent::Up(up) = events.recv().await.unwrap() {
                    if up == id {
                        break;
                    }
                }
            }
            let new = b.router().peer("asa").unwrap().stripes_in.window().session;
            assert_ne!(new, old, "a new table");
            // Sent at once: whole until `a` hears of the new table, striped after.
            assert_eq!(batch(&r, &mut seen, &data, 6).await, ids(6));
            let out = &a.router().peer("asb").unwrap().stripes_out;
            loop {
                let granted = out.granted.notified();
                tokio::pin!(granted);
                granted.as_mut().enable();
                if !out.window().heard_on.is_empty() {
                    break;
                }
                granted.await;
            }
            assert_eq!(out.window().session, Some(new));
            assert_eq!(batch(&r, &mut seen, &data, 12).await, ids(12));
        })
        .await;
        assert!(all.is_ok(), "in 60 s");
        a.shutdown().await;
        b.shutdown().await;
    }

    /// A commit says `ok: false` when one of its pieces was written on a connection that was
    /// lost before the commit is written; a loss before the piece was written says nothing.
    #[test]
    fn a_piece_written_on_a_connection_lost_since_fails_its_commit() {
        use crate::id::LaneId;
        use maquis_proto::wire::decode_head;

        let (lane, _task) = Lane::new(LaneId::new("default", 0), 1 << 20);
        for lost_since in [false, true] {
            let (gate, mut guards) = testing::gate(1, 2, &lane);
            let cut = Arc::new(Losses::default());
            let other = Arc::new(Losses::default());
            cut.lost();
            other.lost();
            guards.pop().unwrap().written(&cut);
            guards.pop().unwrap().written(&other);
            if lost_since {
                cut.lost();
            }
            assert!(gate.is_open());
            let ok = match decode_head(&gate.commit_head()).unwrap() {
                Header::Commit { ok, .. } => ok,
                other => panic!("not a commit: {other:?}"),
            };
            assert_eq!(ok, !lost_since);
        }
    }

    /// A connection of the peer is lost (cut at the receiver, a reset to the sender) while
    /// striped messages flow over the default channel's four lanes. A lane that carries no
    /// pieces or commits (a channel of one lane) loses none of them. A lane that carries
    /// pieces loses those in flight on it: their messages are dropped and counted, the others
    /// arrive; nothing arrives twice, out of order or changed, and the stream goes on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn striped_frames_outlive_a_lost_connection() {
        use crate::{Config, Node, SendOpts};

        const N: u32 = 40;
        const CUT_AT: usize = 10;
        let config = |name: &str| {
            let mut c = Config::new(name)
                .cookie("cut")
                .parallelism(4)
                .channel("single", Some(1));
            c.transport.max_frame_bytes = 4 << 20;
            c.transport.stripe_window_bytes = 32 << 20;
            c
        };
        let (a, b, r, mut seen) = sink_pair(("cua", "cub"), config).await;
        let data = crate::Payload::from(vec![7u8; 2 << 20]);
        let slot_of = |channel: &str, index: usize| {
            b.router()
                .dispatch
                .specs()
                .iter()
                .find(|s| s.name == channel)
                .map(|s| s.offset + index)
                .expect("a channel")
        };
        // Sends N messages from `from` on, cuts `b`'s connection of lane `slot` once CUT_AT
        // have arrived, and returns what arrived (until all did, or none for longer than a
        // commit's patience) and how many `b` counted as dropped.
        async fn round(
            a: &Node,
            b: &Node,
            r: &crate::ActorRef<Big>,
            seen: &mut Logged,
            data: &crate::Payload,
            from: u32,
            slot: usize,
        ) -> (Vec<(u32, bool)>, u64) {
            let peer = b.router().peer("cua").unwrap();
            let sending = a.router().peer("cub").unwrap();
            let before = b.counters().stripes_dropped.get();
            // Striped from the first message on: the window is heard.
            let out = &sending.stripes_out;
            loop {
                let granted = out.granted.notified();
                tokio::pin!(granted);
                granted.as_mut().enable();
                if out.window_bytes().is_some() {
                    break;
                }
                granted.await;
            }
            let sender = tokio::spawn({
                let r = r.clone();
                let data = data.clone();
                async move {
                    let opts = SendOpts::default().partition(1);
                    for id in from..from + N {
                        r.send_with(Big(id, data.clone()), &opts).await.unwrap();
                    }
                }
            });
            let mut got = Vec::new();
            while got.len() < N as usize {
                match tokio::time::timeout(Duration::from_secs(5), seen.recv()).await {
                    Ok(Some(m)) => got.push(m),
                    _ => break,
                }
                if got.len() == CUT_AT {
                    let state = peer.lanes[slot].state.lock().unwrap();
                    state.conn.as_ref().expect("connected").cancel.cancel();
                }
            }
            sender.await.unwrap();
            (got, b.counters().stripes_dropped.get() - before)
        }
        let check = |got: &[(u32, bool)]| {
            assert!(got.iter().all(|&(_, intact)| intact), "changed: {got:?}");
            let ids: Vec<u32> = got.iter().map(|&(id, _)| id).collect();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "order: {ids:?}");
        };
        let all = tokio::time::timeout(Duration::from_secs(60), async {
            let (got, dropped) = round(&a, &b, &r, &mut seen, &data, 0, slot_of("single", 0)).await;
            check(&got);
            assert_eq!((got.len(), dropped), (N as usize, 0), "none lost");
            let (got, dropped) =
                round(&a, &b, &r, &mut seen, &data, N, slot_of("default", 2)).await;
            check(&got);
            let lost = N as usize - got.len();
            assert_eq!(dropped, lost as u64, "every lost message is counted");
            // The stream goes on.
            let (got, dropped) =
                round(&a, &b, &r, &mut seen, &data, 2 * N, slot_of("single", 0)).await;
            check(&got);
            assert_eq!((got.len(), dropped), (N as usize, 0), "none lost");
        })
        .await;
        assert!(all.is_ok(), "in 60 s");
        a.shutdown().await;
        b.shutdown().await;
    }

    /// When the receiver makes a new table, the frames numbered for the old one none of whose
    /// pieces has started are numbered for the new one, in their order, and their pieces'
    /// heads are encoded anew as they start; one with a piece started fails (its commit says
    /// so), and so does one the new window has no room for.
    #[tokio::test]
    async fn frames_not_started_are_numbered_again_for_a_new_table() {
        use maquis_proto::wire::decode_head;

        let out = StripesOut::new(CancellationToken::new());
        out.grant(window(1, 0, WINDOW), Some(1));
        let mut gates = Vec::new();
        for _ in 0..4 {
            gates.push(out.open_gate(250 << 10, None, false).await.unwrap());
        }
        let piece = |gate: &Arc<Gate>, id: u64| PartGuard {
            gate: gate.clone(),
            written: false,
            offset: 0,
            len: 100,
            inner: Bytes::from_static(b"head"),
            encoded: (1, id),
        };
        let mut first = piece(&gates[0], 0);
        let mut second = piece(&gates[1], 1);
        assert!(second.start().is_none(), "numbered as encoded");
        out.grant(
            Window {
                session: 2,
                low: 10,
                limit: 10 + WINDOW,
                bytes: 700 << 10,
            },
            Some(1),
        );
        let commit = |gate: &Arc<Gate>| match decode_head(&gate.commit_head()).unwrap() {
            Header::Commit {
                session, id, ok, ..
            } => (session, id, ok),
            other => panic!("not a commit: {other:?}"),
        };
        assert_eq!(commit(&gates[0]), (2, 10, true));
        assert_eq!(commit(&gates[1]), (1, 1, false), "started: fails");
        assert_eq!(commit(&gates[2]), (2, 11, true));
        assert!(!commit(&gates[3]).2, "no room in the new window");
        let head = first.start().expect("encoded anew");
        assert_eq!(
            decode_head(&head).unwrap(),
            Header::Stripe {
                session: 2,
                id: 10,
                offset: 0,
                total: 250 << 10
            }
        );
        assert!(head.ends_with(b"head"), "with the frame's head it carries");
        assert!(first.start().is_none(), "once");
        assert_eq!(out.take_id(10, false).await.unwrap(), (2, 12));
    }

    /// The window bounds the bytes out too: a frame that would pass them waits until the
    /// receiver says it has handed on enough.
    #[tokio::test]
    async fn senders_keep_to_the_windows_bytes() {
        let out = StripesOut::new(CancellationToken::new());
        out.grant(window(1, 0, WINDOW), Some(1));
        assert_eq!(out.take_id(600 << 10, false).await.unwrap(), (1, 0));
        assert!(matches!(
            out.take_id(500 << 10, false).await,
            Err(SendError::Backpressure(_))
        ));
        assert_eq!(out.take_id(400 << 10, false).await.unwrap(), (1, 1));
        // Frame 0 handed on: its bytes are free again.
        out.grant(window(1, 1, WINDOW + 1), Some(1));
        assert_eq!(out.take_id(500 << 10, false).await.unwrap(), (1, 2));
    }
}
