//! Plumtree (Leitão, Pereira, Rodrigues, SRDS 2007): epidemic broadcast trees.
//!
//! Each node splits its neighbours into *eager* peers (sent every payload at once) and *lazy*
//! peers (sent only the message ids, in IHAVE batches every `lazy_tick`). Every neighbour starts
//! eager; a node that receives a payload it already has moves the sender to lazy and tells it
//! (PRUNE), so the eager links settle into a spanning tree. A node that hears of a message (IHAVE)
//! and does not get the payload within `graft_timeout` asks the announcer for it (GRAFT), which
//! also makes that link eager again: the tree heals where it broke. Optimisation: when the
//! announcement of a message came with a hop count smaller than the eager copy's by at least
//! `optimization_threshold`, the lazy link is grafted and the eager one pruned.
//!
//! Beyond the paper:
//! - A duplicate prunes a link only if the link has no *credit* (`prune_credit`): each first copy
//!   a link brings earns one, up to the limit, and a duplicate spends one. With many senders at
//!   once, duplicates also come from messages crossing a cycle that is being repaired; pruning at
//!   every one cuts such cycles twice, and the tree never settles after a failure (at 1,000
//!   nodes, 10 broadcasts a second from random nodes, 20 % failed: RMR stays at 0.2 and a third
//!   of the tree keeps being re-grafted; with a credit of 2 it settles back to 0 within seconds).
//! - A neighbour that comes up is offered the ids of the recent messages (an IHAVE), so a node
//!   that gets new neighbours after a massive failure fetches what it missed.
//! - Every node can broadcast a small heartbeat on the same trees (a message kind of its own, so
//!   no application topic is reserved). A heartbeat's copy and its announcements carry two
//!   numbers: its round, the hops the copy travelled, which shapes the tree as a broadcast's
//!   does (optimisation included), and a *way*, the sender's distance to the origin: a node
//!   passes a heartbeat on with its own route's length plus one ([`NO_WAY`] to the neighbour
//!   its route goes through), announces it to the neighbour whose copy it is when it is nearer
//!   the origin than that one, and takes as its route, per origin, the neighbour that offers
//!   the shortest way (see `routing`). The routes of a shared spanning tree are long: at 100
//!   nodes 9.6 links against 3.1 for a shortest path, at 1,000 nodes 23.8 against 4.8 (the
//!   simulator's `routed links`); the ways bring them to about 4.1 and 6.3.

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::cache::{Cache, Cached, Fixed};
use super::config::PlumtreeConfig;
use super::routing::{Recorded, RouteInfo, Routes};
use super::types::{
    Announce, Key, MsgId, PlumtreeEffect, PlumtreeMsg, PlumtreeTimer, Topic, NO_WAY,
};

type Out<P> = Vec<PlumtreeEffect<P>>;

/// A message announced but not received yet.
#[derive(Debug)]
struct Missing<P> {
    deadline: Duration,
    /// Who announced it, in arrival order.
    announcers: Vec<Announcer<P>>,
}

/// A neighbour that announced a missing message.
#[derive(Clone, Debug)]
struct Announcer<P> {
    peer: P,
    /// The hop count its copy would arrive with.
    round: u16,
    /// For a heartbeat, its offer of a way to the origin.
    way: Option<u16>,
}

/// Sizes and counters, for monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlumtreeStats {
    /// Messages in the cache.
    pub cached: usize,
    /// Announcements waiting for the next tick.
    pub lazy_queued: usize,
    /// Messages announced and not received.
    pub missing: usize,
    /// Origins in the routing table.
    pub routes: usize,
    /// Announcements dropped because the lazy queue was full.
    pub lazy_dropped: u64,
    /// Announcements ignored because the missing table was full.
    pub missing_dropped: u64,
    /// Heartbeats that gave their origin a route through another neighbour than before, or a
    /// first route.
    pub route_moves: u64,
    /// Heartbeats ignored because they came from a node that is not a neighbour.
    pub strangers_ignored: u64,
}

/// The Plumtree state of one node; `P` identifies peers.
#[derive(Debug)]
pub struct Plumtree<P> {
    me: P,
    cfg: PlumtreeConfig,
    tag: u64,
    seq: u64,
    eager: Vec<P>,
    lazy: Vec<P>,
    cache: Cache,
    queue: Vec<(P, Announce<P>)>,
    missing: HashMap<Key<P>, Missing<P>, Fixed>,
    routes: Routes<P>,
    /// Origins whose route moved since [`Plumtree::take_moved_routes`] (at most one entry per
    /// origin in the table).
    moved: HashSet<P, Fixed>,
    hb_seq: u32,
    hb_on: bool,
    hb_timer: bool,
    tick_armed: bool,
    /// Credit of eager neighbours: first copies brought, minus duplicates (see `prune_credit`).
    credit: Vec<(P, u8)>,
    rng: StdRng,
    stats: PlumtreeStats,
}

impl<P: Clone + Eq + Hash> Plumtree<P> {
    /// A node with no neighbours.
    pub fn new(me: P, cfg: PlumtreeConfig) -> Self {
        let mut h = DefaultHasher::new();
        me.hash(&mut h);
        let tag = h.finish();
        Plumtree {
            rng: StdRng::seed_from_u64(cfg.seed.unwrap_or(tag)),
            cache: Cache::new(cfg.cache_max, cfg.cache_ttl),
            routes: Routes::new(cfg.routes_max),
            moved: HashSet::default(),
            me,
            cfg,
            tag,
            seq: 0,
            eager: Vec::new(),
            lazy: Vec::new(),
            queue: Vec::new(),
            missing: HashMap::default(),
            hb_seq: 0,
            hb_on: false,
            hb_timer: false,
            tick_armed: false,
            credit: Vec::new(),
            stats: PlumtreeStats::default(),
        }
    }

    /// This node.
    pub fn me(&self) -> &P {
        &self.me
    }

    /// The parameters.
    pub fn config(&self) -> &PlumtreeConfig {
        &self.cfg
    }

    /// Neighbours sent payloads at once (this node's tree links).
    pub fn eager_peers(&self) -> &[P] {
        &self.eager
    }

    /// Neighbours sent only announcements.
    pub fn lazy_peers(&self) -> &[P] {
        &self.lazy
    }

    /// Sizes and counters.
    pub fn stats(&self) -> PlumtreeStats {
        PlumtreeStats {
            cached: self.cache.len(),
            lazy_queued: self.queue.len(),
            missing: self.missing.len(),
            routes: self.routes.len(),
            ..self.stats
        }
    }

    fn is_neighbor(&self, p: &P) -> bool {
        self.eager.contains(p) || self.lazy.contains(p)
    }

    fn make_eager(&mut self, p: &P) {
        if let Some(i) = self.lazy.iter().position(|x| x == p) {
            self.eager.push(self.lazy.swap_remove(i));
        }
    }

    fn make_lazy(&mut self, p: &P) {
        if let Some(i) = self.eager.iter().position(|x| x == p) {
            self.lazy.push(self.eager.swap_remove(i));
            self.credit.retain(|(x, _)| x != p);
        }
    }

    fn arm_tick(&mut self, out: &mut Out<P>) {
        if !self.tick_armed {
            self.tick_armed = true;
            out.push(PlumtreeEffect::SetTimer(
                PlumtreeTimer::Tick,
                self.cfg.lazy_tick,
            ));
        }
    }

    /// A neighbour came up (joined the overlay's active view): it starts eager, and is offered
    /// the ids of recent messages.
    pub fn on_neighbor_up(&mut self, peer: P, now: Duration, out: &mut Out<P>) {
        if peer == self.me || self.is_neighbor(&peer) {
            return;
        }
        if self.cfg.offer_recent > 0 {
            let since = now.saturating_sub(self.cfg.offer_window);
            let offer: Vec<Announce<P>> = self
                .cache
                .recent(self.cfg.offer_recent, since)
                .map(|(id, c)| Announce {
                    key: Key::Msg(id),
                    round: c.round.saturating_add(1),
                    way: None,
                })
                .collect();
            self.send_batches(&peer, offer, out);
        }
        self.eager.push(peer);
    }

    /// A neighbour went down (left the active view). The origins it was the way to move to
    /// the best other offer, whose neighbours are told at once that this node is no way back.
    pub fn on_neighbor_down(&mut self, peer: &P, out: &mut Out<P>) {
        self.eager.retain(|p| p != peer);
        self.lazy.retain(|p| p != peer);
        self.queue.retain(|(p, _)| p != peer);
        self.credit.retain(|(p, _)| p != peer);
        self.missing.retain(|_, m| {
            m.announcers.retain(|a| a.peer != *peer);
            !m.announcers.is_empty()
        });
        for origin in self.routes.forget_via(peer) {
            self.poison_new_way(&origin, out);
            self.route_moved(origin);
        }
    }

    fn route_moved(&mut self, origin: P) {
        self.stats.route_moves += 1;
        if self.moved.len() < self.cfg.routes_max {
            self.moved.insert(origin);
        }
    }

    /// A neighbour's offer of a way to `origin`, learnt from its heartbeat `seq`.
    fn offer(&mut self, origin: &P, from: &P, seq: u32, hops: u16, now: Duration) -> Recorded {
        let r = self
            .routes
            .offer(origin.clone(), from.clone(), seq, hops, now);
        if r == Recorded::Moved {
            self.route_moved(origin.clone());
        }
        r
    }

    /// Tells the neighbour a route to `origin` now goes through that this node is no way to
    /// `origin` for it, at once rather than with the next heartbeat: what this node offered
    /// it before is stale, and taking it would make a loop.
    fn poison_new_way(&mut self, origin: &P, out: &mut Out<P>) {
        let Some(e) = self.routes.get(origin) else {
            return;
        };
        let (via, seq) = (e.via.clone(), e.seq);
        if self.is_neighbor(&via) {
            let key = Key::Beat {
                origin: origin.clone(),
                seq,
            };
            // It has the heartbeat (its offer was of it): only the way is news to it.
            let a = Announce {
                key,
                round: u16::MAX,
                way: Some(NO_WAY),
            };
            self.announce_to(&via, a, out);
        }
    }

    /// Broadcasts a payload to every node; it is delivered here too.
    pub fn broadcast(
        &mut self,
        topic: Topic,
        payload: Bytes,
        now: Duration,
        out: &mut Out<P>,
    ) -> MsgId {
        self.seq += 1;
        let id = MsgId {
            origin: self.tag,
            seq: self.seq,
        };
        let c = Cached {
            topic: topic.clone(),
            payload: payload.clone(),
            round: 0,
        };
        self.cache.insert(id, c, now);
        out.push(PlumtreeEffect::Deliver {
            topic: topic.clone(),
            payload: payload.clone(),
            id,
            hops: 0,
        });
        let msg = PlumtreeMsg::Gossip {
            id,
            topic,
            payload,
            round: 1,
        };
        self.eager_push(None, |_| msg.clone(), out);
        self.lazy_push(Key::Msg(id), 1, None, |_| None, out);
        id
    }

    /// Starts broadcasting this node's heartbeat every `heartbeat_every` (the first at a random
    /// point of the first period).
    pub fn start_heartbeats(&mut self, out: &mut Out<P>) {
        self.hb_on = true;
        if !self.hb_timer {
            self.hb_timer = true;
            let first = self.cfg.heartbeat_every.mul_f64(self.rng.gen::<f64>());
            out.push(PlumtreeEffect::SetTimer(PlumtreeTimer::Heartbeat, first));
        }
    }

    /// Sends a heartbeat now, between the periodic ones (a node that hears it is suspected
    /// answers with one); nothing if heartbeats are off.
    pub fn beat_now(&mut self, out: &mut Out<P>) {
        if self.hb_on {
            self.beat(out);
        }
    }

    fn beat(&mut self, out: &mut Out<P>) {
        self.hb_seq = self.hb_seq.wrapping_add(1);
        let (origin, seq) = (self.me.clone(), self.hb_seq);
        // Every neighbour is one hop from this node.
        let beat = PlumtreeMsg::Heartbeat {
            origin: origin.clone(),
            seq,
            round: 1,
            way: 1,
        };
        self.eager_push(None, |_| beat.clone(), out);
        self.lazy_push(Key::Beat { origin, seq }, 1, None, |_| Some(1), out);
    }

    /// Stops this node's heartbeats (relaying others' goes on).
    pub fn stop_heartbeats(&mut self) {
        self.hb_on = false;
    }

    /// Forgets routes not refreshed within `route_ttl` and messages older than `cache_ttl`.
    /// Done at every heartbeat of this node; a node that sends none can call it periodically.
    pub fn expire(&mut self, now: Duration) {
        self.routes.expire(now, self.cfg.route_ttl);
        self.cache.expire(now);
    }

    /// A message from a neighbour.
    pub fn on_message(&mut self, from: &P, msg: PlumtreeMsg<P>, now: Duration, out: &mut Out<P>) {
        match msg {
            PlumtreeMsg::Gossip {
                id,
                topic,
                payload,
                round,
            } => self.on_gossip(from, id, topic, payload, round, now, out),
            PlumtreeMsg::Heartbeat {
                origin,
                seq,
                round,
                way,
            } => self.on_heartbeat(from, origin, seq, round, way, now, out),
            PlumtreeMsg::IHave(list) => {
                for a in list.into_iter().take(self.cfg.ihave_batch_max) {
                    self.on_ihave(from, a, now, out);
                }
            }
            PlumtreeMsg::Graft { key, round } => self.on_graft(from, key, round, out),
            PlumtreeMsg::Prune => self.make_lazy(from),
        }
    }

    /// A timer fired.
    pub fn on_timer(&mut self, timer: PlumtreeTimer, now: Duration, out: &mut Out<P>) {
        match timer {
            PlumtreeTimer::Tick => {
                self.tick_armed = false;
                self.flush(out);
                self.graft_due(now, out);
                self.cache.expire(now);
                if !self.queue.is_empty() || !self.missing.is_empty() {
                    self.arm_tick(out);
                }
            }
            PlumtreeTimer::Heartbeat => {
                self.hb_timer = false;
                self.expire(now);
                if self.hb_on {
                    self.beat(out);
                    self.hb_timer = true;
                    let every = self.cfg.heartbeat_every;
                    out.push(PlumtreeEffect::SetTimer(PlumtreeTimer::Heartbeat, every));
                }
            }
        }
    }

    /// Sends `msg_for(peer)` to every eager peer but `except`.
    fn eager_push(
        &self,
        except: Option<&P>,
        msg_for: impl Fn(&P) -> PlumtreeMsg<P>,
        out: &mut Out<P>,
    ) {
        for p in self.eager.iter().filter(|p| Some(*p) != except) {
            out.push(PlumtreeEffect::Send(p.clone(), msg_for(p)));
        }
    }

    /// Queues one announcement for the next IHAVE batch to `to`.
    fn announce_to(&mut self, to: &P, a: Announce<P>, out: &mut Out<P>) {
        if self.queue.len() >= self.cfg.lazy_queue_max {
            self.stats.lazy_dropped += 1;
            return;
        }
        self.queue.push((to.clone(), a));
        self.arm_tick(out);
    }

    /// Queues an announcement of `key` to every lazy peer but `except`, with the way
    /// `way_for(peer)`.
    fn lazy_push(
        &mut self,
        key: Key<P>,
        round: u16,
        except: Option<&P>,
        way_for: impl Fn(&P) -> Option<u16>,
        out: &mut Out<P>,
    ) {
        let mut any = false;
        for p in self.lazy.iter().filter(|p| Some(*p) != except) {
            if self.queue.len() >= self.cfg.lazy_queue_max {
                self.stats.lazy_dropped += 1;
                continue;
            }
            let key = key.clone();
            let way = way_for(p);
            self.queue.push((p.clone(), Announce { key, round, way }));
            any = true;
        }
        if any {
            self.arm_tick(out);
        }
    }

    fn send_batches(&self, to: &P, mut list: Vec<Announce<P>>, out: &mut Out<P>) {
        let max = self.cfg.ihave_batch_max.max(1);
        while !list.is_empty() {
            let rest = if list.len() > max {
                list.split_off(max)
            } else {
                Vec::new()
            };
            out.push(PlumtreeEffect::Send(to.clone(), PlumtreeMsg::IHave(list)));
            list = rest;
        }
    }

    /// Sends the queued announcements, one IHAVE batch per neighbour.
    fn flush(&mut self, out: &mut Out<P>) {
        let mut batches: Vec<(P, Vec<Announce<P>>)> = Vec::new();
        for (p, a) in std::mem::take(&mut self.queue) {
            if !self.is_neighbor(&p) {
                continue;
            }
            match batches.iter_mut().find(|(b, _)| *b == p) {
                Some((_, list)) => list.push(a),
                None => batches.push((p, vec![a])),
            }
        }
        for (p, list) in batches {
            self.send_batches(&p, list, out);
        }
    }

    fn known(&self, key: &Key<P>) -> bool {
        match key {
            Key::Msg(id) => self.cache.contains(id),
            Key::Beat { origin, seq } => {
                *origin == self.me || self.routes.get(origin).is_some_and(|e| e.seq >= *seq)
            }
        }
    }

    /// Grafts the missing messages whose time is up from their next announcer.
    fn graft_due(&mut self, now: Duration, out: &mut Out<P>) {
        let due: Vec<Key<P>> = self
            .missing
            .iter()
            .filter(|(_, m)| m.deadline <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            if self.known(&key) {
                self.missing.remove(&key);
                continue;
            }
            let Some(m) = self.missing.get_mut(&key) else {
                continue;
            };
            m.deadline = now + self.cfg.graft_retry;
            // The first announcer still a neighbour (announcers that left are skipped), and not
            // one whose way to the origin goes through this node (a heartbeat announced with
            // no way: it will come from elsewhere, and a graft would reshape the tree).
            m.announcers.retain(|a| {
                a.way != Some(NO_WAY)
                    && (self.eager.contains(&a.peer) || self.lazy.contains(&a.peer))
            });
            let next = (!m.announcers.is_empty()).then(|| m.announcers.remove(0));
            match next {
                Some(Announcer { peer, round, .. }) => {
                    self.make_eager(&peer);
                    let key = Some(key);
                    out.push(PlumtreeEffect::Send(
                        peer,
                        PlumtreeMsg::Graft { key, round },
                    ));
                }
                None => {
                    self.missing.remove(&key);
                }
            }
        }
    }

    /// A payload we already had: the link is redundant, make it lazy on both ends, unless it
    /// has credit left from first copies it brought (see `prune_credit`).
    fn duplicate(&mut self, from: &P, out: &mut Out<P>) {
        if self.lazy.contains(from) {
            out.push(PlumtreeEffect::Send(from.clone(), PlumtreeMsg::Prune));
            return;
        }
        if !self.eager.contains(from) {
            return;
        }
        if let Some(i) = self.credit.iter().position(|(p, _)| p == from) {
            self.credit[i].1 -= 1;
            if self.credit[i].1 == 0 {
                self.credit.swap_remove(i);
            }
            return;
        }
        self.make_lazy(from);
        out.push(PlumtreeEffect::Send(from.clone(), PlumtreeMsg::Prune));
    }

    /// After a new payload arrived from `from` at hop count `round`: the link becomes eager, and
    /// a lazy link that announced it much closer to the origin replaces it.
    fn adopt(&mut self, key: &Key<P>, round: u16, from: &P, out: &mut Out<P>) {
        self.make_eager(from);
        let max = self.cfg.prune_credit;
        if max > 0 && self.eager.contains(from) {
            match self.credit.iter_mut().find(|(p, _)| p == from) {
                Some((_, c)) => *c = (*c + 1).min(max),
                None => self.credit.push((from.clone(), 1)),
            }
        }
        let Some(m) = self.missing.remove(key) else {
            return;
        };
        let threshold = self.cfg.optimization_threshold;
        let best = m.announcers.iter().min_by_key(|a| a.round);
        if let Some(Announcer {
            peer: p, round: r, ..
        }) = best
        {
            let better = threshold > 0 && *r < round && round - r >= threshold;
            if better && p != from && self.is_neighbor(p) && self.is_neighbor(from) {
                let graft = PlumtreeMsg::Graft {
                    key: None,
                    round: *r,
                };
                out.push(PlumtreeEffect::Send(p.clone(), graft));
                self.make_eager(p);
                out.push(PlumtreeEffect::Send(from.clone(), PlumtreeMsg::Prune));
                self.make_lazy(from);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_gossip(
        &mut self,
        from: &P,
        id: MsgId,
        topic: Topic,
        payload: Bytes,
        round: u16,
        now: Duration,
        out: &mut Out<P>,
    ) {
        if self.cache.contains(&id) {
            return self.duplicate(from, out);
        }
        let c = Cached {
            topic: topic.clone(),
            payload: payload.clone(),
            round,
        };
        self.cache.insert(id, c, now);
        out.push(PlumtreeEffect::Deliver {
            topic: topic.clone(),
            payload: payload.clone(),
            id,
            hops: round,
        });
        let next = round.saturating_add(1);
        let msg = PlumtreeMsg::Gossip {
            id,
            topic,
            payload,
            round: next,
        };
        self.eager_push(Some(from), |_| msg.clone(), out);
        self.lazy_push(Key::Msg(id), next, Some(from), |_| None, out);
        self.adopt(&Key::Msg(id), round, from, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn on_heartbeat(
        &mut self,
        from: &P,
        origin: P,
        seq: u32,
        round: u16,
        way: u16,
        now: Duration,
        out: &mut Out<P>,
    ) {
        // A route goes through a neighbour. A node that still takes this one for its
        // neighbour (its view has not caught up yet) would otherwise become the way to every
        // origin whose heartbeats it brings first, with no connection to use.
        if !self.is_neighbor(from) {
            self.stats.strangers_ignored += 1;
            return;
        }
        if origin == self.me {
            return self.duplicate(from, out);
        }
        let key = Key::Beat { origin, seq };
        if self.known(&key) {
            let Key::Beat { origin, seq } = key else {
                return;
            };
            if self.offer(&origin, from, seq, way, now) == Recorded::Moved {
                self.poison_new_way(&origin, out);
            }
            return self.duplicate(from, out);
        }
        let Key::Beat { origin, seq } = key else {
            return;
        };
        if self.offer(&origin, from, seq, way, now) == Recorded::Full {
            return;
        }
        // The announcements of it that came before it are offers too.
        let early: Vec<(P, u16)> = self
            .missing
            .get(&Key::Beat {
                origin: origin.clone(),
                seq,
            })
            .map(|m| {
                m.announcers
                    .iter()
                    .filter_map(|a| Some((a.peer.clone(), a.way?)))
                    .collect()
            })
            .unwrap_or_default();
        for (p, w) in early {
            self.offer(&origin, &p, seq, w, now);
        }
        // The copies go on along the tree with their round plus one; the way each neighbour is
        // offered is this node's own (see `way_for`). The neighbour whose copy this is gets an
        // announcement only when this node is nearer the origin than it (its copy's way is its
        // own way's length plus one).
        let next = round.saturating_add(1);
        self.eager_push(
            Some(from),
            |p| PlumtreeMsg::Heartbeat {
                origin: origin.clone(),
                seq,
                round: next,
                way: self.way_for(&origin, p),
            },
            out,
        );
        let nearer = self
            .routes
            .get(&origin)
            .is_some_and(|e| e.via != *from && e.hops.saturating_add(2) < way);
        let lazy: Vec<(P, Option<u16>)> = self
            .lazy
            .iter()
            .filter(|p| *p != from)
            .chain(nearer.then_some(from))
            .map(|p| (p.clone(), Some(self.way_for(&origin, p))))
            .collect();
        let key = Key::Beat { origin, seq };
        for (p, way) in lazy {
            let a = Announce {
                key: key.clone(),
                round: next,
                way,
            };
            self.announce_to(&p, a, out);
        }
        self.adopt(&key, round, from, out);
    }

    /// The way to `origin` this node offers the neighbour `to`: its own route's length plus
    /// one, or [`NO_WAY`] when that route goes through `to` (or when it has none).
    fn way_for(&self, origin: &P, to: &P) -> u16 {
        if *origin == self.me {
            return 1;
        }
        match self.routes.get(origin) {
            Some(e) if e.via != *to => e.hops.saturating_add(1).min(NO_WAY - 1),
            _ => NO_WAY,
        }
    }

    fn on_ihave(&mut self, from: &P, a: Announce<P>, now: Duration, out: &mut Out<P>) {
        if self.known(&a.key) {
            if let (Key::Beat { origin, seq }, Some(way)) = (&a.key, a.way) {
                if *origin != self.me
                    && self.is_neighbor(from)
                    && self.offer(origin, from, *seq, way, now) == Recorded::Moved
                {
                    self.poison_new_way(origin, out);
                }
            }
            return;
        }
        let announcer = Announcer {
            peer: from.clone(),
            round: a.round,
            way: a.way,
        };
        if let Some(m) = self.missing.get_mut(&a.key) {
            let listed = m.announcers.iter().any(|x| x.peer == *from);
            if !listed && m.announcers.len() < self.cfg.announcers_max.max(1) {
                m.announcers.push(announcer);
            }
        } else if self.missing.len() < self.cfg.missing_max {
            let m = Missing {
                deadline: now + self.cfg.graft_timeout,
                announcers: vec![announcer],
            };
            self.missing.insert(a.key, m);
            self.arm_tick(out);
        } else {
            self.stats.missing_dropped += 1;
        }
    }

    fn on_graft(&mut self, from: &P, key: Option<Key<P>>, round: u16, out: &mut Out<P>) {
        if !self.is_neighbor(from) {
            return;
        }
        self.make_eager(from);
        let msg = match key {
            Some(Key::Msg(id)) => self.cache.get(&id).map(|c| PlumtreeMsg::Gossip {
                id,
                topic: c.topic.clone(),
                payload: c.payload.clone(),
                round,
            }),
            Some(Key::Beat { origin, seq }) => {
                let newest = if origin == self.me {
                    Some(self.hb_seq)
                } else {
                    self.routes.get(&origin).map(|e| e.seq)
                };
                newest
                    .filter(|s| *s >= seq)
                    .map(|seq| PlumtreeMsg::Heartbeat {
                        way: self.way_for(&origin, from),
                        origin,
                        seq,
                        round,
                    })
            }
            None => None,
        };
        if let Some(msg) = msg {
            out.push(PlumtreeEffect::Send(from.clone(), msg));
        }
    }

    /// The neighbour to send a message for `dst` to: `dst` itself if it is a neighbour, else
    /// the neighbour `dst`'s heartbeat came from.
    pub fn next_hop(&self, dst: &P) -> Option<P> {
        if self.is_neighbor(dst) {
            return Some(dst.clone());
        }
        self.routes
            .get(dst)
            .map(|e| &e.via)
            .filter(|v| self.is_neighbor(v))
            .cloned()
    }

    /// The sequence number of `origin`'s newest heartbeat known here (to tell a node's later
    /// heartbeats from earlier ones).
    pub fn route_seq(&self, origin: &P) -> Option<u32> {
        self.routes.get(origin).map(|e| e.seq)
    }

    /// The sequence number of this node's last heartbeat (0 before the first).
    pub fn heartbeat_seq(&self) -> u32 {
        self.hb_seq
    }

    /// What is known of the way to `dst`.
    pub fn route_info(&self, dst: &P, now: Duration) -> Option<RouteInfo<P>> {
        self.routes.info(dst, now)
    }

    /// The origins whose heartbeat arrived within `max_age`: the members this node hears from.
    pub fn alive_origins(&self, max_age: Duration, now: Duration) -> Vec<P> {
        self.routes
            .fresh(max_age, now)
            .map(|(o, _)| o.clone())
            .collect()
    }

    /// `(origin, neighbour to go through)` for the origins whose route moved (a first route, or
    /// a heartbeat that came first through another neighbour than the one before) since the
    /// last call, and that are still in the table. Taken after every message, it keeps a route
    /// table built from [`Plumtree::routes`] in step with the heartbeats between two full
    /// reads: two nodes whose entries were read at different moments may otherwise each route
    /// an origin through the other.
    pub fn take_moved_routes(&mut self) -> Vec<(P, P)> {
        if self.moved.is_empty() {
            return Vec::new();
        }
        let moved = std::mem::take(&mut self.moved);
        moved
            .into_iter()
            .filter_map(|o| self.routes.get(&o).map(|e| (o.clone(), e.via.clone())))
            .collect()
    }

    /// The origins whose heartbeats have not been heard for longer than `min_age`, of those
    /// still routed (see [`Plumtree::routes`]).
    pub fn silent(&self, min_age: Duration, now: Duration) -> Vec<P> {
        self.routes.stale(min_age, now).cloned().collect()
    }

    /// `(origin, neighbour to go through)` for the origins heard from within `max_age` (to feed
    /// an overlay's routing, e.g. `HyParView::set_routes`).
    pub fn routes(&self, max_age: Duration, now: Duration) -> Vec<(P, P)> {
        self.routes
            .fresh(max_age, now)
            .map(|(o, e)| (o.clone(), e.via.clone()))
            .collect()
    }
}

#[cfg(test)]
#[path = "plumtree_tests.rs"]
mod tests;
