//! The simulated world: a [`Network`] of the membership machines real nodes run, over the
//! scenario's overlay, and an observer that records what the metrics need (who delivered which
//! broadcast, payload copies received, tree repairs, routed outcomes).
//!
//! Nothing here decides anything about membership, broadcast or routing; it starts nodes,
//! makes them join, crash and broadcast, and watches.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use maquis_proto::broadcast::{Key, MsgId, PlumtreeMsg, Topic};
use maquis_proto::harness::{Micros, NetConfig, Network, Observer, RoutedOutcome, SimId};
use maquis_proto::membership::{
    MembershipConfig, MembershipEvent, Output, Protocol, RESERVED_PREFIX,
};
use maquis_proto::overlay::{
    ClientServer, ClientServerConfig, DynOverlay, Erased, FullMesh, HyParView, Role,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::report::Traffic;
use crate::scenario::{Scenario, SimOverlay};

/// The topic of the tracked broadcasts; the payload is the broadcast's index.
const TOPIC: &str = "sim";

/// One tracked broadcast.
pub(crate) struct Bcast {
    pub at: Micros,
    pub delivered: Vec<u64>,
    pub reached: u32,
    pub received: u64,
    pub max_hops: u16,
}

/// What the world watches.
#[derive(Default)]
pub(crate) struct Watch {
    pub bcasts: Vec<Bcast>,
    pub traffic: Traffic,
    /// The notices seen so far (to count distinct ones).
    notices: HashSet<MsgId>,
    pub routed: HashMap<RoutedOutcome, u64>,
    /// Links travelled by the routed messages that arrived, all added up.
    pub routed_links: u64,
    /// Every `Down` event: (when, the node that reported it, the node reported down).
    pub downs: Vec<(Micros, u32, u32)>,
}

fn index_of(payload: &[u8]) -> Option<usize> {
    let bytes: [u8; 8] = payload.try_into().ok()?;
    Some(u64::from_le_bytes(bytes) as usize)
}

impl Observer for Watch {
    fn on_output(&mut self, now: Micros, node: u32, output: &Output<SimId>) {
        if let Output::Event(MembershipEvent::Down(x)) = output {
            self.downs.push((now, node, x.index));
            return;
        }
        if let Output::Deliver {
            topic,
            payload,
            hops,
        } = output
        {
            if topic.as_str() != TOPIC {
                return;
            }
            let Some(b) = index_of(payload).and_then(|i| self.bcasts.get_mut(i)) else {
                return;
            };
            let (w, bit) = (node as usize / 64, node as usize % 64);
            if w < b.delivered.len() && b.delivered[w] & (1 << bit) == 0 {
                b.delivered[w] |= 1 << bit;
                b.reached += 1;
                b.max_hops = b.max_hops.max(*hops);
            }
        }
    }

    fn on_message(&mut self, _from: u32, _to: u32, protocol: Protocol, payload: &[u8]) {
        let t = &mut self.traffic;
        if protocol != Protocol::Broadcast {
            t.overlay += 1;
            return;
        }
        let Ok(msg) = postcard::from_bytes::<PlumtreeMsg<SimId>>(payload) else {
            return;
        };
        match msg {
            PlumtreeMsg::Gossip {
                id, topic, payload, ..
            } => {
                if topic.as_str() == TOPIC {
                    t.payloads += 1;
                    if let Some(b) = index_of(&payload).and_then(|i| self.bcasts.get_mut(i)) {
                        b.received += 1;
                    }
                } else if topic.as_str().starts_with(RESERVED_PREFIX) {
                    t.notices += 1;
                    if self.notices.insert(id) {
                        t.notices_distinct += 1;
                    }
                } else {
                    t.other_payloads += 1;
                }
            }
            PlumtreeMsg::Heartbeat { .. } => t.heartbeats += 1,
            PlumtreeMsg::IHave(list) => {
                t.ihaves += 1;
                t.announcements += list.len() as u64;
            }
            PlumtreeMsg::Graft { key: None, .. } => t.grafts_tree += 1,
            PlumtreeMsg::Graft {
                key: Some(Key::Msg(_)),
                ..
            } => t.grafts_payload += 1,
            PlumtreeMsg::Graft {
                key: Some(Key::Beat { .. }),
                ..
            } => t.grafts_heartbeat += 1,
            PlumtreeMsg::Prune => t.prunes += 1,
        }
    }

    fn on_routed(&mut self, _token: u64, outcome: RoutedOutcome) {
        let key = match outcome {
            RoutedOutcome::Delivered(hops) => {
                // `hops` counts the forwards: a message sent straight to its destination has 0.
                self.routed_links += u64::from(hops) + 1;
                RoutedOutcome::Delivered(0)
            }
            other => other,
        };
        *self.routed.entry(key).or_default() += 1;
    }
}

pub(crate) struct World {
    pub net: Network<Watch>,
    pub rng: StdRng,
    scenario: Scenario,
    /// Room for this many nodes in a broadcast's delivery set.
    slots: usize,
    membership: MembershipConfig,
}

impl World {
    /// A world with room for `slots` nodes (none started yet).
    pub fn new(s: &Scenario, slots: usize) -> World {
        let net = NetConfig {
            latency: s.latency,
            jitter: s.jitter,
            detect: s.detect,
            hop_limit: s.hop_limit,
            seed: s.seed,
        };
        World {
            net: Network::new(net, Watch::default()),
            rng: StdRng::seed_from_u64(s.seed),
            membership: s.membership(),
            scenario: s.clone(),
            slots,
        }
    }

    pub fn now(&self) -> Micros {
        self.net.now()
    }

    pub fn run_until(&mut self, until: Micros) {
        self.net.run_until(until);
    }

    pub fn alive(&self, i: usize) -> bool {
        self.net.node(i as u32).alive
    }

    pub fn len(&self) -> usize {
        self.net.len()
    }

    /// The overlay of the next node, with a seed of its own.
    fn overlay(&self, id: SimId) -> Box<dyn DynOverlay<SimId>> {
        let i = id.index;
        let mix = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.scenario.seed;
        match &self.scenario.overlay {
            SimOverlay::PeerToPeer => {
                let cfg = maquis_proto::overlay::HyParViewConfig {
                    seed: Some(mix),
                    ..self.scenario.hyparview.clone()
                };
                Box::new(Erased(HyParView::new(id, cfg)))
            }
            SimOverlay::ClientServer {
                servers,
                servers_per_client,
            } => {
                let role = if (i as usize) < *servers {
                    Role::Server
                } else {
                    Role::Client
                };
                let cfg = ClientServerConfig {
                    role,
                    servers_per_client: *servers_per_client,
                    seed: Some(mix),
                    ..ClientServerConfig::default()
                };
                Box::new(Erased(ClientServer::new(id, cfg)))
            }
            SimOverlay::FullMesh => {
                let s = &self.scenario;
                Box::new(Erased(FullMesh::new(id, s.gossip_every, s.retry_every)))
            }
        }
    }

    /// Starts a new node; returns its index.
    pub fn spawn(&mut self) -> u32 {
        let id = self.net.next_id();
        let mut membership = self.membership.clone();
        membership.plumtree.seed = Some(
            (u64::from(id.index).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.scenario.seed)
                .rotate_left(17),
        );
        let overlay = self.overlay(id);
        self.net.spawn(overlay, membership)
    }

    /// A live node a new node joins through: on the client-server overlay a live server (the
    /// way its clients are configured), else any live node.
    pub fn contact(&mut self, new: u32) -> Option<u32> {
        if let SimOverlay::ClientServer { servers, .. } = self.scenario.overlay {
            let live: Vec<u32> = (0..servers.min(self.len()) as u32)
                .filter(|&s| s != new && self.alive(s as usize))
                .collect();
            if !live.is_empty() {
                return Some(live[self.rng.gen_range(0..live.len())]);
            }
        }
        self.random_live_except(Some(new))
    }

    /// A random live node other than `skip`.
    pub fn random_live_except(&mut self, skip: Option<u32>) -> Option<u32> {
        let ok = |w: &World, i: usize| w.alive(i) && Some(i as u32) != skip;
        if !(0..self.len()).any(|i| ok(self, i)) {
            return None;
        }
        loop {
            let i = self.rng.gen_range(0..self.len());
            if ok(self, i) {
                return Some(i as u32);
            }
        }
    }

    /// Node `i` broadcasts a tracked message; returns its index in the watch list.
    pub fn broadcast(&mut self, i: u32) -> usize {
        let at = self.net.now();
        let w = &mut self.net.observer;
        let b = w.bcasts.len();
        w.bcasts.push(Bcast {
            at,
            delivered: vec![0; self.slots.div_ceil(64)],
            reached: 0,
            received: 0,
            max_hops: 0,
        });
        let payload = Bytes::copy_from_slice(&(b as u64).to_le_bytes());
        self.net.broadcast(i, Topic::from(TOPIC), payload);
        b
    }

    /// Whether node `i` delivered broadcast `b`.
    pub fn delivered(&self, b: usize, i: usize) -> bool {
        self.net.observer.bcasts[b].delivered[i / 64] & (1 << (i % 64)) != 0
    }
}
