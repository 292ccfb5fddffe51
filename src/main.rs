//! The `packfs` command: parses arguments and calls the library.

#![deny(clippy::undocumented_unsafe_blocks)]

use packfs::cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // mount(8) runs the helper of an fstab `user` entry with an empty environment, slurmd runs
    // prologs without PATH: what packfs runs (fusermount3, through fuser too) is then looked
    // for where a system keeps it.
    if std::env::var_os("PATH").is_none_or(|p| p.is_empty()) {
        // SAFETY: the first thing the process does, before any thread exists.
        unsafe { std::env::set_var("PATH", packfs::daemon::STANDARD_PATH) };
    }
    // As `mount.fuse.packfs`, mount(8)'s arguments stand for a `packfs mount`.
    let argv = match cli::mount_helper_args() {
        Ok(Some(argv)) => argv,
        Ok(None) => std::env::args_os().collect(),
        Err(code) => return code,
    };
    packfs::util::return_large_buffers();
    let args = cli::Cli::parse_from(&argv);
    if args.writes_to_pipes() {
        // Like coreutils: `packfs ls | head` ends quietly when head has seen enough, instead of
        // failing with "Broken pipe".
        // SAFETY: restores the default disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    if let Err(e) = packfs::util::logging::init(&args.log_setup()) {
        eprintln!("packfs: {e:#}");
        return ExitCode::FAILURE;
    }
    match cli::run(args, &argv) {
        Ok(()) => ExitCode::SUCCESS,
        // The mount's daemon printed why it failed (relayed above): one error line, not two.
        Err(e) if cli::already_reported(&e) => ExitCode::FAILURE,
        Err(e) => {
            // Whatever a message quotes (a URL with a password, say), no secret reaches the terminal.
            let message = format!("{e:#}");
            let redact = packfs::util::redact::urls;
            eprintln!("packfs: error: {}", redact(&message));
            for hint in cli::hints::for_error(&e) {
                eprintln!("packfs: {}", redact(&hint));
            }
            ExitCode::FAILURE
        }
    }
}
