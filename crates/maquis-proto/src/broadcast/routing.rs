//! Multi-hop routing: per origin, the neighbour its heartbeat first came from (the reverse of
//! its broadcast tree), and the hop-by-hop decision for a routed message.

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
    /// The neighbour the origin's newest heartbeat first came from.
    pub via: P,
    /// Hops that heartbeat travelled.
    pub hops: u16,
    /// Time since it arrived.
    pub age: Duration,
}

#[derive(Clone, Debug)]
pub(crate) struct Entry<P> {
    pub via: P,
    pub seq: u32,
    pub hops: u16,
    seen: u32,
}

/// What [`Routes::record`] did with a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// The origin's route goes through the same neighbour as before.
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

    /// Records a heartbeat newer than what is known.
    pub fn record(&mut self, origin: P, via: P, seq: u32, hops: u16, now: Duration) -> Recorded {
        let seen = stamp(now);
        if let Some(e) = self.map.get_mut(&origin) {
            let moved = e.via != via;
            *e = Entry {
                via,
                seq,
                hops,
                seen,
            };
            return if moved {
                Recorded::Moved
            } else {
                Recorded::Same
            };
        }
        if self.map.len() >= self.max {
            return Recorded::Full;
        }
        self.map.insert(
            origin,
            Entry {
                via,
                seq,
                hops,
                seen,
            },
        );
        Recorded::Moved
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
        assert_eq!(r.record(1u32, 10, 1, 2, s(0)), Recorded::Moved, "new");
        assert_eq!(r.record(2, 10, 1, 2, s(5)), Recorded::Moved);
        assert_eq!(r.record(3, 10, 1, 2, s(5)), Recorded::Full);
        assert_eq!(r.record(2, 10, 2, 2, s(5)), Recorded::Same);
        assert_eq!(r.record(1, 11, 2, 1, s(6)), Recorded::Moved, "updates fit");
        assert_eq!(
            r.info(&1, s(7)).map(|i| (i.via, i.hops, i.age)),
            Some((11, 1, s(1)))
        );
        assert_eq!(r.fresh(s(2), s(7)).count(), 2);
        r.expire(s(12), s(6));
        assert_eq!((r.get(&1).is_some(), r.get(&2).is_some()), (true, false));
    }
}
