//! The flat layout of earlier versions (`parallelism = 4` at the top of the file,
//! `MAQUIS_PARALLELISM`, `hyparview_active_size`, `overlay = "static"`): one table from each old
//! name to its key now, which makes the error for the old TOML key and for the old environment
//! variable alike.

use super::keys::{env_name, ENV_PREFIX, OVERLAY_KIND};
use super::{ConfigError, OverlayKind};

/// Each option of the flat layout: its name, its dotted key now, and for an overlay's option the
/// overlay that has it.
pub(super) const MOVED: &[(&str, &str, Option<OverlayKind>)] = &[
    ("name", "node.name", None),
    ("listen", "node.listen", None),
    ("admin", "node.admin", None),
    ("cookie", "node.cookie", None),
    ("overlay", OVERLAY_KIND, None),
    ("peers", "node.peers", None),
    ("mailbox_capacity", "node.mailbox_capacity", None),
    ("event_buffer", "node.event_buffer", None),
    ("channels", "transport.channels", None),
    ("parallelism", "transport.parallelism", None),
    ("affinity", "transport.affinity", None),
    ("lane_queue_bytes", "transport.lane_queue_bytes", None),
    ("node_queue_bytes", "transport.node_queue_bytes", None),
    ("max_frame_bytes", "transport.max_frame_bytes", None),
    (
        "heartbeat_interval_ms",
        "transport.heartbeat_interval_ms",
        None,
    ),
    (
        "heartbeat_timeout_ms",
        "transport.heartbeat_timeout_ms",
        None,
    ),
    ("reconnect_min_ms", "transport.reconnect_min_ms", None),
    ("reconnect_max_ms", "transport.reconnect_max_ms", None),
    (
        "handshake_timeout_ms",
        "transport.handshake_timeout_ms",
        None,
    ),
    (
        "max_pending_handshakes",
        "transport.max_pending_handshakes",
        None,
    ),
    (
        "gossip_interval_ms",
        "overlay.gossip_interval_ms",
        Some(OverlayKind::FullMesh),
    ),
    (
        "hyparview_active_size",
        "overlay.active_size",
        Some(OverlayKind::PeerToPeer),
    ),
    (
        "hyparview_passive_size",
        "overlay.passive_size",
        Some(OverlayKind::PeerToPeer),
    ),
    (
        "hyparview_arwl",
        "overlay.arwl",
        Some(OverlayKind::PeerToPeer),
    ),
    (
        "hyparview_prwl",
        "overlay.prwl",
        Some(OverlayKind::PeerToPeer),
    ),
    (
        "hyparview_shuffle_active",
        "overlay.shuffle_active",
        Some(OverlayKind::PeerToPeer),
    ),
    (
        "hyparview_shuffle_passive",
        "overlay.shuffle_passive",
        Some(OverlayKind::PeerToPeer),
    ),
    (
        "hyparview_shuffle_period_ms",
        "overlay.shuffle_period_ms",
        Some(OverlayKind::PeerToPeer),
    ),
    ("member_heartbeat_ms", "broadcast.member_heartbeat_ms", None),
    ("member_timeout_ms", "broadcast.member_timeout_ms", None),
    ("hop_limit", "broadcast.hop_limit", None),
    (
        "subscription_capacity",
        "broadcast.subscription_capacity",
        None,
    ),
    (
        "client_server_role",
        "overlay.role",
        Some(OverlayKind::ClientServer),
    ),
    (
        "client_server_servers_per_client",
        "overlay.servers_per_client",
        Some(OverlayKind::ClientServer),
    ),
    (
        "client_server_sync_interval_ms",
        "overlay.sync_interval_ms",
        Some(OverlayKind::ClientServer),
    ),
    (
        "client_server_gossip_interval_ms",
        "overlay.gossip_interval_ms",
        Some(OverlayKind::ClientServer),
    ),
];

/// Where an old name went.
fn lookup(old: &str) -> Option<(&'static str, Option<OverlayKind>)> {
    MOVED
        .iter()
        .find(|(o, _, _)| *o == old)
        .map(|(_, key, kind)| (*key, *kind))
}

/// A value as the error shows it: the cluster secret is not repeated.
fn shown(key: &str, value: String) -> String {
    if key == "node.cookie" {
        "\"…\"".into()
    } else {
        value
    }
}

/// Refuses the top-level keys of the flat layout, naming the key each one has now (the first
/// in full, the others after it); a plain string `overlay = "static"` is the old way to choose
/// the overlay.
pub(super) fn check_toml(table: &toml::Table) -> Result<(), ConfigError> {
    let mut moved = table.iter().filter_map(|(old, value)| match lookup(old) {
        Some(_) if old == "overlay" && value.is_table() => None,
        Some((key, kind)) => Some((old, value, key, kind)),
        None => None,
    });
    let Some((old, value, key, kind)) = moved.next() else {
        return Ok(());
    };
    let (section, name) = key.split_once('.').unwrap_or(("", key));
    let value = shown(key, value.to_string());
    let mut hint = match kind {
        _ if key == OVERLAY_KIND => {
            format!("`[overlay] kind = {value}` (env {})", env_name(key))
        }
        Some(kind) => format!(
            "`[overlay] kind = \"{kind}\"` and `{name} = {value}` (env {}, {})",
            env_name(OVERLAY_KIND),
            env_name(key)
        ),
        None => format!("`[{section}] {name} = {value}` (env {})", env_name(key)),
    };
    let others: Vec<String> = moved
        .map(|(old, _, key, _)| format!("`{old}` is `{key}`"))
        .collect();
    if !others.is_empty() {
        hint.push_str(&format!("; also moved: {}", others.join(", ")));
    }
    let old = if old == "overlay" {
        format!("`overlay = {value}`")
    } else {
        format!("`{old}`")
    };
    Err(ConfigError::Moved {
        old,
        key: key.to_string(),
        hint,
    })
}

/// The error for an environment variable of the flat layout (`MAQUIS_PARALLELISM`), naming the
/// variable to use now; `None` if `name` is not one.
pub(super) fn check_env(name: &str, value: &str) -> Option<ConfigError> {
    let old = name.strip_prefix(ENV_PREFIX)?.to_ascii_lowercase();
    let (key, kind) = lookup(&old)?;
    let (section, option) = key.split_once('.').unwrap_or(("", key));
    let value = shown(key, value.trim().to_string());
    let hint = match kind {
        _ if key == OVERLAY_KIND => {
            format!(
                "{}={value} (TOML `[overlay] kind = \"{value}\"`)",
                env_name(key)
            )
        }
        Some(kind) => format!(
            "{}={kind} and {}={value} (TOML `[overlay] kind = \"{kind}\"` and `{option}`)",
            env_name(OVERLAY_KIND),
            env_name(key)
        ),
        None => format!("{}={value} (TOML `[{section}] {option}`)", env_name(key)),
    };
    Some(ConfigError::Moved {
        old: name.to_string(),
        key: key.to_string(),
        hint,
    })
}
