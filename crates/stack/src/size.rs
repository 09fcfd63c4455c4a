//! Sizes as people type them (`1G`, `512M`, `4096`) and as they like to read them.
//!
//! Suffixes follow coreutils (`truncate -s`, `dd`): `K`, `M`, `G`, `T`, `P` and the same
//! with `iB` are powers of 1024; `KB`, `MB`, `GB`, ... are powers of 1000. A bare number is
//! bytes.

use std::fmt;

/// Why a size string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError(String);

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SizeError {}

/// Parses `4096`, `512K`, `1G`, `1GiB`, `10GB`, `1.5G` (case-insensitive) into bytes.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let s = text.trim();
    let bad = || {
        SizeError(format!(
            "{text:?} is not a size; use bytes or a number with a unit, e.g. 4096, 512M, 1G, 2TiB"
        ))
    };
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    if number.is_empty() {
        return Err(bad());
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "p" | "pib" => 1 << 50,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "pb" => 1_000_000_000_000_000,
        _ => return Err(bad()),
    };
    let too_big = || SizeError(format!("{text:?} is too large"));
    match number.split_once('.') {
        None => {
            let n: u64 = number.parse().map_err(|_| bad())?;
            n.checked_mul(multiplier).ok_or_else(too_big)
        }
        Some((whole, frac)) => {
            // Exact decimal arithmetic: "1.5G" is 1610612736, not a float's guess.
            if frac.is_empty() || frac.contains('.') || frac.len() > 9 {
                return Err(bad());
            }
            let whole: u64 = if whole.is_empty() {
                0
            } else {
                whole.parse().map_err(|_| bad())?
            };
            let frac_digits = u32::try_from(frac.len()).map_err(|_| bad())?;
            let frac_value: u64 = frac.parse().map_err(|_| bad())?;
            let scale = 10u64.pow(frac_digits);
            let whole_bytes = whole.checked_mul(multiplier).ok_or_else(too_big)?;
            let frac_bytes = u128::from(frac_value) * u128::from(multiplier);
            if frac_bytes % u128::from(scale) != 0 {
                return Err(SizeError(format!(
                    "{text:?} is not a whole number of bytes"
                )));
            }
            let frac_bytes =
                u64::try_from(frac_bytes / u128::from(scale)).map_err(|_| too_big())?;
            whole_bytes.checked_add(frac_bytes).ok_or_else(too_big)
        }
    }
}

/// `1073741824` -> `1 GiB`, `1610612736` -> `1.5 GiB`, `1000` -> `1000 bytes`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut unit = 0;
    let mut scale: u64 = 1024;
    while unit + 1 < UNITS.len() && bytes >= scale * 1024 {
        unit += 1;
        scale *= 1024;
    }
    // One decimal, rounded, without a trailing ".0".
    let tenths = (u128::from(bytes) * 10 + u128::from(scale) / 2) / u128::from(scale);
    if tenths % 10 == 0 {
        format!("{} {}", tenths / 10, UNITS[unit])
    } else {
        format!("{}.{} {}", tenths / 10, tenths % 10, UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_people_type() {
        let cases: &[(&str, u64)] = &[
            ("4096", 4096),
            ("0", 0),
            ("512b", 512),
            ("1k", 1024),
            ("512M", 512 << 20),
            ("1G", 1 << 30),
            ("1g", 1 << 30),
            ("1GiB", 1 << 30),
            ("2TiB", 2 << 40),
            ("1GB", 1_000_000_000),
            ("10MB", 10_000_000),
            ("1.5G", 3 << 29),
            (" 64M ", 64 << 20),
            ("1 G", 1 << 30),
            ("0.5K", 512),
        ];
        for (text, want) in cases {
            assert_eq!(parse_size(text), Ok(*want), "{text}");
        }
    }

    #[test]
    fn refuses_nonsense() {
        for text in [
            "",
            "G",
            "1X",
            "-1",
            "1.2.3G",
            "1.",
            "abc",
            "1.0001K",
            "99999999999P",
        ] {
            let err = parse_size(text).expect_err(text);
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn formats_for_humans() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1000), "1000 bytes");
        assert_eq!(format_size(1024), "1 KiB");
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
        assert_eq!(format_size(512 << 20), "512 MiB");
        assert_eq!(format_size(u64::MAX), "16384 PiB");
    }
}
