//! `packfs mount`

use std::ffi::OsString;
use std::path::PathBuf;

use crate::daemon::{self, MountRequest};
use crate::engine::EngineOptions;
use crate::fs::{DEFAULT_IO_THREADS, DEFAULT_THREADS, FsOptions};
use crate::source::ImageLocation;
use crate::util::logging::Destination;

use super::args::{Images, Listings, Merge, Staging, Transports, absolute};
use super::progress::ScanBar;
use super::staging::StageFlags;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("staged").args(["stage", "stage_in"])))]
pub struct Args {
    #[command(flatten)]
    images: Images,
    /// An existing empty directory.
    mountpoint: PathBuf,
    /// Mount even if the mountpoint has files in it (they are hidden while it is mounted).
    #[arg(long)]
    nonempty: bool,
    /// Stay in the foreground instead of returning once the mount is ready.
    #[arg(short, long)]
    foreground: bool,
    /// Threads answering FUSE requests (lookups, attributes, listings).
    #[arg(long, default_value_t = DEFAULT_THREADS)]
    threads: usize,
    /// Threads reading file data from the images.
    #[arg(long, default_value_t = DEFAULT_IO_THREADS)]
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
    #[arg(long, value_enum, default_value_t = Listings::Never)]
    readdirplus: Listings,
    /// How requests travel from the kernel: `classic` (/dev/fuse) or `uring` (FUSE over io_uring,
    /// Linux 6.14+ with /sys/module/fuse/parameters/enable_uring = Y; otherwise the mount uses
    /// `classic` and its log says why). See docs/benchmarks.md for what each costs.
    #[arg(long, value_enum, default_value_t = Transports::Classic, env = "PACKFS_TRANSPORT")]
    transport: Transports,
    /// Kernel readahead for the mount (K, M suffixes; 0 keeps the kernel's 128K): a sample up to
    /// this size is fetched with one request, one round trip to a parallel file system instead
    /// of one per 128 KiB. Needs root; otherwise the mount keeps 128K and the log says so.
    #[arg(long, value_name = "BYTES", default_value = "1M", value_parser = super::size::parse_bytes)]
    readahead: u64,
    /// RAM budget (K, M, G suffixes) for decompressed squashfs blocks, inflated zip members and
    /// chunks of stored bytes read from the source. It only has to hold data in short-term use:
    /// file pages, once read, live in the kernel's page cache.
    #[arg(long, value_name = "BYTES", default_value = "64M", value_parser = super::size::parse_bytes)]
    cache_size: u64,
    /// Read stored bytes from the source in whole chunks kept in the RAM cache. Default: on for
    /// images in an object store that fit in half the RAM cache; off otherwise (measured: with
    /// shuffled reads from files, exact reads are faster; see docs/benchmarks.md). The images a
    /// running --stage keeps are read in chunks whatever this says (the stager keeps them).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    ram_chunks: Option<bool>,
    /// Bytes fetched ahead of the readers when a sampler sends its order (packfs.torch's
    /// samplers, or a list on the hints socket: docs/training.md); K, M, G suffixes. Default:
    /// half of --cache-size, within which it is held; 0 turns hints off.
    #[arg(long, value_name = "BYTES", value_parser = super::size::parse_bytes)]
    lookahead: Option<u64>,
    /// Fetches ahead in flight at most (default: 32 for images in an object store, 16 for files).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    lookahead_depth: Option<u16>,
    /// Copy the images to this directory (node-local NVMe or /dev/shm) in the background and
    /// serve each chunk from there once it is complete and checked; a later mount resumes.
    /// The directory is yours: packfs keeps it (see --stage-in for one it makes and removes).
    #[arg(long, value_name = "DIR")]
    stage: Option<PathBuf>,
    /// Stage in a directory packfs makes under BASE (e.g. /dev/shm or the node's NVMe), private
    /// to you: BASE/packfs-UID/NAME-HASH, one per user and dataset, so every rank of a node that
    /// asks the same shares one mount and one copy. Removed when the mount ends, unless
    /// --keep-stage.
    #[arg(long, value_name = "BASE")]
    stage_in: Option<PathBuf>,
    /// Keep the copy --stage-in made when the mount ends (a later mount of the same dataset
    /// on the node then resumes from it).
    #[arg(long, requires = "stage_in")]
    keep_stage: bool,
    /// The job's nodes, one per share in share order: read the images of another node's
    /// --stage-share from that node (checked, the source on any failure), and serve this
    /// node's staged chunks to the others. `host[:port],...` (port 7797 by default), `@FILE`
    /// (one per line) or `slurm` (the job's nodes, in SLURM_NODEID order, at port 11000 +
    /// (SLURM_JOB_ID mod 5440) x 4). Needs --stage-share and --peer-secret.
    #[arg(long, value_name = "NODES", requires = "peer_secret")]
    peers: Option<String>,
    /// The job's secret, shared by its nodes: a file of yours, mode 0600, 16 bytes or more
    /// (e.g. `head -c 32 /dev/urandom | base64 > ~/.packfs-job-secret`). Every request between
    /// peers is signed with it; it never travels.
    #[arg(long, value_name = "FILE", requires = "peers")]
    peer_secret: Option<PathBuf>,
    /// Where this node serves its staged chunks (default: every interface, at the port of its
    /// own entry in --peers; 7797 when that names none).
    #[arg(long, value_name = "ADDR:PORT", requires = "peers")]
    peer_listen: Option<std::net::SocketAddr>,
    /// `eager` copies everything; `lazy` copies the chunks that reads touch.
    #[arg(long, value_enum, default_value_t = Staging::Eager, requires = "staged")]
    stage_mode: Staging,
    #[command(flatten)]
    staging: StageFlags,
    /// Write the mount's counters here every second (default: under /run/packfs, or
    /// $XDG_RUNTIME_DIR/packfs; the log names it).
    #[arg(long, value_name = "PATH")]
    stats_file: Option<PathBuf>,
    /// Let this group read the Prometheus file beside the default stats file (mode 0640; without
    /// it, like every file the daemon writes, 0600): the group node_exporter runs as.
    #[arg(long, value_name = "GROUP", value_parser = parse_group)]
    metrics_group: Option<u32>,
    #[command(flatten)]
    merge: Merge,
    /// Save the catalog scanned from the images as an index file, for faster mounts next time.
    #[arg(long, value_name = "PATH")]
    save_index: Option<PathBuf>,
    /// Append the daemon's log (INFO: ready, staging, every error) to this file. Default: syslog
    /// (journalctl -t packfs) where /dev/log exists, else a file beside the stats file.
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// Write every FUSE request (operation, path, offset, size, latency, tier, thread) to this
    /// file as Chrome/Perfetto trace-event JSON; `packfs trace summarize FILE` reads it.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Stop tracing once the trace file reaches this size (K, M, G suffixes).
    #[arg(long, value_name = "BYTES", default_value = "1G", value_parser = super::size::parse_bytes, requires = "trace")]
    trace_limit: u64,
    /// Unmount after no request came in for this long (e.g. 30m, 2h) and no file is open, as
    /// squashfuse's `-o timeout`.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    idle_timeout: Option<std::time::Duration>,
    /// Unmount when this process exits, however it exits (e.g. `--owner $$` in a job script;
    /// watched by pidfd, so a reused pid does not keep the mount).
    #[arg(long, value_name = "PID")]
    owner: Option<i32>,
    /// Unmount when no process holds a shared flock on this file any more: every process that
    /// uses the mount holds one (what `packfs.mount` does in each rank of a job).
    #[arg(long, value_name = "FILE")]
    users: Option<PathBuf>,
    /// Remove the mountpoint directory when the mount ends, if it is empty: for a directory
    /// made for this mount (`packfs.mount` without a mountpoint passes it).
    #[arg(long)]
    remove_mountpoint: bool,
    /// Write the daemon's process id to this file while it runs.
    #[arg(long)]
    pid_file: Option<PathBuf>,
    /// Internal: set on the re-executed daemon process.
    #[arg(long, hide = true)]
    daemon_child: bool,
}

impl Args {
    /// The engine these arguments ask for: what a mount serves, or what a process opens in
    /// itself (`in_process`).
    pub fn engine(&self) -> anyhow::Result<EngineOptions> {
        Ok(EngineOptions {
            images: self.images.images.clone(),
            merge: {
                let mut merge = self.merge.options();
                // What a daemon may hold (--cache-size + 64 MiB) bounds what the archives inside
                // its images may cost.
                merge.nesting.budget = self.cache_size.saturating_add(64 << 20);
                merge
            },
            cache_size: self.cache_size,
            chunk_size: self.staging.chunk_size,
            ram_chunks: self.ram_chunks,
            stage: self
                .stage_dir()?
                .map(|dir| self.staging.options(dir, self.stage_mode.into()))
                .transpose()?,
            save_index: absolute(&self.save_index)?,
            lookahead: self.lookahead,
            lookahead_depth: self.lookahead_depth.map(usize::from),
            // The daemon's, or the process's: set where it is opened.
            holder: String::new(),
            read_threads: self.io_threads,
            peers: self.peer_options()?,
            reopened: false,
        })
    }

    /// The job's peers, as --peers, --peer-secret and --peer-listen give them.
    fn peer_options(&self) -> anyhow::Result<Option<crate::peers::PeerOptions>> {
        let (Some(nodes), Some(secret)) = (&self.peers, &self.peer_secret) else {
            return Ok(None);
        };
        Ok(Some(crate::peers::PeerOptions {
            nodes: crate::peers::nodes::Nodes::parse(nodes, crate::peers::nodes::DEFAULT_PORT)?,
            secret: crate::peers::auth::Secret::load(secret)?,
            listen: self.peer_listen,
        }))
    }

    /// The stage directory: the one given, or the one --stage-in makes for this user and these
    /// sources (the same in every process that asks the same).
    fn stage_dir(&self) -> anyhow::Result<Option<PathBuf>> {
        let Some(base) = &self.stage_in else {
            return Ok(self.stage.clone());
        };
        let sources = self
            .images
            .images
            .iter()
            .map(|s| match s.contains("://") {
                true => Ok(s.clone()),
                false => std::path::absolute(s).map(|p| p.to_string_lossy().into_owned()),
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let uid = nix::unistd::geteuid().as_raw();
        Ok(Some(crate::tiers::stage::per_node::dir_for(
            &std::path::absolute(base)?,
            &sources,
            uid,
        )))
    }

    /// Whether this process is the re-executed daemon.
    pub fn is_daemon(&self) -> bool {
        self.daemon_child
    }

    /// The daemon's log: the log file, or syslog, or a file beside the default stats file. In
    /// the foreground, only the log file (stderr is the user's).
    pub fn daemon_log(&self) -> Option<Destination> {
        if !self.daemon_child {
            return self.log_file.clone().map(Destination::File);
        }
        let mountpoint = crate::daemon::mounts::absolute(&self.mountpoint)
            .unwrap_or_else(|_| self.mountpoint.clone());
        let fallback = daemon::stats::log_path(&mountpoint);
        if self.log_file.is_none() && daemon::stats::check_default_dir().is_err() {
            // The mount fails on the same check, and says why; log to stderr until then.
            return None;
        }
        Some(Destination::choose(self.log_file.as_deref(), fallback))
    }
}

pub fn run(
    args: Args,
    quiet: bool,
    argv: &[OsString],
    stores: crate::source::StoreOptions,
) -> anyhow::Result<()> {
    let log = args
        .daemon_log()
        .map_or_else(|| "stderr".to_string(), |d| d.describe());
    let engine = args.engine()?;
    let request = MountRequest {
        engine,
        mountpoint: args.mountpoint.clone(),
        fs: FsOptions {
            threads: args.threads,
            io_threads: args.io_threads,
            allow_other: args.allow_other,
            uid: args.uid,
            gid: args.gid,
            readdirplus: args.readdirplus.into(),
            transport: args.transport.into(),
            fsname: dataset_name(&args.images.images),
        },
        readahead: args.readahead,
        stats_file: absolute(&args.stats_file)?,
        metrics_group: args.metrics_group,
        pid_file: absolute(&args.pid_file)?,
        nonempty: args.nonempty,
        trace: absolute(&args.trace)?.map(|p| (p, args.trace_limit)),
        idle_timeout: args.idle_timeout,
        owners: daemon::owners::Owners {
            pid: args.owner,
            users: absolute(&args.users)?,
        },
        log,
        stores,
        discard_stage: args.stage_in.is_some() && !args.keep_stage,
        remove_mountpoint: args.remove_mountpoint,
    };
    if args.daemon_child {
        // Its stderr is the launcher's pipe, where no bar is drawn.
        // Progress as lines: to the launcher, which relays them until the mount is ready (to a
        // terminal, a log, packfs.mount's logging), and to the daemon's log.
        let bar = ScanBar::with_lines(super::progress::LogLines::logged());
        daemon::serve(&request, &|p| bar.update(p), daemon::detach_from_launcher)?;
        // The log packfs chose in the runtime directory: its job is done when it says nothing
        // worth keeping (thousands of mounts left thousands of logs).
        if let (None, Some(Destination::File(log))) = (&args.log_file, args.daemon_log()) {
            daemon::leftovers::remove_quiet_log(&log);
        }
        return Ok(());
    }
    daemon::leftovers::prune_old_logs(&daemon::stats::default_dir().0);
    if args.foreground {
        let bar = ScanBar::new();
        let ready = |line: String| {
            if !quiet {
                eprintln!("packfs: {line}");
            }
        };
        return Ok(daemon::serve(&request, &|p| bar.update(p), ready)?);
    }
    if let Some(line) = reusable(&request) {
        if !quiet {
            eprintln!("packfs: {line}");
        }
        return Ok(());
    }
    // What can fail before mounting fails here, before the fork: at once, and in this process.
    daemon::preflight(&request)?;
    // The daemon re-parses the same arguments; relative paths stay valid until it has opened them.
    let mut child_args: Vec<OsString> = argv.iter().skip(1).cloned().collect();
    child_args.push("--daemon-child".into());
    let ready_line = match daemon::spawn_background(&child_args, &args.mountpoint) {
        Err(e @ daemon::MountError::Cancelled { signal, .. }) => {
            // Exits as the signal would (130 for Ctrl-C), as the shell expects of an interrupt.
            eprintln!("packfs: {e}");
            std::process::exit(128 + signal);
        }
        other => other?,
    };
    if !quiet {
        eprintln!("packfs: {ready_line}");
    }
    Ok(())
}

/// The same dataset mounted again at the same place (a prologue run twice, a job restarted on
/// the node): the live mount of this user is kept instead of failing "already a mount point".
/// Not when the request ties the mount to owners, which the running daemon does not watch.
fn reusable(request: &MountRequest) -> Option<String> {
    if !request.owners.is_empty() {
        return None;
    }
    let abs = crate::daemon::mounts::absolute(&request.mountpoint).ok()?;
    let m = crate::daemon::mounts::find(&abs).ok()??;
    let mine = m.fuse_owner() == Some(nix::unistd::getuid().as_raw());
    if !m.is_packfs() || !mine || m.source != request.fs.fsname || daemon::is_dead(&abs) {
        return None;
    }
    Some(format!(
        "{} already serves {} (a mount of yours): using it as it is, with the options it was \
         mounted with (`packfs umount {}` first to mount it anew)",
        abs.display(),
        m.source,
        abs.display()
    ))
}

/// The source column of /proc/mounts: the index or first image, absolute, and how many more.
fn dataset_name(images: &[String]) -> String {
    let first = images.first().map_or(String::new(), |p| {
        ImageLocation::from_arg(std::path::Path::new(p))
            .map_or_else(|_| p.clone(), |loc| loc.name().display().to_string())
    });
    match images.len() {
        0 | 1 => first,
        n => format!("{first} +{}", n - 1),
    }
}

/// A group by name or number, as chgrp takes it.
fn parse_group(text: &str) -> Result<u32, String> {
    if let Ok(gid) = text.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(text) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => Err(format!("no group named {text:?} (see `getent group`)")),
        Err(e) => Err(format!("cannot look up group {text:?}: {e}")),
    }
}
