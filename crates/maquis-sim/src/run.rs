//! The timeline of a scenario, and the metrics computed from it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::seq::SliceRandom;
use rand::Rng;

use maquis_proto::harness::{Micros, RoutedOutcome};

use crate::report::{peak_rss_kb, Report};
use crate::scenario::{Fault, Scenario, SimOverlay};
use crate::world::World;

/// Routed messages dropped, by reason.
#[derive(Default)]
struct Routed {
    no_route: u64,
    hop_limit: u64,
    unreachable: u64,
    lost: u64,
    /// Mean links travelled by the messages that arrived.
    links_mean: Option<f64>,
    /// Mean links of a shortest path between each message's ends when it was sent.
    shortest_mean: Option<f64>,
}

fn us(d: Duration) -> Micros {
    d.as_micros().min(u128::from(u64::MAX)) as Micros
}

enum Act {
    Broadcast,
    Health(u32),
    ChurnCrash,
    ChurnJoin,
}

impl World {
    fn live(&self) -> Vec<u32> {
        (0..self.len() as u32)
            .filter(|&i| self.alive(i as usize))
            .collect()
    }

    fn random_live(&mut self) -> Option<u32> {
        self.random_live_except(None)
    }

    /// Crashes that fraction of the live nodes; returns them, with the live nodes that counted
    /// each a member just before.
    fn crash_fraction(&mut self, fraction: f64) -> (Vec<u32>, Vec<Vec<u32>>) {
        let mut live = self.live();
        let k = ((live.len() as f64) * fraction.clamp(0.0, 1.0)).round() as usize;
        let (victims, _) = live.partial_shuffle(&mut self.rng, k);
        let victims = victims.to_vec();
        let watchers = self.watchers_of(&victims);
        for &v in victims.iter() {
            self.net.crash(v);
        }
        (victims, watchers)
    }

    /// For each node, the live nodes that count it a member now.
    fn watchers_of(&self, victims: &[u32]) -> Vec<Vec<u32>> {
        let live = self.live();
        victims
            .iter()
            .map(|&v| {
                live.iter()
                    .copied()
                    .filter(|&o| {
                        o != v
                            && self
                                .net
                                .node(o)
                                .machine
                                .members()
                                .iter()
                                .any(|m| m.index == v)
                    })
                    .collect()
            })
            .collect()
    }

    /// For nodes crashed at `t1`: per crashed node, the time until every node that counted it a
    /// member then and is alive at the end reported it down (`None` if one never did), in ms.
    fn detection(&self, victims: &[u32], watchers: &[Vec<u32>], t1: Micros) -> Vec<Option<f64>> {
        let mut first: HashMap<(u32, u32), Micros> = HashMap::new();
        for &(at, by, who) in &self.net.observer.downs {
            if at >= t1 {
                first.entry((by, who)).or_insert(at);
            }
        }
        victims
            .iter()
            .zip(watchers)
            .map(|(&v, watchers)| {
                watchers
                    .iter()
                    .filter(|&&o| self.alive(o as usize))
                    .map(|&o| first.get(&(o, v)).map(|&at| (at - t1) as f64 / 1000.0))
                    .try_fold(0.0f64, |m, d| d.map(|d| m.max(d)))
            })
            .collect()
    }

    /// `Down` events about nodes that never crashed (alive at the end).
    fn false_downs(&self) -> u64 {
        self.net
            .observer
            .downs
            .iter()
            .filter(|(_, _, who)| self.alive(*who as usize))
            .count() as u64
    }

    fn join_new(&mut self) {
        let i = self.spawn();
        if let Some(c) = self.contact(i) {
            self.net.join(i, c);
        }
    }

    /// Delivery fraction of broadcast `b` among nodes alive now that had joined when it was sent.
    fn delivery(&self, b: usize) -> f64 {
        let at = self.net.observer.bcasts[b].at;
        let (mut want, mut got) = (0u64, 0u64);
        for i in 0..self.len() {
            if self.alive(i) && self.net.node(i as u32).born <= at {
                want += 1;
                if self.delivered(b, i) {
                    got += 1;
                }
            }
        }
        if want == 0 {
            1.0
        } else {
            got as f64 / want as f64
        }
    }
}

/// Runs a scenario to the end and measures it. Deterministic: the same scenario gives the same
/// report (but for `wall_ms` and `peak_rss_kb`).
pub fn run(s: &Scenario) -> Report {
    let started = Instant::now();
    let period = us(s.hyparview.shuffle_period).max(1);
    let churn_per_period = match s.fault {
        Fault::Churn { fraction, .. } => ((s.nodes as f64) * fraction).round() as usize,
        _ => 0,
    };
    let churn_periods = match s.fault {
        Fault::Churn { periods, .. } => periods as usize,
        _ => 0,
    };
    let mut w = World::new(s, s.nodes + churn_per_period * churn_periods);
    let mut routed = Routed::default();

    // Bootstrap: each new node joins a random existing one.
    let join_every = us(s.join_every);
    for k in 0..s.nodes {
        w.run_until(k as Micros * join_every);
        w.join_new();
    }
    w.run_until(w.now() + u64::from(s.stabilize_periods) * period);
    let every = us(s.broadcast_every).max(1);
    for _ in 0..s.warmup_broadcasts {
        if let Some(o) = w.random_live() {
            w.broadcast(o);
        }
        w.run_until(w.now() + every);
    }
    w.run_until(w.now() + us(s.drain));

    // The fault.
    let t1 = w.now();
    let mut acts: Vec<(Micros, Act)> = Vec::new();
    let (mut victims, mut watchers) = (Vec::new(), Vec::new());
    let (t_measure, t_heal) = match s.fault {
        Fault::None => (t1, t1),
        Fault::MassiveFailure { fraction } => {
            (victims, watchers) = w.crash_fraction(fraction);
            (t1, t1)
        }
        Fault::Churn { periods, .. } => {
            for c in 0..u64::from(periods) {
                acts.push((t1 + c * period, Act::ChurnCrash));
                for _ in 0..churn_per_period {
                    let at = t1 + c * period + w.rng.gen_range(0..period);
                    acts.push((at, Act::ChurnJoin));
                }
            }
            (t1, t1 + u64::from(periods) * period)
        }
        Fault::Partition { periods } => {
            let side: Vec<bool> = (0..w.len()).map(|_| w.rng.gen()).collect();
            w.net.partition(side);
            w.run_until(t1 + u64::from(periods) * period);
            w.net.heal();
            (w.now(), w.now())
        }
    };
    let window_end = t_heal + u64::from(s.healing_window) * period;
    let first_at = t_measure + 1000;
    let count = (1 + s.broadcasts).max(((window_end - first_at) / every + 1) as usize);
    for b in 0..count as u64 {
        acts.push((first_at + b * every, Act::Broadcast));
    }
    for k in 0..=s.healing_window {
        acts.push((t_heal + u64::from(k) * period, Act::Health(k)));
    }
    acts.sort_by_key(|(t, _)| *t);
    let mut measured: Vec<usize> = Vec::new();
    let mut connected = vec![false; s.healing_window as usize + 1];
    let mut last = t1;
    for (at, act) in acts {
        w.run_until(at);
        last = last.max(at);
        match act {
            Act::Broadcast => {
                if let Some(o) = w.random_live() {
                    measured.push(w.broadcast(o));
                }
            }
            Act::Health(k) => {
                let g = w.net.graph();
                connected[k as usize] = g.components == 1;
            }
            Act::ChurnCrash => {
                w.crash_fraction(churn_per_period as f64 / s.nodes as f64);
            }
            Act::ChurnJoin => w.join_new(),
        }
    }
    w.run_until(last + us(s.drain));

    // Deliveries, redundancy, healing.
    let fractions: Vec<f64> = measured.iter().map(|&b| w.delivery(b)).collect();
    let window = &fractions[..fractions.len().min(1 + s.broadcasts)];
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    let delivery_first = window.first().copied().unwrap_or(0.0);
    let delivery_mean_100 = mean(window.get(1..).unwrap_or(&[]));
    let delivery_last = window.last().copied().unwrap_or(0.0);
    let bcasts = &w.net.observer.bcasts;
    let rmrs: Vec<f64> = measured[..window.len()]
        .iter()
        .map(|&b| &bcasts[b])
        .filter(|b| b.reached > 1)
        .map(|b| b.received as f64 / f64::from(b.reached - 1) - 1.0)
        .collect();
    let hops: Vec<f64> = measured[..window.len()]
        .iter()
        .map(|&b| f64::from(bcasts[b].max_hops))
        .collect();
    let healing_periods = (0..=s.healing_window).find(|&k| {
        let from = t_heal + u64::from(k) * period;
        connected[k as usize]
            && measured
                .iter()
                .zip(&fractions)
                .filter(|(&b, _)| bcasts[b].at >= from)
                .all(|(_, f)| *f >= 1.0)
    });

    // Routing: one member-heartbeat period (every live node announces itself along the
    // current trees), then routed sends between random live pairs, as the runtime routes them.
    let mut routed_delivery = None;
    if s.routed_sends > 0 {
        if s.overlay == SimOverlay::PeerToPeer {
            w.run_until(w.now() + us(s.heartbeat_every()));
        }
        let mut dests = w.live();
        if s.route_destinations > 0 && s.route_destinations < dests.len() {
            let k = s.route_destinations;
            dests.partial_shuffle(&mut w.rng, k);
            dests.truncate(k);
        }
        let before = w.net.observer.routed.clone();
        let links_before = w.net.observer.routed_links;
        let (mut sent, mut shortest, mut paths) = (0u64, 0u64, 0u64);
        for _ in 0..s.routed_sends {
            let Some(a) = w.random_live() else { break };
            let b = dests[w.rng.gen_range(0..dests.len())];
            if a != b && w.alive(b as usize) {
                if let Some(d) = w.net.distance(a, b) {
                    shortest += u64::from(d);
                    paths += 1;
                }
                w.net.route(a, b);
                sent += 1;
            }
            w.run_until(w.now() + 200);
        }
        w.run_until(w.now() + us(s.drain));
        let count = |o: RoutedOutcome| {
            w.net.observer.routed.get(&o).copied().unwrap_or(0)
                - before.get(&o).copied().unwrap_or(0)
        };
        let arrived = count(RoutedOutcome::Delivered(0));
        routed = Routed {
            no_route: count(RoutedOutcome::NoRoute),
            hop_limit: count(RoutedOutcome::HopLimit),
            unreachable: count(RoutedOutcome::Unreachable),
            lost: count(RoutedOutcome::Lost),
            links_mean: (arrived > 0)
                .then(|| (w.net.observer.routed_links - links_before) as f64 / arrived as f64),
            shortest_mean: (paths > 0).then(|| shortest as f64 / paths as f64),
        };
        if sent > 0 {
            routed_delivery = Some(count(RoutedOutcome::Delivered(0)) as f64 / sent as f64);
        }
    }

    // Failure detection: how long until every live node reported each crashed one down.
    let detected = w.detection(&victims, &watchers, t1);
    let mut times: Vec<f64> = detected.iter().flatten().copied().collect();
    times.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        (!times.is_empty()).then(|| times[((times.len() - 1) as f64 * q).round() as usize])
    };

    let g = w.net.graph();
    Report {
        detect_p50_ms: pick(0.5),
        detect_max_ms: pick(1.0),
        undetected: detected.iter().filter(|d| d.is_none()).count(),
        false_downs: w.false_downs(),
        name: s.name.clone(),
        overlay: s.overlay.name().to_string(),
        nodes: w.len(),
        live: w.live().len(),
        components: g.components,
        isolated: g.isolated,
        symmetry: g.symmetry,
        delivery_first,
        delivery_mean_100,
        delivery_last,
        rmr: mean(&rmrs),
        ldh: mean(&hops),
        healing_periods,
        routed_delivery,
        routed_no_route: routed.no_route,
        routed_hop_limit: routed.hop_limit,
        routed_unreachable: routed.unreachable,
        routed_lost: routed.lost,
        routed_links: routed.links_mean,
        routed_shortest: routed.shortest_mean,
        wall_ms: started.elapsed().as_millis() as u64,
        peak_rss_kb: peak_rss_kb(),
        messages: w.net.counters().messages,
        grafts: {
            let t = &w.net.observer.traffic;
            t.grafts_payload + t.grafts_heartbeat + t.grafts_tree
        },
        prunes: w.net.observer.traffic.prunes,
        traffic: w.net.observer.traffic.clone(),
    }
}
