//! ActOp §5 without I/O: a server's stages as a Jackson network of M/M/t queues, their
//! parameters estimated from what the stages measured, and the thread counts that minimise the
//! expected latency plus a penalty per thread.
//!
//! Stage `i` receives `λᵢ` events a second; one of its threads serves an event in `sᵢ` seconds
//! of which the fraction `βᵢ` is computation (the rest waits on synchronous calls). With `tᵢ`
//! threads the stage serves `μᵢ = tᵢ / sᵢ` events a second. The model minimises
//!
//! ```text
//!   (1/λ_tot) Σ λᵢ / (μᵢ − λᵢ)  +  η Σ tᵢ      subject to  μᵢ ≥ λᵢ,  Σ tᵢ βᵢ ≤ p
//! ```
//!
//! (`η`: the cost of a thread, seconds per thread; `p`: processors). The first-order
//! conditions give `tᵢ = λᵢ sᵢ + √(λᵢ sᵢ / (λ_tot (η + ν βᵢ)))`, where `ν = 0` when the
//! processors suffice (the paper's closed form) and otherwise the multiplier that makes the
//! constraint hold, found by bisection ([`threads`]).
//!
//! The parameters come from three measurements per event ([`Sample`]): its count, its wall
//! time `z` and its processor time `x`. The part of `z` an event spent ready but not running,
//! `r`, is estimated from the stages that make no synchronous calls (where `r = z − x`) as a
//! ratio `α = r / x` shared by every stage; then `s = z − r` and `β = x / s` ([`estimate`]).

use std::time::Duration;

/// What one stage measured over an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Events the stage served.
    pub events: u64,
    /// Wall time of those events, summed.
    pub wall: Duration,
    /// Events whose processor time was measured too (a sample of `events`).
    pub timed: u64,
    /// Wall time of the timed events, summed.
    pub timed_wall: Duration,
    /// Processor time of the timed events, summed.
    pub timed_cpu: Duration,
    /// Whether the stage's events may wait on synchronous calls (then its ready time is not
    /// `z − x` and is estimated from the other stages).
    pub blocking: bool,
}

/// One stage's parameters for the model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Events arriving per second (`λ`).
    pub arrivals: f64,
    /// Seconds a thread takes to serve one event, waits included, ready time excluded (`s`).
    pub service: f64,
    /// The share of `service` spent computing (`β`, 0 to 1).
    pub cpu_share: f64,
}

impl Load {
    /// Threads the stage keeps busy on average (`λ s`).
    pub fn busy(&self) -> f64 {
        self.arrivals * self.service
    }
}

/// The model's parameters from an interval's samples (one per stage, in stage order). A stage
/// that served nothing gets zero arrivals; one without a timed event is taken to compute all
/// of its wall time.
pub fn estimate(samples: &[Sample], interval: Duration) -> Vec<Load> {
    let secs = interval.as_secs_f64().max(f64::MIN_POSITIVE);
    // α from the stages without synchronous calls that timed something: r / x = (z − x) / x.
    let ratios: Vec<f64> = samples
        .iter()
        .filter(|s| !s.blocking && s.timed > 0 && !s.timed_cpu.is_zero())
        .map(|s| {
            let z = s.timed_wall.as_secs_f64();
            let x = s.timed_cpu.as_secs_f64();
            ((z - x) / x).max(0.0)
        })
        .collect();
    let alpha = if ratios.is_empty() {
        0.0
    } else {
        ratios.iter().sum::<f64>() / ratios.len() as f64
    };
    samples
        .iter()
        .map(|s| {
            let arrivals = s.events as f64 / secs;
            if s.events == 0 {
                return Load {
                    arrivals: 0.0,
                    service: 0.0,
                    cpu_share: 1.0,
                };
            }
            let z = s.wall.as_secs_f64() / s.events as f64;
            let (x, zt) = if s.timed > 0 {
                (
                    s.timed_cpu.as_secs_f64() / s.timed as f64,
                    s.timed_wall.as_secs_f64() / s.timed as f64,
                )
            } else {
                (z, z)
            };
            // The timed events' processor share of their wall time, applied to all events.
            let x = if zt > 0.0 { z * (x / zt).min(1.0) } else { 0.0 };
            let r = (alpha * x).min(z);
            let service = (z - r).max(x);
            let cpu_share = if service > 0.0 {
                (x / service).clamp(0.0, 1.0)
            } else {
                1.0
            };
            Load {
                arrivals,
                service,
                cpu_share,
            }
        })
        .collect()
}

/// The model's inputs beside the stages' loads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    /// Requests arriving at the server per second (`λ_tot`, the latency sum's weight).
    pub requests: f64,
    /// The cost of a thread in seconds (`η`).
    pub penalty: f64,
    /// Processors the stages share (`p`).
    pub processors: f64,
    /// Threads a stage may have at most (and at least one).
    pub max_threads: usize,
}

/// Threads per stage (same order as `loads`), each from 1 to `limits.max_threads`: the
/// continuous optimum of the model, rounded up (a stage never gets fewer threads than it keeps
/// busy, so `μᵢ ≥ λᵢ` holds whenever the processors allow it).
pub fn threads(loads: &[Load], limits: Limits) -> Vec<usize> {
    optimum(loads, limits)
        .into_iter()
        .map(|t| {
            let t = if t.is_finite() { t.ceil() } else { 1.0 };
            (t as usize).clamp(1, limits.max_threads.max(1))
        })
        .collect()
}

/// The continuous optimum `tᵢ` of the model (before rounding).
pub fn optimum(loads: &[Load], limits: Limits) -> Vec<f64> {
    let requests = limits.requests.max(f64::MIN_POSITIVE);
    let penalty = limits.penalty.max(f64::MIN_POSITIVE);
    let at = |nu: f64| -> Vec<f64> {
        loads
            .iter()
            .map(|l| {
                let busy = l.busy();
                if busy <= 0.0 {
                    return 0.0;
                }
                busy + (busy / (requests * (penalty + nu * l.cpu_share))).sqrt()
            })
            .collect()
    };
    let used = |t: &[f64]| -> f64 {
        t.iter()
            .zip(loads)
            .map(|(t, l)| t * l.cpu_share)
            .sum::<f64>()
    };
    let free = at(0.0);
    let floor: f64 = loads.iter().map(|l| l.busy() * l.cpu_share).sum();
    if used(&free) <= limits.processors || floor >= limits.processors {
        // The processors suffice (the paper's closed form), or nothing can make them suffice
        // (an overloaded server: the stages get what they keep busy and more, as if free).
        return free;
    }
    // ν > 0: grow it until the constraint holds, then bisect.
    let (mut lo, mut hi) = (0.0_f64, penalty.max(1e-9));
    while used(&at(hi)) > limits.processors && hi < 1e12 {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if used(&at(mid)) > limits.processors {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    at(hi)
}

/// The model's cost of an allocation: expected latency (seconds, M/M/1 per stage with the
/// stage's service rate) plus the thread penalty; infinite when a stage cannot keep up.
pub fn cost(loads: &[Load], t: &[f64], limits: Limits) -> f64 {
    let requests = limits.requests.max(f64::MIN_POSITIVE);
    let mut latency = 0.0;
    for (l, &t) in loads.iter().zip(t) {
        if l.arrivals <= 0.0 {
            latency += limits.penalty * t;
            continue;
        }
        let mu = t / l.service;
        if mu <= l.arrivals {
            return f64::INFINITY;
        }
        latency += l.arrivals / (mu - l.arrivals) / requests + limits.penalty * t;
    }
    latency
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(arrivals: f64, service_us: f64, cpu_share: f64) -> Load {
        Load {
            arrivals,
            service: service_us / 1e6,
            cpu_share,
        }
    }

    fn limits(requests: f64, penalty_us: f64, processors: f64) -> Limits {
        Limits {
            requests,
            penalty: penalty_us / 1e6,
            processors,
            max_threads: 64,
        }
    }

    /// The best allocation on a fine grid, for comparison with the closed form.
    fn grid_best(loads: &[Load], lim: Limits, step: f64, max: f64) -> (Vec<f64>, f64) {
        let n = (max / step) as usize;
        let mut best = (vec![0.0; loads.len()], f64::INFINITY);
        let mut idx = vec![1usize; loads.len()];
        loop {
            let t: Vec<f64> = idx.iter().map(|&i| i as f64 * step).collect();
            let cpu: f64 = t.iter().zip(loads).map(|(t, l)| t * l.cpu_share).sum();
            if cpu <= lim.processors + 1e-12 {
                let c = cost(loads, &t, lim);
                if c < best.1 {
                    best = (t, c);
                }
            }
            let mut k = 0;
            loop {
                if k == idx.len() {
                    return best;
                }
                idx[k] += 1;
                if idx[k] <= n {
                    break;
                }
                idx[k] = 1;
                k += 1;
            }
        }
    }

    #[test]
    fn the_closed_form_is_the_optimum_when_processors_suffice() {
        // Receive, execute, send: 10k events/s, 30 / 80 / 20 µs a thread.
        let loads = [
            load(10_000.0, 30.0, 1.0),
            load(10_000.0, 80.0, 1.0),
            load(10_000.0, 20.0, 1.0),
        ];
        let lim = limits(10_000.0, 100.0, 8.0);
        let t = optimum(&loads, lim);
        for (t, l) in t.iter().zip(&loads) {
            let closed = l.busy() + (l.busy() / (lim.requests * lim.penalty)).sqrt();
            assert!((t - closed).abs() < 1e-9, "{t} vs {closed}");
        }
        let (grid, best) = grid_best(&loads, lim, 0.025, 2.5);
        let ours = cost(&loads, &t, lim);
        assert!(
            ours <= best + 1e-9,
            "closed form {t:?} costs {ours}, grid {grid:?} {best}"
        );
        // Busier stages get more threads.
        assert!(t[1] > t[0] && t[0] > t[2], "{t:?}");
    }

    #[test]
    fn few_processors_bind_the_allocation_and_it_stays_optimal() {
        let loads = [
            load(20_000.0, 30.0, 1.0),
            load(20_000.0, 50.0, 0.5),
            load(20_000.0, 20.0, 1.0),
        ];
        // Free optimum uses more than 2 processors; the constraint binds.
        let lim = limits(20_000.0, 5.0, 2.0);
        let free: f64 = loads
            .iter()
            .map(|l| (l.busy() + (l.busy() / (lim.requests * lim.penalty)).sqrt()) * l.cpu_share)
            .sum();
        assert!(free > 2.0, "{free}");
        let t = optimum(&loads, lim);
        let used: f64 = t.iter().zip(&loads).map(|(t, l)| t * l.cpu_share).sum();
        assert!((used - 2.0).abs() < 1e-6, "{used}");
        let (grid, best) = grid_best(&loads, lim, 0.025, 2.5);
        let ours = cost(&loads, &t, lim);
        assert!(
            ours <= best + 1e-9,
            "ours {t:?} {ours}, grid {grid:?} {best}"
        );
    }

    #[test]
    fn rounding_keeps_every_stage_ahead_of_its_arrivals_and_inside_the_bounds() {
        let loads = [
            load(0.0, 0.0, 1.0),
            load(30_000.0, 50.0, 1.0),
            load(1_000.0, 10.0, 1.0),
        ];
        let lim = Limits {
            max_threads: 2,
            ..limits(30_000.0, 100.0, 2.0)
        };
        let t = threads(&loads, lim);
        // An idle stage gets one; 1.5 threads busy rounds up to 2; a light stage gets one.
        assert_eq!(t, vec![1, 2, 1]);
        let lim = Limits {
            max_threads: 8,
            ..lim
        };
        for (t, l) in threads(&loads, lim).iter().zip(&loads) {
            assert!(*t as f64 >= l.busy(), "{t} threads for {} busy", l.busy());
        }
    }

    #[test]
    fn a_heavier_penalty_means_fewer_threads() {
        let loads = [load(10_000.0, 30.0, 1.0), load(10_000.0, 80.0, 1.0)];
        let light = optimum(&loads, limits(10_000.0, 1.0, 8.0));
        let heavy = optimum(&loads, limits(10_000.0, 1_000.0, 8.0));
        for (l, h) in light.iter().zip(&heavy) {
            assert!(l > h, "{light:?} {heavy:?}");
        }
    }

    #[test]
    fn estimates_follow_the_papers_ready_time_scheme() {
        let ms = Duration::from_millis;
        let us = Duration::from_micros;
        let samples = [
            // Non-blocking: 1,000 events, 20 ms wall; timed 100: 2 ms wall, 1.6 ms cpu (α = 0.25).
            Sample {
                events: 1_000,
                wall: ms(20),
                timed: 100,
                timed_wall: ms(2),
                timed_cpu: us(1_600),
                blocking: false,
            },
            // Blocking: 500 events, 50 ms; timed 50: 5 ms wall, 2 ms cpu.
            Sample {
                events: 500,
                wall: ms(50),
                timed: 50,
                timed_wall: ms(5),
                timed_cpu: ms(2),
                blocking: true,
            },
            Sample::default(),
        ];
        let loads = estimate(&samples, Duration::from_secs(1));
        assert_eq!(loads[0].arrivals, 1_000.0);
        // s = z − α x = 20 − 0.25 × 16 = 16 µs; β = 1.
        assert!((loads[0].service - 16e-6).abs() < 1e-12, "{:?}", loads[0]);
        assert!((loads[0].cpu_share - 1.0).abs() < 1e-9);
        // z = 100 µs, x = 40 µs, r = 10 µs: s = 90 µs, β = 40 / 90.
        assert!((loads[1].service - 90e-6).abs() < 1e-12, "{:?}", loads[1]);
        assert!((loads[1].cpu_share - 40.0 / 90.0).abs() < 1e-9);
        assert_eq!(loads[2].arrivals, 0.0);
        assert_eq!(threads(&loads, limits(1_000.0, 100.0, 2.0))[2], 1);
    }
}
