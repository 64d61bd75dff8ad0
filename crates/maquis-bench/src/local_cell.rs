//! One cell of `maquis-bench local` in a process of its own: one system, one workload.
//!
//! The driver ([`crate::local`]) starts `maquis-bench agent local-cell --system S --workload W …`
//! once per cell, so that every system is measured in a fresh process (its own heap, its own
//! resident memory to read) and a stuck cell can be killed; the cell prints one JSON line, a
//! [`CellOutcome`], and exits.
//!
//! The workloads are the same for every system ([`local_peers`](crate::local_peers) has the
//! peers, this file Maquis and the bare tokio channel):
//! - `one-to-one` / `many-to-one`: `senders` tasks send `messages` messages in all (16 bytes:
//!   a sequence number and, on every 64th, the time it was sent) to one receiving actor, which
//!   counts them; the time is from the first send to the last message handled. The receiver
//!   records the latency of the stamped messages (with a full mailbox that is its queueing delay).
//! - `calls`: `senders` callers make `messages` request/response calls in all to one server
//!   actor that answers each with the number it was sent; every call's latency is recorded.
//! - `idle`: `actors` actors are spawned, each handles one message, then they wait; the growth
//!   of the process's resident memory divided by `actors` is an idle actor's cost (one ref to each
//!   is held, as a user holds one).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use maquis::{ActorRef, Config, Inbox, Node, ReplyTo};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, Notify};

use crate::local_peers;

/// The systems `bench local` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum System {
    /// A bare tokio bounded channel and tasks: the floor no actor runtime on tokio goes below.
    Tokio,
    /// Maquis actors on one node.
    Maquis,
    /// Maquis actors on one node, on a single-threaded tokio runtime (as actix runs).
    #[serde(rename = "maquis-1t")]
    #[value(name = "maquis-1t")]
    Maquis1t,
    /// actix (its own single-threaded system; `do_send` does not wait for mailbox room).
    Actix,
    /// ractor (unbounded mailboxes: `cast` never waits).
    Ractor,
    /// kameo (bounded mailboxes of its default capacity, 64).
    Kameo,
}

impl System {
    /// The name used in results and reports.
    pub fn name(self) -> &'static str {
        match self {
            System::Tokio => "tokio",
            System::Maquis => "maquis",
            System::Maquis1t => "maquis-1t",
            System::Actix => "actix",
            System::Ractor => "ractor",
            System::Kameo => "kameo",
        }
    }
}

/// The workloads of `bench local`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// One sender, one receiver.
    OneToOne,
    /// `senders` senders, one receiver.
    ManyToOne,
    /// `senders` callers, one server, request/response.
    Calls,
    /// Memory of idle actors.
    Idle,
}

impl Workload {
    /// The name used in results and reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::OneToOne => "one-to-one",
            Workload::ManyToOne => "many-to-one",
            Workload::Calls => "calls",
            Workload::Idle => "idle",
        }
    }
}

/// `maquis-bench agent local-cell`: one cell, its outcome printed as one JSON line.
#[derive(clap::Args, Debug, Clone)]
pub struct LocalCellArgs {
    /// The system to measure.
    #[arg(long, value_enum)]
    pub system: System,
    /// The workload.
    #[arg(long, value_enum)]
    pub workload: Workload,
    /// Messages (or calls) in all.
    #[arg(long, default_value_t = 2_000_000)]
    pub messages: u64,
    /// Sending tasks (`one-to-one` uses one whatever this says).
    #[arg(long, default_value_t = 8)]
    pub senders: usize,
    /// `idle`: actors spawned.
    #[arg(long, default_value_t = 100_000)]
    pub actors: usize,
    /// Worker threads of the tokio runtime (actix and `maquis-1t` run on one thread).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

/// What one cell measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CellOutcome {
    /// Messages or calls completed.
    pub messages: u64,
    /// Wall time of the measured part, seconds.
    pub seconds: f64,
    /// CPU time (user + system) of the process over the measured part, seconds.
    pub cpu_s: f64,
    /// Latencies recorded (stamped messages, or every call).
    pub samples: u64,
    /// Median latency, nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile latency, nanoseconds.
    pub p99_ns: u64,
    /// `idle`: resident memory per idle actor, bytes.
    pub bytes_per_actor: f64,
}

/// The message of the one-way workloads.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Msg {
    /// Its number at its sender.
    pub seq: u64,
    /// When it was sent (nanoseconds from the cell's start), or 0 when it is not stamped.
    pub sent_ns: u64,
}

/// One message in this many carries its send time.
const STAMP_EVERY: u64 = 64;

fn clock() -> &'static Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now)
}

/// Nanoseconds since the cell started (never 0 once the clock was read).
pub fn now_ns() -> u64 {
    clock().elapsed().as_nanos() as u64 + 1
}

/// Message `seq`, stamped when its number says so.
pub fn stamp(seq: u64) -> Msg {
    Msg {
        seq,
        sent_ns: if seq.is_multiple_of(STAMP_EVERY) {
            now_ns()
        } else {
            0
        },
    }
}

/// The receiving actor's state in the one-way workloads, the same in every system: it counts,
/// records the stamped messages' latencies, and says when it has seen them all.
pub struct Sink {
    expect: u64,
    seen: u64,
    lat: Vec<u64>,
    done: Option<oneshot::Sender<Vec<u64>>>,
}

impl Sink {
    /// A sink for `expect` messages, and where it hands its latencies when it has them all.
    pub fn new(expect: u64) -> (Sink, oneshot::Receiver<Vec<u64>>) {
        let (tx, rx) = oneshot::channel();
        let sink = Sink {
            expect,
            seen: 0,
            lat: Vec::with_capacity((expect / STAMP_EVERY) as usize + 64),
            done: Some(tx),
        };
        (sink, rx)
    }

    /// One message handled.
    pub fn take(&mut self, m: Msg) {
        self.seen += 1;
        if m.sent_ns != 0 {
            self.lat.push(now_ns().saturating_sub(m.sent_ns));
        }
        if self.seen == self.expect {
            if let Some(done) = self.done.take() {
                let _ = done.send(std::mem::take(&mut self.lat));
            }
        }
    }
}

/// Counts idle actors' first messages and wakes the driver when all have arrived.
pub struct Started {
    count: AtomicUsize,
    target: usize,
    all: Notify,
}

impl Started {
    /// Expects `n` actors.
    pub fn new(n: usize) -> Arc<Started> {
        Arc::new(Started {
            count: AtomicUsize::new(0),
            target: n,
            all: Notify::new(),
        })
    }

    /// One actor handled its message.
    pub fn one(&self) {
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.target {
            self.all.notify_one();
        }
    }

    /// Waits until every actor has.
    pub async fn wait(&self) {
        // notify_one stores a permit, so a notification before this wait is not lost.
        if self.count.load(Ordering::Acquire) < self.target {
            self.all.notified().await;
        }
    }
}

/// How a one-way workload reaches one system's receiving actor.
pub trait Tell: Clone + Send + Sync + 'static {
    /// Sends one message the system's usual way (waiting for room where its mailbox is bounded).
    fn tell(&self, m: Msg) -> impl Future<Output = ()> + Send;
}

/// How the calls workload reaches one system's server actor.
pub trait Ask: Clone + Send + Sync + 'static {
    /// Calls with `x` and returns the answer.
    fn ask(&self, x: u64) -> impl Future<Output = u64> + Send;
}

/// A one-way workload: `senders` tasks share `n` messages to the sink behind `target`.
pub async fn stream<T: Tell>(
    target: T,
    done: oneshot::Receiver<Vec<u64>>,
    n: u64,
    senders: usize,
) -> Result<Measured, String> {
    let start = Instant::now();
    for s in 0..senders as u64 {
        let share = n / senders as u64 + u64::from(s < n % senders as u64);
        let t = target.clone();
        tokio::spawn(async move {
            for i in 0..share {
                t.tell(stamp(i)).await;
            }
        });
    }
    let lat = tokio::time::timeout(Duration::from_secs(300), done)
        .await
        .map_err(|_| "the receiver did not get every message in 300 s".to_string())?
        .map_err(|_| "the receiver stopped".to_string())?;
    Ok(Measured {
        messages: n,
        seconds: start.elapsed().as_secs_f64(),
        lat,
    })
}

/// The calls workload: `callers` tasks share `n` calls to the server behind `target`.
pub async fn calls<T: Ask>(target: T, n: u64, callers: usize) -> Result<Measured, String> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers as u64 {
        let share = n / callers as u64 + u64::from(c < n % callers as u64);
        let t = target.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(share as usize);
            for i in 0..share {
                let sent = Instant::now();
                let got = t.ask(i).await;
                lat.push(sent.elapsed().as_nanos() as u64);
                if got != i {
                    return Err(format!("call {i} answered {got}"));
                }
            }
            Ok(lat)
        }));
    }
    let mut lat = Vec::with_capacity(n as usize);
    for t in tasks {
        lat.extend(t.await.map_err(|e| e.to_string())??);
    }
    Ok(Measured {
        messages: n,
        seconds: start.elapsed().as_secs_f64(),
        lat,
    })
}

/// What a workload measured before it is summarised.
pub struct Measured {
    /// Messages or calls.
    pub messages: u64,
    /// Wall time.
    pub seconds: f64,
    /// Latencies, nanoseconds.
    pub lat: Vec<u64>,
}

/// CPU time (user + system) of this process, seconds, to the microsecond (cells are short:
/// /proc's clock ticks are too coarse).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct it is given and has no other preconditions.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(u.ru_utime) + secs(u.ru_stime)
}

/// Resident memory of this process, bytes.
pub fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    pages * page
}

/// Spawns `n` idle actors with `spawn` (whose handles the caller keeps), sends each one
/// message with `tell`, waits until all have handled it, and returns the growth of the resident
/// memory per actor.
pub async fn idle<H, S, SF, F, Fut>(n: usize, spawn: S, tell: F) -> f64
where
    S: Fn(Arc<Started>) -> SF,
    SF: Future<Output = H>,
    F: Fn(H) -> Fut,
    Fut: Future<Output = H>,
{
    let started = Started::new(n);
    let before = rss_bytes();
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(spawn(started.clone()).await);
    }
    let mut told = Vec::with_capacity(n);
    for h in held {
        told.push(tell(h).await);
    }
    started.wait().await;
    let per = rss_bytes().saturating_sub(before) as f64 / n.max(1) as f64;
    drop(told);
    per
}

/// Sends an idle actor its one message and gives its handle back.
pub async fn told<T: Tell>(t: T) -> T {
    t.tell(stamp(1)).await;
    t
}

/// Runs one cell (in the process that `agent local-cell` started) and prints its outcome.
pub fn run(args: &LocalCellArgs) -> Result<(), String> {
    let _ = clock();
    let senders = match args.workload {
        Workload::OneToOne => 1,
        _ => args.senders.max(1),
    };
    let a = LocalCellArgs {
        senders,
        ..args.clone()
    };
    let cpu0 = cpu_seconds();
    let outcome = if a.system == System::Actix {
        local_peers::actix_cell(&a)?
    } else if a.system == System::Maquis1t {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(maquis_cell(&a))?
    } else {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(a.workers.max(1))
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            match a.system {
                System::Tokio => tokio_cell(&a).await,
                System::Maquis => maquis_cell(&a).await,
                System::Ractor => local_peers::ractor_cell(&a).await,
                System::Kameo => local_peers::kameo_cell(&a).await,
                System::Actix | System::Maquis1t => unreachable!("run on their own threads above"),
            }
        })?
    };
    let cpu_s = cpu_seconds() - cpu0;
    let out = summarise(outcome, cpu_s);
    println!(
        "{}",
        serde_json::to_string(&out).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// What a system's cell returns: a measured workload, or the memory per idle actor.
pub enum Outcome {
    /// A one-way or calls workload.
    Measured(Measured),
    /// Bytes per idle actor.
    Idle(f64),
}

fn summarise(o: Outcome, cpu_s: f64) -> CellOutcome {
    match o {
        Outcome::Idle(bytes) => CellOutcome {
            bytes_per_actor: bytes,
            cpu_s,
            ..Default::default()
        },
        Outcome::Measured(mut m) => {
            m.lat.sort_unstable();
            CellOutcome {
                messages: m.messages,
                seconds: m.seconds,
                cpu_s,
                samples: m.lat.len() as u64,
                p50_ns: maquis::admin::percentile(&m.lat, 50.0),
                p99_ns: maquis::admin::percentile(&m.lat, 99.0),
                bytes_per_actor: 0.0,
            }
        }
    }
}

/// The floor's mailbox: a bounded tokio channel of Maquis's default mailbox capacity.
const TOKIO_CAPACITY: usize = 1024;

impl Tell for mpsc::Sender<Msg> {
    async fn tell(&self, m: Msg) {
        let _ = self.send(m).await;
    }
}

impl Ask for mpsc::Sender<(u64, oneshot::Sender<u64>)> {
    async fn ask(&self, x: u64) -> u64 {
        let (tx, rx) = oneshot::channel();
        let _ = self.send((x, tx)).await;
        rx.await.unwrap_or(u64::MAX)
    }
}

async fn tokio_cell(a: &LocalCellArgs) -> Result<Outcome, String> {
    Ok(match a.workload {
        Workload::OneToOne | Workload::ManyToOne => {
            let (mut sink, done) = Sink::new(a.messages);
            let (tx, mut rx) = mpsc::channel::<Msg>(TOKIO_CAPACITY);
            tokio::spawn(async move {
                while let Some(m) = rx.recv().await {
                    sink.take(m);
                }
            });
            Outcome::Measured(stream(tx, done, a.messages, a.senders).await?)
        }
        Workload::Calls => {
            let (tx, mut rx) = mpsc::channel::<(u64, oneshot::Sender<u64>)>(TOKIO_CAPACITY);
            tokio::spawn(async move {
                while let Some((x, reply)) = rx.recv().await {
                    let _ = reply.send(x);
                }
            });
            Outcome::Measured(calls(tx, a.messages, a.senders).await?)
        }
        Workload::Idle => Outcome::Idle(
            idle(
                a.actors,
                |started| async move {
                    let (tx, mut rx) = mpsc::channel::<Msg>(TOKIO_CAPACITY);
                    tokio::spawn(async move {
                        while rx.recv().await.is_some() {
                            started.one();
                        }
                    });
                    tx
                },
                told,
            )
            .await,
        ),
    })
}

/// A call to the Maquis server actor.
#[derive(Debug, Serialize, Deserialize)]
pub struct AskMsg(u64, ReplyTo<u64>);

impl Tell for ActorRef<Msg> {
    async fn tell(&self, m: Msg) {
        let _ = self.send(m).await;
    }
}

impl Ask for ActorRef<AskMsg> {
    async fn ask(&self, x: u64) -> u64 {
        self.call(|r| AskMsg(x, r), Duration::from_secs(60))
            .await
            .unwrap_or(u64::MAX)
    }
}

async fn maquis_cell(a: &LocalCellArgs) -> Result<Outcome, String> {
    let node = Node::start(Config::new("local"))
        .await
        .map_err(|e| e.to_string())?;
    let out = match a.workload {
        Workload::OneToOne | Workload::ManyToOne => {
            let (mut sink, done) = Sink::new(a.messages);
            let to = node.spawn_fn(|mut inbox: Inbox<Msg>| async move {
                while let Some(m) = inbox.recv().await {
                    sink.take(m);
                }
            });
            stream(to, done, a.messages, a.senders)
                .await
                .map(Outcome::Measured)
        }
        Workload::Calls => {
            let server = node.spawn_fn(|mut inbox: Inbox<AskMsg>| async move {
                while let Some(AskMsg(x, reply)) = inbox.recv().await {
                    let _ = reply.send(x).await;
                }
            });
            calls(server, a.messages, a.senders)
                .await
                .map(Outcome::Measured)
        }
        Workload::Idle => Ok(Outcome::Idle(
            idle(
                a.actors,
                |started| async { node.spawn(IdleActor { started }) },
                told,
            )
            .await,
        )),
    };
    node.shutdown().await;
    out
}

/// A Maquis actor that reports its first message, then waits.
struct IdleActor {
    started: Arc<Started>,
}

impl maquis::Actor for IdleActor {
    type Msg = Msg;

    async fn handle(&mut self, _msg: Msg, _ctx: &mut maquis::Context<Msg>) {
        self.started.one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sink_hands_over_the_stamped_latencies_once_it_has_every_message() {
        let (mut sink, mut done) = Sink::new(3 * STAMP_EVERY);
        for i in 0..3 * STAMP_EVERY {
            assert!(done.try_recv().is_err(), "not before the last message");
            sink.take(stamp(i));
        }
        assert_eq!(done.try_recv().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn started_wakes_its_waiter_even_when_the_last_actor_came_first() {
        let s = Started::new(2);
        s.one();
        s.one();
        tokio::time::timeout(Duration::from_secs(5), s.wait())
            .await
            .expect("the count reached its target before the wait");
    }

    #[tokio::test]
    async fn the_senders_share_every_message_between_them() {
        let (mut sink, done) = Sink::new(1003);
        let (tx, mut rx) = mpsc::channel::<Msg>(16);
        tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                sink.take(m);
            }
        });
        let m = stream(tx, done, 1003, 7).await.unwrap();
        assert_eq!(m.messages, 1003);
    }
}
