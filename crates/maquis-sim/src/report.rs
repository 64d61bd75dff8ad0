//! What a simulation measured.

use std::fmt;

use serde::Serialize;

/// The metrics of one simulation run (serialized with these field names).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The scenario's name.
    pub name: String,
    /// The overlay simulated.
    pub overlay: String,
    /// Nodes started in all (bootstrap and churn).
    pub nodes: usize,
    /// Nodes alive at the end.
    pub live: usize,
    /// Connected components of the active-view graph among live nodes, at the end.
    pub components: usize,
    /// Live nodes with an empty active view, at the end.
    pub isolated: usize,
    /// Fraction of active-view links between live nodes that both ends have, at the end.
    pub symmetry: f64,
    /// Fraction of the live nodes that delivered the first broadcast after the fault.
    pub delivery_first: f64,
    /// Mean delivery fraction of the next `broadcasts` (100 by default) broadcasts.
    pub delivery_mean_100: f64,
    /// Delivery fraction of the last of those.
    pub delivery_last: f64,
    /// Relative message redundancy, mean over the measured broadcasts: payload messages
    /// received / (nodes reached − 1) − 1. 0 is a perfect tree.
    pub rmr: f64,
    /// Last delivery hop: hops to the farthest node, mean over the measured broadcasts.
    pub ldh: f64,
    /// Shuffle periods after the fault (or the heal, or the end of churn) until the active-view
    /// graph is connected and every broadcast from then on reaches all live nodes; `None`: not
    /// within the healing window.
    pub healing_periods: Option<u32>,
    /// Fraction of routed sends between random live pairs that arrived (`None`: not measured).
    pub routed_delivery: Option<f64>,
    /// Routed messages dropped on the way because a node knew no way on.
    pub routed_no_route: u64,
    /// Routed messages dropped at the hop limit.
    pub routed_hop_limit: u64,
    /// Routed messages whose sender had no connection and no route.
    pub routed_unreachable: u64,
    /// Routed messages lost with a connection or a crashed node.
    pub routed_lost: u64,
    /// Links travelled by the routed messages that arrived, mean (`None`: none arrived).
    pub routed_links: Option<f64>,
    /// Links of a shortest path over the active views between the two ends of each routed
    /// message when it was sent, mean: what the routes could take at best.
    pub routed_shortest: Option<f64>,
    /// Massive failure: per crashed node, the time from the crash until every node that
    /// counted it a member then (and is alive at the end) reported it down; the median over
    /// the crashed nodes, in ms (`None`: no crash detected).
    pub detect_p50_ms: Option<f64>,
    /// The same, the slowest crashed node.
    pub detect_max_ms: Option<f64>,
    /// Crashed nodes that some node counting them a member never reported down.
    pub undetected: usize,
    /// `Down` events, over the whole run, about nodes that never crashed (false positives;
    /// each node reporting one counts).
    pub false_downs: u64,
    /// Wall-clock time of the run.
    pub wall_ms: u64,
    /// Peak resident memory of the process so far (VmHWM), in KiB.
    pub peak_rss_kb: u64,
    /// Messages sent in the simulation.
    pub messages: u64,
    /// GRAFTs sent (tree repairs), over the whole run.
    pub grafts: u64,
    /// PRUNEs sent (redundant links cut), over the whole run.
    pub prunes: u64,
    /// The messages of the whole run, by kind.
    pub traffic: Traffic,
}

/// Messages sent in a simulation, by kind (their sum is [`Report::messages`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Traffic {
    /// The overlay's own messages (joins, shuffles, views).
    pub overlay: u64,
    /// Broadcast payloads of the scenario's own broadcasts (eager pushes and graft answers).
    pub payloads: u64,
    /// Broadcast payloads of the runtime's notices (down and leave notices), copies.
    pub notices: u64,
    /// Distinct notices (broadcasts) among them.
    pub notices_distinct: u64,
    /// Broadcast payloads on any other topic.
    pub other_payloads: u64,
    /// Member heartbeats (eager pushes and graft answers).
    pub heartbeats: u64,
    /// IHAVE messages (each a batch of announcements).
    pub ihaves: u64,
    /// The announcements in them.
    pub announcements: u64,
    /// GRAFTs asking for a missing broadcast payload.
    pub grafts_payload: u64,
    /// GRAFTs asking for a missing heartbeat.
    pub grafts_heartbeat: u64,
    /// GRAFTs that only move the tree (a shorter path was announced).
    pub grafts_tree: u64,
    /// PRUNEs.
    pub prunes: u64,
}

impl Traffic {
    /// The column names of [`Traffic::row`], Markdown style.
    pub fn header() -> String {
        "| scenario | overlay msgs | payloads | notices (distinct) | other payloads | heartbeats | ihaves \
         (announcements) | grafts: payload / heartbeat / tree | prunes |\n\
         |---|---|---|---|---|---|---|---|---|"
            .to_string()
    }

    /// One Markdown table row, named `name`.
    pub fn row(&self, name: &str) -> String {
        format!(
            "| {name} | {} | {} | {} ({}) | {} | {} | {} ({}) | {} / {} / {} | {} |",
            self.overlay,
            self.payloads,
            self.notices,
            self.notices_distinct,
            self.other_payloads,
            self.heartbeats,
            self.ihaves,
            self.announcements,
            self.grafts_payload,
            self.grafts_heartbeat,
            self.grafts_tree,
            self.prunes
        )
    }
}

impl Report {
    /// The column names of [`Report::row`], Markdown style.
    pub fn header() -> String {
        "| scenario | overlay | nodes | live | components | isolated | symmetry | delivery_first | \
         delivery_mean_100 | delivery_last | rmr | ldh | healing_periods | routed_delivery | \
         routed drops (no route / hop limit / unreachable / lost) | routed links (shortest) | detect p50 / max ms | \
         undetected | false_downs | messages | grafts | prunes | wall_ms | peak_rss_kb |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
            .to_string()
    }

    /// One Markdown table row.
    pub fn row(&self) -> String {
        let heal = self
            .healing_periods
            .map_or("never".to_string(), |h| h.to_string());
        let routed = self
            .routed_delivery
            .map_or("-".to_string(), |r| format!("{:.4}", r));
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        let links = match (self.routed_links, self.routed_shortest) {
            (Some(l), Some(s)) => format!("{l:.2} ({s:.2})"),
            (Some(l), None) => format!("{l:.2}"),
            _ => "-".to_string(),
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.3} | {:.1} | {} | {} | {} / {} / {} / {} | {} | {} / {} | {} | {} | {} | {} | {} | {} | {} |",
            self.name,
            self.overlay,
            self.nodes,
            self.live,
            self.components,
            self.isolated,
            self.symmetry,
            self.delivery_first,
            self.delivery_mean_100,
            self.delivery_last,
            self.rmr,
            self.ldh,
            heal,
            routed,
            self.routed_no_route,
            self.routed_hop_limit,
            self.routed_unreachable,
            self.routed_lost,
            links,
            ms(self.detect_p50_ms),
            ms(self.detect_max_ms),
            self.undetected,
            self.false_downs,
            self.messages,
            self.grafts,
            self.prunes,
            self.wall_ms,
            self.peak_rss_kb
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.row())
    }
}

/// VmHWM of this process, in KiB (0 where /proc is not available).
pub(crate) fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
