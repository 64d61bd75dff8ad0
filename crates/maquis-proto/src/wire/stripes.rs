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
//! Nothing here does I/O: the transport feeds pieces and commits in, waits when told to, and
//! says when a lane has lost its connection.
//!
//! # Bounds
//!
//! A striped frame obeys the receiver's frame limit (checked on `total` before any piece is
//! kept), its pieces may not overlap or run past `total`, and memory grows only with the bytes
//! that arrived (pieces are kept as they were read and joined once, at the end, by the caller
//! and outside its lock on the table; a frame of one piece is never copied). At most `soft` frames are open at once: a piece of a new frame waits
//! ([`PartOutcome::Wait`]) until one is handed on, except a frame below the horizon of a commit
//! that is waiting for its pieces (its pieces may be queued ahead of the missing one), which is
//! let in up to `hard` open frames; past that the stream is hostile or corrupt (an error). A
//! sender keeps at most `hard - soft` frames unwritten-committed, so it never reaches `hard`.
//! The ids of the last [`ABORTED_KEPT`] frames dropped are remembered, so that their late
//! pieces are dropped too.
//!
//! # Losses
//!
//! When a connection of the peer ends, pieces in it may be lost and the commits behind them
//! can never complete: [`Stripes::lane_lost`] drops every frame open then, and every piece or
//! commit of a frame numbered below the highest seen so far (they were sent before the loss).
//! A commit still waiting for pieces after the transport's patience runs out is dropped too
//! ([`Stripes::give_up`]). Both are counted by the transport as dropped frames.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::frame::{ActorHeader, Dest};

use bytes::{Bytes, BytesMut};

use super::frame::{decode_whole, Frame, Header};
use super::WireError;

/// How many dropped frames' ids are remembered (their late pieces are dropped).
pub const ABORTED_KEPT: usize = 256;

/// The bounds of a [`Stripes`] table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeLimits {
    /// The largest frame accepted (its length prefix excluded, as for whole frames).
    pub max_frame: usize,
    /// Open frames before a piece of a new one waits.
    pub soft: usize,
    /// Open frames beyond which the stream is refused.
    pub hard: usize,
}

/// What became of a piece.
#[derive(Debug, PartialEq, Eq)]
pub enum PartOutcome {
    /// Kept; its frame still misses pieces.
    Kept,
    /// Kept, and its frame is complete.
    Complete,
    /// Not kept: the table is full. Offer it again once a frame has been handed on.
    Wait,
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

/// The pieces of a striped frame, all in, in order: joined and decoded by
/// [`Assembled::into_frame`], or piece by piece by a caller that wants to do the copying in
/// steps (outside any lock it holds on the table).
#[derive(Debug, PartialEq)]
pub struct Assembled {
    total: usize,
    pieces: Vec<Bytes>,
}

impl Assembled {
    /// The frame's length in bytes, its length prefix included.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The pieces, in order.
    pub fn into_pieces(self) -> Vec<Bytes> {
        self.pieces
    }

    /// Joins the pieces (a frame of one piece is not copied) and decodes the frame.
    pub fn into_frame(self) -> Result<Frame, WireError> {
        let whole = if self.pieces.len() == 1 {
            self.pieces.into_iter().next().expect("one piece")
        } else {
            let mut buf = BytesMut::with_capacity(self.total);
            for p in self.pieces {
                buf.extend_from_slice(&p);
            }
            buf.freeze()
        };
        decode_striped(whole)
    }
}

/// Decodes the bytes of a striped frame, which may not be a part, piece or commit itself.
pub fn decode_striped(whole: Bytes) -> Result<Frame, WireError> {
    let frame = decode_whole(whole)?;
    if matches!(
        frame.header,
        Header::Part { .. }
            | Header::Stripe { .. }
            | Header::Commit { .. }
            | Header::Barrier { .. }
    ) {
        return Err(WireError::BadHeader(
            "a part, piece, commit or barrier inside a striped frame".into(),
        ));
    }
    Ok(frame)
}

/// One striped frame being put together.
#[derive(Debug)]
struct Open {
    total: usize,
    received: usize,
    /// Pieces by offset.
    pieces: BTreeMap<usize, Bytes>,
}

/// A peer's striped frames being put together (see the module's doc).
#[derive(Debug)]
pub struct Stripes {
    limits: StripeLimits,
    open: HashMap<u64, Open>,
    aborted: VecDeque<u64>,
    /// Every frame numbered below this was dropped.
    floor: u64,
    /// One more than the highest id seen.
    seen: u64,
    /// The horizons of the commits waiting for pieces.
    waiting: Vec<(u64, u64)>,
}

impl Stripes {
    /// An empty table.
    pub fn new(limits: StripeLimits) -> Self {
        Stripes {
            limits,
            open: HashMap::new(),
            aborted: VecDeque::new(),
            floor: 0,
            seen: 0,
            waiting: Vec::new(),
        }
    }

    /// Frames open now.
    pub fn open(&self) -> usize {
        self.open.len()
    }

    fn dropped(&self, id: u64) -> bool {
        id < self.floor || self.aborted.contains(&id)
    }

    fn abort(&mut self, id: u64) {
        self.open.remove(&id);
        if self.aborted.len() == ABORTED_KEPT {
            self.aborted.pop_front();
        }
        self.aborted.push_back(id);
    }

    /// Takes in the piece of frame `id` (of `total` bytes) at `offset`.
    pub fn part(
        &mut self,
        id: u64,
        offset: u64,
        total: u64,
        piece: Bytes,
    ) -> Result<PartOutcome, WireError> {
        if self.dropped(id) {
            return Ok(PartOutcome::Dropped);
        }
        let total = usize::try_from(total).unwrap_or(usize::MAX);
        // The length prefix counts everything after itself.
        if total.saturating_sub(4) > self.limits.max_frame {
            return Err(WireError::FrameTooLarge {
                len: total.saturating_sub(4),
                max: self.limits.max_frame,
            });
        }
        let offset = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = offset.checked_add(piece.len()).filter(|&e| e <= total);
        let Some(end) = end else {
            return Err(WireError::BadHeader(format!(
                "a piece at {offset} of {} bytes runs past its frame's {total}",
                piece.len()
            )));
        };
        if piece.is_empty() {
            return Err(WireError::BadHeader("an empty piece".into()));
        }
        if !self.open.contains_key(&id) {
            let below_horizon = self.waiting.iter().any(|&(_, h)| id < h);
            if self.open.len() >= self.limits.hard {
                return Err(WireError::BadHeader(format!(
                    "more than {} striped frames open",
                    self.limits.hard
                )));
            }
            if self.open.len() >= self.limits.soft && !below_horizon {
                return Ok(PartOutcome::Wait);
            }
            self.open.insert(
                id,
                Open {
                    total,
                    received: 0,
                    pieces: BTreeMap::new(),
                },
            );
        }
        self.seen = self.seen.max(id.saturating_add(1));
        let open = self.open.get_mut(&id).expect("inserted above");
        if open.total != total {
            return Err(WireError::BadHeader(format!(
                "pieces of one striped frame announce {} and {total} bytes",
                open.total
            )));
        }
        let before = open.pieces.range(..end).next_back();
        let overlaps = before.is_some_and(|(&o, p)| o + p.len() > offset);
        if overlaps {
            return Err(WireError::BadHeader(format!(
                "a piece at {offset} overlaps another"
            )));
        }
        open.received += piece.len();
        open.pieces.insert(offset, piece);
        Ok(if open.received == open.total {
            PartOutcome::Complete
        } else {
            PartOutcome::Kept
        })
    }

    /// Takes in the commit of frame `id`: the frame to hand on, or why not yet.
    pub fn commit(&mut self, id: u64, ok: bool, horizon: u64) -> Result<CommitOutcome, WireError> {
        if self.dropped(id) {
            self.stop_waiting(id);
            return Ok(CommitOutcome::Dropped);
        }
        self.seen = self.seen.max(id.saturating_add(1));
        if !ok {
            self.stop_waiting(id);
            self.abort(id);
            return Ok(CommitOutcome::Dropped);
        }
        let complete = self
            .open
            .get(&id)
            .is_some_and(|o| o.received == o.total && o.total > 0);
        if !complete {
            if !self.waiting.iter().any(|&(w, _)| w == id) {
                self.waiting.push((id, horizon));
            }
            return Ok(CommitOutcome::Pending);
        }
        self.stop_waiting(id);
        let open = self.open.remove(&id).expect("complete above");
        Ok(CommitOutcome::Deliver(Assembled {
            total: open.total,
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
        let was = self.waiting.iter().any(|&(w, _)| w == id);
        self.stop_waiting(id);
        self.abort(id);
        was
    }

    /// A connection of the peer ended: every frame open, and every frame numbered below the
    /// highest seen, is dropped. Returns how many open frames were dropped.
    pub fn lane_lost(&mut self) -> usize {
        let n = self.open.len();
        self.open.clear();
        self.floor = self.floor.max(self.seen);
        n
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
        /// The striped frame.
        id: u64,
        /// False when its sender lost a piece.
        ok: bool,
        /// See [`Header::Commit`].
        horizon: u64,
        /// Its hold key.
        hold: Option<u64>,
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
                id,
                ok,
                horizon,
                hold,
            } => (
                hold,
                Held::Commit {
                    id,
                    ok,
                    horizon,
                    hold,
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

    fn limits() -> StripeLimits {
        StripeLimits {
            max_frame: 1 << 20,
            soft: 2,
            hard: 4,
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
        match s.commit(id, true, id + 1).unwrap() {
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
            let mut s = Stripes::new(limits());
            let last = pieces.len() - 1;
            for (i, (o, p)) in pieces.into_iter().enumerate() {
                if i == last {
                    prop_assert_eq!(s.commit(7, true, 8).unwrap(), CommitOutcome::Pending);
                }
                let out = s.part(7, o as u64, total, p).unwrap();
                prop_assert_eq!(out, if i == last { PartOutcome::Complete } else { PartOutcome::Kept });
            }
            let f = deliver(&mut s, 7);
            prop_assert_eq!(f.payload.len(), n);
            prop_assert_eq!(s.open(), 0);
        }

        /// Hostile pieces and commits never panic, and the table never holds more than its
        /// bound.
        #[test]
        fn hostile_input_is_refused_not_obeyed(
            ops in proptest::collection::vec((0u64..8, any::<u64>(), any::<u64>(), 0usize..64, any::<bool>()), 0..64)
        ) {
            let mut s = Stripes::new(limits());
            for (id, offset, total, len, commit) in ops {
                let total = total % (2 << 20);
                let _ = if commit {
                    s.commit(id, offset % 2 == 0, total).map(|_| ())
                } else {
                    s.part(id, offset % (2 << 20), total, Bytes::from(vec![0u8; len])).map(|_| ())
                };
                prop_assert!(s.open() <= limits().hard);
            }
        }
    }

    #[test]
    fn a_full_table_makes_new_frames_wait_unless_a_commit_needs_them() {
        let mut s = Stripes::new(limits());
        let whole = frame(100);
        let total = whole.len() as u64;
        let half = whole.len() / 2;
        for id in 0..2 {
            let out = s.part(id, 0, total, whole.slice(..half)).unwrap();
            assert_eq!(out, PartOutcome::Kept);
        }
        assert_eq!(
            s.part(5, 0, total, whole.slice(..half)).unwrap(),
            PartOutcome::Wait
        );
        // Frame 1's commit waits for its second piece, which is queued behind a piece of
        // frame 5 on some lane: frame 5 is below its horizon and comes in.
        assert_eq!(s.commit(1, true, 6).unwrap(), CommitOutcome::Pending);
        assert_eq!(
            s.part(5, 0, total, whole.slice(..half)).unwrap(),
            PartOutcome::Kept
        );
        // Not frame 6: it was sent after frame 1's last piece.
        assert_eq!(
            s.part(6, 0, total, whole.slice(..half)).unwrap(),
            PartOutcome::Wait
        );
        assert_eq!(
            s.part(1, half as u64, total, whole.slice(half..)).unwrap(),
            PartOutcome::Complete
        );
        assert_eq!(deliver(&mut s, 1).payload.len(), 100);
        // A hostile sender filling the table past its hard bound is refused.
        s.commit(0, true, 100).unwrap();
        for id in 10..12 {
            s.part(id, 0, total, whole.slice(..half)).unwrap();
        }
        assert!(s.part(12, 0, total, whole.slice(..half)).is_err());
    }

    #[test]
    fn lost_and_aborted_frames_are_dropped_with_their_late_pieces() {
        let mut s = Stripes::new(limits());
        let whole = frame(100);
        let total = whole.len() as u64;
        s.part(3, 0, total, whole.slice(..10)).unwrap();
        assert_eq!(s.commit(3, false, 4).unwrap(), CommitOutcome::Dropped);
        assert_eq!(
            s.part(3, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
        assert_eq!(s.open(), 0);
        s.part(4, 0, total, whole.slice(..10)).unwrap();
        assert_eq!(s.lane_lost(), 1);
        assert_eq!(
            s.part(4, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
        assert_eq!(s.commit(4, true, 5).unwrap(), CommitOutcome::Dropped);
        // A frame sent after the loss goes through.
        s.part(9, 0, total, whole.clone()).unwrap();
        assert_eq!(deliver(&mut s, 9).payload.len(), 100);
        // Given up on: its late piece is dropped.
        s.part(10, 0, total, whole.slice(..10)).unwrap();
        assert_eq!(s.commit(10, true, 11).unwrap(), CommitOutcome::Pending);
        assert!(s.give_up(10));
        assert_eq!(
            s.part(10, 10, total, whole.slice(10..)).unwrap(),
            PartOutcome::Dropped
        );
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
                id,
                ok: true,
                horizon: id + 1,
                hold,
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

    #[test]
    fn bad_pieces_are_errors() {
        let mut s = Stripes::new(limits());
        let whole = frame(100);
        let total = whole.len() as u64;
        assert!(
            s.part(1, 0, (2 << 20) + 8, whole.clone()).is_err(),
            "too large"
        );
        assert!(s.part(1, 50, total, whole.clone()).is_err(), "past the end");
        assert!(s.part(1, 0, total, Bytes::new()).is_err(), "empty");
        s.part(1, 0, total, whole.slice(..20)).unwrap();
        assert!(
            s.part(1, 10, total, whole.slice(10..30)).is_err(),
            "overlap"
        );
        assert!(
            s.part(1, 20, total + 1, whole.slice(20..)).is_err(),
            "another total"
        );
        // A commit of a frame whose bytes are a commit.
        let mut s = Stripes::new(limits());
        let inner = encode_frame(
            &Header::Commit {
                id: 1,
                ok: true,
                horizon: 2,
                hold: None,
            },
            b"",
            usize::MAX,
        )
        .unwrap();
        let inner = Bytes::from(inner.to_vec());
        s.part(2, 0, inner.len() as u64, inner).unwrap();
        let CommitOutcome::Deliver(a) = s.commit(2, true, 3).unwrap() else {
            panic!("complete");
        };
        assert!(a.into_frame().is_err());
    }
}
