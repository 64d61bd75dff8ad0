//! ActOp's pairwise partitioning on a Halo-Presence-like graph far larger than one machine can
//! host as live actors: the same `maquis_proto::actop` code the nodes run (offers, exchange,
//! balance), over a graph of games and players.
//!
//! Each game actor talks with its players (an edge of weight 10 each way counted at the
//! player, and the game's view of each player), players are placed at random, and every
//! round each server in turn offers its best peer what it would gain by moving, as a node's
//! `$maquis/actop` round does; the peer decides. What a round reports: the share of the
//! graph's weight that crosses servers, the actors moved, the spread of actors per server.

use std::collections::HashMap;
use std::time::Instant;

use maquis_proto::actop::{exchange, offers, Balance, View};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What to simulate.
#[derive(Clone, Debug)]
pub struct ActopSim {
    /// Servers.
    pub servers: u16,
    /// Games; each has one game actor and `players` player actors.
    pub games: u32,
    /// Players per game.
    pub players: u32,
    /// Actors a server offers, or sends back, per exchange at most.
    pub candidates: usize,
    /// Actors two servers may differ by (δ).
    pub imbalance: usize,
    /// Rounds at most (one exchange started by every server per round); the run ends early
    /// when a round moves nothing.
    pub rounds: usize,
    /// Seed of the placement.
    pub seed: u64,
}

/// One round's outcome.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ActopRound {
    /// Round number (0: the placement before any exchange).
    pub round: usize,
    /// Share of the edges' weight between actors on different servers.
    pub remote_fraction: f64,
    /// Actors moved in the round.
    pub migrations: usize,
    /// Most minus fewest actors on a server.
    pub imbalance: usize,
    /// Wall time of the round, milliseconds.
    pub millis: u64,
}

/// The graph and where every actor is.
struct World {
    /// Neighbours of each actor, with weights.
    adj: Vec<Vec<(u32, u64)>>,
    at: Vec<u16>,
    servers: u16,
}

impl World {
    fn remote_fraction(&self) -> f64 {
        let (mut total, mut remote) = (0u64, 0u64);
        for (v, edges) in self.adj.iter().enumerate() {
            for (u, w) in edges {
                total += w;
                if self.at[v] != self.at[*u as usize] {
                    remote += w;
                }
            }
        }
        remote as f64 / total.max(1) as f64
    }

    fn sizes(&self) -> Vec<usize> {
        let mut s = vec![0usize; usize::from(self.servers)];
        for a in &self.at {
            s[usize::from(*a)] += 1;
        }
        s
    }

    /// What server `s` knows: its actors' edges, and where their neighbours are.
    fn view(&self, s: u16) -> View<u32, u16> {
        let mut edges = HashMap::new();
        let mut location = HashMap::new();
        for (v, at) in self.at.iter().enumerate() {
            if *at != s {
                continue;
            }
            let e = &self.adj[v];
            for (u, _) in e {
                let where_u = self.at[*u as usize];
                if where_u != s {
                    location.insert(*u, where_u);
                }
            }
            edges.insert(v as u32, e.clone());
        }
        View {
            here: s,
            edges,
            location,
        }
    }
}

/// Runs the simulation; the placement first, then one entry per round.
pub fn run_actop(cfg: &ActopSim) -> Vec<ActopRound> {
    let servers = cfg.servers.max(2);
    let per_game = cfg.players + 1;
    let n = (cfg.games * per_game) as usize;
    let mut adj: Vec<Vec<(u32, u64)>> = vec![Vec::new(); n];
    for g in 0..cfg.games {
        let game = g * per_game;
        for p in 1..=cfg.players {
            let player = game + p;
            adj[game as usize].push((player, 10));
            adj[player as usize].push((game, 10));
        }
    }
    // Random, balanced: a random permutation dealt round robin.
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut order: Vec<u32> = (0..n as u32).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    let mut at = vec![0u16; n];
    for (i, v) in order.iter().enumerate() {
        at[*v as usize] = (i % usize::from(servers)) as u16;
    }
    let mut world = World { adj, at, servers };
    let spread = |w: &World| {
        let s = w.sizes();
        s.iter().max().copied().unwrap_or(0) - s.iter().min().copied().unwrap_or(0)
    };
    let mut out = vec![ActopRound {
        round: 0,
        remote_fraction: world.remote_fraction(),
        migrations: 0,
        imbalance: spread(&world),
        millis: 0,
    }];
    for round in 1..=cfg.rounds {
        let t0 = Instant::now();
        let mut moved = 0;
        for p in 0..servers {
            let view = world.view(p);
            for (q, offered) in offers(&view, cfg.candidates) {
                let own = world.view(q).candidates(&p, cfg.candidates);
                let sizes = world.sizes();
                let pair = (sizes[usize::from(p)], sizes[usize::from(q)]);
                // Every server within δ/2 of the mean: the simulator knows the total (a node
                // knows only its own count and its peer's; see the node's driver).
                let balance = Balance::around(n, usize::from(servers), cfg.imbalance);
                let x = exchange(&offered, &own, pair, balance);
                if x.to_decider.is_empty() && x.to_offerer.is_empty() {
                    continue;
                }
                for v in &x.to_decider {
                    world.at[*v as usize] = q;
                }
                for v in &x.to_offerer {
                    world.at[*v as usize] = p;
                }
                moved += x.to_decider.len() + x.to_offerer.len();
                break;
            }
        }
        out.push(ActopRound {
            round,
            remote_fraction: world.remote_fraction(),
            migrations: moved,
            imbalance: spread(&world),
            millis: t0.elapsed().as_millis() as u64,
        });
        if moved == 0 {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn games_and_players_placed_at_random_end_up_together() {
        let rounds = run_actop(&ActopSim {
            servers: 4,
            games: 200,
            players: 8,
            candidates: 400,
            imbalance: 20,
            rounds: 30,
            seed: 7,
        });
        let first = &rounds[0];
        let last = rounds.last().expect("rounds");
        assert!(first.remote_fraction > 0.7, "{first:?}");
        assert!(last.remote_fraction < 0.2, "{last:?}");
        assert!(rounds.iter().all(|r| r.imbalance <= 20 + 1), "{rounds:?}");
    }
}
