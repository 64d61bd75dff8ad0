//! Prometheus text exposition format (version 0.0.4) of a [`Status`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{LaneStatus, PeerStatus, Status};

type LaneValue = fn(&LaneStatus) -> u64;

/// The per-lane families: name, help, type, value.
const LANE_FAMILIES: [(&str, &str, &str, LaneValue); 10] = [
    (
        "maquis_lane_messages_out_total",
        "Messages sent on the lane.",
        "counter",
        |l| l.msgs_out,
    ),
    (
        "maquis_lane_messages_direct_out_total",
        "Messages sent on the lane that their senders wrote themselves (the lane had nothing queued).",
        "counter",
        |l| l.direct_out,
    ),
    (
        "maquis_lane_bytes_out_total",
        "Bytes sent on the lane.",
        "counter",
        |l| l.bytes_out,
    ),
    (
        "maquis_lane_messages_in_total",
        "Messages received on the lane.",
        "counter",
        |l| l.msgs_in,
    ),
    (
        "maquis_lane_bytes_in_total",
        "Bytes received on the lane.",
        "counter",
        |l| l.bytes_in,
    ),
    (
        "maquis_lane_queued_bytes",
        "Bytes queued for sending on the lane.",
        "gauge",
        |l| l.queued_bytes,
    ),
    (
        "maquis_lane_dropped_total",
        "Messages dropped on the lane.",
        "counter",
        |l| l.dropped,
    ),
    (
        "maquis_lane_connected",
        "Whether the lane is connected (1) or not (0).",
        "gauge",
        |l| u64::from(l.connected),
    ),
    (
        "maquis_lane_small",
        "Whether messages under the striping size take the lane now (1) or not (0).",
        "gauge",
        |l| u64::from(l.small),
    ),
    (
        "maquis_lane_striped",
        "Whether striped messages' parts take the lane now (1) or not (0).",
        "gauge",
        |l| u64::from(l.striped),
    ),
];

const PEER_UP: &str = "maquis_peer_up";
const PEER_RTT: &str = "maquis_peer_heartbeat_rtt_seconds";
const MEMBERS: &str = "maquis_members";

/// Renders `status` in the Prometheus text exposition format (version 0.0.4).
///
/// Per lane, labelled `peer="n2",channel="default",index="0"`: `maquis_lane_messages_out_total`,
/// `maquis_lane_bytes_out_total`, `maquis_lane_messages_in_total`, `maquis_lane_bytes_in_total`,
/// `maquis_lane_queued_bytes` (gauge), `maquis_lane_dropped_total`, and the gauges (0 or 1)
/// `maquis_lane_connected`, `maquis_lane_small` and `maquis_lane_striped`. Per peer, labelled `peer="n2"`: `maquis_peer_up` (gauge, 0 or 1) and
/// `maquis_peer_heartbeat_rtt_seconds` (gauge, only for peers with a measured round trip).
/// For the node: `maquis_members` (gauge, the number of members) and one counter
/// `maquis_<name>_total` per entry of [`Status::counters`].
///
/// Counter names are sanitized to `[a-zA-Z0-9_]` (other characters become `_`, an empty name
/// becomes `unnamed`, and a trailing `_total` is not doubled). Counters whose sanitized names
/// coincide are added up into one series; a counter whose name would coincide with one of the
/// families above is left out. Label values are escaped (`\\`, `\"`, `\n`). Each family gets its
/// `# HELP` and `# TYPE` lines once, before its samples; a family without samples is left out.
pub fn render_metrics(status: &Status) -> String {
    let mut out = String::new();

    for (name, help, kind, value) in LANE_FAMILIES {
        let mut lanes = status
            .peers
            .iter()
            .flat_map(|p| p.lanes.iter().map(move |l| (p, l)))
            .peekable();
        if lanes.peek().is_some() {
            family_header(&mut out, name, help, kind);
        }
        for (peer, lane) in lanes {
            let _ = writeln!(
                out,
                "{name}{{peer=\"{}\",channel=\"{}\",index=\"{}\"}} {}",
                escape_label_value(&peer.name),
                escape_label_value(&lane.channel),
                lane.index,
                value(lane)
            );
        }
    }

    if !status.peers.is_empty() {
        family_header(
            &mut out,
            PEER_UP,
            "Whether the peer is considered up (1) or not (0).",
            "gauge",
        );
        for peer in &status.peers {
            peer_sample(&mut out, PEER_UP, peer, u8::from(peer.up));
        }
    }
    let mut with_rtt = status
        .peers
        .iter()
        .filter_map(|p| p.rtt_us.map(|rtt| (p, rtt)))
        .peekable();
    if with_rtt.peek().is_some() {
        family_header(
            &mut out,
            PEER_RTT,
            "Last measured heartbeat round-trip time to the peer.",
            "gauge",
        );
    }
    for (peer, rtt_us) in with_rtt {
        // Exact decimal seconds, no floating-point rounding.
        let seconds = format!("{}.{:06}", rtt_us / 1_000_000, rtt_us % 1_000_000);
        peer_sample(&mut out, PEER_RTT, peer, seconds);
    }

    family_header(
        &mut out,
        MEMBERS,
        "Number of members of the cluster as this node sees it.",
        "gauge",
    );
    let _ = writeln!(out, "{MEMBERS} {}", status.members.len());

    // Sanitized family name -> (original names, sum).
    let mut counters: BTreeMap<String, (Vec<&str>, u64)> = BTreeMap::new();
    for (name, value) in &status.counters {
        let family = counter_family(name);
        if is_builtin_family(&family) {
            continue;
        }
        let entry = counters.entry(family).or_default();
        entry.0.push(name);
        entry.1 = entry.1.saturating_add(*value);
    }
    for (family, (names, value)) in counters {
        let help = format!("Node counter {}.", names.join(", "));
        family_header(&mut out, &family, &help, "counter");
        let _ = writeln!(out, "{family} {value}");
    }
    for (name, value) in &status.gauges {
        let family = gauge_family(name);
        if is_builtin_family(&family) || family.ends_with("_total") {
            continue;
        }
        family_header(&mut out, &family, &format!("Node gauge {name}."), "gauge");
        let _ = writeln!(out, "{family} {value}");
    }

    out
}

fn family_header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn peer_sample(out: &mut String, name: &str, peer: &PeerStatus, value: impl std::fmt::Display) {
    let _ = writeln!(
        out,
        "{name}{{peer=\"{}\"}} {value}",
        escape_label_value(&peer.name)
    );
}

fn is_builtin_family(name: &str) -> bool {
    LANE_FAMILIES.iter().any(|f| f.0 == name) || [PEER_UP, PEER_RTT, MEMBERS].contains(&name)
}

/// `maquis_<sanitized name>` for a node gauge.
fn gauge_family(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("maquis_{clean}")
}

/// `maquis_<sanitized name>_total` for a node counter.
pub(super) fn counter_family(name: &str) -> String {
    let mut sanitized: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if let Some(stripped) = sanitized.strip_suffix("_total") {
        sanitized.truncate(stripped.len());
    }
    if sanitized.is_empty() {
        sanitized.push_str("unnamed");
    }
    format!("maquis_{sanitized}_total")
}

/// Escapes a label value as the text format requires: `\` → `\\`, `"` → `\"`, newline → `\n`.
pub(super) fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes `# HELP` text: `\` → `\\`, newline → `\n`.
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}
