//! Flag value syntax shared by several subcommands: token counts (`16k`), depth lists
//! (`0:100:10`), probed positions (`all|last|LIST`), GPU architectures (`sm_90`).
//!
//! Each parser returns `Err(String)` describing the expected form; clap prefixes it with the flag
//! and the offending value (`invalid value '12q' for '--length <LENGTH>': expected ...`), and
//! exits with the usage code 2. [`join_hyphen_values`] lets such values start with `-`.

use std::ffi::OsString;

/// Token counts: a plain integer, or an integer with a binary suffix `k` (x1024) or `m`
/// (x1048576), case-insensitive. `16k` = 16,384 and `1m` = 1,048,576, matching the powers of
/// two that context lengths are quoted in (V4's 1m context is 1,048,576 positions).
pub fn parse_token_count(s: &str) -> Result<usize, String> {
    const FORM: &str =
        "expected a token count such as 16000, 16k or 1m (k = 1024, m = 1048576; no fractions)";
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("{FORM}; it must be positive"));
    }
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1024usize),
        Some((i, 'm' | 'M')) => (&t[..i], 1024 * 1024),
        _ => (t, 1),
    };
    let digits = digits.replace('_', "");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(FORM.to_string());
    }
    let n: usize = digits
        .parse()
        .map_err(|_| format!("{FORM}; {t:?} is too large"))?;
    let n = n
        .checked_mul(mult)
        .ok_or_else(|| format!("{FORM}; {t:?} is too large"))?;
    if n == 0 {
        return Err(format!("{FORM}; it must be positive"));
    }
    Ok(n)
}

/// A positive integer (top-k values, sample counts, shard counts).
pub fn parse_positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("expected a positive integer, found 0".into()),
        Ok(n) => Ok(n),
        Err(_) => Err("expected a positive integer such as 512".into()),
    }
}

/// A needle depth in percent of the haystack, 0..=100 (fractions allowed: `12.5`).
pub fn parse_depth(s: &str) -> Result<f64, String> {
    const FORM: &str = "expected a depth in percent between 0 and 100, e.g. 40 or 12.5";
    let v: f64 = s.trim().parse().map_err(|_| FORM.to_string())?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{FORM}; found {v}"));
    }
    // -0 is 0: one cell id (`d0`) and one JSON value for the same depth.
    Ok(v + 0.0)
}

/// `--depths`: a comma list of percentages (`10,50,90`) or an inclusive range
/// `start:stop:step` (`0:100:10` = 0, 10, ..., 100).
#[derive(Clone, Debug, PartialEq)]
pub struct DepthList(pub Vec<f64>);

/// A count of tokens, 0 or more (`--generate`), with a message that says so (clap's own
/// says "invalid digit found in string" for `-1`).
pub fn parse_count(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .map_err(|_| "expected a whole number, 0 or more".to_string())
}

/// A seed: a whole number from 0 to 2^64 - 1.
pub fn parse_seed(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("expected a whole number from 0 to {}", u64::MAX))
}

/// The most depths a `start:stop:step` range may give.
pub const MAX_DEPTHS: usize = 1000;

impl std::str::FromStr for DepthList {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        const FORM: &str = "expected a comma list of percentages (10,50,90) or start:stop:step (0:100:10), each between 0 and 100";
        let s = s.trim();
        if s.contains(':') {
            let parts: Vec<&str> = s.split(':').collect();
            if parts.len() != 3 {
                return Err(FORM.into());
            }
            let num = |p: &str| -> Result<f64, String> {
                let v: f64 = p
                    .trim()
                    .parse()
                    .map_err(|_| format!("{FORM}; {p:?} is not a number"))?;
                if !(0.0..=100.0).contains(&v) {
                    return Err(format!("{FORM}; {v} is outside 0..100"));
                }
                Ok(v + 0.0)
            };
            let (start, stop) = (num(parts[0])?, num(parts[1])?);
            let step: f64 = parts[2]
                .trim()
                .parse()
                .map_err(|_| format!("{FORM}; step {:?} is not a number", parts[2]))?;
            if !(step > 0.0 && step.is_finite()) {
                return Err(format!("{FORM}; the step must be positive"));
            }
            if stop < start {
                return Err(format!("{FORM}; stop {stop} is below start {start}"));
            }
            let n = ((stop - start) / step + 1e-9).floor() as usize;
            // Each depth is a prompt per length, top-k and sample: a range past a thousand
            // depths is a typo (a step of 0.00001), not a grid.
            if n >= MAX_DEPTHS {
                return Err(format!(
                    "{FORM}; {start}:{stop}:{step} gives {} depths, expected at most {MAX_DEPTHS}",
                    n.saturating_add(1)
                ));
            }
            // `start + i·step` rounded to the decimals the user wrote (0:100:33.3 gives 99.9,
            // not 99.89999999999999: the depth names cells and files).
            let decimals = [parts[0], parts[2]]
                .iter()
                .map(|p| p.trim().split_once('.').map_or(0, |(_, f)| f.len()))
                .max()
                .unwrap_or(0);
            let at = |i: usize| -> f64 {
                let v = start + step * i as f64;
                format!("{v:.decimals$}").parse().unwrap_or(v)
            };
            Ok(DepthList((0..=n).map(at).collect()))
        } else {
            let v = s
                .split(',')
                .map(|p| parse_depth(p).map_err(|e| format!("{e} (in list {s:?})")))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(DepthList(v))
        }
    }
}

/// `--positions` of `trace`: which query positions to record (the type is the trace plan's,
/// [`crate::run::trace::Positions`]; its syntax is parsed here).
pub use crate::run::trace::Positions;

impl std::str::FromStr for Positions {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        const FORM: &str =
            "expected `all`, `last` or a comma list of 0-based token positions such as 0,17,4095";
        match s.trim() {
            "all" => Ok(Positions::All),
            "last" => Ok(Positions::Last),
            list => {
                let mut v = list
                    .split(',')
                    .map(|p| p.trim().parse::<usize>().map_err(|_| FORM.to_string()))
                    .collect::<Result<Vec<_>, _>>()?;
                v.sort_unstable();
                Ok(Positions::List(v))
            }
        }
    }
}

/// A planted model's needle margin in haystack standard deviations, inside
/// [`crate::synth::planted::MARGIN_RANGE`] (checked when the flag is parsed, so `demo`
/// refuses it before writing anything).
pub fn parse_margin(s: &str) -> Result<f64, String> {
    let (lo, hi) = crate::synth::planted::MARGIN_RANGE;
    match s.trim().parse::<f64>() {
        Ok(m) if (lo..=hi).contains(&m) => Ok(m),
        _ => Err(format!(
            "expected haystack standard deviations from {lo} to {hi}"
        )),
    }
}

/// An NVRTC target architecture, `sm_XY` (`sm_90`, `sm_120`, `sm_90a`).
pub fn parse_arch(s: &str) -> Result<String, String> {
    let t = s.trim();
    // The same rule NVRTC compilation applies (`sm_` and at least two digits, an optional
    // `a` / `f` suffix), so a name like `sm_9` is refused here, not by NVRTC later.
    crate::backend::gpu::kernels::check_arch(t)
        .map(|()| t.to_string())
        .map_err(|_| format!("expected a GPU architecture such as sm_90 or sm_120, found {t:?}"))
}

/// `--chunk`: `auto` ([`crate::devices::placement::AUTO_CHUNK`]: 2,048 on the CPU, on GPUs the largest
/// of 8,192, 4,096 and 2,048 that fits) or a token count.
pub fn parse_chunk(s: &str) -> Result<usize, String> {
    if s.trim().eq_ignore_ascii_case("auto") {
        return Ok(crate::devices::placement::AUTO_CHUNK);
    }
    parse_token_count(s).map_err(|e| match e.strip_prefix("expected ") {
        Some(rest) => format!("expected auto or {rest}"),
        None => format!("expected auto or a token count: {e}"),
    })
}

/// Joins a long flag and a following value that starts with `-` and a digit (`--length -2k`,
/// `--depths -10:50:10`) into `--length=-2k` before clap sees them. Clap takes such a value for
/// a short flag (`unexpected argument '-2'`) unless it parses as a plain number, so the flag's
/// own parser never got to say what is wrong with it. No short flag starts with a digit, so
/// nothing valid changes meaning; a forgotten value (`--length --out x`) keeps clap's "a value
/// is required". Stops at `--`.
pub fn join_hyphen_values(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut joined: Vec<OsString> = Vec::new();
    let mut options_ended = false;
    for arg in args {
        let text = arg.to_str().unwrap_or("");
        let starts_with_minus_digit = text
            .strip_prefix('-')
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit() || c == '.'));
        let flag_before = joined
            .last()
            .and_then(|a| a.to_str())
            .filter(|f| f.len() > 2 && f.starts_with("--") && !f.contains('='));
        match flag_before {
            Some(flag) if !options_ended && starts_with_minus_digit => {
                let merged = format!("{flag}={text}");
                *joined.last_mut().expect("a flag precedes") = merged.into();
            }
            _ => {
                options_ended |= text == "--";
                joined.push(arg);
            }
        }
    }
    joined
}

#[cfg(test)]
mod chunk_tests {
    use super::*;

    fn joined(args: &[&str]) -> Vec<String> {
        let os = args.iter().map(OsString::from);
        let out = join_hyphen_values(os);
        out.into_iter().map(|a| a.into_string().unwrap()).collect()
    }

    #[test]
    fn a_value_starting_with_minus_and_a_digit_joins_its_flag() {
        assert_eq!(
            joined(&["ns", "probe", "--length", "-2k", "--depth", "-.5"]),
            ["ns", "probe", "--length=-2k", "--depth=-.5"]
        );
        assert_eq!(
            joined(&["ns", "sweep", "--depths", "-10:50:10", "--lengths=-1k"]),
            ["ns", "sweep", "--depths=-10:50:10", "--lengths=-1k"]
        );
        // Flags, a forgotten value, short flags, values after `--` and a second value stay.
        for args in [
            &["ns", "probe", "--length", "--out", "x"][..],
            &["ns", "probe", "-h", "-2k"],
            &["ns", "probe", "--length=1k", "-2k"],
            &["ns", "probe", "--", "--length", "-2k"],
            &["ns", "probe", "--length", "-k"],
        ] {
            assert_eq!(joined(args), args);
        }
    }

    #[test]
    fn chunk_is_auto_or_a_token_count() {
        assert_eq!(
            parse_chunk("auto"),
            Ok(crate::devices::placement::AUTO_CHUNK)
        );
        assert_eq!(
            parse_chunk(" AUTO "),
            Ok(crate::devices::placement::AUTO_CHUNK)
        );
        assert_eq!(parse_chunk("8k"), Ok(8192));
        let e = parse_chunk("0").unwrap_err();
        assert!(
            e.starts_with("expected auto or a token count") && e.contains("positive"),
            "{e}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_use_binary_suffixes() {
        assert_eq!(parse_token_count("16000"), Ok(16000));
        assert_eq!(parse_token_count("16k"), Ok(16384));
        assert_eq!(parse_token_count("128K"), Ok(131072));
        assert_eq!(parse_token_count("1m"), Ok(1 << 20));
        assert!(parse_token_count("12q").unwrap_err().contains("16k"));
        assert!(parse_token_count("k").is_err());
        assert!(parse_token_count("0").is_err());
        assert!(parse_token_count("-2k")
            .unwrap_err()
            .ends_with("it must be positive"));
        assert!(parse_token_count("1.5k").is_err());
        assert!(parse_token_count("99999999999999999999m").is_err());
    }

    #[test]
    fn minus_zero_depth_is_zero() {
        for s in ["-0", "-0.0", " -0 "] {
            let d = parse_depth(s).unwrap();
            assert!(d == 0.0 && d.is_sign_positive(), "{s}: {d}");
        }
        for s in ["-0,50", "-0:50:50"] {
            let list = s.parse::<DepthList>().unwrap().0;
            assert!(list[0].is_sign_positive(), "{s}: {list:?}");
        }
    }

    #[test]
    fn depth_ranges_include_the_stop() {
        let d: DepthList = "0:100:10".parse().unwrap();
        assert_eq!(d.0.len(), 11);
        assert_eq!(d.0[10], 100.0);
        let d: DepthList = "10,50,90".parse().unwrap();
        assert_eq!(d.0, vec![10.0, 50.0, 90.0]);
        assert!("0:120:10".parse::<DepthList>().is_err());
        assert!("0:100:0".parse::<DepthList>().is_err());
        assert!("50:10:5".parse::<DepthList>().is_err());
        assert!("1:2".parse::<DepthList>().is_err());
    }

    /// Summing a decimal step drifts in binary (3 x 33.3 = 99.89999999999999); the list holds
    /// the decimal the user meant, as if typed.
    #[test]
    fn fractional_depth_steps_give_the_written_decimals() {
        let d: DepthList = "0:100:33.3".parse().unwrap();
        assert_eq!(d.0, vec![0.0, 33.3, 66.6, 99.9]);
        let d: DepthList = "0.5:1:0.1".parse().unwrap();
        assert_eq!(d.0, vec![0.5, 0.6, 0.7, 0.8, 0.9, 1.0]);
        let many = "0:100:0.00001".parse::<DepthList>().unwrap_err();
        assert!(
            many.contains("gives 10000001 depths, expected at most 1000"),
            "{many}"
        );
        assert_eq!("0:99.9:0.1".parse::<DepthList>().unwrap().0.len(), 1000);
        let d: DepthList = "12.5:100:12.5".parse().unwrap();
        assert_eq!(d.0.len(), 8);
        assert_eq!(d.0[7], 100.0);
    }

    #[test]
    fn counts_and_seeds_say_what_they_expect() {
        assert_eq!(parse_count("24"), Ok(24));
        assert_eq!(parse_count("0"), Ok(0));
        assert_eq!(
            parse_count("-1"),
            Err("expected a whole number, 0 or more".into())
        );
        assert_eq!(parse_seed("18446744073709551615"), Ok(u64::MAX));
        let e = parse_seed("18446744073709551616").unwrap_err();
        assert_eq!(e, "expected a whole number from 0 to 18446744073709551615");
        assert!(parse_seed("-1").is_err());
    }

    #[test]
    fn positions_accept_all_last_and_lists() {
        assert_eq!("all".parse::<Positions>(), Ok(Positions::All));
        assert_eq!("last".parse::<Positions>(), Ok(Positions::Last));
        assert_eq!("5,1".parse::<Positions>(), Ok(Positions::List(vec![1, 5])));
        // A position given twice parses; the trace refuses it (exit 1, as a length twice).
        assert_eq!(
            "5,1,5".parse::<Positions>(),
            Ok(Positions::List(vec![1, 5, 5]))
        );
        assert!("first".parse::<Positions>().is_err());
    }

    #[test]
    fn arches_look_like_sm_xy() {
        assert_eq!(parse_arch("sm_90"), Ok("sm_90".into()));
        assert!(parse_arch("sm90").is_err());
        assert!(parse_arch("sm_").is_err());
        // NVRTC's rule: at least two digits; `a` / `f` suffixes are real architectures.
        assert!(parse_arch("sm_9").unwrap_err().contains("\"sm_9\""));
        assert_eq!(parse_arch("sm_90a"), Ok("sm_90a".into()));
        // One suffix and two or three digits, as before the rule was shared with NVRTC.
        assert!(parse_arch("sm_90aa").is_err());
        assert!(parse_arch("sm_1200").is_err());
    }
}
