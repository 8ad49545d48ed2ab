//! Report directories: records and their CSV formats, the store, resume, checks of hand-edited records, summaries and plots, `needlescope report`.
//!
//! One test binary per area (docs/architecture.md section 8); each module is one family of
//! tests, shared helpers come from `needlescope-testkit` (tests/support).

mod checks;
mod cli;
mod html;
mod plot_layout;
mod plots;
mod records;
mod store;
mod summary;
