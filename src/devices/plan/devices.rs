//! Device sets (`--devices 8x96G`) and their parsing.

/// `--devices`: groups `COUNTxSIZE` separated by commas (`8x96G`, `2x80GiB,1x40G`); a bare
/// `SIZE` means one device. `G`/`GiB` = 2^30 bytes (what GPU vendors' "80GB" cards hold),
/// `GB` = 10^9; likewise `M`/`MiB`/`MB` and `T`/`TiB`/`TB`; units in any case (`96gib`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSet {
    pub capacities: Vec<u64>,
    pub spec: String,
}

pub const DEVICE_FORM: &str = "expected COUNTxSIZE such as 8x96G or 2x80GiB (G = GiB = 2^30 bytes, GB = 10^9; groups may be joined with commas: 2x80G,1x40G)";

impl std::str::FromStr for DeviceSet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut capacities = Vec::new();
        for group in s.split(',') {
            let g = group.trim();
            let (count, size) = match g.split_once(['x', 'X']) {
                Some((n, size)) => {
                    let n: usize = n
                        .trim()
                        .parse()
                        .map_err(|_| format!("{DEVICE_FORM}; {n:?} is not a device count"))?;
                    (n, size)
                }
                None => (1, g),
            };
            if count == 0 || count > 4096 {
                return Err(format!("{DEVICE_FORM}; the device count must be 1..=4096"));
            }
            let bytes = parse_bytes(size)?;
            capacities.extend(std::iter::repeat_n(bytes, count));
        }
        if capacities.len() > 4096 {
            return Err(format!("{DEVICE_FORM}; at most 4096 devices"));
        }
        Ok(DeviceSet {
            capacities,
            spec: s.trim().to_string(),
        })
    }
}

/// `96G`, `80GiB`, `94GB`, `1.5T`, `512M` -> bytes.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("{DEVICE_FORM}; the size after the `x` is missing"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{DEVICE_FORM}; {t:?} has no unit"))?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{DEVICE_FORM}; {t:?} is not a memory size"))?;
    // Units in any case: `G`, `GiB`, `gib` are 2^30 bytes, `GB`, `gb` 10^9.
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "m" | "mib" => (1u64 << 20) as f64,
        "g" | "gib" => (1u64 << 30) as f64,
        "t" | "tib" => (1u64 << 40) as f64,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("{DEVICE_FORM}; unknown unit {:?}", unit.trim())),
    };
    let bytes = v * mult;
    if !(1.0..1e18).contains(&bytes) {
        return Err(format!("{DEVICE_FORM}; {t:?} is not a usable memory size"));
    }
    Ok(bytes as u64)
}

// ---------------------------------------------------------------------------------------------
// Placement
// ---------------------------------------------------------------------------------------------
