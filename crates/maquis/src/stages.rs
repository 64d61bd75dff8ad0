//! A node's work in three stages — receive (lane readers: frames decoded and delivered),
//! execute (actors) and send (lane writers) — sized at run time by ActOp's queueing model
//! ([`maquis_proto::actop::stages`]), when `services.stage_interval_ms` is set.
//!
//! The stages share the runtime's worker threads; a stage's size is how many of them may run
//! its tasks at once. Every poll of a stage's task takes one of the stage's permits for the
//! length of the poll (never across an `.await`), so a stage of size `t` occupies at most `t`
//! workers, and the others stay free for the other stages. Each poll is timed (wall time; the
//! thread's processor time on one poll in [`TIMED_EVERY`]); every interval the controller
//! turns the measurements into the model's parameters, solves it, and grows or shrinks each
//! stage's permits. Without the setting no task is gated and nothing is measured.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use maquis_proto::actop::stages::{self as model, Limits, Load, Sample};
use tokio::sync::Semaphore;
use tokio_util::sync::{CancellationToken, PollSemaphore};

/// One poll in this many has its processor time measured (a system call each).
pub(crate) const TIMED_EVERY: u64 = 16;

/// A stage of a node's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Lane readers: frames read, decoded and delivered to mailboxes.
    Receive = 0,
    /// Actors handling their messages (and encoding what they send).
    Execute = 1,
    /// Lane writers: queued frames written to the connections.
    Send = 2,
}

impl Stage {
    /// All stages, in the model's order.
    pub(crate) const ALL: [Stage; 3] = [Stage::Receive, Stage::Execute, Stage::Send];

    /// The stage's name in logs and metrics.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Receive => "receive",
            Stage::Execute => "execute",
            Stage::Send => "send",
        }
    }
}

/// The sizing settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// How often the model runs.
    pub(crate) interval: Duration,
    /// The cost of a thread (the model's η).
    pub(crate) penalty: Duration,
}

/// One stage's permits and measurements.
struct Gate {
    permits: Arc<Semaphore>,
    /// Permits the stage is meant to have (those out for a shrink are not counted).
    size: AtomicUsize,
    events: AtomicU64,
    wall_ns: AtomicU64,
    timed: AtomicU64,
    timed_wall_ns: AtomicU64,
    timed_cpu_ns: AtomicU64,
}

impl Gate {
    fn new(size: usize) -> Self {
        Gate {
            permits: Arc::new(Semaphore::new(size)),
            size: AtomicUsize::new(size),
            events: AtomicU64::new(0),
            wall_ns: AtomicU64::new(0),
            timed: AtomicU64::new(0),
            timed_wall_ns: AtomicU64::new(0),
            timed_cpu_ns: AtomicU64::new(0),
        }
    }

    /// The measurements since the last take, reset.
    fn take(&self) -> Sample {
        let ns = |a: &AtomicU64| Duration::from_nanos(a.swap(0, Ordering::Relaxed));
        Sample {
            events: self.events.swap(0, Ordering::Relaxed),
            wall: ns(&self.wall_ns),
            timed: self.timed.swap(0, Ordering::Relaxed),
            timed_wall: ns(&self.timed_wall_ns),
            timed_cpu: ns(&self.timed_cpu_ns),
            // A stage's task never blocks its thread: it returns from the poll instead.
            blocking: false,
        }
    }
}

/// The stages of one node.
pub(crate) struct Stages {
    gates: [Gate; 3],
    /// Worker threads of the runtime (a stage's largest size).
    workers: usize,
    /// Processors the stages share.
    processors: usize,
    settings: Settings,
    /// The model's last loads, for `/status` (thousandths of a thread busy, per stage).
    busy_milli: [AtomicU64; 3],
    resizes: AtomicU64,
}

impl Stages {
    /// Stages for the runtime this is called on, each as large as its workers (the default:
    /// no stage is limited until the model has measured something).
    pub(crate) fn new(settings: Settings) -> Arc<Self> {
        let workers = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_workers())
            .unwrap_or(1)
            .max(1);
        let processors = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Arc::new(Stages {
            gates: [Gate::new(workers), Gate::new(workers), Gate::new(workers)],
            workers,
            processors,
            settings,
            busy_milli: Default::default(),
            resizes: AtomicU64::new(0),
        })
    }

    /// Each stage's current size.
    pub(crate) fn sizes(&self) -> [usize; 3] {
        Stage::ALL.map(|s| self.gates[s as usize].size.load(Ordering::Relaxed))
    }

    /// Gauges for `/status`: each stage's size and how many threads the model found it
    /// keeping busy (thousandths), and the resizes so far.
    pub(crate) fn gauges(&self) -> Vec<(String, u64)> {
        let mut out = Vec::with_capacity(7);
        for (stage, size) in Stage::ALL.iter().zip(self.sizes()) {
            out.push((format!("stage_threads_{}", stage.name()), size as u64));
            out.push((
                format!("stage_busy_milli_{}", stage.name()),
                self.busy_milli[*stage as usize].load(Ordering::Relaxed),
            ));
        }
        out.push((
            "stage_resizes".to_string(),
            self.resizes.load(Ordering::Relaxed),
        ));
        out
    }

    /// Runs the model every interval until `stop`.
    pub(crate) fn spawn_controller(self: &Arc<Self>, stop: CancellationToken) {
        let stages = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(stages.settings.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let mut last = Instant::now();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let now = Instant::now();
                let samples = Stage::ALL.map(|s| stages.gates[s as usize].take());
                let sizes = stages.plan(&samples, now - last);
                last = now;
                stages.resize(sizes).await;
            }
        });
    }

    /// The sizes the model gives for an interval's samples (and the loads noted for `/status`).
    fn plan(&self, samples: &[Sample; 3], interval: Duration) -> [usize; 3] {
        let loads = model::estimate(samples, interval);
        for (busy, load) in self.busy_milli.iter().zip(&loads) {
            busy.store((load.busy() * 1000.0).round() as u64, Ordering::Relaxed);
        }
        // Every request ends in an actor: the execute stage's events are the requests.
        let requests = loads[Stage::Execute as usize].arrivals;
        let limits = Limits {
            requests,
            penalty: self.settings.penalty.as_secs_f64(),
            processors: self.processors as f64,
            max_threads: self.workers,
        };
        if loads.iter().all(|l: &Load| l.arrivals == 0.0) {
            // Nothing ran: keep the sizes.
            return self.sizes();
        }
        let t = model::threads(&loads, limits);
        tracing::debug!(?loads, threads = ?t, "stage sizes from the queueing model");
        [t[0], t[1], t[2]]
    }

    /// Grows or shrinks each stage to `sizes` (a shrink waits for polls in progress to end).
    async fn resize(&self, sizes: [usize; 3]) {
        for (gate, &want) in self.gates.iter().zip(&sizes) {
            let have = gate.size.load(Ordering::Relaxed);
            if want > have {
                gate.permits.add_permits(want - have);
            } else if want < have {
                let n = u32::try_from(have - want).unwrap_or(u32::MAX);
                match gate.permits.acquire_many(n).await {
                    Ok(p) => p.forget(),
                    Err(_) => continue,
                }
            } else {
                continue;
            }
            gate.size.store(want, Ordering::Relaxed);
            self.resizes.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Spawns `fut` as a task of `stage` when the node sizes its stages (gated and timed), else
/// as it is (nothing added to its polls).
pub(crate) fn spawn<F>(
    stages: Option<&Arc<Stages>>,
    stage: Stage,
    fut: F,
) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match stages {
        None => tokio::spawn(fut),
        Some(s) => tokio::spawn(Gated {
            gate: Slot {
                stages: s.clone(),
                permits: PollSemaphore::new(s.gates[stage as usize].permits.clone()),
                stage,
            },
            inner: fut,
        }),
    }
}

struct Slot {
    stages: Arc<Stages>,
    permits: PollSemaphore,
    stage: Stage,
}

pin_project_lite::pin_project! {
    /// A future whose every poll holds one of its stage's permits, timed.
    pub(crate) struct Gated<F> {
        gate: Slot,
        #[pin]
        inner: F,
    }
}

impl<F: Future> Future for Gated<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let slot = this.gate;
        let permit = match slot.permits.poll_acquire(cx) {
            Poll::Ready(Some(p)) => p,
            // The semaphore is never closed; were it, the stage would run ungated.
            Poll::Ready(None) => return this.inner.poll(cx),
            Poll::Pending => return Poll::Pending,
        };
        let gate = &slot.stages.gates[slot.stage as usize];
        let n = gate.events.fetch_add(1, Ordering::Relaxed);
        let timed = n.is_multiple_of(TIMED_EVERY);
        let cpu = if timed { thread_cpu() } else { None };
        let start = Instant::now();
        let out = this.inner.poll(cx);
        let wall = nanos(start.elapsed());
        gate.wall_ns.fetch_add(wall, Ordering::Relaxed);
        if let (Some(before), Some(after)) = (cpu, cpu.and_then(|_| thread_cpu())) {
            gate.timed.fetch_add(1, Ordering::Relaxed);
            gate.timed_wall_ns.fetch_add(wall, Ordering::Relaxed);
            gate.timed_cpu_ns
                .fetch_add(nanos(after.saturating_sub(before)), Ordering::Relaxed);
        }
        drop(permit);
        out
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The calling thread's processor time so far.
fn thread_cpu() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(
        u64::try_from(ts.tv_sec).ok()?,
        u32::try_from(ts.tv_nsec).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn stages() -> Arc<Stages> {
        Stages::new(Settings {
            interval: Duration::from_millis(50),
            penalty: Duration::from_micros(100),
        })
    }

    /// A future that spins 300 µs in each poll, `polls` times, and counts how many of its kind
    /// are in a poll at once; it polls on (for up to 10 s) until `want` of them have been in a
    /// poll together: an overlap needs the OS to run two worker threads at the same moment,
    /// which a machine busy with other work may not do for a while.
    async fn busy(inside: Arc<AtomicUsize>, most: Arc<AtomicUsize>, polls: usize, want: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut done = 0;
        while done < polls || (most.load(Ordering::SeqCst) < want && Instant::now() < deadline) {
            done += 1;
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_micros(300);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            inside.fetch_sub(1, Ordering::SeqCst);
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_stage_of_size_one_runs_one_poll_at_a_time_and_others_run_beside_it() {
        let s = stages();
        assert_eq!(s.sizes(), [4, 4, 4]);
        s.resize([4, 1, 4]).await;
        assert_eq!(s.sizes(), [4, 1, 4]);
        let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let fut = busy(inside.clone(), most.clone(), 20, 1);
                spawn(Some(&s), Stage::Execute, fut)
            })
            .collect();
        // The receive stage keeps its four: its tasks overlap (while execute's run one by one).
        let (rin, rmost) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let others: Vec<_> = (0..3)
            .map(|_| {
                let fut = busy(rin.clone(), rmost.clone(), 20, 2);
                spawn(Some(&s), Stage::Receive, fut)
            })
            .collect();
        for t in tasks.into_iter().chain(others) {
            t.await.unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1, "execute ran polls at once");
        assert!(rmost.load(Ordering::SeqCst) > 1, "receive never overlapped");
        let taken = s.gates[Stage::Execute as usize].take();
        assert_eq!(
            taken.events,
            8 * 21,
            "each task: 20 yields and the last poll"
        );
        assert!(taken.timed > 0 && taken.timed <= taken.events);
        assert!(taken.wall >= Duration::from_micros(300 * 8 * 20));
        // Growing back lets them overlap again.
        s.resize([4, 3, 4]).await;
        most.store(0, Ordering::SeqCst);
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let fut = busy(inside.clone(), most.clone(), 20, 2);
                spawn(Some(&s), Stage::Execute, fut)
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let m = most.load(Ordering::SeqCst);
        assert!((2..=3).contains(&m), "{m} at once with 3 permits");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shrink_waits_for_polls_in_progress() {
        let s = stages();
        let release = Arc::new(AtomicBool::new(false));
        let started = Arc::new(tokio::sync::Notify::new());
        // One poll holds a permit (spins until released); shrinking to 1 must wait for it.
        let task = spawn(Some(&s), Stage::Send, {
            let (release, started) = (release.clone(), started.clone());
            async move {
                started.notify_one();
                while !release.load(Ordering::SeqCst) {
                    std::hint::spin_loop();
                }
            }
        });
        started.notified().await;
        // Two permits: one is free, one is in the poll. Shrinking by one takes the free one.
        s.resize([2, 2, 1]).await;
        assert_eq!(s.sizes()[Stage::Send as usize], 1);
        assert_eq!(s.gates[Stage::Send as usize].permits.available_permits(), 0);
        release.store(true, Ordering::SeqCst);
        task.await.unwrap();
        assert_eq!(s.gates[Stage::Send as usize].permits.available_permits(), 1);
    }

    #[test]
    fn the_plan_follows_the_model_and_keeps_sizes_when_nothing_ran() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let s = rt.block_on(async { stages() });
        let idle = [Sample::default(); 3];
        assert_eq!(s.plan(&idle, Duration::from_secs(1)), [2, 2, 2]);
        let ms = Duration::from_millis;
        let sample = |events: u64, wall: Duration| Sample {
            events,
            wall,
            timed: events / 16,
            timed_wall: wall / 16,
            timed_cpu: wall / 16,
            blocking: false,
        };
        // Execute keeps 1.5 threads busy, receive and send 0.1 each: 2 / 1 / 1.
        let busy = [
            sample(10_000, ms(100)),
            sample(10_000, ms(1_500)),
            sample(10_000, ms(100)),
        ];
        assert_eq!(s.plan(&busy, Duration::from_secs(1)), [1, 2, 1]);
        let g = s.gauges();
        assert!(
            g.contains(&("stage_busy_milli_execute".to_string(), 1500)),
            "{g:?}"
        );
    }
}
