//! The GPU backend on the host emulator against the CPU reference (every op, whole forwards, memory, pools, transfers, kernels), the NVRTC kernel cache, exact placement, and the GPU check script on stand-ins.
//!
//! One test binary per area (docs/architecture.md section 8); each module is one family of
//! tests, shared helpers come from `needlescope-testkit` (tests/support).

mod emu_attention_moe;
mod emu_combos;
mod emu_core;
mod emu_decoded;
mod emu_flash_forward;
mod emu_flash_ops;
mod emu_indexer;
mod emu_indexer_batch;
mod emu_kernel_variants;
mod emu_memory;
mod emu_norm;
mod emu_parity;
mod emu_pool;
mod emu_transfer;
mod gpu_check_script;
mod kernel_cache;
mod placement_exact;
