//! `maquis-bench agent adcounter-host`: a process holding a range of the advertisement
//! counter's nodes, driven by `maquis-bench adcounter` one JSON command a line on stdin
//! ([`HostCmd`]), one JSON answer a line on stdout ([`HostAnswer`], or `error …`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use maquis::config::{ClientServerOptions, PeerToPeerOptions};
use maquis::overlay::Role;
use maquis::{ActorRef, Config, Node};
use maquis_adcounter::{AdMsg, Settings, Snapshot};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

/// `maquis-bench agent adcounter-host`.
#[derive(clap::Args, Debug)]
pub struct AdcounterHostArgs {
    /// The first node's index (node i is named `ad<i>` and listens on 127.0.0.1:base-port+i;
    /// node 0 is the client-server server and the peer-to-peer contact).
    #[arg(long)]
    pub first: usize,
    /// Nodes this process holds.
    #[arg(long)]
    pub count: usize,
    /// Node 0's port.
    #[arg(long)]
    pub base_port: u16,
    /// client-server or peer-to-peer.
    #[arg(long)]
    pub overlay: String,
    /// The replicas' sync interval, milliseconds.
    #[arg(long)]
    pub sync_ms: u64,
    /// Nodes in the whole cluster.
    #[arg(long)]
    pub nodes: usize,
    /// Peer-to-peer: member heartbeats the whole cluster sends a second (see [`node_config`]).
    #[arg(long)]
    pub heartbeats_per_s: u64,
    /// Every this many sync intervals, a replica's state goes again to a neighbour it sent
    /// nothing meanwhile (`Settings::resend_every`).
    #[arg(long)]
    pub resend_every: u32,
    /// Replicas send their whole state every time, not what changed (`Settings::deltas`).
    #[arg(long)]
    pub whole_states: bool,
}

/// A command to a host.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum HostCmd {
    /// Start the nodes one after another, each joining node 0 (node 0 itself just starts).
    Join {
        /// Seconds a node may take to join.
        timeout_s: u64,
    },
    /// How many members each node here sees (answer: `members`).
    Members,
    /// Start a replica on every node.
    Start,
    /// Every node's `bytes_sent` (answer: `bytes`).
    Sent,
    /// Count `increments` impressions on every replica but node 0's, over `ads` ads (answer:
    /// `at_ms`, when the last was counted).
    Count {
        /// Impressions per replica.
        increments: u64,
        /// Ads they are spread over.
        ads: usize,
    },
    /// Wait until every replica here holds `want` (answer: `at_ms`, when the last got there,
    /// as the replicas recorded it). While waiting, says every 30 s on stderr where the
    /// others stand.
    Await {
        /// The total every replica must reach.
        want: u64,
        /// Seconds to wait at most.
        timeout_s: u64,
    },
    /// Every replica's total and the encoded bytes of the states it sent (answer: `totals`,
    /// `state_bytes`).
    Totals,
    /// The process's peak resident memory (answer: `hwm_kib`).
    Memory,
    /// The nodes' counters, summed over the nodes here (answer: `counters`).
    Counters,
}

/// A host's answer; the fields the command does not set are zero or empty.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct HostAnswer {
    /// [`HostCmd::Members`], one per node in order.
    #[serde(default)]
    pub members: Vec<usize>,
    /// [`HostCmd::Sent`], one per node in order.
    #[serde(default)]
    pub bytes: Vec<u64>,
    /// [`HostCmd::Count`], [`HostCmd::Await`]: milliseconds since the Unix epoch.
    #[serde(default)]
    pub at_ms: u64,
    /// [`HostCmd::Totals`], one per replica in order.
    #[serde(default)]
    pub totals: Vec<u64>,
    /// [`HostCmd::Totals`]: the states' encoded bytes each replica sent, in order.
    #[serde(default)]
    pub state_bytes: Vec<u64>,
    /// [`HostCmd::Memory`].
    #[serde(default)]
    pub hwm_kib: u64,
    /// [`HostCmd::Counters`]: each counter's sum over the nodes here.
    #[serde(default)]
    pub counters: BTreeMap<String, u64>,
}

/// The shortest member heartbeat period, milliseconds (the configuration's default).
const MIN_HEARTBEAT_MS: u64 = 5_000;

/// The configuration of node `i` of a cluster of `n`.
///
/// Peer-to-peer members learn of each other from the heartbeats every member broadcasts:
/// every node handles every heartbeat, so the cluster handles n²/period of them a second,
/// and here the whole cluster shares one machine. The period grows with the cluster so that
/// the cluster sends `heartbeats_per_s` a second (`broadcast.member_heartbeat_ms` = n /
/// rate, at least 5 s; the configuration's guidance is n ÷ period at 100 a second or below),
/// a member times out after three periods, and an accused member is suspected for one.
pub fn node_config(
    i: usize,
    n: usize,
    base_port: u16,
    overlay: &str,
    heartbeats_per_s: u64,
) -> Result<Config, String> {
    let listen = addr(base_port, i)?;
    let mut cfg = Config::new(format!("ad{i}"))
        .listen(listen)
        .cookie("adcounter-bench");
    cfg = match overlay {
        "client-server" => cfg.overlay(ClientServerOptions {
            role: if i == 0 { Role::Server } else { Role::Client },
            servers_per_client: 1,
            ..ClientServerOptions::default()
        }),
        "peer-to-peer" => cfg.overlay(PeerToPeerOptions {
            shuffle_period_ms: 10_000,
            ..PeerToPeerOptions::default()
        }),
        other => {
            return Err(format!(
                "unknown overlay {other:?} (client-server, peer-to-peer)"
            ))
        }
    };
    // Hundreds of nodes on two cores: a node's runtime may not get the CPU for a second or
    // more. Connection heartbeats every 10 s (a node also recomputes its routes at that
    // period, a pass over every member), a connection lost after 30 s of silence, and a
    // handshake's proof of the cookie awaited as long as the whole handshake.
    cfg.transport.heartbeat_timeout_ms = 30_000;
    cfg.transport.heartbeat_interval_ms = 30_000 / 3;
    cfg.transport.unauthenticated_timeout_ms = cfg.transport.handshake_timeout_ms;
    // Every node dials from 127.0.0.1: the limit per source address is the overall one.
    cfg.transport.max_pending_handshakes_per_source = cfg.transport.max_pending_handshakes;
    let period = (n as u64 * 1_000 / heartbeats_per_s.max(1)).max(MIN_HEARTBEAT_MS);
    cfg.broadcast.member_heartbeat_ms = period;
    cfg.broadcast.member_timeout_ms = 3 * period;
    // An accused member refutes with a heartbeat that must reach every node before its
    // suspicion ends; through a loaded machine that takes seconds, not the default 1 s (at
    // 1,024 nodes with it, members were declared down 2,600 times a second and came back).
    cfg.broadcast.suspicion_ms = period;
    Ok(cfg)
}

/// Node `i`'s address.
pub fn addr(base_port: u16, i: usize) -> Result<SocketAddr, String> {
    u16::try_from(base_port as usize + i)
        .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
        .map_err(|_| format!("node {i}: port {base_port} + {i} is past the last port"))
}

fn settings(a: &AdcounterHostArgs) -> Settings {
    Settings {
        limit: u64::MAX,
        max_ads: 1024,
        sync_every: Duration::from_millis(a.sync_ms),
        resend_every: a.resend_every,
        deltas: !a.whole_states,
    }
}

/// How long a replica may take to answer.
const T: Duration = Duration::from_secs(30);

/// The pause between two rounds of [`HostCmd::Await`]'s reads (the rounds do not time the
/// convergence: each replica records when its total last changed).
const POLL: Duration = Duration::from_millis(50);

/// How often a host still waiting for its replicas says where they are (on its stderr, the
/// cell's `hosts.log`).
const AWAIT_REPORT: Duration = Duration::from_secs(30);

async fn snapshot(r: &ActorRef<AdMsg>) -> Result<Snapshot, String> {
    r.call(AdMsg::Read, T).await.map_err(|e| e.to_string())
}

/// The host: runs until stdin closes.
pub async fn host(a: AdcounterHostArgs) -> Result<(), String> {
    crate::debench_agent::raise_fd_limit();
    let mut nodes: Vec<Node> = Vec::with_capacity(a.count);
    let mut replicas: Vec<ActorRef<AdMsg>> = Vec::new();
    println!("ready");
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let answer = match serde_json::from_str::<HostCmd>(&line) {
            Ok(cmd) => handle(&a, cmd, &mut nodes, &mut replicas).await,
            Err(e) => Err(format!("bad command {line:?}: {e}")),
        };
        match answer {
            Ok(ans) => println!(
                "{}",
                serde_json::to_string(&ans).map_err(|e| e.to_string())?
            ),
            Err(e) => println!("error {}", e.replace('\n', " ")),
        }
    }
    for n in nodes {
        n.shutdown().await;
    }
    Ok(())
}

async fn handle(
    a: &AdcounterHostArgs,
    cmd: HostCmd,
    nodes: &mut Vec<Node>,
    replicas: &mut Vec<ActorRef<AdMsg>>,
) -> Result<HostAnswer, String> {
    let mut ans = HostAnswer::default();
    match cmd {
        HostCmd::Join { timeout_s } => {
            let contact = addr(a.base_port, 0)?;
            for i in a.first + nodes.len()..a.first + a.count {
                let cfg = node_config(i, a.nodes, a.base_port, &a.overlay, a.heartbeats_per_s)?;
                let node = Node::start(cfg).await.map_err(|e| format!("ad{i}: {e}"))?;
                if i != 0 {
                    node.join_wait(contact, Duration::from_secs(timeout_s))
                        .await
                        .map_err(|e| format!("ad{i} cannot join: {e}"))?;
                }
                nodes.push(node);
            }
        }
        HostCmd::Members => {
            ans.members = nodes.iter().map(Node::member_count).collect();
        }
        HostCmd::Start => {
            if replicas.is_empty() {
                for n in nodes.iter() {
                    let r = maquis_adcounter::start(n, settings(a)).map_err(|e| e.to_string())?;
                    replicas.push(r);
                }
            }
        }
        HostCmd::Sent => {
            ans.bytes = nodes
                .iter()
                .map(|n| n.status().counters["bytes_sent"])
                .collect();
        }
        HostCmd::Count { increments, ads } => {
            // The replicas count at once, each its impressions in order (one replica after
            // another, each impression waited behind the states queued at every replica).
            let mut counting = tokio::task::JoinSet::new();
            for (k, r) in replicas.iter().enumerate() {
                let i = a.first + k;
                if i == 0 {
                    continue;
                }
                let r = r.clone();
                counting.spawn(async move {
                    for j in 0..increments {
                        let ad = format!("ad{}", (i as u64 + j) % ads.max(1) as u64);
                        r.call(|reply| AdMsg::Impression { ad, reply }, T)
                            .await
                            .map_err(|e| e.to_string())?
                            .map_err(|e| format!("not counted: {e}"))?;
                    }
                    Ok::<(), String>(())
                });
            }
            while let Some(done) = counting.join_next().await {
                done.map_err(|e| e.to_string())??;
            }
            ans.at_ms = maquis_adcounter::unix_ms();
        }
        HostCmd::Await { want, timeout_s } => {
            let started = Instant::now();
            let deadline = started + Duration::from_secs(timeout_s);
            let mut next_report = started + AWAIT_REPORT;
            // The replicas not there yet, all read at once each round (counts only grow: one
            // that got there stays there). When the last got there is its own record of its
            // total's last change, not the instant a read found it.
            let mut short: Vec<usize> = (0..replicas.len()).collect();
            while !short.is_empty() {
                let mut round = tokio::task::JoinSet::new();
                for &k in &short {
                    let r = replicas[k].clone();
                    round.spawn(async move { (k, snapshot(&r).await) });
                }
                let mut seen = Vec::with_capacity(short.len());
                let left = deadline.saturating_duration_since(Instant::now());
                // Past the deadline the reads still out are dropped with the round.
                if let Ok(Err(e)) = tokio::time::timeout(left, async {
                    while let Some(read) = round.join_next().await {
                        seen.push(read.map_err(|e| e.to_string())?);
                    }
                    Ok::<(), String>(())
                })
                .await
                {
                    return Err(e);
                }
                let (mut low, mut high, mut resends) = (u64::MAX, 0, 0);
                for (k, snap) in seen {
                    let snap = snap?;
                    if snap.total >= want {
                        ans.at_ms = ans.at_ms.max(snap.total_changed_ms);
                        short.retain(|&j| j != k);
                    } else {
                        low = low.min(snap.total);
                        high = high.max(snap.total);
                        resends += snap.resends;
                    }
                }
                if short.is_empty() {
                    break;
                }
                let progress = || {
                    format!(
                        "{} of {} replicas hold {want}; the others hold {}..{high} and resent {resends} states",
                        replicas.len() - short.len(),
                        replicas.len(),
                        if low == u64::MAX { 0 } else { low },
                    )
                };
                if Instant::now() >= deadline {
                    return Err(format!("after {timeout_s} s, {}", progress()));
                }
                if Instant::now() >= next_report {
                    next_report += AWAIT_REPORT;
                    eprintln!(
                        "host of nodes {}..{}, {:.0} s waiting: {}",
                        a.first,
                        a.first + a.count,
                        started.elapsed().as_secs_f64(),
                        progress()
                    );
                }
                tokio::time::sleep(POLL).await;
            }
        }
        HostCmd::Totals => {
            // All at once: one after another, a loaded host of 128 took minutes.
            let mut reads = tokio::task::JoinSet::new();
            for (k, r) in replicas.iter().enumerate() {
                let r = r.clone();
                reads.spawn(async move { (k, snapshot(&r).await) });
            }
            let mut snaps: Vec<Option<Snapshot>> = vec![None; replicas.len()];
            while let Some(read) = reads.join_next().await {
                let (k, snap) = read.map_err(|e| e.to_string())?;
                snaps[k] = Some(snap?);
            }
            for s in snaps.into_iter().flatten() {
                ans.totals.push(s.total);
                ans.state_bytes.push(s.state_bytes);
            }
        }
        HostCmd::Memory => ans.hwm_kib = crate::stats::proc_status_kib("VmHWM:"),
        HostCmd::Counters => {
            for n in nodes.iter() {
                for (k, v) in n.counters().snapshot() {
                    *ans.counters.entry(k).or_default() += v;
                }
            }
        }
    }
    Ok(ans)
}
