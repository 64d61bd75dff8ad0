//! ActOp's distributed pairwise partitioning (§4, Algorithm 1), without I/O: what a server
//! offers a peer, and how the peer decides the exchange.
//!
//! Each server knows the (heavy) edges of its own actors and where their other ends are. For
//! a peer `q`, the *transfer score* of a local actor `v` is the weight of its edges to actors
//! on `q` minus the weight of its edges to actors here: how much remote traffic moving `v` to
//! `q` saves. A server offers the peer with the largest total its `k` best-scoring actors
//! ([`offers`]); the peer picks `k` of its own the same way and decides which of both sets
//! move ([`exchange`]): greedily the best-scoring actor of either set, as long as the two
//! servers' actor counts stay within `delta` of each other (or get closer), updating the
//! others' scores after each move, until no actor with a positive score can move. Every move
//! lowers the remote traffic, so repeated exchanges settle on a partition where no single
//! actor of any pair of servers can move with profit within the balance bound.

use std::collections::HashMap;
use std::hash::Hash;

/// A local actor offered to a peer: its transfer score towards the peer and its edges (the
/// peer needs them to score the moves against each other).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Candidate<A> {
    /// The actor.
    pub actor: A,
    /// Weight of its edges to the peer's actors minus weight of its edges to local ones.
    pub score: i64,
    /// Its edges: the other end and the weight.
    pub edges: Vec<(A, u64)>,
}

/// What one server knows: its actors' edges and where the other ends run.
#[derive(Clone, Debug)]
pub struct View<A, S> {
    /// This server.
    pub here: S,
    /// Its actors and their (heavy) edges.
    pub edges: HashMap<A, Vec<(A, u64)>>,
    /// Where the other ends of those edges run, as far as this server knows (an end it does
    /// not know of counts as neither here nor there).
    pub location: HashMap<A, S>,
}

impl<A: Ord + Hash + Clone, S: Eq + Clone> View<A, S> {
    fn at(&self, a: &A) -> Option<&S> {
        if self.edges.contains_key(a) {
            Some(&self.here)
        } else {
            self.location.get(a)
        }
    }

    /// The transfer score of local actor `v` towards server `there`.
    pub fn score(&self, v: &A, there: &S) -> i64 {
        let mut s: i64 = 0;
        for (u, w) in self.edges.get(v).into_iter().flatten() {
            let w = i64::try_from(*w).unwrap_or(i64::MAX);
            match self.at(u) {
                Some(at) if at == there => s = s.saturating_add(w),
                Some(at) if *at == self.here => s = s.saturating_sub(w),
                _ => {}
            }
        }
        s
    }

    /// The at most `k` local actors with the best positive scores towards `there`, best first.
    pub fn candidates(&self, there: &S, k: usize) -> Vec<Candidate<A>> {
        let mut c: Vec<(&A, i64)> = self
            .edges
            .keys()
            .map(|v| (v, self.score(v, there)))
            .filter(|(_, s)| *s > 0)
            .collect();
        // Best first; ties by actor, so that a view decides the same way every time.
        c.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        c.truncate(k);
        c.into_iter()
            .map(|(v, score)| Candidate {
                actor: v.clone(),
                score,
                edges: self.edges.get(v).cloned().unwrap_or_default(),
            })
            .collect()
    }
}

/// For every server this one has edges to (but itself), its candidates, the servers with the
/// largest total score first; servers with nothing to gain are left out. The caller asks the
/// first; if it declines, the next.
pub fn offers<A, S>(view: &View<A, S>, k: usize) -> Vec<(S, Vec<Candidate<A>>)>
where
    A: Ord + Hash + Clone,
    S: Ord + Hash + Clone,
{
    let mut servers: Vec<S> = Vec::new();
    for s in view.location.values() {
        if *s != view.here && !servers.contains(s) {
            servers.push(s.clone());
        }
    }
    let mut out: Vec<(i64, S, Vec<Candidate<A>>)> = servers
        .into_iter()
        .map(|s| {
            let c = view.candidates(&s, k);
            (c.iter().map(|c| c.score).sum(), s, c)
        })
        .filter(|(total, _, _)| *total > 0)
        .collect();
    out.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    out.into_iter().map(|(_, s, c)| (s, c)).collect()
}

/// What a pairwise exchange moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange<A> {
    /// From the server that offered, to the one that decided.
    pub to_decider: Vec<A>,
    /// From the server that decided, to the one that offered.
    pub to_offerer: Vec<A>,
}

/// How many actors a server may run: at least `min`, at most `max`. Servers that all keep
/// within it differ by at most `max - min` (ActOp's δ); one outside may only come closer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Balance {
    /// Fewest actors on a server.
    pub min: usize,
    /// Most actors on a server.
    pub max: usize,
}

impl Balance {
    /// `total` actors on `servers` servers, each within `delta / 2` of the mean (rounded
    /// outwards).
    pub fn around(total: usize, servers: usize, delta: usize) -> Balance {
        let servers = servers.max(1);
        let (lo, hi) = (total / servers, total.div_ceil(servers));
        Balance {
            min: lo.saturating_sub(delta / 2),
            max: hi + delta / 2,
        }
    }

    /// How far `n` actors are outside the bounds.
    fn outside(&self, n: i64) -> i64 {
        (self.min as i64 - n).max(n - self.max as i64).max(0)
    }
}

/// The decision of server `q` on `offered` (from `p`, scored towards `q`), given `own`, its
/// candidates towards `p` (see [`View::candidates`]), with `sizes` = (actors on `p`, actors on
/// `q`): a move may not take either server further outside `balance`.
pub fn exchange<A: Ord + Hash + Clone>(
    offered: &[Candidate<A>],
    own: &[Candidate<A>],
    sizes: (usize, usize),
    balance: Balance,
) -> Exchange<A> {
    // The weight between two candidates, as either side knows it.
    let mut weight: HashMap<(A, A), u64> = HashMap::new();
    for c in offered.iter().chain(own) {
        for (u, w) in &c.edges {
            for key in [(c.actor.clone(), u.clone()), (u.clone(), c.actor.clone())] {
                let e = weight.entry(key).or_default();
                *e = (*e).max(*w);
            }
        }
    }
    let w = |a: &A, b: &A| -> i64 {
        weight
            .get(&(a.clone(), b.clone()))
            .map_or(0, |w| i64::try_from(*w).unwrap_or(i64::MAX))
    };
    // (actor, score, from p?) still to decide.
    let mut left: Vec<(A, i64, bool)> = offered
        .iter()
        .map(|c| (c.actor.clone(), c.score, true))
        .chain(own.iter().map(|c| (c.actor.clone(), c.score, false)))
        .collect();
    let (mut p, mut q) = (sizes.0 as i64, sizes.1 as i64);
    let allowed = |from_p: bool, p: i64, q: i64| {
        let (p2, q2) = if from_p {
            (p - 1, q + 1)
        } else {
            (p + 1, q - 1)
        };
        balance.outside(p2) + balance.outside(q2) <= balance.outside(p) + balance.outside(q)
    };
    let mut out = Exchange {
        to_decider: Vec::new(),
        to_offerer: Vec::new(),
    };
    loop {
        // The best actor that may move, from either side.
        let pick = left
            .iter()
            .enumerate()
            .filter(|(_, (_, s, from_p))| *s > 0 && allowed(*from_p, p, q))
            .max_by(|(_, (a, sa, _)), (_, (b, sb, _))| sa.cmp(sb).then_with(|| b.cmp(a)))
            .map(|(i, _)| i);
        let Some(i) = pick else { break };
        let (v, _, from_p) = left.swap_remove(i);
        // Its move changes the others' scores: an actor on the side it left now has it on
        // the other side (twice its edge: one remote edge saved, one local edge less lost);
        // one on the side it joined now has it here.
        for (u, s, u_from_p) in left.iter_mut() {
            let d = 2 * w(u, &v);
            *s += if *u_from_p == from_p { d } else { -d };
        }
        if from_p {
            p -= 1;
            q += 1;
            out.to_decider.push(v);
        } else {
            p += 1;
            q -= 1;
            out.to_offerer.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// An undirected weighted graph and where each vertex runs.
    struct World {
        edges: BTreeMap<(u32, u32), u64>,
        at: BTreeMap<u32, u8>,
    }

    impl World {
        fn edge(&mut self, a: u32, b: u32, w: u64) {
            let (a, b) = (a.min(b), a.max(b));
            *self.edges.entry((a, b)).or_default() += w;
        }

        /// The weight of edges whose ends run on different servers.
        fn cost(&self) -> u64 {
            self.edges
                .iter()
                .filter(|((a, b), _)| self.at[a] != self.at[b])
                .map(|(_, w)| *w)
                .sum()
        }

        fn size(&self, s: u8) -> usize {
            self.at.values().filter(|x| **x == s).count()
        }

        /// What server `s` knows: all edges of its actors, and where every actor runs.
        fn view(&self, s: u8) -> View<u32, u8> {
            let mut edges: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
            for (v, at) in &self.at {
                if *at == s {
                    edges.insert(*v, Vec::new());
                }
            }
            for ((a, b), w) in &self.edges {
                if let Some(e) = edges.get_mut(a) {
                    e.push((*b, *w));
                }
                if let Some(e) = edges.get_mut(b) {
                    e.push((*a, *w));
                }
            }
            let location = self
                .at
                .iter()
                .filter(|(_, at)| **at != s)
                .map(|(v, at)| (*v, *at))
                .collect();
            View {
                here: s,
                edges,
                location,
            }
        }

        /// One round of Algorithm 1 started by every server in turn; how many actors moved.
        fn round(&mut self, servers: u8, k: usize, delta: usize) -> usize {
            let balance = Balance::around(self.at.len(), usize::from(servers), delta);
            let mut moved = 0;
            for p in 0..servers {
                let view = self.view(p);
                for (q, offered) in offers(&view, k) {
                    let own = self.view(q).candidates(&p, k);
                    let x = exchange(&offered, &own, (self.size(p), self.size(q)), balance);
                    if x.to_decider.is_empty() && x.to_offerer.is_empty() {
                        continue; // declined: try the next peer
                    }
                    let before = self.cost();
                    for v in &x.to_decider {
                        self.at.insert(*v, q);
                    }
                    for v in &x.to_offerer {
                        self.at.insert(*v, p);
                    }
                    assert!(self.cost() < before, "every exchange lowers the cost");
                    moved += x.to_decider.len() + x.to_offerer.len();
                    break;
                }
            }
            moved
        }

        fn settle(&mut self, servers: u8, k: usize, delta: usize) -> usize {
            for rounds in 1..=100 {
                if self.round(servers, k, delta) == 0 {
                    return rounds;
                }
                for a in 0..servers {
                    for b in 0..servers {
                        let (x, y) = (self.size(a) as i64, self.size(b) as i64);
                        assert!((x - y).unsigned_abs() as usize <= delta, "balance kept");
                    }
                }
            }
            panic!("no fixed point in 100 rounds");
        }
    }

    /// `groups` cliques of `size` actors (edges of 10 within), consecutive cliques joined by
    /// one light edge (1), placed round robin over `servers` servers.
    fn cliques(groups: u32, size: u32, servers: u8) -> World {
        let mut w = World {
            edges: BTreeMap::new(),
            at: BTreeMap::new(),
        };
        for g in 0..groups {
            for i in 0..size {
                for j in (i + 1)..size {
                    w.edge(g * size + i, g * size + j, 10);
                }
            }
            if g + 1 < groups {
                w.edge(g * size, (g + 1) * size, 1);
            }
        }
        for v in 0..groups * size {
            // Spread every clique over all servers.
            w.at.insert(v, (v % u32::from(servers)) as u8);
        }
        w
    }

    #[test]
    fn two_servers_settle_on_the_optimum_within_the_balance_bound() {
        let mut w = cliques(2, 8, 2);
        // Each clique split 4 / 4: 16 of its 28 edges cross (the light edge joins two
        // actors of server 0).
        assert_eq!(w.cost(), 2 * 4 * 4 * 10);
        w.settle(2, 8, 2);
        // Optimum: each clique on a server of its own; only the light edge crosses.
        assert_eq!(w.cost(), 1);
        assert_eq!((w.size(0), w.size(1)), (8, 8));
    }

    #[test]
    fn four_servers_settle_on_the_optimum_within_the_balance_bound() {
        let mut w = cliques(4, 6, 4);
        let start = w.cost();
        // A bound of 1 from an even start lets no single actor move; 2 lets pairs swap.
        w.settle(4, 6, 2);
        assert!(w.cost() < start);
        // Optimum: a clique per server; only the three light edges cross.
        assert_eq!(w.cost(), 3);
        for s in 0..4 {
            assert_eq!(w.size(s), 6);
        }
    }

    #[test]
    fn many_cliques_placed_at_random_end_mostly_local() {
        // 16 cliques of 6 on 4 servers, placed at random (a fixed seed): about 3/4 of the
        // traffic crosses servers at first, as with Orleans' random placement.
        let mut w = cliques(16, 6, 4);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut counts = [0usize; 4];
        for v in 0..96u32 {
            // Random, but 24 per server (ActOp starts from a balanced placement).
            let s = loop {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let s = (seed % 4) as usize;
                if counts[s] < 24 {
                    break s;
                }
            };
            counts[s] += 1;
            w.at.insert(v, s as u8);
        }
        let total: u64 = w.edges.values().sum();
        let before = w.cost() as f64 / total as f64;
        assert!(before > 0.6, "{before}");
        // 0.77 -> 0.14 in 3 rounds with 12 candidates and 4 actors either side of the mean
        // (with 8 and 2 it stops at 0.00-0.34, depending on how ties fall).
        let rounds = w.settle(4, 12, 8);
        let after = w.cost() as f64 / total as f64;
        assert!(
            after <= 0.2,
            "remote fraction {before:.2} -> {after:.2} in {rounds} rounds"
        );
    }

    #[test]
    fn a_tight_bound_is_never_broken_and_moves_only_what_pays() {
        // One clique of 6 and 6 loners, all on server 0 but for three clique members: the
        // clique cannot gather on server 1 without breaking a bound of 0.
        let mut w = cliques(1, 6, 2);
        for v in 6..12 {
            w.at.insert(v, 0);
        }
        for v in 0..6 {
            w.at.insert(v, if v < 3 { 1 } else { 0 });
        }
        // 9 on server 0, 3 on server 1: moves may only even them out.
        let before = w.cost();
        w.settle(2, 6, 6);
        assert!(w.cost() <= before);
        assert!(w.size(0).abs_diff(w.size(1)) <= 6);
        // Nothing to gain: the clique is together and the loners have no edges.
        let mut together = cliques(1, 6, 1);
        for v in 6..12 {
            together.at.insert(v, 1);
        }
        assert_eq!(together.cost(), 0);
        assert_eq!(together.round(2, 6, 0), 0);
    }

    #[test]
    fn scores_count_remote_edges_minus_local_ones() {
        let mut w = cliques(1, 3, 1);
        w.at.insert(2, 1);
        let v = w.view(0);
        // Actor 0: edge to 1 (here, 10), edge to 2 (server 1, 10).
        assert_eq!(v.score(&0, &1), 0);
        let v1 = w.view(1);
        assert_eq!(v1.score(&2, &0), 20);
        assert_eq!(v1.candidates(&0, 5).len(), 1);
    }
}
