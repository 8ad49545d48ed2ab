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

/// What `inspect --devices` plans over: GPUs ([`DeviceSet`]), or the CPU host (`cpu`: its
/// `MemAvailable` now; `cpu:SIZE`: a host of that size, e.g. `cpu:768G`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanDevices {
    Gpus(DeviceSet),
    Host {
        /// `cpu:SIZE`'s size; `None`: this host's memory.
        size: Option<u64>,
        spec: String,
    },
}

impl std::str::FromStr for PlanDevices {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        if lower == "cpu" {
            return Ok(PlanDevices::Host {
                size: None,
                spec: "cpu".into(),
            });
        }
        if let Some(size) = lower.strip_prefix("cpu:") {
            let bytes = parse_bytes(size).map_err(|e| {
                format!(
                    "cpu:SIZE plans for a host of SIZE bytes (cpu:768G); {}",
                    e.strip_prefix(DEVICE_FORM)
                        .unwrap_or(&e)
                        .trim_start_matches("; ")
                )
            })?;
            return Ok(PlanDevices::Host {
                size: Some(bytes),
                spec: t.to_string(),
            });
        }
        t.parse().map(PlanDevices::Gpus).map_err(|e: String| {
            format!("{e}; or cpu for this host's memory, cpu:SIZE for another host's")
        })
    }
}

impl PlanDevices {
    /// The host's memory for a `cpu` plan and the total the `auto` residency rule reads: the
    /// size given (both), or what this process may take now
    /// ([`crate::devices::host::host_memory_available`]) and `MemTotal`; `Err` when neither can
    /// be read. `None` for GPUs.
    pub fn host_memory(&self) -> Result<Option<(super::HostMemory, u64)>, String> {
        let PlanDevices::Host { size, spec } = self else {
            return Ok(None);
        };
        let (capacity, total, source) = match size {
            Some(b) => (*b, *b, "given"),
            None => {
                let (available, source) = crate::devices::host::host_memory_available()?
                    .ok_or_else(|| {
                        "--devices cpu: cannot read the host's available memory (/proc/meminfo, \
                         the cgroup limit); give it instead, e.g. --devices cpu:512G"
                            .to_string()
                    })?;
                let total = match source {
                    crate::devices::host::HOST_MEMORY_ENV => available,
                    _ => crate::devices::host::meminfo_bytes("MemTotal").unwrap_or(available),
                };
                (available, total, source)
            }
        };
        Ok(Some((
            super::HostMemory {
                capacity,
                source,
                spec: spec.clone(),
            },
            total,
        )))
    }
}

/// `96G`, `80GiB`, `94GB`, `1.5T`, `512M` -> bytes ([`crate::units::parse_size`]), errors
/// prefixed with the `--devices` form.
fn parse_bytes(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s).map_err(|e| format!("{DEVICE_FORM}; {e}"))
}

// ---------------------------------------------------------------------------------------------
// Placement
// ---------------------------------------------------------------------------------------------
