//! The order in which a lane's writer puts its frames on the wire.
//!
//! Small frames go in the order they were queued. A frame longer than a part
//! ([`maquis_proto::wire::parts`]) goes in parts, with the frames queued meanwhile written
//! between its parts: one part per write when other frames go with it, up to `PARTS_ALONE`
//! when it is alone (fewer system calls), so a small message behind an 8 MiB one waits for the
//! write in progress, not for the whole message. Order still holds where it is promised: every
//! frame carries an order key
//! (the hash the lane was picked by: the sender and receiver, or the partition key), and a
//! frame whose key is that of a frame still in parts, or of a frame already waiting, waits
//! too, in queue order. Frames without a key (the runtime's own) are in no order with large
//! frames. One frame is in parts at a time; the next large frame waits for its turn.
//!
//! The commit of a frame striped over other lanes ([`super::stripe`]) is held the same way
//! until its gate opens (every piece written or dropped), with the frames of its key behind
//! it; the writer is woken when a gate opens and the held frames are placed again.
//!
//! A barrier across a channel's lanes ([`super::widen`]) goes after every frame queued before
//! it and before every frame queued after it, whatever their keys.
//!
//! Nothing here does I/O: the writer asks for a [`Round`] (what to write next), writes it, and
//! says how the write went.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use maquis_proto::wire::Parts;

use super::lane::OutFrame;
use super::stripe::Role;

/// The most parts of a frame in one write when no other frame is waiting.
const PARTS_ALONE: usize = 4;

/// What one write puts on the wire: whole frames, then at most one part of a large frame.
#[derive(Default)]
pub(crate) struct Round {
    /// Whole frames, in order.
    pub frames: Vec<OutFrame>,
    /// The buffers of the parts in this write (each part's head, then its piece), or nothing:
    /// one part when whole frames go too, up to `PARTS_ALONE` when none do.
    pub part: Vec<Bytes>,
    /// Whether `part` ends with the last part of its frame.
    pub last_part: bool,
    /// The bytes of the frame in parts that `part` carries (heads of parts not counted).
    pub part_len: usize,
}

impl Round {
    /// Whether there is nothing to write.
    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty() && self.part.is_empty()
    }

    /// Empties it for the next write (keeping its memory).
    pub(crate) fn clear(&mut self) {
        self.frames.clear();
        self.part.clear();
        self.last_part = false;
        self.part_len = 0;
    }
}

/// The frame in parts: the queued frame (which holds queue room for the bytes not written yet)
/// and its parts.
struct Large {
    frame: OutFrame,
    parts: Parts,
}

/// A lane writer's frames that are not plain first-in, first-out (see the module's doc).
pub(crate) struct Schedule {
    part: usize,
    large: Option<Large>,
    /// Frames that wait, in queue order: behind a frame in parts with their key, or large
    /// frames waiting for their turn.
    held: VecDeque<OutFrame>,
    /// How many frames of each key wait in `held`.
    held_keys: HashMap<u64, usize>,
    /// How many barriers wait in `held` (every frame behind one waits too).
    held_barriers: usize,
    /// Frames let go from `held`: they go before any frame queued after them.
    ready: VecDeque<OutFrame>,
}

impl Schedule {
    /// A schedule that sends frames longer than `part` bytes in parts of that size.
    pub(crate) fn new(part: usize) -> Self {
        Schedule {
            part,
            large: None,
            held: VecDeque::new(),
            held_keys: HashMap::new(),
            held_barriers: 0,
            ready: VecDeque::new(),
        }
    }

    /// Whether it holds no frame at all (nothing in parts, held or let go).
    pub(crate) fn is_empty(&self) -> bool {
        !self.busy() && self.held.is_empty()
    }

    /// Whether it has something to write without any new frame: parts left, or frames let go.
    pub(crate) fn busy(&self) -> bool {
        self.large.is_some() || !self.ready.is_empty()
    }

    /// Fills `round` with the next write: the frames let go, then `incoming` (newly queued,
    /// emptied), each written now or held, then the next part of the frame in parts. `opened`:
    /// a gate of a commit held here may have opened since the last write.
    pub(crate) fn fill(&mut self, incoming: &mut Vec<OutFrame>, round: &mut Round, opened: bool) {
        if opened && !self.held.is_empty() {
            self.let_go();
        }
        // Placed when they were let go (a large frame behind them may have started its
        // parts since; they go before it all the same).
        round.frames.extend(self.ready.drain(..));
        for f in incoming.drain(..) {
            if let Some(f) = self.place(f) {
                round.frames.push(f);
            }
        }
        if let Some(large) = &mut self.large {
            let before = large.parts.sent();
            // With nothing else to write, several parts go in one write (fewer system calls);
            // a frame queued meanwhile waits for at most that write.
            let most = if round.frames.is_empty() {
                PARTS_ALONE
            } else {
                1
            };
            for _ in 0..most {
                round.last_part = large.parts.next_part(&mut round.part);
                if round.last_part {
                    break;
                }
            }
            round.part_len = large.parts.sent() - before;
        }
    }

    /// The write of `round` went out whole: with its last part, the frame in parts is done
    /// and handed back (to be counted and to give back its permits); the frames it held back
    /// are let go.
    pub(crate) fn written(&mut self, round: &Round) -> Option<OutFrame> {
        if !round.last_part {
            if let Some(large) = &mut self.large {
                large.frame.release(round.part_len);
            }
            return None;
        }
        let done = self.large.take().map(|l| l.frame);
        self.let_go();
        done
    }

    /// The connection was lost; `failed` is the write that failed, if one did. A frame in
    /// parts whose last part was not in a write goes again, whole, on the next connection (the
    /// other end drops a frame it has only part of; the queue room its written parts gave
    /// back is not taken again, so the queue may exceed its bound by that much). One whose last part was in the failed
    /// write may have arrived: it is handed back to be dropped, and never sent twice.
    pub(crate) fn lost(&mut self, failed: Option<&Round>) -> Option<OutFrame> {
        if failed.is_some_and(|r| r.last_part) {
            let dropped = self.large.take().map(|l| l.frame);
            self.let_go();
            return dropped;
        }
        if let Some(large) = &mut self.large {
            large.parts.restart();
        }
        None
    }

    /// Every frame it holds, in queue order (the frame in parts first), to be sent another
    /// way or dropped: the lane's writer is ending.
    pub(crate) fn take_all(&mut self) -> Vec<OutFrame> {
        let mut all = Vec::with_capacity(1 + self.ready.len() + self.held.len());
        all.extend(self.large.take().map(|l| l.frame));
        all.extend(self.ready.drain(..));
        all.extend(self.held.drain(..));
        self.held_keys.clear();
        self.held_barriers = 0;
        all
    }

    /// Where frame `f` goes: returned to be written now, or kept (held, or as the frame in
    /// parts).
    fn place(&mut self, mut f: OutFrame) -> Option<OutFrame> {
        let gated = match &f.role {
            Role::Commit { gate, .. } if gate.is_open() => {
                f.head = gate.commit_head();
                false
            }
            Role::Commit { .. } => true,
            // A barrier passes nothing queued before it.
            Role::Barrier => !self.held.is_empty() || self.large.is_some(),
            _ => false,
        };
        let blocked = gated
            || self.held_barriers > 0
            || f.order.is_some_and(|k| {
                self.held_keys.contains_key(&k)
                    || self
                        .large
                        .as_ref()
                        .is_some_and(|l| l.frame.order == Some(k))
            });
        // A piece of a striped frame is at most a part already.
        let large = matches!(f.role, Role::Whole)
            && Parts::needed(f.head.len(), f.payload.len(), self.part);
        if blocked || (large && self.large.is_some()) {
            if let Some(k) = f.order {
                *self.held_keys.entry(k).or_default() += 1;
            }
            if matches!(f.role, Role::Barrier) {
                self.held_barriers += 1;
            }
            self.held.push_back(f);
            None
        } else if large {
            let parts = Parts::new(f.head.clone(), f.payload.clone(), self.part);
            self.large = Some(Large { frame: f, parts });
            None
        } else {
            // A piece going to be written is numbered for good (and encoded anew if its frame
            // was numbered again for a new table of the receiver's).
            if let Role::Part(guard) = &mut f.role {
                if let Some(head) = guard.start() {
                    f.head = head;
                }
            }
            Some(f)
        }
    }

    /// Places the held frames again, in order, with no frame in parts: the first large one
    /// becomes the frame in parts, the frames of its key wait again, the others are let go.
    fn let_go(&mut self) {
        self.held_keys.clear();
        self.held_barriers = 0;
        let held = std::mem::take(&mut self.held);
        for f in held {
            if let Some(f) = self.place(f) {
                self.ready.push_back(f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::lane::testing::frame;

    const PART: usize = 100;

    /// The ids (first payload byte) of the whole frames in a round, and whether it carries a
    /// part.
    fn ids(round: &Round) -> (Vec<u8>, bool) {
        let ids = round
            .frames
            .iter()
            .map(|f| f.payload.bufs()[0][0])
            .collect();
        (ids, !round.part.is_empty())
    }

    /// Runs writes until nothing is left; the frames in the order their last byte went out.
    fn run(s: &mut Schedule, mut incoming: Vec<OutFrame>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut round = Round::default();
        loop {
            s.fill(&mut incoming, &mut round, false);
            if round.is_empty() {
                return out;
            }
            out.extend(round.frames.iter().map(|f| f.payload.bufs()[0][0]));
            if let Some(done) = s.written(&round) {
                out.push(done.payload.bufs()[0][0]);
            }
            round.clear();
        }
    }

    #[test]
    fn small_frames_go_between_the_parts_of_a_large_one() {
        let mut s = Schedule::new(PART);
        let mut round = Round::default();
        // Frame 1 is 1,006 bytes: eleven parts. Alone, several go in one write.
        s.fill(&mut vec![frame(1, Some(1), 1000)], &mut round, false);
        assert_eq!(ids(&round), (vec![], true));
        assert_eq!(round.part_len, PARTS_ALONE * PART);
        assert!(s.written(&round).is_none());
        round.clear();
        s.fill(
            &mut vec![frame(2, Some(2), 10), frame(3, None, 10)],
            &mut round,
            false,
        );
        assert_eq!(ids(&round), (vec![2, 3], true), "other keys overtake");
        assert_eq!(round.part_len, PART, "one part beside other frames");
        assert!(s.written(&round).is_none());
        assert!(s.busy());
        round.clear();
        let rest = run(&mut s, vec![]);
        assert_eq!(rest, vec![1], "the other parts, then it is done");
        assert!(!s.busy());
    }

    #[test]
    fn a_key_keeps_its_order_behind_its_frame_in_parts() {
        let mut s = Schedule::new(PART);
        let order = run(
            &mut s,
            vec![
                frame(1, Some(7), 300),
                frame(2, Some(7), 10),
                frame(3, Some(8), 10),
                frame(4, Some(7), 10),
                frame(5, None, 10),
            ],
        );
        assert_eq!(order, vec![3, 5, 1, 2, 4]);
    }

    #[test]
    fn large_frames_take_turns_and_keep_their_keys_order() {
        let mut s = Schedule::new(PART);
        let order = run(
            &mut s,
            vec![
                frame(1, Some(1), 300),
                frame(2, Some(2), 300),
                frame(3, Some(2), 10),
                frame(4, Some(3), 10),
                frame(5, Some(1), 10),
            ],
        );
        // 2 waits for 1 to finish (one frame in parts at a time), 3 for 2 (same key); 4 goes
        // at once; 5 as soon as 1 is done.
        assert_eq!(order, vec![4, 1, 5, 2, 3]);
    }

    #[test]
    fn a_lost_connection_restarts_the_frame_unless_its_end_may_have_arrived() {
        let mut s = Schedule::new(PART);
        let mut round = Round::default();
        s.fill(&mut vec![frame(1, Some(1), 1000)], &mut round, false);
        assert!(!round.last_part);
        s.written(&round);
        round.clear();
        // Lost between writes: the frame goes again from its first part.
        assert!(s.lost(None).is_none());
        s.fill(&mut vec![], &mut round, false);
        assert!(!round.last_part);
        assert_eq!(round.part_len, PARTS_ALONE * PART, "from its first byte");
        round.clear();
        assert_eq!(run(&mut s, vec![]), vec![1]);

        // Lost in the write of its last part: dropped, and the frame of its key behind it
        // goes.
        let mut s = Schedule::new(PART);
        let mut round = Round::default();
        s.fill(
            &mut vec![frame(1, Some(1), 150), frame(2, Some(1), 10)],
            &mut round,
            false,
        );
        assert!(round.last_part, "both parts in one write");
        let dropped = s.lost(Some(&round)).expect("handed back");
        assert_eq!(dropped.payload.bufs()[0][0], 1);
        round.clear();
        assert_eq!(run(&mut s, vec![]), vec![2]);
    }

    #[test]
    fn a_commit_waits_for_its_pieces_with_its_key_behind_it() {
        use crate::id::LaneId;
        use crate::transport::lane::Lane;
        use crate::transport::stripe::testing::{commit, gate};
        use maquis_proto::wire::{decode_head, Header};

        let (lane, _task) = Lane::new(LaneId::new("default", 0), 1 << 20);
        for (pieces_written, ok) in [(true, true), (false, false)] {
            let mut s = Schedule::new(PART);
            let mut round = Round::default();
            let (g, mut guards) = gate(7, 2, &lane);
            let mut c = frame(1, Some(1), 10);
            c.role = commit(&g);
            s.fill(
                &mut vec![c, frame(2, Some(1), 10), frame(3, Some(2), 10)],
                &mut round,
                false,
            );
            assert_eq!(ids(&round), (vec![3], false), "other keys go by");
            round.clear();
            let mut first = guards.pop().unwrap();
            first.written(&Default::default());
            drop(first);
            s.fill(&mut vec![frame(4, Some(1), 10)], &mut round, true);
            assert!(round.is_empty(), "one piece is still out");
            // The last piece goes: written, or dropped unwritten.
            let mut last = guards.pop().unwrap();
            if pieces_written {
                last.written(&Default::default());
            }
            drop(last);
            assert!(g.is_open());
            s.fill(&mut vec![], &mut round, true);
            assert_eq!(ids(&round), (vec![1, 2, 4], false));
            let header = decode_head(&round.frames[0].head).unwrap();
            assert_eq!(
                header,
                Header::Commit {
                    session: 0,
                    id: 7,
                    ok,
                    hold: None,
                    lanes: 0
                }
            );
        }
    }

    /// The commit (frame `id`, order key `order`) of a striped frame of one piece, and the
    /// piece's guard: the commit may go once the guard is dropped.
    fn one_piece_commit(id: u8, order: u64) -> (OutFrame, crate::transport::stripe::PartGuard) {
        use crate::id::LaneId;
        use crate::transport::lane::Lane;
        use crate::transport::stripe::testing::{commit, gate};

        let (lane, _task) = Lane::new(LaneId::new("default", 0), 1 << 20);
        let (g, mut guards) = gate(7, 1, &lane);
        let mut c = frame(id, Some(order), 10);
        c.role = commit(&g);
        (c, guards.pop().expect("one piece"))
    }

    #[test]
    fn a_barrier_passes_nothing_and_nothing_passes_it() {
        let mut s = Schedule::new(PART);
        let mut round = Round::default();
        let (c, mut piece) = one_piece_commit(1, 1);
        let mut barrier = frame(3, None, 10);
        barrier.role = Role::Barrier;
        s.fill(
            &mut vec![c, frame(2, Some(2), 10), barrier, frame(4, Some(5), 10)],
            &mut round,
            false,
        );
        // Another key passes the waiting commit; the barrier waits behind it, and a key
        // queued after the barrier waits behind the barrier.
        assert_eq!(ids(&round), (vec![2], false));
        round.clear();
        // A large frame behind the barrier does not start its parts either.
        s.fill(&mut vec![frame(5, Some(6), 300)], &mut round, false);
        assert!(round.is_empty());
        piece.written(&Default::default());
        drop(piece);
        s.fill(&mut vec![], &mut round, true);
        assert_eq!(
            ids(&round),
            (vec![1, 3, 4], true),
            "in queue order, then parts"
        );
        round.clear();
        assert_eq!(run(&mut s, vec![]), vec![5]);

        // Behind a frame in parts, a barrier waits for its last part.
        let mut s = Schedule::new(PART);
        let mut barrier = frame(2, None, 10);
        barrier.role = Role::Barrier;
        let order = run(
            &mut s,
            vec![frame(1, Some(1), 300), barrier, frame(3, None, 10)],
        );
        assert_eq!(order, vec![1, 2, 3]);
    }

    #[test]
    fn frames_let_go_stay_ahead_of_a_large_frame_of_their_key_behind_them() {
        let mut s = Schedule::new(PART);
        let mut round = Round::default();
        let (c, mut piece) = one_piece_commit(1, 1);
        s.fill(
            &mut vec![c, frame(2, Some(1), 10), frame(3, Some(1), 300)],
            &mut round,
            false,
        );
        assert!(round.is_empty());
        piece.written(&Default::default());
        drop(piece);
        s.fill(&mut vec![], &mut round, true);
        assert_eq!(ids(&round), (vec![1, 2], true));
        round.clear();
        assert_eq!(run(&mut s, vec![]), vec![3]);
    }

    #[test]
    fn everything_held_is_handed_back_in_order() {
        let mut s = Schedule::new(PART);
        let mut round = Round::default();
        s.fill(
            &mut vec![
                frame(1, Some(1), 300),
                frame(2, Some(1), 10),
                frame(3, Some(2), 300),
            ],
            &mut round,
            false,
        );
        let all: Vec<u8> = s
            .take_all()
            .iter()
            .map(|f| f.payload.bufs()[0][0])
            .collect();
        assert_eq!(all, vec![1, 2, 3]);
        assert!(!s.busy());
    }
}
