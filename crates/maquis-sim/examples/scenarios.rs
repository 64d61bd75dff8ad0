//! Runs the standard scenarios and prints a Markdown table.
//!
//! `cargo run --release -p maquis-sim --example scenarios -- [nodes] [scenario names...]`

use maquis_sim::{run, Report, Scenario};

fn main() {
    let mut args = std::env::args().skip(1);
    let nodes = args.next().and_then(|n| n.parse().ok()).unwrap_or(1000);
    let only: Vec<String> = args.collect();
    println!("{}", Report::header());
    for mut s in Scenario::standard(nodes) {
        if let Some(ms) = std::env::var("SIM_EVERY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            s.broadcast_every = std::time::Duration::from_millis(ms);
        }
        if let Some(ms) = std::env::var("SIM_GRAFT_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            s.plumtree.graft_timeout = std::time::Duration::from_millis(ms);
            s.plumtree.graft_retry = std::time::Duration::from_millis(ms / 2);
        }
        if let Some(ms) = std::env::var("SIM_JITTER_MS")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            s.jitter = std::time::Duration::from_millis(ms);
        }
        if let Some(t) = std::env::var("SIM_PRUNE").ok().and_then(|v| v.parse().ok()) {
            s.plumtree.prune_credit = t;
        }
        if let Some(t) = std::env::var("SIM_ROUTED")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            s.routed_sends = t;
        }
        if let Some(ms) = std::env::var("SIM_HB_MS").ok().and_then(|v| v.parse().ok()) {
            s.member_heartbeat = Some(std::time::Duration::from_millis(ms));
        }
        if let Some(t) = std::env::var("SIM_HOP").ok().and_then(|v| v.parse().ok()) {
            s.hop_limit = t;
        }
        if let Some(t) = std::env::var("SIM_OPT").ok().and_then(|v| v.parse().ok()) {
            s.plumtree.optimization_threshold = t;
        }
        if only.is_empty() || only.contains(&s.name) {
            println!("{}", run(&s));
        }
    }
}
