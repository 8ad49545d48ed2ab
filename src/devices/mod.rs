//! What a run may use of the machine, decided before any weight loads: room on the host
//! ([`host`]: memory, disk, the check that refuses an output that cannot fit), the memory plan
//! of a model on GPUs ([`plan`]: footprints, per-layer state, workspace, the chunk search) and
//! the placement of decoder layers onto devices ([`placement`]). It reads the workspace limits
//! the backend exports; the model reads the plan's bounds (e.g. probed logit rows per pass).

pub mod host;
pub mod placement;
pub mod plan;
