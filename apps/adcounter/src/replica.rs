//! The replica on each node: an actor registered as [`NAME`] that counts the impressions its
//! clients report, merges the states its neighbours send, and every `sync_every` sends its
//! own state to each of the overlay's neighbours ([`maquis::Node::neighbors`]) that has not
//! had it since it last changed — Lasp's state synchronisation over whichever overlay the
//! node runs. A neighbour new to the view gets the state too, and a change made while the
//! node had no neighbour (or while a neighbour's lane was full) waits for one: the last
//! change of a replica is never kept from the cluster by the moment it happened. With
//! [`Settings::deltas`] a neighbour is sent only what changed since its last state (a state
//! of ~a count per node and ad is large; what changed in one interval is a small part of
//! it), the whole state when it is new to the view. Every
//! `resend_every` ticks a neighbour sent nothing meanwhile gets the state again (anti-entropy:
//! a state lost on the way — with a connection that closed under it, or at a node whose
//! replica had not started — is repaired without waiting for a change).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use maquis::{ActorRef, Inbox, Node, ReplyTo};
use serde::{Deserialize, Serialize};

use crate::crdt::{AdError, Ads};

/// The local name of every node's replica.
pub const NAME: &str = "adcounter";

/// What a replica is sent.
#[derive(Debug, Serialize, Deserialize)]
pub enum AdMsg {
    /// A client saw `ad`: counted here; the answer is the ad's count as this replica knows
    /// it, or why it was not counted.
    Impression {
        /// The ad.
        ad: String,
        /// Where the answer goes.
        reply: ReplyTo<Result<u64, String>>,
    },
    /// A neighbour's state (shared: the same state goes to every neighbour).
    State(Arc<Ads>),
    /// What this replica knows.
    Read(ReplyTo<Snapshot>),
}

/// A replica's view.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Impressions of every ad, summed.
    pub total: u64,
    /// Ads known.
    pub ads: usize,
    /// Ads that reached their limit.
    pub disabled: usize,
    /// States sent to neighbours (resends included).
    pub syncs_sent: u64,
    /// States sent again to a neighbour that had them (see [`Settings::resend_every`]).
    pub resends: u64,
    /// The states' encoded size, summed over every send (the frame around each adds a few
    /// bytes): what the replica's synchronisation costs, apart from the node's other traffic.
    pub state_bytes: u64,
    /// When the total last changed, milliseconds since the Unix epoch (0: never): once every
    /// replica holds the final total, the latest of these is when the last one got there.
    pub total_changed_ms: u64,
    /// Ads a merge left out for want of room (the table is bounded).
    pub left_out: u64,
}

/// A replica's settings.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Impressions after which an ad is disabled.
    pub limit: u64,
    /// Ads a replica keeps at most.
    pub max_ads: usize,
    /// How often a changed state goes to the neighbours.
    pub sync_every: Duration,
    /// Every this many ticks, a neighbour that was sent nothing meanwhile is sent the state
    /// again, changed or not (repairs a state lost on the way); 0: never (a lost state waits
    /// for the next change).
    pub resend_every: u32,
    /// Send a neighbour only what changed since the state it was last sent (a delta, see
    /// [`Ads::delta_from`]), not the whole state; a neighbour new to the view and a resend
    /// get the whole state. `false`: the whole state every time (Lasp's state
    /// synchronisation as PARTISAN measured it).
    pub deltas: bool,
}

/// Why a replica did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The name is taken on this node.
    #[error("cannot register the replica: {0}")]
    Register(String),
}

/// Starts this node's replica and registers it as [`NAME`].
pub fn start(node: &Node, settings: Settings) -> Result<ActorRef<AdMsg>, StartError> {
    let me = node.clone();
    let replica = node.spawn_fn(move |inbox: Inbox<AdMsg>| run(me, settings, inbox));
    node.register(NAME, &replica)
        .map_err(|e| StartError::Register(e.to_string()))?;
    Ok(replica)
}

async fn run(node: Node, settings: Settings, mut inbox: Inbox<AdMsg>) {
    let name = node.id().name.clone();
    // Shared with the messages that carry it out and, with deltas, with the record of what
    // each neighbour was last sent: the first change after a tick's sends copies it (once a
    // tick; remote sends are encoded at once, so the messages never hold it long).
    let mut ads = Arc::new(Ads::new(settings.limit, settings.max_ads));
    // Bumped by every change; per neighbour, the version it was last sent (kept for the
    // current neighbours only: as many entries as the overlay's view).
    let mut version = 0u64;
    let mut sent: HashMap<maquis::NodeId, Sent> = HashMap::new();
    let (mut syncs_sent, mut resends, mut left_out, mut state_bytes) = (0u64, 0u64, 0u64, 0u64);
    let mut total_changed_ms = 0u64;
    let mut ticks = 0u64;
    let mut tick = tokio::time::interval(settings.sync_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = inbox.recv() => {
                let Some(msg) = msg else { return };
                match msg {
                    AdMsg::Impression { ad, reply } => {
                        let r = Arc::make_mut(&mut ads).impression(&name, &ad);
                        if r.is_ok() {
                            version += 1;
                            total_changed_ms = unix_ms();
                        }
                        let _ = reply.send(r.map_err(|e: AdError| e.to_string())).await;
                    }
                    AdMsg::State(theirs) => {
                        let out = Arc::make_mut(&mut ads).merge(&theirs);
                        left_out += out.left_out.len() as u64;
                        // A merge changes the table only by raising counts: the total rose.
                        if out.changed {
                            version += 1;
                            total_changed_ms = unix_ms();
                        }
                    }
                    AdMsg::Read(reply) => {
                        let disabled = ads.disabled();
                        let _ = reply
                            .send(Snapshot {
                                total: ads.total(),
                                ads: ads.len(),
                                disabled,
                                syncs_sent,
                                resends,
                                state_bytes,
                                total_changed_ms,
                                left_out,
                            })
                            .await;
                    }
                }
            }
            _ = tick.tick() => {
                ticks += 1;
                if version == 0 {
                    continue;
                }
                let neighbors = node.neighbors();
                sent.retain(|peer, _| neighbors.contains(peer));
                let resend = u64::from(settings.resend_every);
                // The deltas of this tick, by the state they were taken against: neighbours
                // last sent the same state share one. With each, and with the whole state,
                // its encoded size.
                let mut deltas: Vec<(Arc<Ads>, Arc<Ads>, u64)> = Vec::new();
                let mut whole: Option<u64> = None;
                for peer in neighbors {
                    let (again, base) = match sent.get(&peer) {
                        Some(s) if s.version == version => {
                            if resend == 0 || ticks - s.tick < resend {
                                continue;
                            }
                            (true, None)
                        }
                        Some(s) => (false, s.base.clone()),
                        None => (false, None),
                    };
                    let Some(r) = node.remote::<AdMsg>(&peer.name, NAME) else {
                        continue;
                    };
                    let (state, size) = match base {
                        Some(base) => match deltas.iter().find(|(b, ..)| Arc::ptr_eq(b, &base)) {
                            Some((_, d, size)) => (d.clone(), *size),
                            None => {
                                let d = Arc::new(ads.delta_from(&base));
                                let size = encoded_size(&d);
                                deltas.push((base, d.clone(), size));
                                (d, size)
                            }
                        },
                        None => (ads.clone(), *whole.get_or_insert_with(|| encoded_size(&ads))),
                    };
                    // A neighbour whose lane is full misses this state and gets it at the
                    // next tick (a delta then from the state it last had: nothing is skipped).
                    match r.try_send(AdMsg::State(state)) {
                        Ok(()) => {
                            syncs_sent += 1;
                            resends += u64::from(again);
                            state_bytes += size;
                            let base = settings.deltas.then(|| ads.clone());
                            sent.insert(peer, Sent { version, tick: ticks, base });
                        }
                        Err(e) => tracing::debug!(peer = %peer, error = %e, "state not sent"),
                    }
                }
            }
        }
    }
}

/// What a neighbour was last sent: the state's version, at which tick, and (with deltas) the
/// state itself, which the next delta is taken against. Holding it makes the next change copy
/// the table once (`Arc::make_mut`), where a delta saves each neighbour decoding it whole.
struct Sent {
    version: u64,
    tick: u64,
    base: Option<Arc<Ads>>,
}

/// A state's encoded size (postcard, as the runtime encodes messages).
fn encoded_size(state: &Ads) -> u64 {
    postcard::experimental::serialized_size(state).map_or(0, |n| n as u64)
}

/// The wall clock in milliseconds since the Unix epoch (0 if it reads before the epoch): the
/// clock of [`Snapshot::total_changed_ms`], to compare it with a time read elsewhere.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
