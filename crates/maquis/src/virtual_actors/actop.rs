//! ActOp on a node: the edges between its activations and the virtual actors they send to,
//! counted as they send, and every `services.actop_interval_ms` an exchange with the peer it
//! would gain most from (the decisions are `maquis_proto::actop`'s; the moves are
//! [`Node::migrate`]'s).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use maquis_proto::actop::{exchange, offers, Balance, Candidate, SpaceSaving, View};
use serde::{Deserialize, Serialize};

use super::PREFIX;
use crate::id::NodeId;
use crate::{Inbox, Node, ReplyTo};

/// The local name of every node's exchange service.
pub(crate) const SERVICE: &str = "$maquis/actop";

tokio::task_local! {
    /// The name of the activation whose task this is.
    static CURRENT: Arc<str>;
}

/// Runs `fut` as the activation named `name` (its sends to virtual actors are counted as its
/// edges).
pub(crate) fn scope<F: std::future::Future>(
    name: Arc<str>,
    fut: F,
) -> impl std::future::Future<Output = F::Output> {
    CURRENT.scope(name, fut)
}

/// The activation running the current task, if it is one.
pub(crate) fn current() -> Option<Arc<str>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// ActOp's settings, from `[services]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// Between exchanges (zero: off).
    pub interval: Duration,
    /// Actors offered per exchange at most.
    pub candidates: usize,
    /// Actors two servers may differ by.
    pub imbalance: usize,
    /// Edges counted at most.
    pub edges: usize,
}

/// The heaviest edges from this node's activations, and where their other ends were.
pub(crate) struct Edges {
    counts: SpaceSaving<(Arc<str>, String)>,
    /// Where each counted edge's other end was when last sent to (the names in `counts`).
    at: HashMap<String, NodeId>,
}

impl Edges {
    pub(crate) fn new(capacity: usize) -> Self {
        Edges {
            counts: SpaceSaving::new(capacity),
            at: HashMap::new(),
        }
    }

    /// Activation `from` sent to the virtual actor `to`, on node `host`.
    pub(crate) fn sent(&mut self, from: Arc<str>, to: &str, host: &NodeId) {
        self.counts.observe((from, to.to_string()), 1);
        if let Some(at) = self.at.get_mut(to) {
            if at != host {
                *at = host.clone();
            }
        } else {
            self.at.insert(to.to_string(), host.clone());
        }
        // Bounded with the counts: ends no counted edge names are forgotten now and then.
        if self.at.len() > 2 * self.counts.len().max(1) {
            let named: std::collections::HashSet<String> =
                self.counts.top().into_iter().map(|((_, u), _)| u).collect();
            self.at.retain(|k, _| named.contains(k));
        }
    }

    /// Older edges weigh half as much from now on.
    pub(crate) fn decay(&mut self) {
        self.counts.decay();
    }

    /// What this node knows, for the activations in `running` (names) here: their edges and
    /// where the other ends are, by node name.
    pub(crate) fn view(&self, me: &NodeId, running: &HashSet<String>) -> View<String, String> {
        let mut edges: HashMap<String, Vec<(String, u64)>> = HashMap::new();
        for ((from, to), c) in self.counts.top() {
            if running.contains(&*from) {
                edges
                    .entry(from.to_string())
                    .or_default()
                    .push((to, c.count));
            }
        }
        let location = self
            .at
            .iter()
            .filter(|(name, _)| !running.contains(*name))
            .map(|(name, node)| (name.clone(), node.name.to_string()))
            .collect();
        View {
            here: me.name.to_string(),
            edges,
            location,
        }
    }
}

/// What the last interval showed, for `/status` and `/metrics` (when ActOp is on).
#[derive(Default)]
pub(crate) struct Gauges {
    /// Thousandths of this node's sends to virtual actors that went to another node.
    remote_permille: AtomicU64,
    /// Activations this node moved away, per minute.
    moves_per_min: AtomicU64,
    /// How many activations this node and the peer of its last exchange differed by after
    /// it (the balance a node keeps is pairwise).
    imbalance: AtomicU64,
    /// Counters at the start of the interval: sends local, sends remote, moves.
    since: Mutex<(u64, u64, u64)>,
}

impl Gauges {
    /// The gauges, named for `/status`.
    pub(crate) fn read(&self) -> [(String, u64); 3] {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        [
            ("actop_remote_permille".into(), get(&self.remote_permille)),
            ("actop_moves_per_min".into(), get(&self.moves_per_min)),
            ("actop_imbalance".into(), get(&self.imbalance)),
        ]
    }

    /// An interval of `interval` ended, with the node's counters at `now` (sends local,
    /// sends remote, moves).
    fn interval(&self, now: (u64, u64, u64), interval: Duration) {
        let mut since = self.since.lock().unwrap_or_else(|e| e.into_inner());
        let (l, r, m) = (
            now.0.saturating_sub(since.0),
            now.1.saturating_sub(since.1),
            now.2.saturating_sub(since.2),
        );
        *since = now;
        if let Some(permille) = (r * 1000).checked_div(l + r) {
            self.remote_permille.store(permille, Ordering::Relaxed);
        }
        let per_min = m as f64 * 60.0 / interval.as_secs_f64().max(1e-3);
        self.moves_per_min
            .store(per_min.round() as u64, Ordering::Relaxed);
    }

    /// An exchange left this node with `own` activations and its peer with `peer`.
    fn exchanged(&self, own: usize, peer: usize) {
        self.imbalance
            .store(own.abs_diff(peer) as u64, Ordering::Relaxed);
    }
}

/// An exchange offered by another node.
#[derive(Serialize, Deserialize)]
pub(crate) struct Offer {
    /// The node offering.
    from: String,
    /// Its activations.
    size: u64,
    /// Its candidates, scored towards the node asked.
    candidates: Vec<Candidate<String>>,
    /// The activations the node asked takes (it sends its own on at once); `None`: declined.
    reply: ReplyTo<Option<Vec<String>>>,
}

/// Starts the exchange service and, when `settings.interval` is not zero, the exchanges.
pub(crate) fn start(node: &Node, settings: Settings) {
    if settings.interval.is_zero() {
        return;
    }
    let last = Arc::new(Mutex::new(None::<tokio::time::Instant>));
    let me = node.clone();
    let busy = last.clone();
    let service = node.spawn_fn(move |mut inbox: Inbox<Offer>| async move {
        while let Some(offer) = inbox.recv().await {
            let decided = decide(&me, settings, &busy, &offer);
            let _ = offer.reply.send(decided).await;
        }
    });
    node.register_system(SERVICE, &service);
    let node = node.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = node.inner().router.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            round(&node, settings, &last).await;
            let c = node.inner().router.counters.snapshot();
            let now = (
                c["virtual_sent_local"],
                c["virtual_sent_remote"],
                c["virtual_migrations"],
            );
            node.inner()
                .virtuals
                .actop_gauges
                .interval(now, settings.interval);
        }
    });
}

/// Whether an exchange took place less than an interval ago (a node takes part in one
/// exchange per interval, as the paper's servers reject requests after a recent one).
fn recently(last: &Mutex<Option<tokio::time::Instant>>, interval: Duration) -> bool {
    let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
    let now = tokio::time::Instant::now();
    if l.is_some_and(|t| now.duration_since(t) < interval) {
        return true;
    }
    *l = Some(now);
    false
}

/// One round: offer the best peer this node's candidates; move what it accepts.
async fn round(node: &Node, settings: Settings, last: &Mutex<Option<tokio::time::Instant>>) {
    let host = &node.inner().virtuals;
    let (view, size) = host.actop_view(node.id());
    host.actop_decay();
    for (peer, candidates) in offers(&view, settings.candidates) {
        if recently(last, settings.interval) {
            return;
        }
        let Some(to) = node.member(&peer) else {
            continue;
        };
        let Some(service) = node.remote::<Offer>(&peer, SERVICE) else {
            continue;
        };
        let asked = service
            .call(
                |reply| Offer {
                    from: node.id().name.to_string(),
                    size: size as u64,
                    candidates,
                    reply,
                },
                settings.interval,
            )
            .await;
        match asked {
            Ok(Some(taken)) => {
                for name in taken {
                    host.migrate(&name, to.clone());
                }
                return;
            }
            // Declined, or no answer: the next peer.
            _ => *last.lock().unwrap_or_else(|e| e.into_inner()) = None,
        }
    }
}

/// The decision on an offer: which of the offered activations this node takes, after sending
/// its own on to the offering node.
fn decide(
    node: &Node,
    settings: Settings,
    last: &Mutex<Option<tokio::time::Instant>>,
    offer: &Offer,
) -> Option<Vec<String>> {
    let to = node.member(&offer.from)?;
    if recently(last, settings.interval) {
        return None;
    }
    let host = &node.inner().virtuals;
    let (view, size) = host.actop_view(node.id());
    let own = view.candidates(&offer.from, settings.candidates);
    let sizes = (offer.size as usize, size);
    let balance = Balance::around(sizes.0 + sizes.1, 2, settings.imbalance);
    let x = exchange(&offer.candidates, &own, sizes, balance);
    for name in &x.to_offerer {
        host.migrate(name, to.clone());
    }
    let taken: Vec<String> = x
        .to_decider
        .into_iter()
        .filter(|n| n.starts_with(PREFIX))
        .collect();
    let sent = x.to_offerer.len();
    host.actop_gauges.exchanged(
        (sizes.1 + taken.len()).saturating_sub(sent),
        (sizes.0 + sent).saturating_sub(taken.len()),
    );
    tracing::debug!(from = %offer.from, taken = taken.len(), sent = x.to_offerer.len(), "actop exchange");
    Some(taken)
}
