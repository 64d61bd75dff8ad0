//! `MAQUIS_<SECTION>_<KEY>` overrides, by one mapping for every option: the configuration is
//! written out as a TOML table, each variable sets the value at its key, and the table is read
//! back, so that serde does the typing and the errors.

use serde::Deserialize;

use super::keys::{self, ENV_PREFIX, OVERLAY_KIND};
use super::{invalid, moved, Config, ConfigError, OverlayKind};

impl Config {
    /// Applies the `MAQUIS_*` environment variables (see the README).
    pub fn apply_env(self) -> Result<Config, ConfigError> {
        self.apply_vars(std::env::vars())
    }

    /// Applies `MAQUIS_<SECTION>_<KEY>` overrides from an iterator of (name, value) pairs, e.g.
    /// `MAQUIS_TRANSPORT_MAX_FRAME_BYTES=1048576` for `transport.max_frame_bytes`.
    ///
    /// A value is read as a TOML value when it is one (`4`, `true`, `["a", "b"]`), else as a
    /// string; a list may also be given comma separated (`vnode:16,gossip`). `MAQUIS_OVERLAY_KIND`
    /// is applied first: when it changes the overlay, the overlay's options start from the new
    /// overlay's defaults. Names without the prefix are ignored; an unknown `MAQUIS_*` name is an
    /// error (as unknown TOML keys are), and so is a name of the flat layout of earlier versions,
    /// naming the variable to use now.
    pub fn apply_vars(
        self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut sets = Vec::new();
        for (name, value) in vars {
            if !name.starts_with(ENV_PREFIX) {
                continue;
            }
            match keys::key_of_env(&name) {
                Some(key) => sets.push((key, value)),
                None => {
                    return Err(moved::check_env(&name, &value)
                        .unwrap_or(ConfigError::UnknownVariable(name)))
                }
            }
        }
        sets.sort_by_key(|(key, _)| key != OVERLAY_KIND);
        let mut config = self;
        for (key, value) in sets {
            config = if key == OVERLAY_KIND {
                let kind = match toml_value(value.trim(), false) {
                    toml::Value::String(s) => s,
                    _ => value.trim().to_string(),
                };
                let mut c = config;
                c.overlay.switch_to(kind.parse::<OverlayKind>()?);
                c
            } else {
                set(&config, &key, value.trim())?
            };
        }
        Ok(config)
    }
}

/// `config` with the option `key` (dotted) set from the text of a variable: as the TOML value
/// the text is (if it is one), then, if that does not fit, as a string.
fn set(config: &Config, key: &str, text: &str) -> Result<Config, ConfigError> {
    let table = toml::Table::try_from(config).map_err(|e| invalid(key, e.to_string()))?;
    let (section, name) = key.split_once('.').unwrap_or((key, ""));
    let current = table.get(section).and_then(|s| s.get(name));
    let first = toml_value(text, matches!(current, Some(toml::Value::Array(_))));
    let mut tries = vec![first];
    if !matches!(tries[0], toml::Value::String(_)) {
        tries.push(toml::Value::String(text.to_string()));
    }
    let mut first_error = None;
    for v in tries {
        let mut t = table.clone();
        if let Some(toml::Value::Table(s)) = t.get_mut(section) {
            s.insert(name.to_string(), v);
        }
        match Config::deserialize(toml::Value::Table(t)) {
            Ok(c) => return Ok(c),
            Err(e) => {
                first_error.get_or_insert_with(|| e.message().to_string());
            }
        }
    }
    Err(invalid(key, first_error.unwrap_or_default()))
}

/// The TOML value of a variable's text: the text as a TOML value when it is one, else as a
/// string; for a list, a comma-separated text is a list of such values.
fn toml_value(text: &str, is_list: bool) -> toml::Value {
    let parsed = toml::Value::deserialize(toml::de::ValueDeserializer::new(text)).ok();
    match parsed {
        Some(v @ toml::Value::Array(_)) => v,
        _ if is_list => toml::Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml_value(s, false))
                .collect(),
        ),
        Some(v) => v,
        None => toml::Value::String(text.to_string()),
    }
}
