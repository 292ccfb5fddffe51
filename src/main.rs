//! The `packfs` command: parses arguments and calls the library.

#![deny(clippy::undocumented_unsafe_blocks)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    if args.writes_to_pipes() {
        // Like coreutils: `packfs ls | head` ends quietly when head has seen enough, instead of
        // failing with "Broken pipe".
        // SAFETY: restores the default disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    if let Err(e) = packfs::logging::init(args.verbose, args.log_file()) {
        eprintln!("packfs: {e:#}");
        return ExitCode::FAILURE;
    }
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("packfs: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
