//! Numbers as text, shared by the library's messages, the reports and the CLI's tables: digit
//! grouping (`1,234,567`), byte sizes in binary units (`1.50 GiB`), counts with their noun,
//! token counts as users write them (`16k`), percentages that keep every decimal (`50.04%`),
//! figures with at least three significant digits (`0.123`, `2.35e-4`), f32 fields in JSON
//! as the CSVs write them, and memory sizes as users write them (`96G`, `80GiB`, `94GB`). Pure formatting, no I/O; the bottom layer: it imports nothing of the
//! crate.

/// `1234567` -> `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A memory size as users write it -> bytes: a number (decimals allowed) and a unit in any
/// case, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` binary (2^20, 2^30, 2^40), `MB`, `GB`, `TB` decimal;
/// `Err` says what is wrong with it.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("the size is missing".into());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{t:?} has no unit"))?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{t:?} is not a memory size"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "m" | "mib" => (1u64 << 20) as f64,
        "g" | "gib" => (1u64 << 30) as f64,
        "t" | "tib" => (1u64 << 40) as f64,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("unknown unit {:?}", unit.trim())),
    };
    let bytes = v * mult;
    if !(1.0..1e18).contains(&bytes) {
        return Err(format!("{t:?} is not a usable memory size"));
    }
    Ok(bytes as u64)
}

/// Bytes in binary units: `1.50 GiB`, `12.00 MiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// `n` bytes as `human (exact bytes)`, e.g. `1.50 GiB (1,610,612,736 bytes)`; a figure that
/// saturated at `u64::MAX` (sizes summed from absurd inputs) says it is too large to count
/// instead of printing a precise-looking number.
pub fn bytes_and_count(n: u64) -> String {
    if n == u64::MAX {
        "more than 16 EiB (too large to count)".to_string()
    } else {
        format!("{} ({} bytes)", human_bytes(n), group_digits(n))
    }
}

/// `n` and `noun`, with an `s` unless `n` is 1: `1 position`, `3 positions`.
pub fn count_of(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Token counts as users write them: `2048` -> `2k`, `1048576` -> `1m`, `3000` -> `3000`.
pub fn format_tokens(n: usize) -> String {
    const M: usize = 1 << 20;
    if n >= M && n.is_multiple_of(M) {
        format!("{}m", n / M)
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

/// A percentage with every decimal it has: `50%`, `33.3%`, `50.04%` (probes sharing an
/// `--out` at depths 50.04 and 50.000001 must not get two rows labelled alike).
pub fn percent_label(pct: f64) -> String {
    if pct.fract() == 0.0 {
        format!("{pct:.0}%")
    } else {
        format!("{pct}%")
    }
}

/// At least three significant digits whatever the scale: `512.3`, `0.123`, `2.35e-4` (a tiny
/// model on the CPU or the emulator must not print a positive TFLOP/s as `0.000`).
pub fn three_significant(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.1}")
    } else if x >= 0.1 || x == 0.0 {
        format!("{x:.3}")
    } else {
        format!("{x:.2e}")
    }
}

/// `value` (layers.csv or attention.csv records as JSON) with every non-integer number written
/// as layers.csv writes its f32 fields: the shortest decimal that reads back to the same f32.
/// serde_json widens an f32 to f64 and prints that, 0.4555131494998932 where the CSV says
/// 0.45551315; a JSON record then would not equal its CSV row. The records' only non-integer
/// numbers are f32 fields, so narrowing them back to f32 is exact.
pub fn f32_as_in_csv(mut value: serde_json::Value) -> serde_json::Value {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Number(n) if n.is_f64() => {
                let x = n.as_f64().unwrap_or(f64::NAN) as f32;
                if let Some(m) = x
                    .to_string()
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                {
                    *n = m;
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            serde_json::Value::Object(o) => o.values_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut value);
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_print_as_users_write_them() {
        assert_eq!(format_tokens(2048), "2k");
        assert_eq!(format_tokens(16384), "16k");
        assert_eq!(format_tokens(1 << 20), "1m");
        assert_eq!(format_tokens(3000), "3000");
        assert_eq!(format_tokens(1536), "1536");
    }

    #[test]
    fn percent_labels_keep_every_decimal() {
        assert_eq!(percent_label(50.0), "50%");
        assert_eq!(percent_label(33.3), "33.3%");
        assert_eq!(percent_label(12.5), "12.5%");
        assert_ne!(percent_label(50.04), percent_label(50.000001));
        assert_eq!(percent_label(50.04), "50.04%");
    }

    #[test]
    fn figures_keep_at_least_three_significant_digits() {
        assert_eq!(three_significant(512.34), "512.3");
        assert_eq!(three_significant(12.3456), "12.346");
        assert_eq!(three_significant(0.1234), "0.123");
        assert_eq!(three_significant(0.0), "0.000");
        let small = three_significant(0.000_234_5);
        assert_eq!(small, "2.35e-4");
        assert!(small.parse::<f64>().unwrap() > 0.0);
    }

    /// An f32 field serde_json widened to f64 prints as the CSV prints the f32; integers,
    /// strings and nesting are left as they are.
    #[test]
    fn json_f32_fields_print_as_the_csv_does() {
        let x = 0.455_513_15_f32;
        let v = serde_json::json!({"margin": x, "rank": 3, "ok": "a", "rows": [[x], 1.5]});
        assert_ne!(
            v["margin"].to_string(),
            x.to_string(),
            "serde_json widens the f32"
        );
        let v = f32_as_in_csv(v);
        assert_eq!(v["margin"].to_string(), x.to_string());
        assert_eq!(v["rows"][0][0].to_string(), x.to_string());
        assert_eq!(v["rows"][1].to_string(), "1.5");
        assert_eq!(v["rank"].to_string(), "3");
        assert_eq!(v["ok"], "a");
    }

    #[test]
    fn counts_take_a_plural_unless_one() {
        assert_eq!(count_of(1, "position"), "1 position");
        assert_eq!(count_of(0, "position"), "0 positions");
        assert_eq!(count_of(21, "CSA layer"), "21 CSA layers");
    }

    #[test]
    fn digits_group_by_thousands() {
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
        assert_eq!(group_digits(159_609_485_896), "159,609,485,896");
    }

    #[test]
    fn a_saturated_byte_figure_is_not_printed_as_exact() {
        assert_eq!(bytes_and_count(1536), "1.50 KiB (1,536 bytes)");
        assert_eq!(
            bytes_and_count(u64::MAX),
            "more than 16 EiB (too large to count)"
        );
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(12), "12 B");
    }
}
