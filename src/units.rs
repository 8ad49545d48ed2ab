//! Human-readable numbers shared by the library's messages and the CLI's tables: digit grouping
//! (`1,234,567`) and byte sizes in binary units (`1.50 GiB`). Pure formatting, no I/O; the CLI
//! re-exports both as `crate::cli::{group_digits, human_bytes}`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
