//! Room on the host: memory (`/proc/meminfo`; what this process may take, lowered to its cgroup
//! limit or set by `NEEDLESCOPE_HOST_MEMORY`, for the host memory plan) and free space on a
//! path's filesystem (`statvfs`), and the check that refuses a run whose output cannot fit
//! before it starts; and the process's own peak resident set size (`/proc/self/status`), which
//! `bench` reports.
//!
//! The readings are `None` where the platform does not tell (no /proc, a failed `statvfs`):
//! the room check then passes, since refusing on a guess would block runs that fit.

use crate::units::human_bytes;
use std::path::Path;

/// A `/proc/meminfo` field (`MemTotal`, `MemAvailable`) in bytes.
pub fn meminfo_bytes(field: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.split(':').next() == Some(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The environment variable that sets the memory a CPU run plans against (a size such as
/// `64G`, `512M`), instead of what [`host_memory_available`] reads: for a host whose limits
/// the kernel does not show, or to rehearse a smaller one.
pub const HOST_MEMORY_ENV: &str = "NEEDLESCOPE_HOST_MEMORY";

/// The memory this process may still take, and where the figure comes from: the
/// [`HOST_MEMORY_ENV`] size when set (`Err` naming it when it is not a size); else
/// `MemAvailable`, lowered to the room left under the process's cgroup limit (v2
/// `memory.max` - `memory.current`, v1 `memory.limit_in_bytes` - `memory.usage_in_bytes`)
/// when there is one: inside a container /proc/meminfo shows the whole machine. `Ok(None)`
/// where neither can be read.
pub fn host_memory_available() -> Result<Option<(u64, &'static str)>, String> {
    if let Ok(v) = std::env::var(HOST_MEMORY_ENV) {
        let bytes =
            crate::units::parse_size(&v).map_err(|e| format!("{HOST_MEMORY_ENV}={v:?}: {e}"))?;
        return Ok(Some((bytes, HOST_MEMORY_ENV)));
    }
    let available = meminfo_bytes("MemAvailable");
    Ok(match (available, cgroup_room()) {
        (Some(a), Some(c)) if c < a => Some((c, "cgroup memory limit")),
        (Some(a), _) => Some((a, "MemAvailable")),
        (None, Some(c)) => Some((c, "cgroup memory limit")),
        (None, None) => None,
    })
}

/// Bytes left under this process's cgroup memory limit, if it has one (module doc of
/// [`host_memory_available`]); `None` without a limit or where it cannot be read.
fn cgroup_room() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read =
        |path: String| -> Option<u64> { std::fs::read_to_string(path).ok()?.trim().parse().ok() };
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (limit, usage) = if controllers.is_empty() {
            let dir = format!("/sys/fs/cgroup{path}");
            (
                read(format!("{dir}/memory.max")),
                read(format!("{dir}/memory.current")),
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = format!("/sys/fs/cgroup/memory{path}");
            (
                read(format!("{dir}/memory.limit_in_bytes")),
                read(format!("{dir}/memory.usage_in_bytes")),
            )
        } else {
            continue;
        };
        // v1 writes "no limit" as a page-rounded i64::MAX; v2 as "max" (no number).
        if let (Some(limit), Some(usage)) = (limit, usage) {
            if limit < (1u64 << 62) {
                return Some(limit.saturating_sub(usage));
            }
        }
    }
    None
}

/// The process's peak resident set size in MiB (Linux `VmHWM`), if readable.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Bytes an unprivileged process may still write on the filesystem holding `dir`.
pub fn free_disk_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated path and `stat` is a valid out-pointer; the struct
    // is read only when the call reports success.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let stat = unsafe { stat.assume_init() };
    // Both are u64 on 64-bit Linux, narrower on some other targets.
    #[allow(clippy::unnecessary_cast)]
    let (blocks, block_size) = (stat.f_bavail as u64, stat.f_frsize as u64);
    Some(blocks.saturating_mul(block_size))
}

/// What a run will need, and what the host has (`None`: unknown).
#[derive(Clone, Debug)]
pub struct Room {
    pub memory_needed: u64,
    pub memory_available: Option<u64>,
    pub disk_needed: u64,
    pub disk_free: Option<u64>,
}

impl Room {
    /// `Err(what does not fit)` when the memory or the disk the host reports is short.
    pub fn check(&self) -> Result<(), String> {
        if let Some(free) = self.disk_free.filter(|&f| self.disk_needed > f) {
            return Err(format!(
                "the file would take {}, and its filesystem has {} free",
                human_bytes(self.disk_needed),
                human_bytes(free)
            ));
        }
        if let Some(avail) = self.memory_available.filter(|&a| self.memory_needed > a) {
            return Err(format!(
                "the records would take {} of memory until written, and {} is available",
                human_bytes(self.memory_needed),
                human_bytes(avail)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_exist_on_linux() {
        assert!(meminfo_bytes("MemTotal").unwrap() > 0);
        assert!(meminfo_bytes("MemAvailable").unwrap() > 0);
        assert!(meminfo_bytes("NoSuchField").is_none());
        assert!(free_disk_bytes(Path::new(".")).unwrap() > 0);
        assert!(free_disk_bytes(Path::new("/no/such/dir")).is_none());
    }

    #[test]
    fn check_names_what_is_short() {
        let room = Room {
            memory_needed: 10 << 30,
            memory_available: Some(20 << 30),
            disk_needed: 3 << 30,
            disk_free: Some(2 << 30),
        };
        let msg = room.check().unwrap_err();
        assert!(
            msg.contains("3.00 GiB") && msg.contains("2.00 GiB free"),
            "{msg}"
        );
        let room = Room {
            disk_free: Some(4 << 30),
            memory_available: Some(1 << 30),
            ..room
        };
        let msg = room.check().unwrap_err();
        assert!(msg.contains("10.00 GiB of memory") && msg.contains("1.00 GiB is available"));
        let room = Room {
            memory_available: None,
            disk_free: None,
            ..room
        };
        assert!(room.check().is_ok(), "unknown readings never refuse");
        let fits = Room {
            memory_needed: 1,
            memory_available: Some(1),
            disk_needed: 1,
            disk_free: Some(1),
        };
        assert!(fits.check().is_ok(), "exactly enough fits");
    }
}
