//! A plain-text rendering of [`Status`] for people (`maquis status`).

use std::fmt::Write as _;

use super::Status;

impl Status {
    /// Renders the status as a plain-text table for people: a line about the node, a line with
    /// the members, then one row per lane of each peer (peer, address, up, heartbeat round trip,
    /// channel, index, connected, what it carries now — `small` messages, `striped` messages'
    /// parts, `both` or `-` —, messages out/in, bytes out/in, queued bytes, dropped), a peer
    /// without lanes getting one row of its own, and finally the node's counters, if any.
    /// Ends with a newline.
    pub fn render_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "node {}  incarnation {}  overlay {}  listen {}",
            cell(&self.name),
            self.incarnation,
            cell(&self.overlay),
            cell(&self.listen)
        );
        let members: Vec<String> = self.members.iter().map(|m| cell(m)).collect();
        let _ = writeln!(
            out,
            "members ({}): {}",
            members.len(),
            if members.is_empty() {
                "-".to_owned()
            } else {
                members.join(", ")
            }
        );

        if self.peers.is_empty() {
            out.push_str("no peers\n");
        } else {
            let mut rows = vec![HEADER.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
            for peer in &self.peers {
                let peer_cells = [
                    cell(&peer.name),
                    cell(&peer.addr),
                    if peer.up { "up" } else { "down" }.to_owned(),
                    peer.rtt_us.map_or_else(|| "-".to_owned(), duration),
                ];
                if peer.lanes.is_empty() {
                    let mut row = peer_cells.to_vec();
                    row.resize(HEADER.len(), "-".to_owned());
                    rows.push(row);
                }
                for lane in &peer.lanes {
                    let mut row = peer_cells.to_vec();
                    row.extend([
                        cell(&lane.channel),
                        lane.index.to_string(),
                        if lane.connected { "yes" } else { "no" }.to_owned(),
                        carries(lane.small, lane.striped).to_owned(),
                        lane.msgs_out.to_string(),
                        lane.msgs_in.to_string(),
                        bytes(lane.bytes_out),
                        bytes(lane.bytes_in),
                        bytes(lane.queued_bytes),
                        lane.dropped.to_string(),
                    ]);
                    rows.push(row);
                }
            }
            render_rows(&mut out, &rows);
        }

        if !self.counters.is_empty() {
            out.push_str("counters:\n");
            let width = self
                .counters
                .keys()
                .map(|k| cell(k).chars().count())
                .max()
                .unwrap_or(0);
            for (name, value) in &self.counters {
                let _ = writeln!(out, "  {:<width$}  {value}", cell(name));
            }
        }
        if !self.refusals.is_empty() {
            out.push_str(
                "refused handshakes:
",
            );
            for r in &self.refusals {
                let who = if r.by_us { "by us" } else { "by them" };
                let _ = writeln!(
                    out,
                    "  {}  {who}  x{}  {} ms ago  {}",
                    cell(&r.addr),
                    r.count,
                    r.ago_ms,
                    cell(&r.reason)
                );
            }
        }
        out
    }
}

const HEADER: [&str; 14] = [
    "PEER",
    "ADDR",
    "UP",
    "RTT",
    "CHANNEL",
    "IDX",
    "CONN",
    "CARRIES",
    "MSGS OUT",
    "MSGS IN",
    "BYTES OUT",
    "BYTES IN",
    "QUEUED",
    "DROPPED",
];

/// Columns from this one on are numbers, aligned right.
const FIRST_NUMERIC: usize = 8;

fn render_rows(out: &mut String, rows: &[Vec<String>]) {
    let mut widths = vec![0; HEADER.len()];
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    for row in rows {
        let mut line = String::new();
        for (i, (c, w)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if i >= FIRST_NUMERIC {
                let _ = write!(line, "{c:>w$}");
            } else {
                let _ = write!(line, "{c:<w$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// A value from the network, with control characters (which would break the table) replaced.
fn cell(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Bytes for people: exact below 1 KiB, else one decimal in KiB, MiB, GiB or TiB.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Microseconds for people.
fn duration(us: u64) -> String {
    if us < 1_000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        format!("{:.1}ms", us as f64 / 1_000.0)
    } else {
        format!("{:.2}s", us as f64 / 1_000_000.0)
    }
}

/// What a lane carries now, in a word.
fn carries(small: bool, striped: bool) -> &'static str {
    match (small, striped) {
        (true, true) => "both",
        (true, false) => "small",
        (false, true) => "striped",
        (false, false) => "-",
    }
}

#[cfg(test)]
mod tests {
    use super::{bytes, duration};

    #[test]
    fn human_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(5 * 1024 * 1024), "5.0 MiB");
        assert_eq!(duration(250), "250µs");
        assert_eq!(duration(1_500), "1.5ms");
        assert_eq!(duration(2_000_000), "2.00s");
    }
}
