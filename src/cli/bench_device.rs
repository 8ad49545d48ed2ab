//! The device-side figures of `needlescope bench` (GPU backends): the operation profile of one
//! length (`NEEDLESCOPE_PROFILE=1`: calls and wall time per kernel, GEMM shape, allocation and
//! copy) and each device's peak memory against its memory plan.

use crate::backend::{DeviceMemoryUse, OpTime};
use crate::devices::plan::{DevicePlan, FIXED_WORKSPACE};
use std::io::Write;

/// The operations' calls and seconds since `before` (a profile is cumulative), largest first.
pub(super) fn profile_since(before: &[OpTime], now: &[OpTime]) -> Vec<OpTime> {
    let mut rows: Vec<OpTime> = now
        .iter()
        .map(|r| {
            let (calls, seconds) = before
                .iter()
                .find(|b| b.op == r.op)
                .map_or((0, 0.0), |b| (b.calls, b.seconds));
            OpTime {
                op: r.op.clone(),
                calls: r.calls - calls,
                seconds: r.seconds - seconds,
            }
        })
        .filter(|r| r.calls > 0)
        .collect();
    rows.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    rows
}

/// Kernel and GEMM rows shown of an operation profile; the rest are summed in one line.
const PROFILE_ROWS: usize = 24;

/// One length's operation profile (`NEEDLESCOPE_PROFILE=1`): the largest kernels and GEMMs by
/// wall time, every allocation and copy row, the rest summed, then what the timed operations
/// leave of the prefill (host work, frees, launch gaps).
pub(super) fn write_op_profile(
    rows: &[OpTime],
    prefill_s: f64,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let timed: f64 = rows.iter().map(|r| r.seconds).sum();
    writeln!(
        out,
        "  op profile (NEEDLESCOPE_PROFILE: every device op synchronised and timed, so the prefill above is slower than unprofiled):"
    )?;
    writeln!(
        out,
        "  {:<44} {:>9} {:>10} {:>7} {:>10}",
        "operation", "calls", "total ms", "share", "mean us"
    )?;
    let line = |out: &mut dyn Write, op: &str, calls: u64, s: f64| {
        writeln!(
            out,
            "  {:<44} {:>9} {:>10.1} {:>6.1}% {:>10}",
            op,
            calls,
            s * 1e3,
            100.0 * s / prefill_s.max(1e-12),
            if calls > 0 {
                format!("{:.1}", s * 1e6 / calls as f64)
            } else {
                "-".into()
            }
        )
    };
    // The largest kernels and GEMMs, then always the allocations and copies (what the buffer
    // pool, uninitialised allocations and stream-ordered uploads are judged by), then the rest.
    let is_memory = |r: &&OpTime| r.op.starts_with("alloc ") || r.op.starts_with("copy ");
    let (memory, compute): (Vec<&OpTime>, Vec<&OpTime>) = rows.iter().partition(is_memory);
    let shown = compute.len().min(PROFILE_ROWS);
    for r in compute[..shown].iter().chain(&memory) {
        line(out, &r.op, r.calls, r.seconds)?;
    }
    if compute.len() > shown {
        let rest = &compute[shown..];
        let calls = rest.iter().map(|r| r.calls).sum();
        let s = rest.iter().map(|r| r.seconds).sum();
        line(out, &format!("({} more operations)", rest.len()), calls, s)?;
    }
    line(
        out,
        "(not in a timed op: host work, frees)",
        0,
        (prefill_s - timed).max(0.0),
    )?;
    Ok(())
}

/// Per device, the peak bytes its buffers had in use during one prefill (`time_prefill`
/// restarts the peaks, so the reference GEMM, the warm-up and earlier lengths are not in it)
/// against the memory plan: the peak less what was in use right after loading (the weights)
/// and the decoded weight copies held now (charged at their allocations' size, as the
/// executors count them), against the plan's state + workspace less its fixed part (the CUDA
/// context and cuBLAS's own memory, which the executors do not count). The plan is the run's,
/// made for its longest length. Decoded copies made after the peak make the comparison
/// lenient; `NEEDLESCOPE_DECODE_CACHE_MIB=0` makes it exact.
pub(super) fn memory_lines(
    loaded: &[DeviceMemoryUse],
    now: &[DeviceMemoryUse],
    plans: &[DevicePlan],
) -> Vec<String> {
    use crate::units::human_bytes;
    let b = |n: u64| human_bytes(n);
    now.iter()
        .enumerate()
        .map(|(i, d)| {
            let m = d.memory;
            let weights = loaded
                .iter()
                .find(|l| l.device == d.device)
                .map_or(0, |l| l.memory.in_use) as u64;
            let beyond = (m.peak_in_use as u64).saturating_sub(weights + d.decoded_copies as u64);
            let head = format!(
                "{}: peak {} in use ({} held with the pool), {} after loading, {} of decoded copies",
                d.device,
                b(m.peak_in_use as u64),
                b(m.peak_held as u64),
                b(weights),
                b(d.decoded_copies as u64)
            );
            match plans.get(i) {
                Some(p) => {
                    let allowed = (p.state + p.workspace).saturating_sub(FIXED_WORKSPACE);
                    let verdict = if beyond <= allowed {
                        "within the plan"
                    } else {
                        "OVER THE PLAN"
                    };
                    format!(
                        "{head}; plan: weights {}, state + workspace less its fixed {}: {}; \
                         the peak less weights and copies, {}, is {verdict}",
                        b(p.weights),
                        b(FIXED_WORKSPACE),
                        b(allowed),
                        b(beyond),
                    )
                }
                None => head,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peak less the weights loaded and the decoded copies is held to the plan's state and
    /// workspace less the fixed part; a device without a plan row gets the figures alone.
    #[test]
    fn memory_lines_compare_the_peak_beyond_weights_and_copies_with_the_plan() {
        let mib = 1usize << 20;
        let device = |in_use: usize, peak: usize, copies: usize| DeviceMemoryUse {
            device: "cuda:0".into(),
            memory: crate::backend::MemoryUse {
                held: in_use,
                in_use,
                peak_held: peak,
                peak_in_use: peak,
            },
            decoded_copies: copies,
        };
        let loaded = [device(100 * mib, 100 * mib, 0)];
        let mut plan = DevicePlan::idle(0, 1 << 40);
        plan.weights = 100 << 20;
        plan.state = 10 << 20;
        plan.workspace = FIXED_WORKSPACE + (20 << 20);
        // 100 MiB weights + 5 MiB copies + 30 MiB activations: exactly the allowance.
        let now = [device(105 * mib, 135 * mib, 5 * mib)];
        let lines = memory_lines(&loaded, &now, std::slice::from_ref(&plan));
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].contains("30.00 MiB, is within the plan"),
            "{}",
            lines[0]
        );
        let over = [device(105 * mib, 136 * mib, 5 * mib)];
        let lines = memory_lines(&loaded, &over, std::slice::from_ref(&plan));
        assert!(lines[0].ends_with("is OVER THE PLAN"), "{}", lines[0]);
        let bare = memory_lines(&loaded, &over, &[]);
        assert!(!bare[0].contains("plan"), "{}", bare[0]);
    }
}
