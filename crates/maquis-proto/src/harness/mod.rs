//! A deterministic network of [`Membership`] machines on simulated time.
//!
//! Every node runs the membership machine a real node runs, over any overlay; the network
//! carries out its outputs the way the runtime's driver does over TCP, with a latency per
//! message and a delay before a lost connection is noticed. Nothing here decides anything
//! about membership, broadcast or routing: the machines do, and routed messages take the hops
//! the runtime's router ([`next_hop`], [`forward`]) picks, with the runtime's hop limit.
//!
//! Connections: [`Output::Connect`] to a live, reachable node opens a connection at both ends,
//! and each end's machine hears [`Membership::handle_connected`] one latency later; to a dead
//! or unreachable node it fails after the detection delay (refused by a dead node's port,
//! [`Disconnect::Lost`]; unanswered across a partition, [`Disconnect::Inconclusive`]). A message needs a connection (as in
//! the runtime, it is dropped otherwise) and arrives after a latency, in order per connection.
//! A node that crashes, or a partition, closes its connections; the other ends hear
//! [`Membership::handle_disconnected`] after the detection delay, and what was sent meanwhile
//! is lost. [`Output::Close`] closes both ends: the other one hears a goodbye after what was
//! already sent. Timers: after every input a node's earliest deadline is scheduled as an event.
//!
//! A node may also run the directory of global names ([`Network::start_names`]) and the process
//! groups ([`Network::start_groups`]): they hear the members its membership machine publishes,
//! their messages travel as routed messages (hop by hop where there is no direct connection, as
//! in the runtime), and what the directory answers goes to [`Observer::on_names`].
//!
//! What a test or the simulator wants to see (deliveries, events, the messages on the wire,
//! every node after every input it handles) it gets through an [`Observer`], which may also
//! lose chosen messages. A test can hand a machine an input of its own ([`Network::input`]),
//! break one connection ([`Network::break_link`]) and change the delays while the network
//! runs ([`Network::config_mut`]).
//!
//! ```
//! use std::time::Duration;
//! use maquis_proto::harness::{NetConfig, Network, NoObserver};
//! use maquis_proto::membership::MembershipConfig;
//! use maquis_proto::overlay::{Erased, HyParView, HyParViewConfig};
//!
//! let mut net = Network::new(NetConfig::default(), NoObserver);
//! let cfg = MembershipConfig::default();
//! for i in 0..20u32 {
//!     let id = net.next_id();
//!     let overlay = Erased(HyParView::new(id, HyParViewConfig::default()));
//!     let node = net.spawn(Box::new(overlay), cfg.clone());
//!     if i > 0 {
//!         net.join(node, 0);
//!     }
//!     net.run_for(Duration::from_millis(50));
//! }
//! net.run_for(Duration::from_secs(10));
//! assert_eq!(net.graph().components, 1);
//! assert!(net.node(5).machine.members().len() == 20);
//! ```

mod queue;

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

pub use self::queue::Micros;
use self::queue::Queue;
use crate::broadcast::{DropReason, ForwardDecision, Topic};
use crate::groups::{Groups, GroupsConfig};
use crate::id::PeerId;
use crate::membership::{
    forward, next_hop, Direct, Disconnect, Membership, MembershipConfig, NextHop, Output, Protocol,
};
use crate::names::{DirOutput, Directory, DirectoryConfig};

mod services;

use crate::overlay::DynOverlay;
use services::{ServiceOut, Which};

/// The identity of a simulated node: its index in the network and its incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SimId {
    /// The node's index (its name).
    pub index: u32,
    /// Which life of the node this is.
    pub incarnation: u32,
}

impl PeerId for SimId {
    type Name = u32;

    fn name(&self) -> &u32 {
        &self.index
    }

    fn incarnation(&self) -> u64 {
        u64::from(self.incarnation)
    }
}

impl fmt::Display for SimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}", self.index)
    }
}

/// The network's delays and the runtime settings it carries out.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Fixed part of one message's delay.
    pub latency: Duration,
    /// Random extra delay of one message, uniform in `[0, jitter)`.
    pub jitter: Duration,
    /// Time until a connection's failure (crash, partition, unreachable dial) is noticed.
    pub detect: Duration,
    /// Routed messages are dropped after this many hops (the runtime's `broadcast.hop_limit`).
    pub hop_limit: u16,
    /// Seed of the random delays.
    pub seed: u64,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            latency: Duration::from_millis(5),
            jitter: Duration::from_millis(10),
            detect: Duration::from_millis(200),
            hop_limit: crate::membership::DEFAULT_HOP_LIMIT,
            seed: 1,
        }
    }
}

/// How a routed message ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RoutedOutcome {
    /// It reached its destination, after this many hops.
    Delivered(u16),
    /// A node on the way knew no way on (or only back where it came from).
    NoRoute,
    /// It travelled the hop limit.
    HopLimit,
    /// Its sender had no connection and no route to the destination.
    Unreachable,
    /// A hop's connection was gone, or the node it was on crashed.
    Lost,
}

/// What a test or the simulator sees of the network, and the messages it loses. Every method
/// has a default that looks at nothing and loses nothing.
pub trait Observer {
    /// Node `node` produced an output the network does not consume itself (a delivery, an
    /// event, new members, neighbours or routes, a gone node, a malformed notice).
    fn on_output(&mut self, _now: Micros, _node: u32, _output: &Output<SimId>) {}
    /// A protocol message arrived at `to` (before its machine handles it).
    fn on_message(&mut self, _from: u32, _to: u32, _protocol: Protocol, _payload: &[u8]) {}
    /// A routed message (see [`Network::route`]) ended.
    fn on_routed(&mut self, _token: u64, _outcome: RoutedOutcome) {}
    /// Node `node`'s directory answered a request or lost a name
    /// ([`DirOutput::Registered`], [`DirOutput::Found`], [`DirOutput::Lost`]).
    fn on_names(&mut self, _now: Micros, _node: u32, _output: &DirOutput<SimId>) {}
    /// Node `node` handled an input (its start, a join, a leave, a broadcast, a connection
    /// that came up or went down, a protocol message, its timers, an input of
    /// [`Network::input`]). Called before the outputs the input produced are carried out, with
    /// every node (`nodes[node]` is this one): the place to check a machine's invariants after
    /// every step.
    fn on_input(&mut self, _now: Micros, _node: u32, _nodes: &[SimNode]) {}
    /// Whether a protocol message from `from` is lost as it arrives at `to`, the connection
    /// staying up: how a test loses the messages it chooses. A lost message is counted in
    /// [`NetCounters::lost`] and not shown to [`Observer::on_message`].
    fn lose(&mut self, _from: u32, _to: u32, _protocol: Protocol, _payload: &[u8]) -> bool {
        false
    }
}

/// An observer that looks at nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoObserver;

impl Observer for NoObserver {}

/// Counters of what happened on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCounters {
    /// Messages put on a connection.
    pub messages: u64,
    /// Protocol messages (overlay and broadcast) the machines asked to send, whether or not
    /// they were put on a connection.
    pub protocol: u64,
    /// Messages lost to a crash, a partition or a failing connection.
    pub lost: u64,
    /// Messages dropped because their sender had no connection to the receiver.
    pub unconnected: u64,
    /// Protocol messages a machine could not decode.
    pub malformed: u64,
    /// Directory messages sent (each counted once, however many hops it took).
    pub names_sent: u64,
    /// Directory messages that did not arrive (no route, hop limit, a lost hop).
    pub names_dropped: u64,
    /// Group messages sent (each counted once, however many hops it took).
    pub groups_sent: u64,
    /// Group messages that did not arrive (no route, hop limit, a lost hop).
    pub groups_dropped: u64,
}

impl NetCounters {
    /// Counts a message of `which` service sent, or (`sent` false) dropped.
    fn service(&mut self, which: Which, sent: bool) {
        let c = match (which, sent) {
            (Which::Names, true) => &mut self.names_sent,
            (Which::Names, false) => &mut self.names_dropped,
            (Which::Groups, true) => &mut self.groups_sent,
            (Which::Groups, false) => &mut self.groups_dropped,
        };
        *c += 1;
    }
}

/// One simulated node.
pub struct SimNode {
    /// Its identity.
    pub id: SimId,
    /// The membership machine it runs.
    pub machine: Membership<SimId>,
    /// The directory of global names it runs, if started ([`Network::start_names`]).
    pub names: Option<Directory<SimId>>,
    /// The process groups it runs, if started ([`Network::start_groups`]).
    pub groups: Option<Groups<SimId>>,
    /// Whether it is running (not crashed).
    pub alive: bool,
    /// When it started.
    pub born: Micros,
    conns: Vec<Conn>,
    /// The deadline a wake-up event is scheduled for.
    wake: Option<Micros>,
}

impl fmt::Debug for SimNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimNode")
            .field("id", &self.id)
            .field("alive", &self.alive)
            .finish_non_exhaustive()
    }
}

struct Conn {
    peer: u32,
    gen: u32,
    /// Arrival time of the last message sent on it (to keep order).
    fifo: Micros,
    /// One-sided: an attempt to reach a node that cannot be reached.
    failing: bool,
}

enum Wire {
    Proto(Protocol, Bytes),
    Routed { body: Body, to: SimId, hops: u16 },
}

/// What a routed message carries.
enum Body {
    /// A probe of [`Network::route`], reported to [`Observer::on_routed`].
    Probe(u64),
    /// A service's message (the directory's, the groups'), encoded as the runtime sends it.
    Service {
        which: Which,
        from: SimId,
        payload: Bytes,
    },
}

enum Ev {
    Msg {
        from: u32,
        to: u32,
        wire: Wire,
    },
    /// A connection came up; stale if the node's connection has another generation.
    Up {
        node: u32,
        peer: u32,
        gen: u32,
    },
    /// A connection went down; stale if the node has a connection of another generation
    /// (unless `gen` is `None`).
    Down {
        node: u32,
        peer: u32,
        gen: Option<u32>,
        why: Disconnect,
    },
    /// A node's timer deadline.
    Wake {
        node: u32,
        at: Micros,
    },
    /// A node's join through a contact, once their connection is up.
    Join {
        node: u32,
        contact: u32,
    },
}

/// The active-view graph among live nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Graph {
    /// Connected components among live nodes.
    pub components: usize,
    /// Live nodes with no neighbour.
    pub isolated: usize,
    /// Fraction of links that both ends hold.
    pub symmetry: f64,
}

/// A network of simulated nodes. See the [module documentation](self).
pub struct Network<O: Observer> {
    q: Queue<Ev>,
    nodes: Vec<SimNode>,
    cfg: NetConfig,
    rng: StdRng,
    gen: u32,
    next_token: u64,
    /// Which side of a partition each node is on, while one lasts.
    side: Option<Vec<bool>>,
    counters: NetCounters,
    /// What looks at the network.
    pub observer: O,
}

fn us(d: Duration) -> Micros {
    d.as_micros().min(u128::from(u64::MAX)) as Micros
}

impl<O: Observer> Network<O> {
    /// An empty network.
    pub fn new(cfg: NetConfig, observer: O) -> Self {
        Network {
            q: Queue::new(),
            nodes: Vec::new(),
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            gen: 0,
            next_token: 0,
            side: None,
            counters: NetCounters::default(),
            observer,
        }
    }

    /// The current simulated time.
    pub fn now(&self) -> Micros {
        self.q.now
    }

    fn now_d(&self) -> Duration {
        Duration::from_micros(self.q.now)
    }

    /// The identity the next spawned node gets.
    pub fn next_id(&self) -> SimId {
        SimId {
            index: self.nodes.len() as u32,
            incarnation: 1,
        }
    }

    /// How many nodes were ever spawned.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node was ever spawned.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A node.
    pub fn node(&self, i: u32) -> &SimNode {
        &self.nodes[i as usize]
    }

    /// All nodes, by index.
    pub fn nodes(&self) -> &[SimNode] {
        &self.nodes
    }

    /// What happened on the wire.
    pub fn counters(&self) -> NetCounters {
        self.counters
    }

    /// The delays and settings, which may change while the network runs (a slow period, say):
    /// what is already on its way keeps its arrival time. The seed counts only at the start.
    pub fn config_mut(&mut self) -> &mut NetConfig {
        &mut self.cfg
    }

    /// Whether nodes `a` and `b` have a connection (one that came up or is coming up, not an
    /// attempt that fails).
    pub fn connected(&self, a: u32, b: u32) -> bool {
        self.nodes[a as usize]
            .conns
            .iter()
            .any(|c| c.peer == b && !c.failing)
    }

    /// Starts a node running `overlay` (made for [`Network::next_id`]); returns its index.
    pub fn spawn(&mut self, overlay: Box<dyn DynOverlay<SimId>>, cfg: MembershipConfig) -> u32 {
        let id = self.next_id();
        let i = id.index;
        self.nodes.push(SimNode {
            id,
            machine: Membership::new(id, overlay, cfg),
            names: None,
            groups: None,
            alive: true,
            born: self.q.now,
            conns: Vec::new(),
            wake: None,
        });
        let now = self.now_d();
        self.nodes[i as usize].machine.handle_start(now);
        self.after(i);
        i
    }

    /// Node `i` joins through `contact`: a connection first, then the join once it is up (as
    /// the runtime's `join` does).
    pub fn join(&mut self, i: u32, contact: u32) {
        self.connect(i, contact);
        if let Some(up) = self.conn(i, contact).filter(|c| !c.failing).map(|c| c.fifo) {
            let at = up.max(self.q.now) + 1;
            self.q.push(at, Ev::Join { node: i, contact });
        }
    }

    /// Node `i` broadcasts a payload on a topic.
    pub fn broadcast(&mut self, i: u32, topic: Topic, payload: Bytes) {
        let now = self.now_d();
        self.nodes[i as usize]
            .machine
            .broadcast(now, topic, payload);
        self.after(i);
    }

    /// Node `i` leaves the cluster.
    pub fn leave(&mut self, i: u32) {
        let now = self.now_d();
        self.nodes[i as usize].machine.handle_leave(now);
        self.after(i);
    }

    /// Hands node `i`'s machine an input the network would not (a removal, a lost connection
    /// its driver reports while the other end notices nothing, ...) at the current time, then
    /// carries out its outputs. The network's connections stay as they are, whatever the input
    /// says of them.
    pub fn input(&mut self, i: u32, f: impl FnOnce(&mut Membership<SimId>, Duration)) {
        let now = self.now_d();
        f(&mut self.nodes[i as usize].machine, now);
        self.after(i);
    }

    /// The connection between `a` and `b` breaks while both run: each end hears it lost after
    /// the detection delay, and what is sent on it meanwhile is lost (what was already on its
    /// way arrives). Either end may connect again.
    pub fn break_link(&mut self, a: u32, b: u32) {
        let at = self.q.now + us(self.cfg.detect);
        for (node, peer) in [(a, b), (b, a)] {
            let gen = self.nodes[node as usize]
                .conns
                .iter()
                .find(|c| c.peer == peer && !c.failing)
                .map(|c| c.gen);
            if let Some(gen) = gen {
                self.remove_conn(node, peer, gen);
                let gen = Some(gen);
                let why = Disconnect::Lost;
                self.q.push(
                    at,
                    Ev::Down {
                        node,
                        peer,
                        gen,
                        why,
                    },
                );
            }
        }
    }

    /// Node `i` crashes: its connections close, the other ends notice after the detection
    /// delay.
    pub fn crash(&mut self, i: u32) {
        let node = &mut self.nodes[i as usize];
        node.alive = false;
        node.wake = None;
        let conns = std::mem::take(&mut node.conns);
        let at = self.q.now + us(self.cfg.detect);
        for c in conns {
            if self.remove_conn(c.peer, i, c.gen) {
                let (node, peer, gen) = (c.peer, i, Some(c.gen));
                self.q.push(
                    at,
                    Ev::Down {
                        node,
                        peer,
                        gen,
                        why: Disconnect::Lost,
                    },
                );
            }
        }
    }

    /// Splits the nodes in two (`side[i]`), closing the connections across.
    pub fn partition(&mut self, side: Vec<bool>) {
        let at = self.q.now + us(self.cfg.detect);
        for i in 0..self.nodes.len() as u32 {
            let across: Vec<(u32, u32)> = self.nodes[i as usize]
                .conns
                .iter()
                .filter(|c| side[i as usize] != side[c.peer as usize])
                .map(|c| (c.peer, c.gen))
                .collect();
            for (peer, gen) in across {
                self.remove_conn(i, peer, gen);
                let gen = Some(gen);
                self.q.push(
                    at,
                    Ev::Down {
                        node: i,
                        peer,
                        gen,
                        why: Disconnect::Lost,
                    },
                );
            }
        }
        self.side = Some(side);
    }

    /// Ends the partition.
    pub fn heal(&mut self) {
        self.side = None;
    }

    /// Sends a message from `src` to `dst` the way the runtime routes an actor message: over
    /// a direct connection, or hop by hop through the neighbours routes name. Returns the
    /// token its outcome is reported with ([`Observer::on_routed`]).
    pub fn route(&mut self, src: u32, dst: u32) -> u64 {
        self.next_token += 1;
        let token = self.next_token;
        let to = self.nodes[dst as usize].id;
        if !self.send_routed(src, to, Body::Probe(token)) {
            self.observer.on_routed(token, RoutedOutcome::Unreachable);
        }
        token
    }

    /// Sends `body` from `src` toward `to` as the runtime's router would; false if `src` has
    /// neither a connection nor a route to it.
    fn send_routed(&mut self, src: u32, to: SimId, body: Body) -> bool {
        match self.first_hop(src, &to) {
            Some(NextHop::Direct) => self.send(src, to.index, Wire::Routed { body, to, hops: 0 }),
            Some(NextHop::Via(via)) => {
                self.send(src, via.index, Wire::Routed { body, to, hops: 1 })
            }
            None => return false,
        }
        true
    }

    /// Starts the directory of global names on node `i` (it hears the current members at
    /// once).
    pub fn start_names(&mut self, i: u32, cfg: DirectoryConfig) {
        let now = self.now_d();
        let node = &mut self.nodes[i as usize];
        let mut dir = Directory::new(node.id, cfg);
        dir.handle_members(now, node.machine.members());
        node.names = Some(dir);
        self.after(i);
    }

    /// Starts the process groups on node `i` (they hear the current members at once).
    pub fn start_groups(&mut self, i: u32, cfg: GroupsConfig) {
        let now = self.now_d();
        let node = &mut self.nodes[i as usize];
        let mut groups = Groups::new(node.id, cfg);
        groups.handle_members(now, node.machine.members());
        node.groups = Some(groups);
        self.after(i);
    }

    /// Hands node `i`'s groups a request (join, leave, an actor that stopped, ...) at the
    /// current time, then carries out what they produced. Panics if the node runs no groups.
    pub fn groups<R>(&mut self, i: u32, f: impl FnOnce(&mut Groups<SimId>, Duration) -> R) -> R {
        let now = self.now_d();
        let groups = self.nodes[i as usize]
            .groups
            .as_mut()
            .expect("the node runs no groups (Network::start_groups)");
        let r = f(groups, now);
        self.after(i);
        r
    }

    /// Hands node `i`'s directory a request (register, unregister, whereis, ...) at the
    /// current time, then carries out what it produced. Panics if the node runs no directory.
    pub fn names<R>(&mut self, i: u32, f: impl FnOnce(&mut Directory<SimId>, Duration) -> R) -> R {
        let now = self.now_d();
        let dir = self.nodes[i as usize]
            .names
            .as_mut()
            .expect("the node runs no directory (Network::start_names)");
        let r = f(dir, now);
        self.after(i);
        r
    }

    /// The runtime's first hop from node `i` toward `to`.
    fn first_hop(&self, i: u32, to: &SimId) -> Option<NextHop<SimId>> {
        let node = &self.nodes[i as usize];
        let direct = node
            .conns
            .iter()
            .find(|c| c.peer == to.index && !c.failing)
            .map(|c| &self.nodes[c.peer as usize].id)
            .map(|id| Direct {
                id,
                up: node.machine.is_up(id),
            });
        let route = || node.machine.route(&to.index).cloned();
        let connected = |via: &SimId| {
            node.conns.iter().any(|c| {
                c.peer == via.index && !c.failing && self.nodes[c.peer as usize].id == *via
            })
        };
        next_hop(node.machine.liveness(), to, direct, route, connected).ok()
    }

    /// Processes events up to time `until`.
    pub fn run_until(&mut self, until: Micros) {
        while let Some(ev) = self.q.pop_until(until) {
            self.handle(ev);
        }
        self.q.now = self.q.now.max(until);
    }

    /// Processes events for `d` of simulated time.
    pub fn run_for(&mut self, d: Duration) {
        self.run_until(self.q.now + us(d));
    }

    /// The graph of neighbours among live nodes.
    pub fn graph(&self) -> Graph {
        let n = self.nodes.len();
        let mut parent: Vec<u32> = (0..n as u32).collect();
        let (mut links, mut symmetric, mut isolated) = (0u64, 0u64, 0);
        for (i, node) in self.nodes.iter().enumerate().filter(|(_, n)| n.alive) {
            let view = node.machine.neighbors();
            if view.is_empty() {
                isolated += 1;
            }
            for a in view {
                let j = a.index as usize;
                if j >= n || !self.nodes[j].alive {
                    continue;
                }
                links += 1;
                if self.nodes[j]
                    .machine
                    .neighbors()
                    .binary_search(&node.id)
                    .is_ok()
                {
                    symmetric += 1;
                }
                let (ri, rj) = (find(&mut parent, i as u32), find(&mut parent, j as u32));
                if ri != rj {
                    parent[ri as usize] = rj;
                }
            }
        }
        let components = (0..n)
            .filter(|&i| self.nodes[i].alive && find(&mut parent, i as u32) == i as u32)
            .count();
        Graph {
            components,
            isolated,
            symmetry: if links == 0 {
                1.0
            } else {
                symmetric as f64 / links as f64
            },
        }
    }

    /// Links on a shortest path from `a` to `b` over the live nodes' active views (each node's
    /// own view; `None`: no path). What a routed message between them could take at best.
    pub fn distance(&self, a: u32, b: u32) -> Option<u32> {
        let n = self.nodes.len();
        let (a, b) = (a as usize, b as usize);
        if a >= n || b >= n || !self.nodes[a].alive || !self.nodes[b].alive {
            return None;
        }
        let mut dist = vec![u32::MAX; n];
        let mut queue = std::collections::VecDeque::from([a]);
        dist[a] = 0;
        while let Some(i) = queue.pop_front() {
            if i == b {
                return Some(dist[i]);
            }
            for nb in self.nodes[i].machine.neighbors() {
                let j = nb.index as usize;
                if j < n && self.nodes[j].alive && dist[j] == u32::MAX {
                    dist[j] = dist[i] + 1;
                    queue.push_back(j);
                }
            }
        }
        None
    }

    fn cut(&self, a: u32, b: u32) -> bool {
        self.side
            .as_ref()
            .is_some_and(|s| s[a as usize] != s[b as usize])
    }

    fn lat(&mut self) -> Micros {
        let jitter = us(self.cfg.jitter);
        us(self.cfg.latency)
            + if jitter > 0 {
                self.rng.gen_range(0..jitter)
            } else {
                0
            }
    }

    fn remove_conn(&mut self, node: u32, peer: u32, gen: u32) -> bool {
        let conns = &mut self.nodes[node as usize].conns;
        match conns.iter().position(|c| c.peer == peer && c.gen == gen) {
            Some(p) => {
                conns.swap_remove(p);
                true
            }
            None => false,
        }
    }

    fn conn(&mut self, node: u32, peer: u32) -> Option<&mut Conn> {
        self.nodes[node as usize]
            .conns
            .iter_mut()
            .find(|c| c.peer == peer)
    }

    /// Opens a connection from `i` to the node `j` (the incarnation `want`, if given).
    fn connect_to(&mut self, i: u32, j: u32, want: Option<SimId>) {
        if i == j || j as usize >= self.nodes.len() || self.conn(i, j).is_some() {
            return;
        }
        self.gen += 1;
        let gen = self.gen;
        let now = self.q.now;
        let target = &self.nodes[j as usize];
        let stale = want.is_some_and(|w| w != target.id);
        let cut = self.cut(i, j);
        if !target.alive || stale || cut {
            let c = Conn {
                peer: j,
                gen,
                fifo: 0,
                failing: true,
            };
            self.nodes[i as usize].conns.push(c);
            // A dead node's port refuses the dial; across a partition it goes unanswered.
            let why = if cut {
                Disconnect::Inconclusive
            } else {
                Disconnect::Lost
            };
            let d = Ev::Down {
                node: i,
                peer: j,
                gen: Some(gen),
                why,
            };
            self.q.push(now + us(self.cfg.detect), d);
            return;
        }
        // A failed attempt of j towards i is superseded: j hears of its failure first.
        if let Some(p) = self.nodes[j as usize]
            .conns
            .iter()
            .position(|c| c.peer == i)
        {
            self.nodes[j as usize].conns.swap_remove(p);
            let d = Ev::Down {
                node: j,
                peer: i,
                gen: None,
                why: Disconnect::Lost,
            };
            self.q.push(now, d);
        }
        let at = now + self.lat();
        for (a, b) in [(i, j), (j, i)] {
            let c = Conn {
                peer: b,
                gen,
                fifo: at,
                failing: false,
            };
            self.nodes[a as usize].conns.push(c);
            self.q.push(
                at,
                Ev::Up {
                    node: a,
                    peer: b,
                    gen,
                },
            );
        }
    }

    fn connect(&mut self, i: u32, j: u32) {
        self.connect_to(i, j, None);
    }

    /// Closes `i`'s connection to `j` gracefully: `j` hears a goodbye after what was sent.
    fn close(&mut self, i: u32, j: u32) {
        let Some(p) = self.nodes[i as usize]
            .conns
            .iter()
            .position(|c| c.peer == j)
        else {
            return;
        };
        let c = self.nodes[i as usize].conns.swap_remove(p);
        if !c.failing && self.remove_conn(j, i, c.gen) {
            let at = (self.q.now + self.lat()).max(c.fifo);
            let ev = Ev::Down {
                node: j,
                peer: i,
                gen: Some(c.gen),
                why: Disconnect::Bye,
            };
            self.q.push(at, ev);
        }
    }

    fn send(&mut self, i: u32, j: u32, wire: Wire) {
        let now = self.q.now;
        let lat = self.lat();
        let dead =
            j as usize >= self.nodes.len() || !self.nodes[j as usize].alive || self.cut(i, j);
        let Some(c) = self.conn(i, j) else {
            self.counters.unconnected += 1;
            return self.lose(wire);
        };
        if c.failing || dead {
            self.counters.lost += 1;
            return self.lose(wire);
        }
        let at = (now + lat).max(c.fifo);
        c.fifo = at;
        self.counters.messages += 1;
        self.q.push(
            at,
            Ev::Msg {
                from: i,
                to: j,
                wire,
            },
        );
    }

    fn lose(&mut self, wire: Wire) {
        if let Wire::Routed { body, .. } = wire {
            self.ended(body, RoutedOutcome::Lost);
        }
    }

    /// A routed message that did not arrive.
    fn ended(&mut self, body: Body, outcome: RoutedOutcome) {
        match body {
            Body::Probe(token) => self.observer.on_routed(token, outcome),
            Body::Service { which, .. } => self.counters.service(which, false),
        }
    }

    /// Shows node `i` to the observer, carries out its outputs and schedules its next timer.
    fn after(&mut self, i: u32) {
        let now = self.q.now;
        self.observer.on_input(now, i, &self.nodes);
        while let Some(out) = self.nodes[i as usize].machine.poll_output() {
            match out {
                Output::Connect(p) => self.connect_to(i, p.index, Some(p)),
                Output::Dial(_) => {}
                Output::Close(p) => self.close(i, p.index),
                Output::Send {
                    to,
                    protocol,
                    payload,
                } => {
                    self.counters.protocol += 1;
                    self.send(i, to.index, Wire::Proto(protocol, payload))
                }
                other => {
                    if let Output::Members(m) = &other {
                        self.nodes[i as usize].services_hear_members(Duration::from_micros(now), m);
                    }
                    self.observer.on_output(now, i, &other);
                }
            }
        }
        self.drain_services(i);
        let node = &mut self.nodes[i as usize];
        let earliest = match (node.machine.poll_timeout(), node.services_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // Rounded up: a wake-up before the deadline would find nothing due.
        let next =
            earliest.map(|d| d.as_nanos().div_ceil(1000).min(u128::from(u64::MAX)) as Micros);
        if next.is_some() && next != node.wake {
            node.wake = next;
            if let Some(at) = next {
                self.q.push(at, Ev::Wake { node: i, at });
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        let now = self.now_d();
        match ev {
            Ev::Msg { from, to, wire } => {
                if !self.nodes[to as usize].alive || self.cut(from, to) {
                    self.counters.lost += 1;
                    return self.lose(wire);
                }
                match wire {
                    Wire::Proto(protocol, payload) => {
                        if self.observer.lose(from, to, protocol, &payload) {
                            self.counters.lost += 1;
                            return;
                        }
                        self.observer.on_message(from, to, protocol, &payload);
                        let sender = self.nodes[from as usize].id;
                        let m = &mut self.nodes[to as usize].machine;
                        let r = match protocol {
                            Protocol::Overlay => m.handle_overlay_msg(now, &sender, &payload),
                            Protocol::Broadcast => m.handle_broadcast_msg(now, &sender, &payload),
                        };
                        if r.is_err() {
                            self.counters.malformed += 1;
                        }
                        self.after(to);
                    }
                    Wire::Routed {
                        body,
                        to: dst,
                        hops,
                    } => self.forward(from, to, body, dst, hops),
                }
            }
            Ev::Up { node, peer, gen } => {
                let n = &self.nodes[node as usize];
                let current = n.conns.iter().any(|c| c.peer == peer && c.gen == gen);
                if current && n.alive {
                    let p = self.nodes[peer as usize].id;
                    self.nodes[node as usize].machine.handle_connected(now, &p);
                    self.after(node);
                }
            }
            Ev::Down {
                node,
                peer,
                gen,
                why,
            } => {
                if !self.nodes[node as usize].alive {
                    return;
                }
                if let Some(g) = gen {
                    let conns = &mut self.nodes[node as usize].conns;
                    match conns.iter().position(|c| c.peer == peer) {
                        Some(p) if conns[p].gen == g => {
                            conns.swap_remove(p);
                        }
                        Some(_) => return,
                        None => {}
                    }
                }
                let p = self.nodes[peer as usize].id;
                self.nodes[node as usize]
                    .machine
                    .handle_disconnected(now, &p, why);
                self.after(node);
            }
            Ev::Wake { node, at } => {
                let n = &mut self.nodes[node as usize];
                if n.alive && n.wake == Some(at) {
                    n.wake = None;
                    n.machine.handle_timeout(now);
                    n.services_timeout(now);
                    self.after(node);
                }
            }
            Ev::Join { node, contact } => {
                let up = self.nodes[node as usize]
                    .conns
                    .iter()
                    .any(|c| c.peer == contact && !c.failing);
                if self.nodes[node as usize].alive && up {
                    let c = self.nodes[contact as usize].id;
                    self.nodes[node as usize].machine.handle_join(now, &c);
                    self.after(node);
                }
            }
        }
    }

    /// A routed message arrived at `at` from neighbour `came_from`.
    fn forward(&mut self, came_from: u32, at: u32, body: Body, to: SimId, hops: u16) {
        let me = self.nodes[at as usize].id;
        let prev = self.nodes[came_from as usize].id;
        let limit = self.cfg.hop_limit;
        let decision = forward(&me, &prev, &to, hops, limit, |d| {
            self.first_hop(at, d).map(|h| match h {
                NextHop::Direct => *d,
                NextHop::Via(v) => v,
            })
        });
        match decision {
            ForwardDecision::Deliver => match body {
                Body::Probe(token) => self
                    .observer
                    .on_routed(token, RoutedOutcome::Delivered(hops)),
                Body::Service {
                    which,
                    from,
                    payload,
                } => self.deliver_service(at, which, from, &payload),
            },
            ForwardDecision::ForwardTo(next) => {
                let hops = hops.saturating_add(1);
                self.send(at, next.index, Wire::Routed { body, to, hops });
            }
            ForwardDecision::Drop(DropReason::NoRoute) => self.ended(body, RoutedOutcome::NoRoute),
            ForwardDecision::Drop(DropReason::HopLimit) => {
                self.ended(body, RoutedOutcome::HopLimit)
            }
        }
    }

    /// A service's message for node `at` arrived (a node that does not run that service drops
    /// it).
    fn deliver_service(&mut self, at: u32, which: Which, from: SimId, payload: &[u8]) {
        let now = self.now_d();
        match self.nodes[at as usize].services_deliver(which, now, from, payload) {
            Ok(true) => self.after(at),
            Ok(false) => self.counters.service(which, false),
            Err(()) => self.counters.malformed += 1,
        }
    }

    /// Carries out what node `i`'s services produced.
    fn drain_services(&mut self, i: u32) {
        let now = self.q.now;
        let me = self.nodes[i as usize].id;
        while let Some(out) = self.nodes[i as usize].services_poll() {
            match out {
                ServiceOut::Send { which, to, payload } => {
                    self.counters.service(which, true);
                    let Some(payload) = payload else {
                        self.counters.service(which, false);
                        continue;
                    };
                    let body = Body::Service {
                        which,
                        from: me,
                        payload,
                    };
                    if !self.send_routed(i, to, body) {
                        self.counters.service(which, false);
                    }
                }
                ServiceOut::Names(answer) => self.observer.on_names(now, i, &answer),
            }
        }
    }
}

fn find(parent: &mut [u32], mut x: u32) -> u32 {
    while parent[x as usize] != x {
        let p = parent[x as usize];
        parent[x as usize] = parent[p as usize];
        x = p;
    }
    x
}
