//! Where a message for a node goes first, and what a node does with a routed message that is
//! not for it. Pure functions over what the caller knows (its connection to the destination,
//! the route table the membership machine keeps), so the runtime's send path and the
//! simulator decide alike.

use crate::broadcast::{decide_forward, DropReason, ForwardDecision};
use crate::id::{NodeId, PeerId};
use crate::overlay::Liveness;

/// What the sender knows of its direct connection to a node of the destination's name.
#[derive(Debug)]
pub struct Direct<'a, P = NodeId> {
    /// The incarnation the connection is with.
    pub id: &'a P,
    /// Whether its membership lane has connected (else it is still connecting).
    pub up: bool,
}

impl<P> Clone for Direct<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P> Copy for Direct<'_, P> {}

/// The first hop of a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NextHop<P = NodeId> {
    /// Straight to the destination (connected, or connecting: its lanes queue the frame).
    Direct,
    /// Through this neighbour, which forwards it.
    Via(P),
}

/// Why a message cannot leave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoHop {
    /// The destination is an older incarnation than the one known: it restarted.
    Stale {
        /// The incarnation known now.
        current: u64,
    },
    /// No connection and no route.
    Unreachable,
}

/// Decides the first hop toward `dst`.
///
/// - `direct`: the connection to `dst`'s name, if there is one (any incarnation).
/// - `route`: reads the route table's entry for `dst`'s name, `(destination, neighbour)`;
///   called only when no connection to `dst` is up (the common case on the send path skips it).
/// - `connected`: whether there is a connection to that neighbour (the exact incarnation).
///
/// With [`Liveness::Connection`] only direct connections count. Otherwise a connection that is
/// up wins, then a route through a connected neighbour, then a connection still coming up.
pub fn next_hop<P: PeerId>(
    liveness: Liveness,
    dst: &P,
    direct: Option<Direct<'_, P>>,
    route: impl FnOnce() -> Option<(P, P)>,
    connected: impl FnOnce(&P) -> bool,
) -> Result<NextHop<P>, NoHop> {
    if let Some(d) = direct {
        if d.id.incarnation() != dst.incarnation() {
            return Err(NoHop::Stale {
                current: d.id.incarnation(),
            });
        }
    }
    // A node connected to us is reachable even before the overlay lists it (a reply to a node
    // that is still joining, say).
    let direct = direct.filter(|d| d.id == dst);
    if liveness == Liveness::Connection {
        return direct.map(|_| NextHop::Direct).ok_or(NoHop::Unreachable);
    }
    if direct.is_some_and(|d| d.up) {
        return Ok(NextHop::Direct);
    }
    match route() {
        Some((d, via)) if d == *dst && connected(&via) => return Ok(NextHop::Via(via)),
        Some((d, _)) if d.incarnation() > dst.incarnation() => {
            return Err(NoHop::Stale {
                current: d.incarnation(),
            })
        }
        _ => {}
    }
    // A peer still connecting: its lanes queue the frame.
    direct.map(|_| NextHop::Direct).ok_or(NoHop::Unreachable)
}

/// What node `me` does with a routed message for `to` that came from neighbour `came_from`
/// after `hops` hops: deliver it, forward it to the node `next` names (the first hop from here,
/// see [`next_hop`]), or drop it. A next hop that is the neighbour the message came from
/// (routes that disagree for a moment) counts as no route: the message is dropped at once
/// rather than bounced until the hop limit.
pub fn forward<P: PeerId>(
    me: &P,
    came_from: &P,
    to: &P,
    hops: u16,
    hop_limit: u16,
    next: impl FnOnce(&P) -> Option<P>,
) -> ForwardDecision<P> {
    match decide_forward(me, to, hops, hop_limit, next) {
        ForwardDecision::ForwardTo(n) if n == *came_from => {
            ForwardDecision::Drop(DropReason::NoRoute)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, inc: u64) -> NodeId {
        NodeId::new(name, ([127, 0, 0, 1], 7000).into(), inc)
    }

    #[test]
    fn first_hops() {
        let (b1, b2, c) = (id("b", 1), id("b", 2), id("c", 1));
        let up = Direct { id: &b1, up: true };
        let connecting = Direct { id: &b1, up: false };
        let yes = |_: &NodeId| true;
        let no = |_: &NodeId| false;
        let m = Liveness::Membership;
        assert_eq!(
            next_hop(m, &b1, Some(up), || None, yes),
            Ok(NextHop::Direct)
        );
        assert_eq!(
            next_hop(m, &b1, Some(Direct { id: &b2, up: true }), || None, yes),
            Err(NoHop::Stale { current: 2 })
        );
        let route = (b1.clone(), c.clone());
        assert_eq!(
            next_hop(m, &b1, Some(connecting), || Some(route.clone()), yes),
            Ok(NextHop::Via(c.clone())),
            "a route beats a connection still coming up"
        );
        assert_eq!(
            next_hop(m, &b1, Some(connecting), || Some(route.clone()), no),
            Ok(NextHop::Direct),
            "a route through a neighbour that is gone does not count"
        );
        assert_eq!(
            next_hop(m, &b1, None, || Some(route.clone()), no),
            Err(NoHop::Unreachable)
        );
        let newer = (b2.clone(), c.clone());
        assert_eq!(
            next_hop(m, &b1, None, || Some(newer.clone()), yes),
            Err(NoHop::Stale { current: 2 })
        );
        let conn = Liveness::Connection;
        assert_eq!(
            next_hop(conn, &b1, None, || Some(route.clone()), yes),
            Err(NoHop::Unreachable)
        );
        assert_eq!(
            next_hop(conn, &b1, Some(connecting), || None, no),
            Ok(NextHop::Direct)
        );
    }

    #[test]
    fn forwarding_never_bounces() {
        let (a, b, c) = (id("a", 1), id("b", 1), id("c", 1));
        assert_eq!(
            forward(&a, &b, &a, 3, 16, |_| None),
            ForwardDecision::Deliver
        );
        assert_eq!(
            forward(&a, &b, &c, 3, 16, |_| Some(b.clone())),
            ForwardDecision::Drop(DropReason::NoRoute)
        );
        assert_eq!(
            forward(&a, &b, &c, 3, 16, |_| Some(c.clone())),
            ForwardDecision::ForwardTo(c.clone())
        );
        assert_eq!(
            forward(&a, &b, &c, 16, 16, |_| Some(c.clone())),
            ForwardDecision::Drop(DropReason::HopLimit)
        );
    }
}
