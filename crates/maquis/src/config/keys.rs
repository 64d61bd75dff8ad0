//! The option keys, read off the section structs themselves: the sections are the fields of
//! [`Config`], a section's keys are the fields its derived `Deserialize` declares, and the
//! `[overlay]` keys are `kind` and the fields of each overlay's options struct. The environment
//! names are made from the keys by one rule ([`env_name`]).

use std::cell::Cell;

use serde::de::{self, Deserialize, Visitor};

use super::{
    BroadcastConfig, ClientServerOptions, Config, FullMeshOptions, NodeConfig, OverlayKind,
    PeerToPeerOptions, ServicesConfig, TransportConfig,
};

/// The prefix of every environment variable.
pub(super) const ENV_PREFIX: &str = "MAQUIS_";

/// The key that selects the overlay.
pub(super) const OVERLAY_KIND: &str = "overlay.kind";

/// The field names that a struct's derived `Deserialize` declares.
fn fields<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    let found = Cell::new(&[][..]);
    let _ = T::deserialize(Probe(&found));
    found.get()
}

/// A deserializer that only notes the field names a struct asks for, then fails.
struct Probe<'a>(&'a Cell<&'static [&'static str]>);

impl<'de> de::Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.set(fields);
        Err(de::Error::custom("field names noted"))
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The sections, in the order of [`Config`]'s fields.
pub(super) fn sections() -> &'static [&'static str] {
    fields::<Config>()
}

/// The options of an overlay (without `kind`).
pub(super) fn overlay_options(kind: OverlayKind) -> &'static [&'static str] {
    match kind {
        OverlayKind::Static => &[],
        OverlayKind::FullMesh => fields::<FullMeshOptions>(),
        OverlayKind::PeerToPeer => fields::<PeerToPeerOptions>(),
        OverlayKind::ClientServer => fields::<ClientServerOptions>(),
    }
}

/// Whether `key` (without its section) is a key of `section`; for `overlay`, of any overlay.
fn in_section(section: &str, key: &str) -> bool {
    match section {
        "node" => fields::<NodeConfig>().contains(&key),
        "transport" => fields::<TransportConfig>().contains(&key),
        "broadcast" => fields::<BroadcastConfig>().contains(&key),
        "services" => fields::<ServicesConfig>().contains(&key),
        "overlay" => {
            key == "kind"
                || OverlayKind::ALL
                    .iter()
                    .any(|k| overlay_options(*k).contains(&key))
        }
        _ => false,
    }
}

/// Every option: its dotted key, and for an overlay's option the overlay (an option several
/// overlays have appears once for each).
#[cfg(test)]
pub(super) fn all() -> Vec<(String, Option<OverlayKind>)> {
    let mut keys = Vec::new();
    for section in sections() {
        let plain = match *section {
            "node" => fields::<NodeConfig>(),
            "transport" => fields::<TransportConfig>(),
            "broadcast" => fields::<BroadcastConfig>(),
            "services" => fields::<ServicesConfig>(),
            _ => &[],
        };
        keys.extend(plain.iter().map(|k| (format!("{section}.{k}"), None)));
        if *section == "overlay" {
            keys.push((OVERLAY_KIND.to_string(), None));
            for kind in OverlayKind::ALL {
                let options = overlay_options(kind).iter();
                keys.extend(options.map(|k| (format!("overlay.{k}"), Some(kind))));
            }
        }
    }
    keys
}

/// The environment variable of a dotted key: `transport.max_frame_bytes` is
/// `MAQUIS_TRANSPORT_MAX_FRAME_BYTES`.
pub(super) fn env_name(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.replace('.', "_").to_ascii_uppercase())
}

/// The dotted key an environment variable sets, if it names an option.
pub(super) fn key_of_env(name: &str) -> Option<String> {
    let rest = name.strip_prefix(ENV_PREFIX)?.to_ascii_lowercase();
    let (section, key) = rest.split_once('_')?;
    (sections().contains(&section) && in_section(section, key)).then(|| format!("{section}.{key}"))
}

/// The overlays that have an option.
fn overlays_with(option: &str) -> Vec<OverlayKind> {
    OverlayKind::ALL
        .into_iter()
        .filter(|k| overlay_options(*k).contains(&option))
        .collect()
}

/// Refuses the options (keys of `[overlay]` besides `kind`) that `kind` does not have, naming
/// the overlays that do.
pub(super) fn check_overlay_options<'a>(
    kind: OverlayKind,
    keys: impl IntoIterator<Item = &'a String>,
) -> Result<(), String> {
    for key in keys {
        if overlay_options(kind).contains(&key.as_str()) {
            continue;
        }
        let owners = overlays_with(key);
        if owners.is_empty() {
            let known = overlay_options(kind).join(", ");
            let known = if known.is_empty() { "none" } else { &known };
            return Err(format!(
                "unknown option `{key}` of the {kind} overlay (its options: {known})"
            ));
        }
        let owners: Vec<&str> = owners.iter().map(OverlayKind::as_str).collect();
        let overlays = if owners.len() == 1 {
            "overlay"
        } else {
            "overlays"
        };
        return Err(format!(
            "`{key}` is an option of the {} {overlays}, but kind is {kind} (set kind = \"{}\" \
             to use it)",
            owners.join(" and "),
            owners[0],
        ));
    }
    Ok(())
}
