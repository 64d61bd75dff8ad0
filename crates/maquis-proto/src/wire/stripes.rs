//! Large frames striped over the lanes of a channel, and put back in order on its ordering lane.
//!
//! A channel of several lanes carries its small frames on one lane, its *ordering lane*, so
//! that they are batched as on a single connection. A frame of `transport.stripe_bytes` or
//! more does not: its bytes (length prefix, header and payload, exactly as they would go
//! whole) are cut into pieces, each sent as the payload of a [`Header::Stripe`] frame on one of
//! the channel's other lanes (the least loaded), so that one large message gets the bandwidth
//! of all of them. Its place in the order is a small [`Header::Commit`] frame on the ordering
//! lane, queued where the frame itself would have been and written once every piece has been
//! written: frames of the same order key queued after it wait behind it, other frames do not.
//!
//! The receiver keeps the pieces in a [`Stripes`] table (one per peer) and hands the frame on
//! when its commit is read, so the order on the ordering lane is the order of delivery. A
//! commit read before the last of its pieces (they travel on other connections) holds up its
//! lane until they are in: the sender writes the commit only after the pieces, so the wait is
//! about the time the pieces spend in the other connections' buffers.
//!
//! Nothing here does I/O and nothing reads a clock: the transport feeds pieces and commits in,
//! waits when told to, says when a lane has lost its connection, and passes the time to
//! [`Stripes::tick`].
//!
//! # The window
//!
//! The receiver bounds the frames it holds by a *window*, as QUIC bounds streams: the sender
//! numbers its striped frames 0, 1, 2, … and may use an id only below the limit the receiver
//! last announced ([`Header::StripeWindow`]); the receiver announces `low + window`, where
//! every frame below `low` has been handed on or dropped, and refuses a piece or a commit at or
//! past that limit as hostile or corrupt; the frames from `low` on may also announce at most
//! `bytes` together (the sender counts them from the announced `low`). So at most `window`
//! frames and `bytes` bytes are open at once however
//! the sender's lanes lag behind one another (a commit written long ago may still sit unread
//! on a slow ordering lane while others go on), every piece that arrives can be kept, and no
//! reader ever waits for room in the table. The transport announces the window when the
//! peer's first lane connects, and the table a new limit ([`Stripes::take_window`]) once it
//! has moved by a quarter of the window, and again on the next few [`Stripes::tick`]s, since
//! an announcement may be dropped (a full queue) or lost with a connection.
//!
//! Each table has a *session*, a number the transport picks at random when it makes it (when
//! the peer is first connected, or again after it was dropped). The window names it, and so do
//! the sender's pieces and commits: a sender that hears of a new session numbers its frames
//! from 0 again, and a receiver drops what was numbered for another session. So the two ends
//! agree again when only one of them forgot the other.
//!
//! # Bounds
//!
//! A striped frame obeys the receiver's frame limit (checked on `total` before any piece is
//! kept), its pieces may not overlap or run past `total`, and a frame's memory is taken when its
//! first piece arrives, `total` bytes: at most `window` frames of at most `max_frame` bytes,
//! and `bytes` together. Each piece goes into its place in that memory: a reader is lent the
//! room for a piece ([`Stripes::lend`], through [`PieceRooms`]) and reads it there straight
//! from its socket, or a piece read whole is copied in ([`Stripes::part`]); the pieces of a
//! complete frame lie end to end and make it without a copy ([`Assembled::into_frame`]). The ids handed on or dropped above `low` are kept
//! until `low` passes them: at most `window` of them.
//!
//! # Losses
//!
//! When a connection of the peer ends, pieces written on it may be lost; the pieces still
//! queued for it at the sender go on its successor, and the frames they belong to must not be
//! dropped. What was lost is known in part at each end, and each end drops what it knows:
//! - the sender knows which pieces it wrote on a connection it then lost: the commit it
//!   writes after that says `ok: false`;
//! - the receiver knows the piece a lost connection's reader was in the middle of
//!   ([`Stripes::piece_lost`]), and that a commit waiting for pieces when a connection ends
//!   came after all of them were written, so a missing one may have gone with the connection
//!   if the commit names the connection's lane among those its pieces were queued on
//!   ([`Stripes::lane_lost`] drops those frames; the others wait on for pieces that come on
//!   their own lanes);
//! - a commit still waiting for pieces after the transport's patience runs out is dropped
//!   ([`Stripes::give_up`]): a piece written on the lost connection whose commit came after
//!   the loss was noticed here, before the sender noticed it.
//!
//! All are counted by the transport as dropped frames. A frame whose
//! commit was lost, or all of whose pieces and commit were, would hold `low` (and so the
//! window) for ever: within a window of ids past a loss, a frame that holds `low` and whose
//! commit is not waiting is dropped after the patience ([`Stripes::tick`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use super::frame::{ActorHeader, Dest};

use bytes::{Bytes, BytesMut};

use super::frame::{decode_whole, Frame, Header};
use super::WireError;

/// The bit of the lane of index `index` in its channel in a commit's `lanes`
/// ([`Header::Commit`]): lanes whose indices differ by a multiple of 64 share one.
pub fn lane_bit(index: u16) -> u64 {
    1 << (index % 64)
}

/// Where the pieces of a striped frame were queued, as its commit's reader knows it: the
/// channel whose ordering lane read the commit (pieces and commit travel on one channel's
/// lanes) and the lanes its commit names ([`lane_bit`] of their indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PiecesOn {
    /// Any number that tells the peer's channels apart (the transport uses the channel's
    /// first lane slot).
    pub channel: u16,
    /// The commit's `lanes`.
    pub lanes: u64,
}

impl PiecesOn {
    /// Whether a piece may have gone on lane `index` of `channel`.
    fn names(&self, channel: u16, index: u16) -> bool {
        self.channel == channel && self.lanes & lane_bit(index) != 0
    }
}

/// The bounds of a [`Stripes`] table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeLimits {
    /// The largest frame accepted (its length prefix excluded, as for whole frames).
    pub max_frame: usize,
    /// Frames the sender may have sent and not seen handed on or dropped (at least 4).
    pub window: u64,
    /// Bytes (as their frames announce them) the frames the sender may have sent and not seen
    /// handed on or dropped may hold together: at least twice `max_frame`, so that any frame
    /// fits.
    pub bytes: usize,
}

/// What became of a piece.
#[derive(Debug, PartialEq, Eq)]
pub enum PartOutcome {
    /// Kept; its frame still misses pieces.
    Kept,
    /// Kept, and its frame is complete.
    Complete,
    /// Dropped: its frame was dropped before (lost, or given up on).
    Dropped,
}

/// What became of a commit.
#[derive(Debug, PartialEq)]
pub enum CommitOutcome {
    /// The frame's pieces, to be joined ([`Assembled`]) and handed on now.
    Deliver(Assembled),
    /// Some pieces have not arrived: offer the commit again when they have (or give up).
    Pending,
    /// The frame was dropped (its sender lost a piece, or it was sent before a lost
    /// connection).
    Dropped,
}

/// The pieces of a striped frame, all in, in order, end to end in the frame's memory: made
/// one and decoded by [`Assembled::into_frame`].
#[derive(Debug, PartialEq)]
pub struct Assembled {
    pieces: Vec<BytesMut>,
}

impl Assembled {
    /// Makes the pieces one frame (they lie end to end: no copy) and decodes it.
    pub fn into_frame(self) -> Result<Frame, WireError> {
        let mut pieces = self.pieces.into_iter();
        let mut whole = pieces.next().unwrap_or_default();
        for p in pieces {
            whole.unsplit(p);
        }
        decode_striped(whole.freeze())
    }
}

/// Decodes the bytes of a striped frame, which may not be a part, piece, commit, barrier or
/// window itself.
pub fn decode_striped(whole: Bytes) -> Result<Frame, WireError> {
    let frame = decode_whole(whole)?;
    if matches!(
        frame.header,
        Header::Part { .. }
            | Header::Stripe { .. }
            | Header::Commit { .. }
            | Header::Barrier { .. }
            | Header::StripeWindow { .. }
    ) {
        return Err(WireError::BadHeader(
            "a part, piece, commit, barrier or window inside a striped frame".into(),
        ));
    }
    Ok(frame)
}

/// One striped frame being put together.
#[derive(Debug)]
struct Open {
    total: usize,
    received: usize,
    /// Pieces in, by offset: each in its place in the frame's memory.
    pieces: BTreeMap<usize, BytesMut>,
    /// The frame's memory no piece has taken or been lent yet, by offset (empty buffers whose
    /// capacity is the room).
    free: BTreeMap<usize, BytesMut>,
}

impl Open {
    /// Takes the room `offset..end` out of the free memory; `None` if any of it is taken.
    fn carve(&mut self, offset: usize, end: usize) -> Option<BytesMut> {
        let (&start, seg) = self.free.range(..=offset).next_back()?;
        if start + seg.capacity() < end {
            return None;
        }
        let mut before = self.free.remove(&start)?;
        let mut room = before.split_off(offset - start);
        let after = room.split_off(end - offset);
        if before.capacity() > 0 {
            self.free.insert(start, before);
        }
        if after.capacity() > 0 {
            self.free.insert(end, after);
        }
        Some(room)
    }
}

/// Where a reader's decoder puts the pieces of striped frames as it reads them
/// ([`super::FrameDecoder::pieces_into`]): the transport's table of the peer, behind its lock.
pub trait PieceRooms: Send + Sync + std::fmt::Debug {
    /// Room for the piece of `len` bytes at `offset` of frame `id` (of `total` bytes, numbered
    /// for `session`), to read it into ([`Stripes::lend`]); `None`: read it as a frame of its
    /// own (it is dropped when it is taken in).
    fn lend(
        &self,
        session: u64,
        id: u64,
        offset: u64,
        total: u64,
        len: usize,
    ) -> Result<Option<BytesMut>, WireError>;

    /// The room lent for the piece at `offset` of frame `id`, filled ([`Stripes::placed`]).
    fn filled(&self, session: u64, id: u64, offset: u64, room: BytesMut) -> Result<(), WireError>;
}

/// A peer's striped frames being put together (see the module's doc).
#[derive(Debug)]
pub struct Stripes {
    limits: StripeLimits,
    session: u64,
    open: HashMap<u64, Open>,
    /// The bytes the open frames announce.
    open_bytes: usize,
    /// Every frame numbered below this was handed on or dropped.
    low: u64,
    /// Frames numbered `low` or more that were handed on or dropped.
    done: BTreeSet<u64>,
    /// One more than the highest id seen.
    seen: u64,
    /// The limit last announced.
    announced: u64,
    /// The bytes of the frames handed on or dropped since then.
    freed: usize,
    /// The commits waiting for pieces, with where their pieces were queued.
    waiting: Vec<(u64, PiecesOn)>,
    /// Frames below this may have lost their commit, or everything, with a connection.
    suspect_below: u64,
    /// `low` when a tick last saw it move, and when.
    stuck: Option<(u64, u64)>,
    /// The limit at the last tick, and the ticks since it last changed.
    ticked: (u64, u32),
}

/// A receiver's window, as announced ([`Header::StripeWindow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The receiver's table.
    pub session: u64,
    /// Every frame below it was handed on or dropped.
    pub low: u64,
    /// Frames below it may be sent.
    pub limit: u64,
    /// The frames from `low` on may hold this many bytes together.
    pub bytes: u64,
}

impl Window {
    /// Its frame's header.
    pub fn header(&self) -> Header {
        Header::StripeWindow {
            session: self.session,
            low: self.low,
            limit: self.limit,
            bytes: self.bytes,
        }
    }
}

/// Ticks after a change of the window during which it is announced again.
pub const ANNOUNCE_TICKS: u32 = 4;

/// What a [`Stripes::tick`] found.
#[derive(Debug, PartialEq, Eq)]
pub struct Tick {
    /// A frame with pieces was dropped (for the caller to count; one without is counted when
    /// its commit arrives, if ever).
    pub dropped: bool,
    /// The window, to announce again.
    pub announce: Option<Window>,
}

impl Stripes {
    /// An empty table of session `session` (a random number: see the module's doc).
    pub fn new(limits: StripeLimits, session: u64) -> Self {
        Stripes {
            limits,
            session,
            open: HashMap::new(),
            open_bytes: 0,
            low: 0,
            done: BTreeSet::new(),
            seen: 0,
            announced: limits.window,
            freed: 0,
            waiting: Vec::new(),
            suspect_below: 0,
            stuck: None,
            // The first window is announced when the peer connects, not on ticks.
            ticked: (limits.window, ANNOUNCE_TICKS),
        }
    }

    /// The table's session.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Frames open now.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    fn finished(&self, id: u64) -> bool {
        id < self.low || self.done.contains(&id)
    }

    /// Refuses an id the window does not allow.
    fn in_window(&self, id: u64) -> Result<(), WireError> {
        let limit = self.low.saturating_add(self.limits.window);
        if id >= limit {
            return Err(WireError::BadHeader(format!(
                "striped frame {id} is past the window's limit {limit}"
            )));
        }
        Ok(())
    }

    /// Takes frame `id` out of the open ones.
    fn close(&mut self, id: u64) -> Option<Open> {
        let open = self.open.remove(&id)?;
        self.open_bytes -= open.total;
        self.freed += open.total;
        Some(open)
    }

    /// Frame `id` is handed on or dropped.
    fn finish(&mut self, id: u64) {
        self.close(id);
        if id < self.low {
            return;
        }
        self.done.insert(id);
        while self.done.remove(&self.low) {
            self.low += 1;
        }
    }

    /// Takes in the piece of frame `id` (of `total` bytes) at `offset`, numbered for
    /// `session`.
    pub fn part(
        &mut self,
        session: u64,
        id: u64,
        offset: u64,
        total: u64,
        piece: Bytes,
    ) -> Result<PartOutcome, WireError> {
        let Some(mut room) = self.lend(session, id, offset, total, piece.len())? else {
            return Ok(PartOutcome::Dropped);
        };
        room.extend_from_slice(&piece);
        self.placed(session, id, offset, room)
    }

    /// Lends the room of the piece of `len` bytes at `offset` of frame `id` (of `total`
    /// bytes), numbered for `session`, for a reader to read it into: an empty buffer of `len`
    /// bytes' capacity in the frame's memory, to give back filled with [`Stripes::placed`].
    /// `None`: the frame was dropped (so will the piece be). The piece is checked as
    /// [`Stripes::part`] checks it, and its room is taken: a piece over it is refused.
    pub fn lend(
        &mut self,
        session: u64,
        id: u64,
        offset: u64,
        total: u64,
        len: usize,
    ) -> Result<Option<BytesMut>, WireError> {
        if session != self.session || self.finished(id) {
            return Ok(None);
        }
        self.in_window(id)?;
        let total = usize::try_from(total).unwrap_or(usize::MAX);
        // The length prefix counts everything after itself.
        if total.saturating_sub(4) > self.limits.max_frame {
            return Err(WireError::FrameTooLarge {
                len: total.saturating_sub(4),
                max: self.limits.max_frame,
            });
        }
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = offset.checked_add(len).filter(|&e| e <= total);
        let Some(end) = end else {
            return Err(WireError::BadHeader(format!(
                "a piece at {offset} of {len} bytes runs past its frame's {total}"
            )));
        };
        if len == 0 {
            return Err(WireError::BadHeader("an empty piece".into()));
        }
        if !self.open.contains_key(&id) {
            if self.open_bytes.saturating_add(total) > self.limits.bytes {
                return Err(WireError::BadHeader(format!(
                    "striped frames past the window's {} bytes",
                    self.limits.bytes
                )));
            }
            self.open_bytes += total;
        }
        self.seen = self.seen.max(id + 1);
        let open = self.open.entry(id).or_insert_with(|| Open {
            total,
            received: 0,
            pieces: BTreeMap::new(),
            free: BTreeMap::from([(0, BytesMut::with_capacity(total))]),
        });
        if open.total != total {
            return Err(WireError::BadHeader(format!(
                "pieces of one striped frame announce {} and {total} bytes",
                open.total
            )));
        }
        match open.carve(offset, end) {
            Some(room) => Ok(Some(room)),
            None => Err(WireError::BadHeader(format!(
                "a piece at {offset} overlaps another"
            ))),
        }
    }

    /// Takes back the room lent for the piece at `offset` of frame `id` ([`Stripes::lend`]),
    /// filled with the piece.
    pub fn placed(
        &mut self,
        session: u64,
        id: u64,
        offset: u64,
        room: BytesMut,
    ) -> Result<PartOutcome, WireError> {
        let open = match self.open.get_mut(&id) {
            Some(open) if session == self.session => open,
            // Dropped since it was lent.
            _ => return Ok(PartOutcome::Dropped),
        };
        if room.is_empty() {
            return Err(WireError::BadHeader("an empty piece".into()));
        }
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
        open.received += room.len();
        open.pieces.insert(offset, room);
        Ok(if open.received == open.total {
            PartOutcome::Complete
        } else {
            PartOutcome::Kept
        })
    }

    /// Takes in the commit of frame `id`, numbered for `session`, whose pieces were queued
    /// where `on` says: the frame to hand on, or why not yet.
    pub fn commit(
        &mut self,
        session: u64,
        id: u64,
        ok: bool,
        on: PiecesOn,
    ) -> Result<CommitOutcome, WireError> {
        if session != self.session {
            return Ok(CommitOutcome::Dropped);
        }
        if self.finished(id) {
            self.stop_waiting(id);
            return Ok(CommitOutcome::Dropped);
        }
        self.in_window(id)?;
        self.seen = self.seen.max(id + 1);
        if !ok {
            self.stop_waiting(id);
            self.finish(id);
            return Ok(CommitOutcome::Dropped);
        }
        let complete = self
            .open
            .get(&id)
            .is_some_and(|o| o.received == o.total && o.total > 0);
        if !complete {
            if !self.is_waiting(id) {
                self.waiting.push((id, on));
            }
            return Ok(CommitOutcome::Pending);
        }
        self.stop_waiting(id);
        let open = self.close(id).expect("complete above");
        self.finish(id);
        Ok(CommitOutcome::Deliver(Assembled {
            pieces: open.pieces.into_values().collect(),
        }))
    }

    /// Whether the commit of frame `id` waits for pieces.
    pub fn is_waiting(&self, id: u64) -> bool {
        self.waiting.iter().any(|&(w, _)| w == id)
    }

    fn stop_waiting(&mut self, id: u64) {
        self.waiting.retain(|&(w, _)| w != id);
    }

    /// The wait for the pieces of frame `id` is over without them: it is dropped. Returns
    /// whether it was still waited for.
    pub fn give_up(&mut self, id: u64) -> bool {
        let was = self.is_waiting(id);
        self.stop_waiting(id);
        if !self.finished(id) {
            self.finish(id);
        }
        was
    }

    /// A connection of the peer ended, of the lane of index `lane` in `channel` (as in
    /// [`PiecesOn`]): a frame whose commit waits for pieces and names that lane is dropped
    /// (the sender wrote its commit after all its pieces, so one missing may have been lost
    /// with the connection); the others are kept (those waiting wait for pieces on other
    /// lanes; the pieces of the rest still queued at the sender come on other connections,
    /// and their commits say whether one was lost). Lanes of the channel whose indices differ
    /// by a multiple of 64 count as the same lane: such a frame is dropped too. Returns how
    /// many frames were dropped.
    pub fn lane_lost(&mut self, channel: u16, lane: u16) -> usize {
        let (lost, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(_, on)| on.names(channel, lane));
        self.waiting = kept;
        let n = lost.len();
        for (id, _) in lost {
            self.finish(id);
        }
        // The sender may have had ids up to the window's limit out when the connection went.
        self.suspect_below = self.low.saturating_add(self.limits.window);
        n
    }

    /// The piece of frame `id`, numbered for `session`, that a reader was reading when its
    /// connection ended will never be whole: the frame is dropped (its other pieces and its
    /// commit are when they come). Returns whether it was open.
    pub fn piece_lost(&mut self, session: u64, id: u64) -> bool {
        if session != self.session || self.finished(id) {
            return false;
        }
        self.stop_waiting(id);
        let was = self.open.contains_key(&id);
        self.finish(id);
        was
    }

    /// The window to announce to the sender ([`Header::StripeWindow`]), when its limit has
    /// moved by a quarter of its frames, or has moved and a quarter of its bytes were freed,
    /// since the last announcement.
    pub fn take_window(&mut self) -> Option<Window> {
        let now = self.window();
        let step = (self.limits.window / 4).max(1);
        let moved = now.limit > self.announced;
        let freed = self.freed >= self.limits.bytes / 4;
        if now.limit >= self.announced.saturating_add(step) || (moved && freed) {
            self.announced = now.limit;
            self.freed = 0;
            return Some(now);
        }
        None
    }

    /// The window now.
    pub fn window(&self) -> Window {
        Window {
            session: self.session,
            low: self.low,
            limit: self.low.saturating_add(self.limits.window),
            bytes: self.limits.bytes as u64,
        }
    }

    /// Time passes (`now_us`, any clock that only moves forward): a frame numbered below the
    /// window after a lost connection that has held `low` for `patience_us` without its commit
    /// waiting for it is dropped (its commit, or everything of it, was lost with the
    /// connection); the window is to be announced again for [`ANNOUNCE_TICKS`] ticks after it
    /// moved.
    pub fn tick(&mut self, now_us: u64, patience_us: u64) -> Tick {
        let dropped = self.drop_stuck(now_us, patience_us);
        let now = self.window();
        if now.limit != self.ticked.0 {
            self.ticked = (now.limit, 0);
        }
        let announce = (self.ticked.1 < ANNOUNCE_TICKS).then_some(now);
        self.ticked.1 = self.ticked.1.saturating_add(1);
        Tick { dropped, announce }
    }

    /// The frame holding `low` after a lost connection, if it has for the patience: dropped;
    /// whether it had pieces.
    fn drop_stuck(&mut self, now_us: u64, patience_us: u64) -> bool {
        let low = self.low;
        // Nothing seen at `low` or past it: the sender may not have sent it yet.
        if low >= self.seen || low >= self.suspect_below || self.is_waiting(low) {
            self.stuck = None;
            return false;
        }
        match self.stuck {
            Some((at, since)) if at == low => {
                if now_us.saturating_sub(since) < patience_us {
                    return false;
                }
                let had_pieces = self.open.contains_key(&low);
                self.finish(low);
                self.stuck = Some((self.low, now_us));
                had_pieces
            }
            _ => {
                self.stuck = Some((low, now_us));
                false
            }
        }
    }
}

/// The key that orders a frame on an ordering lane while a striped frame before it waits for
/// its pieces: the destination of an application message (an actor id, or a name), or the call
/// a reply answers. Frames with another key, or none of these, are in no order with it that
/// the runtime promises; `None` (watches, links, exits, acknowledged messages, protocol
/// frames): the frame waits for everything before it. The same on every node (FNV-1a over the
/// kind and the value).
pub fn hold_key(header: &Header) -> Option<u64> {
    match header {
        Header::Actor(actor) | Header::Routed { actor, .. } => actor_hold_key(actor),
        _ => None,
    }
}

/// [`hold_key`] of a frame carrying `actor`.
pub fn actor_hold_key(actor: &ActorHeader) -> Option<u64> {
    match actor {
        ActorHeader::Send {
            to: Dest::Id(id), ..
        } => Some(fnv(0, &id.to_be_bytes())),
        ActorHeader::Send {
            to: Dest::Name(n), ..
        } => Some(fnv(1, n.as_bytes())),
        ActorHeader::Reply { call, .. } => Some(fnv(2, &call.to_be_bytes())),
        _ => None,
    }
}

fn fnv(kind: u8, bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in std::iter::once(&kind).chain(bytes) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// What waits on an ordering lane: a commit whose frame is not complete yet, or a frame behind
/// one with its key.
#[derive(Debug)]
pub enum Held {
    /// A striped frame's commit.
    Commit {
        /// The session it was numbered for.
        session: u64,
        /// The striped frame.
        id: u64,
        /// False when its sender lost a piece.
        ok: bool,
        /// Its hold key.
        hold: Option<u64>,
        /// The lanes its pieces were queued on.
        lanes: u64,
    },
    /// A frame that may not overtake what is before it.
    Frame(Frame),
}

/// The frames of one ordering lane that wait behind striped frames still missing pieces
/// (without I/O: the reader feeds every frame it reads to [`OrderingQueue::admit`], and hands on
/// what [`OrderingQueue::front`] says is ready). A commit waits for its pieces; a frame waits if a
/// commit or frame before it in the queue has its hold key ([`hold_key`]), or if it or one of
/// them has none; the others go on at once, so small messages to other actors do not wait
/// for a large one's last piece. Bounded: at most `max_frames` frames and `max_bytes` of
/// payload wait; when [`OrderingQueue::is_full`], the reader stops reading until the front is
/// handed on.
#[derive(Debug)]
pub struct OrderingQueue {
    queue: VecDeque<Held>,
    /// Keys in the queue, with how many items have each.
    keys: HashMap<u64, usize>,
    /// Items in the queue without a key.
    barriers: usize,
    bytes: usize,
    max_frames: usize,
    max_bytes: usize,
}

impl OrderingQueue {
    /// An empty queue bounded by `max_frames` frames and `max_bytes` of payload.
    pub fn new(max_frames: usize, max_bytes: usize) -> Self {
        OrderingQueue {
            queue: VecDeque::new(),
            keys: HashMap::new(),
            barriers: 0,
            bytes: 0,
            max_frames,
            max_bytes,
        }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether the reader should stop reading until the front is handed on.
    pub fn is_full(&self) -> bool {
        self.queue.len() >= self.max_frames || self.bytes >= self.max_bytes
    }

    /// Takes a frame read on the lane: returned to be handed on now, or kept (a commit always
    /// is; the reader then looks at [`OrderingQueue::front`]).
    pub fn admit(&mut self, frame: Frame) -> Option<Frame> {
        let (key, held) = match frame.header {
            Header::Commit {
                session,
                id,
                ok,
                hold,
                lanes,
            } => (
                hold,
                Held::Commit {
                    session,
                    id,
                    ok,
                    hold,
                    lanes,
                },
            ),
            _ if self.queue.is_empty() => return Some(frame),
            _ => {
                let key = hold_key(&frame.header);
                let free = self.barriers == 0 && key.is_some_and(|k| !self.keys.contains_key(&k));
                if free {
                    return Some(frame);
                }
                (key, Held::Frame(frame))
            }
        };
        match key {
            Some(k) => *self.keys.entry(k).or_default() += 1,
            None => self.barriers += 1,
        }
        if let Held::Frame(f) = &held {
            self.bytes += f.payload.len();
        }
        self.queue.push_back(held);
        None
    }

    /// What waits at the front.
    pub fn front(&self) -> Option<&Held> {
        self.queue.front()
    }

    /// Takes the front away (handed on, or dropped).
    pub fn pop(&mut self) -> Option<Held> {
        let held = self.queue.pop_front()?;
        let key = match &held {
            Held::Frame(f) => {
                self.bytes -= f.payload.len();
                hold_key(&f.header)
            }
            Held::Commit { hold, .. } => *hold,
        };
        match key {
            Some(k) => self.forget(k),
            None => self.barriers -= 1,
        }
        Some(held)
    }

    fn forget(&mut self, k: u64) {
        if let Some(n) = self.keys.get_mut(&k) {
            *n -= 1;
            if *n == 0 {
                self.keys.remove(&k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::frame::{encode_frame, ActorHeader, Dest};
    use proptest::prelude::*;

    /// The tables' session.
    const S: u64 = 0x5e55;
    /// A commit's lanes when the test does not care which: every lane.
    const ANY: PiecesOn = PiecesOn {
        channel: 0,
        lanes: u64::MAX,
    };

    fn limits() -> StripeLimits {
        window(4)
    }

    fn window(window: u64) -> StripeLimits {
        StripeLimits {
            max_frame: 1 << 20,
            window,
            bytes: 4 << 20,
        }
    }

    fn frame(n: usize) -> Bytes {
        let header = Header::Actor(ActorHeader::Send {
            to: Dest::Id(3),
            incarnation: 0,
            call: None,
            ty: 0,
        });
        let payload: Vec<u8> = (0..n).map(|i| i as u8).collect();
        Bytes::from(
            encode_frame(&header, &payload, usize::MAX)
                .unwrap()
                .to_vec(),
        )
    }

    fn deliver(s: &mut Stripes, id: u64) -> Frame {
        match s.commit(S, id, true, ANY).unwrap() {
            CommitOutcome::Deliver(a) => a.into_frame().unwrap(),
            other => panic!("not delivered: {other:?}"),
        }
    }

    proptest! {
        /// Pieces in any order make the frame again; its commit hands it on only once all are
        /// in.
        #[test]
        fn pieces_in_any_order_make_the_frame(n in 1usize..5000, cut in 1usize..700, seed in any::<u64>()) {
            let whole = frame(n);
            let total = whole.len() as u64;
            let mut pieces: Vec<(usize, Bytes)> = (0..whole.len())
                .step_by(cut)
                .map(|o| (o, whole.slice(o..(o + cut).min(whole.len()))))
                .collect();
            // A fixed shuffle from the seed.
            let mut x = seed | 1;
            for i in (1..pieces.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                pieces.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let mut s = Stripes::new(limits(), S);
            let last = pieces.len() - 1;
            for (i, (o, p)) in pieces.into_iter().enumerate() {
                if i == last {
                    prop_assert_eq!(s.commit(S, 2, true, ANY).unwrap(), CommitOutcome::Pending);
                }
                let out = s.part(S, 2, o as u64, total, p).unwrap();
                prop_assert_eq!(out, if i == last { PartOutcome::Complete } else { PartOutcome::Kept });
            }
            let f = deliver(&mut s, 2);
            prop_assert_eq!(f.payload.len(), n);
            prop_assert_eq!(s.open(), 0);
        }

        /// Hostile pieces and commits never panic, and the table never holds more than its
        /// bound.
        #[test]
        fn hostile_input_is_refused_not_obeyed(
            ops in proptest::collection::vec((0u64..8, any::<u64>(), any::<u64>(), 0usize..64, any::<bool>()), 0..64)
        ) {
            let mut s = Stripes::new(limits(), S);
            for (id, offset, total, len, commit) in ops {
                let total = total % (2 << 20);
                let _ = if commit {
                    s.commit(S, id, offset % 2 == 0, ANY).map(|_| ())
                } else {
                    s.part(S, id, offset % (2 << 20), total, Bytes::from(vec![0u8; len])).map(|_| ())
                };
                prop_assert!(s.open() as u64 <= limits().window);
            }
        }
    }

    #[test]
    fn ids_past_the_window_are_refused_and_the_window_moves_as_frames_finish() {
        let mut s = Stripes::new(limits(), S);
        let whole = frame(100);
        let total = whole.len() as u64;
        assert!(s.part(S, 4, 0, total, whole.clone()).is_err(), "past 0 + 4");
        assert!(s.commit(S, 4, true, ANY).is_err(), "past 0 + 4");
        for id in 0..4 {
            s.part(S, id, 0, total, whole.clone()).unwrap();
        }
        assert_eq!(s.take_window(), None, "the first window is implied");
        // Handed on out of order: the window moves with the lowest.
        deliver(&mut s, 2);
        assert_eq!((s.take_window(), s.window().limit), (None, 4));
        deliver(&mut s, 0);
        assert_eq!(s.take_window().map(|w| (w.low, w.limit)), Some((1, 5)));
        assert_eq!(s.take_window(), None, "announced once");
        deliver(&mut s, 1);
        assert_eq!(
            s.take_window().map(|w| w.limit),
            Some(7),
            "2 was done already"
        );
        s.part(S, 6, 0, total, whole.clone()).unwrap();
        assert!(s.part(S, 7, 0, total, whole.clone()).is_err());
        // A late piece of a frame handed on is dropped, not refused.
        assert_eq!(
            s.part(S, 2, 0, total, whole.clone()).unwrap(),
            PartOutcome::Dropped
        );
    }

    /// The window bounds bytes too: frames that announce more than its bytes together are
    /// refused until some are handed on.
    #[test]
    fn frames_past_the_windows_bytes_are_refused() {
        let mut s = Stripes::new(window(16), S);
        let mb = 1u64 << 20;
        let piece = Bytes::from(vec![0u8; 10]);
        for id in 0..4 {
            s.part(S, id, 0, mb, piece.clone()).unwrap();
        }
        assert!(s.part(S, 4, 0, mb, piece.clone()).is_err(), "5 MiB open");
        assert!(
            s.part(S, 4, 0, 10, piece.clone()).is_err(),
            "4 MiB and 10 bytes"
        );
        assert_eq!(s.window().bytes, 4 << 20);
        assert_eq!(s.commit(S, 0, false, ANY).unwrap(), CommitOutcome::Dropped);
        assert_eq!(s.part(S, 4, 0, mb, piece).unwrap(), PartOutcome::Kept);
    }

    /// A window of few large frames is announced again once a quarter of its bytes are free,
    /// long before a quarter of its ids are.
    #[test]
    fn the_window_is_announced_as_its_bytes_free() {
        let mut s = Stripes::new(window(1000), S);
        let mb = 1u64 << 20;
        let whole = frame(100);
        s.part(S, 0, 0, mb, whole.slice(..10)).unwrap();
        s.part(S, 1, 0, whole.len() as u64, whole.clone()).unwrap();
        deliver(&mut s, 1);
        assert_eq!(s.take_window(), None, "nothing below 1 is done");
        assert_eq!(s.commit(S, 0, false, ANY).unwrap(), CommitOutcome::Dropped);
        let w = s.take_window().expect("1 MiB of 4 freed");
        assert_eq!((w.low, w.limit), (2, 1002));
        assert_eq!(s.take_window(), None);
    }

    /// The case the window is for: the commits of every other frame sit unread on an ordering
    /// lane that lags (its reader is busy, or its connection slow) while the other ordering
    /// lane's commits are read before their pieces. The sender runs out of window and waits;
    /// the receiver never holds more than a window, and refuses nothing.
    #[test]
    fn a_lagging_ordering_lane_holds_the_sender_not_the_receiver() {
        let mut s = Stripes::new(window(8), S);
        let whole = frame(100);
        let total = whole.len() as u64;
        let mut granted = 8;
        let mut lagging = Vec::new();
        let mut next = 0;
        for _round in 0..100 {
            while next < granted {
                let id = next;
                next += 1;
                if id % 2 == 0 {
                    s.part(S, id, 0, total, whole.clone()).unwrap();
                    lagging.push(id);
                } else {
                    assert_eq!(s.commit(S, id, true, ANY).unwrap(), CommitOutcome::Pending);
                    s.part(S, id, 0, total, whole.clone()).unwrap();
                    deliver(&mut s, id);
                }
                assert!(s.open() <= 8);
                if let Some(w) = s.take_window() {
                    granted = w.limit;
                }
            }
            // The lagging lane catches up with one commit.
            if let Some(id) = (!lagging.is_empty()).then(|| lagging.remove(0)) {
                deliver(&mut s, id);
            }
            if let Some(w) = s.take_window() {
                granted = w.limit;
            }
        }
        assert!(next > 100, "the sender went on: {next}");
    }

    #[derive(Debug)]
    enum Item {
        Piece(u64, usize),
        Commit(u64),
    }

    proptest! {
        /// A sender that keeps to the window, whatever order its lanes are read in and however
        /// late the window's announcements arrive, is never refused, never makes the receiver
        /// hold more than the window, and every frame is handed on once.
        #[test]
        fn a_sender_in_its_window_is_never_refused(
            frames in 1u64..120,
            cut in 20usize..200,
            choices in proptest::collection::vec(any::<u8>(), 0..3000),
        ) {
            const WINDOW: u64 = 8;
            const ORDERING: usize = 2;
            const DATA: usize = 3;
            let whole = frame(300);
            let total = whole.len() as u64;
            let mut s = Stripes::new(window(WINDOW), S);
            let mut lanes: Vec<VecDeque<Item>> = (0..ORDERING + DATA).map(|_| VecDeque::new()).collect();
            let mut announced: VecDeque<u64> = VecDeque::new();
            let (mut next, mut granted) = (0u64, WINDOW);
            let mut handed_on = vec![0u32; frames as usize];
            // Once the choices run out, every action in turn.
            let mut choices = choices.into_iter().chain((0..=255u8).cycle());
            let mut idle = 0;
            while handed_on.contains(&0) {
                prop_assert!(idle < 10_000, "no progress: {:?}", lanes);
                idle += 1;
                let c = choices.next().unwrap_or(0) as usize;
                match c % 4 {
                    // The sender: pieces over the data lanes, then the commit.
                    0 if next < granted && next < frames => {
                        let id = next;
                        next += 1;
                        for (i, o) in (0..whole.len()).step_by(cut).enumerate() {
                            lanes[ORDERING + (c / 4 + i) % DATA].push_back(Item::Piece(id, o));
                        }
                        lanes[(c / 4) % ORDERING].push_back(Item::Commit(id));
                    }
                    // An announcement arrives.
                    1 => {
                        if let Some(l) = announced.pop_front() {
                            granted = granted.max(l);
                        }
                    }
                    // A lane's reader reads its front; a commit missing pieces holds its lane.
                    _ => {
                        let lane = &mut lanes[(c / 4) % (ORDERING + DATA)];
                        match lane.front() {
                            Some(&Item::Piece(id, o)) => {
                                let piece = whole.slice(o..(o + cut).min(whole.len()));
                                let out = s.part(S, id, o as u64, total, piece).unwrap();
                                prop_assert!(out != PartOutcome::Dropped);
                                lane.pop_front();
                            }
                            Some(&Item::Commit(id)) => match s.commit(S, id, true, ANY).unwrap() {
                                CommitOutcome::Deliver(a) => {
                                    prop_assert_eq!(a.into_frame().unwrap().payload.len(), 300);
                                    handed_on[id as usize] += 1;
                                    lane.pop_front();
                                    idle = 0;
                                }
                                CommitOutcome::Pending => {}
                                CommitOutcome::Dropped => prop_assert!(false, "dropped {}", id),
                            },
                            None => {}
                        }
                        announced.extend(s.take_window().map(|w| w.limit));
                    }
                }
                prop_assert!(s.open() as u64 <= WINDOW);
            }
            prop_assert!(handed_on.iter().all(|&n| n == 1));
        }
    }

    /// A sender that still numbers its frames for a table the receiver no longer has (it
    /// dropped the peer and made a new one) has them dropped, not refused, until it hears of
    /// the new session and starts again from 0.
    #[test]
    fn frames_of_another_session_are_dropped() {
        let mut s = Stripes::new(limits(), S);
        let whole = frame(100);
        let total = whole.len() as u64;
        assert_eq!(
            s.part(S + 1, 900, 0, total, whole.clone()).unwrap(),
            PartOutcome::Dropped
        );
        assert_eq!(
            s.commit(S + 1, 900, true, ANY).unwrap(),
            CommitOutcome::Dropped
        );
        assert_eq!((s.open(), s.session(), s.window().limit), (0, S, 4));
        s.part(S, 0, 0, total, whole).unwrap();
        assert_eq!(deliver(&mut s, 0).payload.len(), 100);
    }

    /// The window is announced again on the ticks after it moved, and then no more; the first
    /// is not (the transport announces it when the peer connects), so that an idle peer's
    /// ticks carry heartbeats, not windows.
    #[test]
    fn ticks_announce_the_window_again_for_a_while_after_it_moved() {
        let mut s = Stripes::new(limits(), S);
        let announced = |s: &mut Stripes| -> Vec<Option<u64>> {
            (0..ANNOUNCE_TICKS + 2)
                .map(|_| s.tick(0, 1).announce.map(|w| w.limit))
                .collect()
        };
        let first = vec![None; ANNOUNCE_TICKS as usize + 2];
        assert_eq!(announced(&mut s), first, "the first, sent on connecting");
        let whole = frame(10);
        s.part(S, 0, 0, whole.len() as u64, whole).unwrap();
        deliver(&mut s, 0);
        let mut then = vec![Some(5); ANNOUNCE_TICKS as usize];
        then.extend([None, None]);
        assert_eq!(announced(&mut s), then);
    }

    #[test]
    fn after_a_lost_connection_a_frame_that_holds_the_window_is_dropped_after_the_patience() {
        let mut s = Stripes::new(window(16), S);
        let whole = frame(100);
        let total = whole.len() as u64;
        // Without a loss, a frame whose commit lags is waited for however long.
        s.part(S, 0, 0, total, whole.clone()).unwrap();
        s.part(S, 1, 0, total, whole.clone()).unwrap();
        for t in 0..10 {
            assert!(!s.tick(t * 1_000_000, 1_000).dropped);
        }
        deliver(&mut s, 0);
        deliver(&mut s, 1);
        // Lost: frame 2's commit went with the connection, frame 3 went whole with it, frame
        // 4 is fine.
        s.part(S, 2, 0, total, whole.clone()).unwrap();
        assert_eq!(s.lane_lost(0, 1), 0);
        s.part(S, 4, 0, total, whole.clone()).unwrap();
        assert_eq!(s.window().limit, 2 + 16);
        assert!(!s.tick(0, 1_000).dropped, "starts the clock");
        assert!(!s.tick(999, 1_000).dropped);
        assert!(s.tick(1_000, 1_000).dropped, "frame 2, with pieces");
        assert!(!s.tick(1_500, 1_000).dropped);
        assert!(
            !s.tick(2_000, 1_000).dropped,
            "frame 3, a hole: counted when its commit comes"
        );
        assert_eq!(s.commit(S, 3, true, ANY).unwrap(), CommitOutcome::Dropped);
        assert_eq!(deliver(&mut s, 4).payload.len(), 100);
        assert_eq!(s.window().limit, 5 + 16);
        // Nothing seen past `low`: the sender has not sent it yet.
        for t in 3..10 {
            assert!(!s.tick(t * 1_000, 1_000).dropped);
        }
        s.part(S, 5, 0, total, whole.clone()).unwrap();
        assert_eq!(deliver(&mut s, 5).payload.len(), 100);
        // A commit waiting for its pieces is the reader's to give up on, not the tick's.
        s.part(S, 6, 0, total, whole.slice(..10)).unwrap();
        assert_eq!(s.commit(S, 6, true, ANY).unwrap(), CommitOutcome::Pending);
        for t in 10..20 {
            assert!(!s.tick(t * 1_000, 1_000).dropped);
        }
        assert!(s.is_waiting(6));
    }

    #[test]
    fn lost_and_aborted_frames_are_dropped_with_their_late_pieces() {
        let mut s = Stripes::new(window(16), S);
        let whole = frame(100);
        let total = whole.len() as u64;
        s.part(S, 3, 0, total, whole.slice(..10)).unwrap();
        assert_eq!(s.commit(S, 3, false, ANY).unwrap(), CommitOutcome::Dropped);
        assert_eq!(
            s.part(S, 3, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
        assert_eq!(s.open(), 0);
        s.part(S, 4, 0, total, whole.slice(..10)).unwrap();
        assert_eq!(s.commit(S, 4, true, ANY).unwrap(), CommitOutcome::Pending);
        assert_eq!(
            s.lane_lost(0, 1),
            1,
            "its commit waited: a piece may have gone with it"
        );
        assert_eq!(
            s.part(S, 4, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
        assert_eq!(s.commit(S, 4, true, ANY).unwrap(), CommitOutcome::Dropped);
        // A frame sent after the loss goes through.
        s.part(S, 9, 0, total, whole.clone()).unwrap();
        assert_eq!(deliver(&mut s, 9).payload.len(), 100);
        // Given up on: its late piece is dropped.
        s.part(S, 10, 0, total, whole.slice(..10)).unwrap();
        assert_eq!(s.commit(S, 10, true, ANY).unwrap(), CommitOutcome::Pending);
        assert!(s.give_up(10));
        assert_eq!(
            s.part(S, 10, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
    }

    #[test]
    fn a_lost_lane_drops_only_the_waiting_frames_whose_pieces_it_carried() {
        let mut s = Stripes::new(window(16), S);
        let whole = frame(100);
        let total = whole.len() as u64;
        let on = |channel, lanes| PiecesOn { channel, lanes };
        // Frame 0's missing piece was queued on lane 2 of channel 1, frame 1's on lanes 3 and
        // 5, frame 2's on lane 67 (the bit of lane 3, as 67 is 3 modulo 64), frame 3's on
        // lane 3 of channel 20.
        for id in 0..4 {
            s.part(S, id, 0, total, whole.slice(..10)).unwrap();
        }
        let waits = [
            (0, on(1, lane_bit(2))),
            (1, on(1, lane_bit(3) | lane_bit(5))),
            (2, on(1, lane_bit(67))),
            (3, on(20, lane_bit(3))),
        ];
        for (id, pieces_on) in waits {
            assert_eq!(
                s.commit(S, id, true, pieces_on).unwrap(),
                CommitOutcome::Pending
            );
        }
        assert_eq!(s.lane_lost(1, 4), 0, "no piece went on lane 4");
        assert_eq!(
            s.lane_lost(1, 3),
            2,
            "frames 1 and 2, not channel 20's frame 3"
        );
        assert!(s.is_waiting(0) && !s.is_waiting(1) && !s.is_waiting(2) && s.is_waiting(3));
        assert_eq!(s.lane_lost(20, 3), 1, "frame 3");
        // Frame 0's piece comes on its own lane: whole, handed on.
        s.part(S, 0, 10, total, whole.slice(10..)).unwrap();
        let CommitOutcome::Deliver(a) = s.commit(S, 0, true, on(1, lane_bit(2))).unwrap() else {
            panic!("frame 0 is whole");
        };
        assert_eq!(a.into_frame().unwrap().payload.len(), 100);
        // Frame 1's late piece is dropped with it, and so is its commit offered again.
        assert_eq!(
            s.part(S, 1, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
        assert_eq!(s.commit(S, 1, true, ANY).unwrap(), CommitOutcome::Dropped);
    }

    #[test]
    fn frames_whose_pieces_come_after_a_lost_connection_are_kept() {
        let mut s = Stripes::new(window(16), S);
        let whole = frame(100);
        let total = whole.len() as u64;
        // Frame 0 has a piece in and the rest queued at the sender; frame 1 came whole, its
        // commit not yet; frame 2's commit waits for a piece.
        s.part(S, 0, 0, total, whole.slice(..10)).unwrap();
        s.part(S, 1, 0, total, whole.clone()).unwrap();
        s.part(S, 2, 0, total, whole.slice(..10)).unwrap();
        assert_eq!(s.commit(S, 2, true, ANY).unwrap(), CommitOutcome::Pending);
        // Frame 3's piece was being read on the connection that ends.
        s.part(S, 3, 0, total, whole.slice(..10)).unwrap();
        assert!(s.piece_lost(S, 3));
        assert!(!s.piece_lost(S, 3), "once");
        assert!(!s.piece_lost(S + 1, 5), "another table's");
        assert_eq!(s.lane_lost(0, 1), 1);
        assert!(!s.is_waiting(2));
        // The pieces that were still queued come on another connection, after the loss.
        assert_eq!(
            s.part(S, 0, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Complete
        );
        assert_eq!(deliver(&mut s, 0).payload.len(), 100);
        assert_eq!(deliver(&mut s, 1).payload.len(), 100);
        assert_eq!(
            s.part(S, 2, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
        assert_eq!(s.commit(S, 2, true, ANY).unwrap(), CommitOutcome::Dropped);
        assert_eq!(
            s.part(S, 3, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
        assert_eq!(s.commit(S, 3, true, ANY).unwrap(), CommitOutcome::Dropped);
        assert_eq!(s.open(), 0);
        assert_eq!(s.window().low, 4);
    }

    fn send_to(id: u64, tag: u8) -> Frame {
        Frame {
            header: Header::Actor(ActorHeader::Send {
                to: Dest::Id(id),
                incarnation: 0,
                call: None,
                ty: 0,
            }),
            payload: Bytes::from(vec![tag]),
        }
    }

    fn commit_for(id: u64, hold: Option<u64>) -> Frame {
        Frame {
            header: Header::Commit {
                session: S,
                id,
                ok: true,
                hold,
                lanes: ANY.lanes,
            },
            payload: Bytes::new(),
        }
    }

    fn tag(f: &Frame) -> u8 {
        f.payload[0]
    }

    #[test]
    fn frames_of_other_keys_pass_a_waiting_commit_and_its_own_wait() {
        let mut o = OrderingQueue::new(8, 1 << 20);
        let to = |id| hold_key(&send_to(id, 0).header);
        assert_eq!(
            o.admit(send_to(1, 1)).map(|f| tag(&f)),
            Some(1),
            "nothing waits"
        );
        assert!(o.admit(commit_for(5, to(1))).is_none());
        // To actor 1: behind the commit. To actor 2: on at once.
        assert!(o.admit(send_to(1, 2)).is_none());
        assert_eq!(o.admit(send_to(2, 3)).map(|f| tag(&f)), Some(3));
        // A frame without a key waits, and so does everything after it.
        let monitor = Frame {
            header: Header::Actor(ActorHeader::Monitor {
                watch: 1,
                target: Dest::Id(2),
            }),
            payload: Bytes::from(vec![4]),
        };
        assert!(o.admit(monitor).is_none());
        assert!(o.admit(send_to(3, 5)).is_none());
        assert!(matches!(o.front(), Some(Held::Commit { id: 5, .. })));
        let order: Vec<u8> = std::iter::from_fn(|| o.pop())
            .filter_map(|h| match h {
                Held::Frame(f) => Some(tag(&f)),
                Held::Commit { .. } => None,
            })
            .collect();
        assert_eq!(order, vec![2, 4, 5]);
        assert!(o.is_empty());
        assert_eq!(
            o.admit(send_to(1, 6)).map(|f| tag(&f)),
            Some(6),
            "all let go"
        );
        // A commit without a key holds everything.
        assert!(o.admit(commit_for(6, None)).is_none());
        assert!(o.admit(send_to(9, 7)).is_none());
    }

    #[test]
    fn a_full_queue_says_so() {
        let mut o = OrderingQueue::new(2, 1 << 20);
        o.admit(commit_for(1, None));
        assert!(!o.is_full());
        o.admit(send_to(1, 1));
        assert!(o.is_full());
        o.pop();
        o.pop();
        assert!(!o.is_full() && o.is_empty());
    }

    #[test]
    fn hold_keys_tell_ids_names_and_calls_apart() {
        let name = Header::Actor(ActorHeader::Send {
            to: Dest::Name("a".into()),
            incarnation: 0,
            call: Some(3),
            ty: 0,
        });
        let reply = Header::Actor(ActorHeader::Reply {
            call: 97,
            status: crate::wire::ReplyStatus::Ok,
            ty: 0,
        });
        let id = hold_key(&send_to(97, 0).header);
        assert!(id.is_some());
        assert_ne!(hold_key(&name), id);
        assert_ne!(hold_key(&reply), id);
        assert_eq!(hold_key(&Header::Bye), None);
        // The same on every node: a fixed function of the value.
        assert_eq!(hold_key(&send_to(97, 0).header), id);
    }

    /// A table as a reader's decoder uses it (the transport's own wraps its table the same
    /// way).
    #[derive(Debug)]
    struct Rooms(std::sync::Mutex<Stripes>);

    impl PieceRooms for Rooms {
        fn lend(
            &self,
            session: u64,
            id: u64,
            offset: u64,
            total: u64,
            len: usize,
        ) -> Result<Option<BytesMut>, WireError> {
            self.0.lock().unwrap().lend(session, id, offset, total, len)
        }

        fn filled(
            &self,
            session: u64,
            id: u64,
            offset: u64,
            room: BytesMut,
        ) -> Result<(), WireError> {
            self.0
                .lock()
                .unwrap()
                .placed(session, id, offset, room)
                .map(|_| ())
        }
    }

    /// Frame `whole` cut into pieces of `cut` bytes in an order shuffled by `seed`: (offset,
    /// piece).
    fn shuffled(whole: &Bytes, cut: usize, seed: u64) -> Vec<(usize, Bytes)> {
        let mut pieces: Vec<(usize, Bytes)> = (0..whole.len())
            .step_by(cut)
            .map(|o| (o, whole.slice(o..(o + cut).min(whole.len()))))
            .collect();
        let mut x = seed | 1;
        for i in (1..pieces.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            pieces.swap(i, (x % (i as u64 + 1)) as usize);
        }
        pieces
    }

    proptest! {
        /// A reader's decoder that puts pieces in place takes every piece of a striped frame
        /// in, whatever the reads' sizes, but those smaller than its read buffer (they come
        /// out, and are taken in as the transport does); the frame made of them is the one
        /// sent.
        #[test]
        fn pieces_read_in_place_make_the_frame(
            n in 1usize..20_000,
            cut in 1usize..3000,
            chunk in 1usize..2000,
            read_buffer in 16usize..512,
            seed in any::<u64>(),
        ) {
            use crate::wire::FrameDecoder;
            let whole = frame(n);
            let total = whole.len() as u64;
            let bye = encode_frame(&Header::Bye, b"", usize::MAX).unwrap();
            let mut stream = Vec::new();
            let pieces = shuffled(&whole, cut, seed);
            for (o, p) in &pieces {
                let head = Header::Stripe { session: S, id: 2, offset: *o as u64, total };
                stream.extend_from_slice(&encode_frame(&head, p, usize::MAX).unwrap());
                stream.extend_from_slice(&bye);
            }
            let rooms = std::sync::Arc::new(Rooms(std::sync::Mutex::new(Stripes::new(limits(), S))));
            let mut decoder = FrameDecoder::new(1 << 20)
                .read_buffer(read_buffer)
                .pieces_into(rooms.clone());
            let mut out = Vec::new();
            let mut small = Vec::new();
            let fed = crate::wire::testing::feed(&mut decoder, &stream, chunk, |f| match f.header {
                // A piece smaller than the read buffer comes out, as the transport takes it.
                Header::Stripe { offset, .. } => small.push((offset, f.payload)),
                h => out.push(h),
            });
            prop_assert!(fed.error.is_none(), "{:?}", fed.error);
            prop_assert!(fed.rest.is_empty());
            prop_assert_eq!(out, vec![Header::Bye; pieces.len()]);
            for (offset, piece) in small {
                prop_assert!(piece.len() < read_buffer, "{} bytes", piece.len());
                rooms.0.lock().unwrap().part(S, 2, offset, total, piece).unwrap();
            }
            let f = deliver(&mut rooms.0.lock().unwrap(), 2);
            prop_assert_eq!(f, decode_whole(whole).unwrap());
        }
    }

    /// Pieces read into the room their frame lends lie end to end: the frame is made of them
    /// without a copy.
    #[test]
    fn a_frame_of_pieces_read_in_place_is_not_copied() {
        let whole = frame(10_000);
        let total = whole.len() as u64;
        let mut s = Stripes::new(limits(), S);
        let mut at_zero = 0;
        for (o, p) in shuffled(&whole, 3000, 7) {
            let mut room = s.lend(S, 2, o as u64, total, p.len()).unwrap().unwrap();
            assert_eq!(room.capacity(), p.len());
            if o == 0 {
                at_zero = room.as_ptr() as usize;
            }
            room.extend_from_slice(&p);
            s.placed(S, 2, o as u64, room).unwrap();
        }
        let f = deliver(&mut s, 2);
        let expected = decode_whole(whole.clone()).unwrap();
        assert_eq!(f, expected);
        let header_end = whole.len() - expected.payload.len();
        assert_eq!(
            f.payload.as_ptr() as usize,
            at_zero + header_end,
            "in place"
        );
    }

    /// Lent room is taken: a piece over it is refused, and a room given back after its frame
    /// was dropped is dropped too.
    #[test]
    fn lent_room_is_taken_and_given_back_late_is_dropped() {
        let whole = frame(100);
        let total = whole.len() as u64;
        let mut s = Stripes::new(limits(), S);
        let room = s.lend(S, 1, 0, total, 20).unwrap().unwrap();
        assert!(
            s.part(S, 1, 10, total, whole.slice(10..30)).is_err(),
            "overlap"
        );
        assert!(s.lend(S, 1, 0, total, 20).is_err(), "lent twice");
        assert!(
            s.lend(S + 1, 1, 20, total, 20).unwrap().is_none(),
            "another session"
        );
        s.give_up(1);
        let mut room = room;
        room.extend_from_slice(&whole[..20]);
        assert_eq!(s.placed(S, 1, 0, room).unwrap(), PartOutcome::Dropped);
        assert!(s.lend(S, 1, 20, total, 20).unwrap().is_none(), "dropped");
        assert_eq!(s.open(), 0);
    }

    #[test]
    fn bad_pieces_are_errors() {
        let mut s = Stripes::new(limits(), S);
        let whole = frame(100);
        let total = whole.len() as u64;
        assert!(
            s.part(S, 1, 0, (2 << 20) + 8, whole.clone()).is_err(),
            "too large"
        );
        assert!(
            s.part(S, 1, 50, total, whole.clone()).is_err(),
            "past the end"
        );
        assert!(s.part(S, 1, 0, total, Bytes::new()).is_err(), "empty");
        s.part(S, 1, 0, total, whole.slice(..20)).unwrap();
        assert!(
            s.part(S, 1, 10, total, whole.slice(10..30)).is_err(),
            "overlap"
        );
        assert!(
            s.part(S, 1, 20, total + 1, whole.slice(20..)).is_err(),
            "another total"
        );
        // A commit of a frame whose bytes are a commit.
        let mut s = Stripes::new(limits(), S);
        let inner = encode_frame(
            &Header::Commit {
                session: S,
                id: 1,
                ok: true,
                hold: None,
                lanes: ANY.lanes,
            },
            b"",
            usize::MAX,
        )
        .unwrap();
        let inner = Bytes::from(inner.to_vec());
        s.part(S, 2, 0, inner.len() as u64, inner).unwrap();
        let CommitOutcome::Deliver(a) = s.commit(S, 2, true, ANY).unwrap() else {
            panic!("complete");
        };
        assert!(a.into_frame().is_err());
    }
}
