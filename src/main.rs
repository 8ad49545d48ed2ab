//! The `needlescope` binary: parse the command line, hand it to the library, map the outcome to
//! an exit code. Nothing else lives here (everything testable is in `needlescope::cli`).
//!
//! Exit codes: 0 success (also when stdout is a closed pipe, e.g. `| head`), 1 any error (the
//! whole error chain is printed to stderr, each cause once), 2 a usage error (clap's default: unknown flag, bad
//! flag value, missing argument), 130 stopped by Ctrl-C (a sweep or demo first finishes the cell in
//! flight, a probe stops at the next chunk, and each says how to go on; see
//! `needlescope::run::interrupt`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = needlescope::cli::flags::join_hyphen_values(std::env::args_os());
    let cli = needlescope::cli::parse_from(args);
    if let Err(err) = needlescope::run::interrupt::install() {
        eprintln!("warning: Ctrl-C handler not installed ({err}); Ctrl-C will stop runs at once");
    }
    match needlescope::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if needlescope::cli::is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) if err.is::<needlescope::run::interrupt::Interrupted>() => {
            eprintln!("{}", needlescope::cli::error_text(&err));
            ExitCode::from(needlescope::run::interrupt::EXIT_INTERRUPTED)
        }
        Err(err) => {
            eprintln!("error: {}", needlescope::cli::error_text(&err));
            ExitCode::from(1)
        }
    }
}
