//! Barriers across a channel's lanes, as they arrive: the receiver's side of a change in how
//! many lanes of a channel carry small frames.
//!
//! A sender that moves the small frames of a channel from `k` lanes to `k'` (each order key
//! then on lane `key mod k'`) writes a [`Header::Barrier`](super::Header::Barrier) with a new
//! epoch on each of the first `max(k, k')` lanes, after every frame queued before the change
//! and before every frame queued after it. A key that changes lanes keeps its order if the
//! receiver hands on nothing behind a barrier on one lane before everything ahead of it on all
//! of them: each lane's reader stops at the barrier, hands on what it holds, then *arrives*;
//! the barrier is *released* once all its lanes have arrived. A lane that never arrives (its
//! connection lost) is waited for a bounded time after it stops reading, then the barrier is
//! given up: the readers go on, and the keys that moved may be out of order once, as messages
//! may be lost with a lost connection. [`Barriers::missing`] names the lanes still awaited.
//!
//! [`Barriers`] is that table for one peer, without I/O or clock: the runtime's readers wait
//! for its changes and give up on their own deadline. Every barrier of a channel shares lane 0
//! (`lanes` ≥ 1), so barriers are released in epoch order.

use std::collections::{BTreeMap, HashMap};

use super::WireError;

/// Barriers of one channel that may wait at once; one more is an error (the sender writes a
/// new one only after its lane 0 passed the last, so a correct peer has at most one per lane).
pub const MAX_PENDING: usize = 64;

/// What an arrival at a barrier came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Every lane of it has arrived, now or before: go on.
    Released,
    /// Other lanes have yet to arrive: wait for a change and ask [`Barriers::is_released`].
    Wait,
}

/// One channel's barriers.
#[derive(Debug, Default)]
struct Channel {
    /// Every barrier up to this epoch is released.
    released: u64,
    /// Barriers after it, with the lanes that have arrived at each.
    pending: BTreeMap<u64, Pending>,
}

#[derive(Debug)]
struct Pending {
    lanes: u16,
    /// One bit per lane index that arrived (indexes ≥ 128 are refused by `arrive`).
    arrived: u128,
}

/// The barriers of one peer's channels (see the module's doc).
#[derive(Debug, Default)]
pub struct Barriers {
    channels: HashMap<u16, Channel>,
}

impl Barriers {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lane `index` of channel `channel` (of `parallelism` lanes) arrived at barrier `epoch`
    /// across the channel's first `lanes` lanes, having handed on everything ahead of it.
    ///
    /// Errors (the peer breaks the protocol; its connection is closed): `lanes` is 0, more
    /// than the channel has or more than 128; the lane is not among them; the lane already
    /// arrived; the barrier disagrees with an earlier arrival on its lane count; too many
    /// barriers wait.
    pub fn arrive(
        &mut self,
        channel: u16,
        index: u16,
        parallelism: u16,
        epoch: u64,
        lanes: u16,
    ) -> Result<Arrival, WireError> {
        if lanes == 0 || lanes > parallelism || lanes > 128 || index >= lanes {
            return Err(WireError::BadHeader(format!(
                "barrier over {lanes} lanes read on lane {index} of {parallelism}"
            )));
        }
        let ch = self.channels.entry(channel).or_default();
        if epoch <= ch.released {
            return Ok(Arrival::Released);
        }
        if !ch.pending.contains_key(&epoch) && ch.pending.len() >= MAX_PENDING {
            return Err(WireError::BadHeader(format!(
                "more than {MAX_PENDING} barriers wait"
            )));
        }
        let p = ch
            .pending
            .entry(epoch)
            .or_insert(Pending { lanes, arrived: 0 });
        let bit = 1u128 << index;
        if p.lanes != lanes || p.arrived & bit != 0 {
            return Err(WireError::BadHeader(format!(
                "barrier {epoch} read twice on lane {index}, or over another lane count"
            )));
        }
        p.arrived |= bit;
        if p.arrived.count_ones() < u32::from(lanes) {
            return Ok(Arrival::Wait);
        }
        ch.release(epoch);
        Ok(Arrival::Released)
    }

    /// Whether barrier `epoch` of `channel` is released (or given up).
    pub fn is_released(&self, channel: u16, epoch: u64) -> bool {
        self.channels
            .get(&channel)
            .is_some_and(|c| c.released >= epoch)
    }

    /// The lanes (a bit per lane index) that have yet to arrive at barrier `epoch` of
    /// `channel`; 0 when it is released or no lane has arrived at it yet.
    pub fn missing(&self, channel: u16, epoch: u64) -> u128 {
        let Some(p) = self
            .channels
            .get(&channel)
            .and_then(|c| c.pending.get(&epoch))
        else {
            return 0;
        };
        let all = if p.lanes >= 128 {
            u128::MAX
        } else {
            (1u128 << p.lanes) - 1
        };
        all & !p.arrived
    }

    /// The lanes (a bit per lane index) of `channel` that have arrived at a barrier before
    /// `epoch` that is not yet released: they read nothing more until it is, and it is that
    /// barrier's waiters, not a later one's, that tell whether its lanes are lost.
    pub fn held_before(&self, channel: u16, epoch: u64) -> u128 {
        self.channels.get(&channel).map_or(0, |c| {
            c.pending
                .range(..epoch)
                .fold(0, |held, (_, p)| held | p.arrived)
        })
    }

    /// Barrier `epoch` of `channel` waited too long: it, and every one before it, counts as
    /// released.
    pub fn give_up(&mut self, channel: u16, epoch: u64) {
        self.channels.entry(channel).or_default().release(epoch);
    }
}

impl Channel {
    fn release(&mut self, epoch: u64) {
        self.released = self.released.max(epoch);
        self.pending = self.pending.split_off(&(epoch + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn held_before_names_the_lanes_stopped_at_an_earlier_barrier() {
        let mut b = Barriers::new();
        // Barrier 1 over lanes 0-1: lane 0 arrived, lane 1 is behind. Barrier 2 over lanes
        // 0-3: lanes 2 and 3 (not in barrier 1) arrived.
        assert_eq!(b.arrive(0, 0, 4, 1, 2).unwrap(), Arrival::Wait);
        assert_eq!(b.arrive(0, 2, 4, 2, 4).unwrap(), Arrival::Wait);
        assert_eq!(b.arrive(0, 3, 4, 2, 4).unwrap(), Arrival::Wait);
        assert_eq!(b.missing(0, 2), 0b0011);
        assert_eq!(b.held_before(0, 2), 0b0001, "lane 0 waits at barrier 1");
        assert_eq!(b.held_before(0, 1), 0);
        assert_eq!(b.held_before(1, 2), 0, "another channel");
        // Barrier 1 released: nothing holds lane 0 any more.
        assert_eq!(b.arrive(0, 1, 4, 1, 2).unwrap(), Arrival::Released);
        assert_eq!(b.held_before(0, 2), 0);
    }

    #[test]
    fn missing_names_the_lanes_yet_to_arrive() {
        let mut b = Barriers::new();
        assert_eq!(b.missing(0, 1), 0, "no lane arrived yet");
        assert_eq!(b.arrive(0, 0, 4, 1, 3).unwrap(), Arrival::Wait);
        assert_eq!(b.missing(0, 1), 0b110);
        assert_eq!(b.arrive(0, 2, 4, 1, 3).unwrap(), Arrival::Wait);
        assert_eq!(b.missing(0, 1), 0b010);
        assert_eq!(b.arrive(0, 1, 4, 1, 3).unwrap(), Arrival::Released);
        assert_eq!(b.missing(0, 1), 0, "released");
        assert_eq!(b.arrive(0, 127, 128, 2, 128).unwrap(), Arrival::Wait);
        assert_eq!(b.missing(0, 2), u128::MAX >> 1);
    }

    #[test]
    fn released_when_every_lane_arrived() {
        let mut b = Barriers::new();
        assert_eq!(b.arrive(0, 0, 4, 1, 3).unwrap(), Arrival::Wait);
        assert_eq!(b.arrive(0, 2, 4, 1, 3).unwrap(), Arrival::Wait);
        assert!(!b.is_released(0, 1));
        // Another channel's barriers are apart.
        assert_eq!(b.arrive(8, 0, 4, 1, 1).unwrap(), Arrival::Released);
        assert_eq!(b.arrive(0, 1, 4, 1, 3).unwrap(), Arrival::Released);
        assert!(b.is_released(0, 1));
        // A late arrival at a released barrier goes on.
        assert_eq!(b.arrive(0, 0, 4, 1, 3).unwrap(), Arrival::Released);
    }

    #[test]
    fn a_barrier_given_up_releases_it_and_those_before() {
        let mut b = Barriers::new();
        assert_eq!(b.arrive(0, 1, 2, 1, 2).unwrap(), Arrival::Wait);
        assert_eq!(b.arrive(0, 1, 2, 2, 2).unwrap(), Arrival::Wait);
        b.give_up(0, 2);
        assert!(b.is_released(0, 1) && b.is_released(0, 2));
        assert!(!b.is_released(0, 3));
        assert_eq!(b.arrive(0, 0, 2, 1, 2).unwrap(), Arrival::Released);
    }

    #[test]
    fn protocol_errors_are_errors() {
        let mut b = Barriers::new();
        assert!(b.arrive(0, 0, 4, 1, 0).is_err(), "no lanes");
        assert!(
            b.arrive(0, 0, 4, 1, 5).is_err(),
            "more lanes than the channel"
        );
        assert!(b.arrive(0, 3, 4, 1, 2).is_err(), "a lane not in it");
        assert!(b.arrive(0, 0, 200, 1, 129).is_err(), "over 128 lanes");
        assert_eq!(b.arrive(0, 0, 4, 1, 2).unwrap(), Arrival::Wait);
        assert!(b.arrive(0, 0, 4, 1, 2).is_err(), "the same lane twice");
        assert!(b.arrive(0, 1, 4, 1, 3).is_err(), "another lane count");
        for e in 2..=MAX_PENDING as u64 {
            b.arrive(0, 1, 4, e, 2).unwrap();
        }
        assert!(b.arrive(0, 1, 4, 1000, 2).is_err(), "too many waiting");
    }

    proptest! {
        /// Whatever the peer sends, nothing panics, and a barrier is released only once every
        /// lane of it, or of a later one, has arrived, or once it or a later one was given up.
        #[test]
        fn arbitrary_arrivals(ops in proptest::collection::vec(
            (0u16..3, 0u16..200, 1u16..200, 0u64..8, 0u16..200, any::<bool>()), 0..200)
        ) {
            let mut b = Barriers::new();
            // Per (channel, epoch): the lane count of its first arrival and the lanes arrived.
            let mut seen: HashMap<(u16, u64), (u16, std::collections::BTreeSet<u16>)> =
                HashMap::new();
            let mut given_up: HashMap<u16, u64> = HashMap::new();
            for (ch, index, par, epoch, lanes, give_up) in ops {
                if give_up {
                    b.give_up(ch, epoch);
                    let g = given_up.entry(ch).or_default();
                    *g = (*g).max(epoch);
                    continue;
                }
                if let Ok(a) = b.arrive(ch, index, par, epoch, lanes) {
                    seen.entry((ch, epoch)).or_insert((lanes, Default::default())).1.insert(index);
                    if a == Arrival::Released {
                        let up = given_up.get(&ch).copied().unwrap_or(0);
                        let complete = seen.iter().any(|((c, e), (n, s))| {
                            *c == ch && *e >= epoch && s.len() >= usize::from(*n)
                        });
                        prop_assert!(epoch == 0 || epoch <= up || complete);
                    }
                }
            }
        }
    }
}
