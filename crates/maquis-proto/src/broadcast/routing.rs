//! Multi-hop routing: per origin, the neighbour that offers the shortest way to it, and the
//! hop-by-hop decision for a routed message.
//!
//! The offers ride on the origin's heartbeats (a distance vector with no messages of its own):
//! every node that passes a heartbeat on, as a copy or as an announcement, says how far the
//! origin is from it, the length of its own route plus one. A node keeps, per origin, the
//! neighbour whose offer is shortest: it moves to another neighbour when that one offers less
//! for the newest heartbeat, and when its neighbour offered nothing of the last two heartbeats
//! (its way may have gone; the best offer of the newest heartbeat takes over). Offers of a
//! heartbeat older than the one before the newest are ignored, so a way that broke is
//! forgotten within two heartbeat periods. Within one heartbeat every offer was made by a node
//! whose own route was one hop shorter, so the routes of nodes that heard the same heartbeats
//! lead to the origin without loops; while heartbeats are still spreading, a message can meet
//! a loop, and the hop limit ends it.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use thiserror::Error;

use super::cache::Fixed;

/// Last-seen times are kept in units of this many milliseconds (a `u32` lasts 13 years).
const STAMP_MS: u128 = 100;

fn stamp(now: Duration) -> u32 {
    (now.as_millis() / STAMP_MS).min(u32::MAX as u128) as u32
}

fn age(now: Duration, seen: u32) -> Duration {
    Duration::from_millis(u64::from(stamp(now).saturating_sub(seen)) * STAMP_MS as u64)
}

/// What this node knows of the way to one origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteInfo<P> {
    /// The neighbour that offers the shortest way.
    pub via: P,
    /// Hops to the origin that way.
    pub hops: u16,
    /// Time since the origin's newest heartbeat arrived.
    pub age: Duration,
}

#[derive(Clone, Debug)]
pub(crate) struct Entry<P> {
    pub via: P,
    /// The origin's newest heartbeat heard of.
    pub seq: u32,
    /// Hops to the origin through `via`, as its last offer said.
    pub hops: u16,
    /// The heartbeat of `via`'s last offer (`None`: `via` is no longer a neighbour).
    via_seq: Option<u32>,
    /// The shortest offer of heartbeat `seq` from another neighbour than `via`.
    best: Option<(P, u16)>,
    seen: u32,
}

impl<P> Entry<P> {
    /// Moves the route to the best offer of the newest heartbeat when there is one and `take`
    /// (given its length and the route's) says so; returns whether it moved.
    fn take_best(&mut self, take: impl FnOnce(u16, u16) -> bool) -> bool {
        match self.best.take() {
            Some((p, h)) if take(h, self.hops) => {
                self.via = p;
                self.hops = h;
                self.via_seq = Some(self.seq);
                true
            }
            best => {
                self.best = best;
                false
            }
        }
    }
}

/// What [`Routes::offer`] did with an offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The origin's route goes through the same neighbour as before (or the offer was too old
    /// to count).
    Same,
    /// The origin is new, or its route now goes through another neighbour.
    Moved,
    /// The origin is new and the table is full: not recorded.
    Full,
}

/// The routing table, bounded by `max` origins.
#[derive(Debug)]
pub(crate) struct Routes<P> {
    map: HashMap<P, Entry<P>, Fixed>,
    max: usize,
}

impl<P: Clone + Eq + Hash> Routes<P> {
    pub fn new(max: usize) -> Self {
        Routes {
            map: HashMap::default(),
            max,
        }
    }

    pub fn get(&self, origin: &P) -> Option<&Entry<P>> {
        self.map.get(origin)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// An offer, learnt from `origin`'s heartbeat `seq` (a copy of it, or an announcement), of
    /// a way to `origin` through the neighbour `from`, `hops` hops long. A heartbeat newer than
    /// any heard of marks the origin alive at `now`. See the [module documentation](self).
    pub fn offer(&mut self, origin: P, from: P, seq: u32, hops: u16, now: Duration) -> Recorded {
        let Some(e) = self.map.get_mut(&origin) else {
            if self.map.len() >= self.max {
                return Recorded::Full;
            }
            let e = Entry {
                via: from,
                seq,
                hops,
                via_seq: Some(seq),
                best: None,
                seen: stamp(now),
            };
            self.map.insert(origin, e);
            return Recorded::Moved;
        };
        if seq > e.seq {
            e.seq = seq;
            e.best = None;
            e.seen = stamp(now);
        } else if seq.saturating_add(1) < e.seq {
            return Recorded::Same;
        }
        if from == e.via {
            if e.via_seq.is_none_or(|v| seq >= v) {
                e.via_seq = Some(seq);
                e.hops = hops;
            }
        } else if seq == e.seq && e.best.as_ref().is_none_or(|(p, h)| hops < *h || *p == from) {
            // A neighbour's later word replaces its earlier one, even when longer.
            e.best = Some((from, hops));
        }
        let silent = e.via_seq.is_none_or(|v| e.seq.saturating_sub(v) >= 2);
        if e.take_best(|h, hops| h < hops || silent) {
            Recorded::Moved
        } else {
            Recorded::Same
        }
    }

    /// Forgets the way through `peer` (it is no longer a neighbour): each origin reached
    /// through it takes the best offer of its newest heartbeat, if another neighbour made one,
    /// or else the next offer any neighbour makes. Returns the origins whose route moved.
    pub fn forget_via(&mut self, peer: &P) -> Vec<P> {
        let mut moved = Vec::new();
        for (o, e) in self.map.iter_mut().filter(|(_, e)| e.via == *peer) {
            if e.take_best(|_, _| true) {
                moved.push(o.clone());
            } else {
                e.via_seq = None;
            }
        }
        moved
    }

    pub fn info(&self, origin: &P, now: Duration) -> Option<RouteInfo<P>> {
        self.map.get(origin).map(|e| RouteInfo {
            via: e.via.clone(),
            hops: e.hops,
            age: age(now, e.seen),
        })
    }

    /// Forgets origins not heard from for longer than `ttl`.
    pub fn expire(&mut self, now: Duration, ttl: Duration) {
        self.map.retain(|_, e| age(now, e.seen) <= ttl);
    }

    /// Origins not heard from for longer than `min_age` (but not yet expired).
    pub fn stale(&self, min_age: Duration, now: Duration) -> impl Iterator<Item = &P> {
        self.map
            .iter()
            .filter(move |(_, e)| age(now, e.seen) > min_age)
            .map(|(o, _)| o)
    }

    /// Origins heard from within `max_age`, with their entries.
    pub fn fresh(&self, max_age: Duration, now: Duration) -> impl Iterator<Item = (&P, &Entry<P>)> {
        self.map
            .iter()
            .filter(move |(_, e)| age(now, e.seen) <= max_age)
    }
}

/// Why a routed message was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum DropReason {
    /// No neighbour leads to the destination.
    #[error("no route to the destination")]
    NoRoute,
    /// The message travelled the hop limit without arriving.
    #[error("hop limit reached")]
    HopLimit,
}

/// What to do with a routed message at one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForwardDecision<P> {
    /// It is for this node.
    Deliver,
    /// Send it on to this neighbour (after adding one to its hop count).
    ForwardTo(P),
    /// Drop it.
    Drop(DropReason),
}

/// Decides, at node `me`, what happens to a routed message for `to` that travelled `hops` hops:
/// delivered here, forwarded to `next_hop(to)`, or dropped (no route, or `hop_limit` reached).
pub fn decide_forward<P: PartialEq>(
    me: &P,
    to: &P,
    hops: u16,
    hop_limit: u16,
    next_hop: impl FnOnce(&P) -> Option<P>,
) -> ForwardDecision<P> {
    if to == me {
        return ForwardDecision::Deliver;
    }
    if hops >= hop_limit {
        return ForwardDecision::Drop(DropReason::HopLimit);
    }
    match next_hop(to) {
        Some(n) => ForwardDecision::ForwardTo(n),
        None => ForwardDecision::Drop(DropReason::NoRoute),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        let hop = |d: &u32| if *d == 9 { Some(2) } else { None };
        assert_eq!(decide_forward(&1, &1, 40, 8, hop), ForwardDecision::Deliver);
        assert_eq!(
            decide_forward(&1, &9, 3, 8, hop),
            ForwardDecision::ForwardTo(2)
        );
        assert_eq!(
            decide_forward(&1, &9, 8, 8, hop),
            ForwardDecision::Drop(DropReason::HopLimit)
        );
        assert_eq!(
            decide_forward(&1, &7, 0, 8, hop),
            ForwardDecision::Drop(DropReason::NoRoute)
        );
    }

    #[test]
    fn table_is_bounded_and_expires() {
        let s = Duration::from_secs;
        let mut r = Routes::new(2);
        assert_eq!(r.offer(1u32, 10, 1, 2, s(0)), Recorded::Moved, "new");
        assert_eq!(r.offer(2, 10, 1, 2, s(5)), Recorded::Moved);
        assert_eq!(r.offer(3, 10, 1, 2, s(5)), Recorded::Full);
        assert_eq!(r.offer(2, 10, 2, 2, s(5)), Recorded::Same);
        assert_eq!(r.offer(1, 11, 2, 1, s(6)), Recorded::Moved, "updates fit");
        assert_eq!(
            r.info(&1, s(7)).map(|i| (i.via, i.hops, i.age)),
            Some((11, 1, s(1)))
        );
        assert_eq!(r.fresh(s(2), s(7)).count(), 2);
        r.expire(s(12), s(6));
        assert_eq!((r.get(&1).is_some(), r.get(&2).is_some()), (true, false));
    }

    #[test]
    fn the_shortest_offer_wins_and_a_silent_neighbour_is_replaced() {
        let t = Duration::ZERO;
        let via = |r: &Routes<u32>| r.get(&9).map(|e| (e.via, e.hops));
        let mut r = Routes::new(8);
        assert_eq!(r.offer(9, 1, 1, 5, t), Recorded::Moved);
        // The same length, or longer, through another neighbour: no move. A neighbour's later
        // word replaces its earlier one.
        assert_eq!(r.offer(9, 4, 1, 6, t), Recorded::Same);
        assert_eq!(r.offer(9, 4, 1, 9, t), Recorded::Same);
        assert_eq!(r.get(&9).and_then(|e| e.best), Some((4, 9)));
        assert_eq!(r.offer(9, 2, 1, 5, t), Recorded::Same);
        assert_eq!(r.offer(9, 3, 2, 6, t), Recorded::Same);
        assert_eq!(via(&r), Some((1, 5)));
        // Shorter, for the newest heartbeat: moved.
        assert_eq!(r.offer(9, 2, 2, 3, t), Recorded::Moved);
        assert_eq!(via(&r), Some((2, 3)));
        // Offers of a heartbeat before the one before the newest do not count.
        r.offer(9, 2, 4, 3, t);
        assert_eq!(r.offer(9, 1, 2, 1, t), Recorded::Same);
        assert_eq!(via(&r), Some((2, 3)));
        // The neighbour's own offers may lengthen its way.
        r.offer(9, 2, 4, 7, t);
        assert_eq!(via(&r), Some((2, 7)));
        r.offer(9, 3, 4, 8, t);
        assert_eq!(via(&r), Some((2, 7)), "8 is longer");
        // Two heartbeats without an offer from the neighbour: the best offer takes over.
        r.offer(9, 3, 5, 8, t);
        assert_eq!(via(&r), Some((2, 7)), "one heartbeat missed");
        assert_eq!(r.offer(9, 3, 6, 8, t), Recorded::Moved, "two missed");
        assert_eq!(via(&r), Some((3, 8)));
        // A neighbour gone: the best offer of the newest heartbeat, if any.
        r.offer(9, 4, 6, 9, t);
        assert_eq!(r.forget_via(&3), vec![9]);
        assert_eq!(via(&r), Some((4, 9)));
        assert!(r.forget_via(&4).is_empty(), "no other offer");
        assert_eq!(
            r.offer(9, 5, 6, 12, t),
            Recorded::Moved,
            "the next offer, however long"
        );
        assert_eq!(via(&r), Some((5, 12)));
    }
}
