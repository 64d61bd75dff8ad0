//! Parsing and printing of the user-facing quantities: durations, rates and
//! loss fractions.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::NetemError;

/// A link rate in bits per second.
///
/// Parsed from `tc`-style strings with decimal (SI) multipliers: `800bit`,
/// `64kbit`, `100mbit`, `10gbit`, `1tbit`. A bare number is bits per second.
/// Byte-based spellings (`bps`, `mbps`…) are rejected on purpose because
/// `tc` reads them as *bytes* per second and people read them as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate {
    bits_per_sec: u64,
}

impl Rate {
    /// A rate of `bits_per_sec` bits per second. Zero is rejected by the
    /// emulator (use no rate at all for an unlimited link).
    pub const fn from_bits_per_sec(bits_per_sec: u64) -> Self {
        Rate { bits_per_sec }
    }

    /// The rate in bits per second.
    pub const fn bits_per_sec(self) -> u64 {
        self.bits_per_sec
    }

    /// The rate in bytes per second (rounded down, at least 1 for a
    /// non-zero rate).
    pub fn bytes_per_sec(self) -> u64 {
        if self.bits_per_sec == 0 {
            0
        } else {
            (self.bits_per_sec / 8).max(1)
        }
    }
}

impl FromStr for Rate {
    type Err = NetemError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let value: f64 = num
            .parse()
            .map_err(|_| NetemError::parse("rate", s, "expected a number, e.g. 10gbit"))?;
        let mult = match unit.trim() {
            "" | "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            "tbit" => 1e12,
            u if u.ends_with("bps") || u.ends_with("b/s") => {
                return Err(NetemError::parse(
                    "rate",
                    s,
                    "ambiguous byte/bit unit; write bits, e.g. 100mbit or 10gbit",
                ))
            }
            _ => {
                return Err(NetemError::parse(
                    "rate",
                    s,
                    "unknown unit; use bit, kbit, mbit, gbit or tbit",
                ))
            }
        };
        let bits = value * mult;
        if !bits.is_finite() || bits < 1.0 || bits > u64::MAX as f64 {
            return Err(NetemError::parse("rate", s, "must be at least 1bit"));
        }
        Ok(Rate::from_bits_per_sec(bits as u64))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_sec;
        for (div, unit) in [(1_000_000_000_000, "tbit"), (1_000_000_000, "gbit")]
            .into_iter()
            .chain([(1_000_000, "mbit"), (1_000, "kbit")])
        {
            if b >= div && b.is_multiple_of(div) {
                return write!(f, "{}{unit}", b / div);
            }
        }
        write!(f, "{b}bit")
    }
}

/// Parses a duration such as `10ms`, `1.5ms`, `250us`, `2s` or `0`.
///
/// Accepts everything [`humantime::parse_duration`] accepts plus a single
/// decimal number with a unit (`1.5ms`), which humantime does not.
pub fn parse_duration(s: &str) -> Result<Duration, NetemError> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if let Ok(d) = humantime::parse_duration(t) {
        return Ok(d);
    }
    // Decimal form: <float><unit>.
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| NetemError::parse("duration", s, "expected e.g. 10ms, 1.5ms, 250us"))?;
    let secs_per_unit = match unit.trim() {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" | "sec" => 1.0,
        _ => {
            return Err(NetemError::parse(
                "duration",
                s,
                "unknown unit; use ns, us, ms or s",
            ))
        }
    };
    Duration::try_from_secs_f64(value * secs_per_unit)
        .map_err(|e| NetemError::parse("duration", s, e.to_string()))
}

/// Parses a loss probability: `0.1%` (percent) or a fraction in `[0, 1]`
/// such as `0.001`.
pub fn parse_loss(s: &str) -> Result<f64, NetemError> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 0.01),
        None => (t, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| NetemError::parse("loss", s, "expected e.g. 0.1% or 0.001"))?;
    let p = v * scale;
    if !(0.0..=1.0).contains(&p) || !p.is_finite() {
        return Err(NetemError::parse("loss", s, "must be between 0% and 100%"));
    }
    Ok(p)
}

/// Formats a duration compactly for reports (`10ms`, `312.5us`).
pub fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        "0".to_string()
    } else if ns.is_multiple_of(1_000_000_000) {
        format!("{}s", ns / 1_000_000_000)
    } else if ns >= 1_000_000 {
        format!("{}ms", trim_float(ns as f64 / 1e6))
    } else if ns >= 1_000 {
        format!("{}us", trim_float(ns as f64 / 1e3))
    } else {
        format!("{ns}ns")
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(
            "10gbit".parse::<Rate>().unwrap().bits_per_sec(),
            10_000_000_000
        );
        assert_eq!("2.5Mbit".parse::<Rate>().unwrap().bits_per_sec(), 2_500_000);
        assert_eq!("800".parse::<Rate>().unwrap().bits_per_sec(), 800);
        assert!("10mbps".parse::<Rate>().is_err());
        assert!("fast".parse::<Rate>().is_err());
        assert!("0bit".parse::<Rate>().is_err());
        assert_eq!(
            Rate::from_bits_per_sec(10_000_000_000).to_string(),
            "10gbit"
        );
        assert_eq!(Rate::from_bits_per_sec(1_500_000).to_string(), "1500kbit");
        assert_eq!(Rate::from_bits_per_sec(1_000_000).bytes_per_sec(), 125_000);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms").unwrap(), Duration::from_millis(10));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("250us").unwrap(), Duration::from_micros(250));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1ms").is_err());
        assert_eq!(fmt_duration(Duration::from_millis(10)), "10ms");
        assert_eq!(fmt_duration(Duration::from_micros(312)), "312us");
        assert_eq!(fmt_duration(Duration::from_micros(1500)), "1.5ms");
    }

    #[test]
    fn losses() {
        assert!((parse_loss("0.1%").unwrap() - 0.001).abs() < 1e-12);
        assert!((parse_loss("0.25").unwrap() - 0.25).abs() < 1e-12);
        assert_eq!(parse_loss("100%").unwrap(), 1.0);
        assert!(parse_loss("101%").is_err());
        assert!(parse_loss("2").is_err());
        assert!(parse_loss("x%").is_err());
    }
}
