//! `packfs mount`

use std::ffi::OsString;
use std::path::PathBuf;

use packfs::catalog::DuplicatePolicy;
use packfs::daemon::{self, MountRequest};
use packfs::fs::{FsOptions, ReaddirPlus};
use packfs::tiers::stage::StageMode;

use super::staging::StageFlags;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One index file (`packfs index`), or tar images: brace ranges (`train-{000000..000127}.tar`)
    /// and globs are expanded.
    #[arg(required = true, num_args = 1..)]
    images: Vec<String>,
    /// An existing empty directory.
    mountpoint: PathBuf,
    /// Stay in the foreground instead of returning once the mount is ready.
    #[arg(short, long)]
    foreground: bool,
    /// Threads answering FUSE requests (lookups, attributes, listings).
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Threads reading file data from the images.
    #[arg(long, default_value_t = 16)]
    io_threads: usize,
    /// Let other users read the mount (non-root users need user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    allow_other: bool,
    /// Owner shown for every file, e.g. $SLURM_JOB_UID when a root prologue mounts for a job
    /// (with --allow-other); the mounting user by default.
    #[arg(long)]
    uid: Option<u32>,
    /// Group shown for every file; the mounting user's group by default.
    #[arg(long)]
    gid: Option<u32>,
    /// Whether listings carry attributes: `never` is fastest for find/os.walk/ImageFolder scans,
    /// `always` for stat-heavy walks (ls -l, du, rsync); `auto` lets the kernel decide.
    #[arg(long, value_enum, default_value_t = ReaddirPlus::Never)]
    readdirplus: ReaddirPlus,
    /// RAM budget (K, M, G suffixes) for decompressed squashfs blocks, inflated zip members and
    /// chunks of stored bytes read from the source. It only has to hold data in short-term use:
    /// file pages, once read, live in the kernel's page cache.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = super::size::parse_bytes)]
    cache_size: u64,
    /// Read stored bytes from the source in whole chunks kept in the RAM cache, and hand them to
    /// the stager. Default: on with --stage, off without (measured: with shuffled reads, exact
    /// reads are faster when nothing is staged; see docs/benchmarks.md).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    ram_chunks: Option<bool>,
    /// Copy the images to this directory (node-local NVMe or /dev/shm) in the background and
    /// serve each chunk from there once it is complete and checked; a later mount resumes.
    #[arg(long, value_name = "DIR")]
    stage: Option<PathBuf>,
    /// `eager` copies everything; `lazy` copies the chunks that reads touch.
    #[arg(long, value_enum, default_value_t = StageMode::Eager, requires = "stage")]
    stage_mode: StageMode,
    #[command(flatten)]
    staging: StageFlags,
    /// Write the mount's counters here every second (default: under /run/packfs, or
    /// $XDG_RUNTIME_DIR/packfs; the log names it).
    #[arg(long, value_name = "PATH")]
    stats_file: Option<PathBuf>,
    /// What to do when two images hold the same path.
    #[arg(long, value_enum, default_value_t = DuplicatePolicy::Error)]
    duplicates: DuplicatePolicy,
    /// Save the catalog scanned from the images as an index file, for faster mounts next time.
    #[arg(long, value_name = "PATH")]
    save_index: Option<PathBuf>,
    /// Append the daemon's log to this file.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Write the daemon's process id to this file while it runs.
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// Internal: set on the re-executed daemon process.
    #[arg(long, hide = true)]
    daemon_child: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let request = MountRequest {
        images: args.images.clone(),
        mountpoint: args.mountpoint.clone(),
        duplicates: args.duplicates,
        fs: FsOptions {
            threads: args.threads,
            io_threads: args.io_threads,
            allow_other: args.allow_other,
            uid: args.uid,
            gid: args.gid,
            readdirplus: args.readdirplus,
            ..FsOptions::default()
        },
        cache_size: args.cache_size,
        chunk_size: args.staging.chunk_size,
        ram_chunks: args.ram_chunks.unwrap_or(args.stage.is_some()),
        stage: args
            .stage
            .clone()
            .map(|dir| args.staging.options(dir, args.stage_mode))
            .transpose()?,
        stats_file: args
            .stats_file
            .as_ref()
            .map(std::path::absolute)
            .transpose()?,
        pid_file: args
            .pid_file
            .as_ref()
            .map(std::path::absolute)
            .transpose()?,
        save_index: args
            .save_index
            .as_ref()
            .map(std::path::absolute)
            .transpose()?,
    };
    if args.daemon_child {
        return daemon::serve(&request, daemon::detach_from_launcher);
    }
    if args.foreground {
        return daemon::serve(&request, || {});
    }
    // The daemon re-parses the same arguments; relative paths stay valid until it has opened them.
    let mut child_args: Vec<OsString> = std::env::args_os().skip(1).collect();
    child_args.push("--daemon-child".into());
    daemon::spawn_background(&child_args, &args.mountpoint)
}
