//! Mount lifecycle for batch jobs: check, build, mount, report readiness, serve until unmounted or
//! signalled, unmount.
//!
//! In the background mode `packfs mount` re-executes itself as a detached child and relays the
//! child's messages until the child says it is ready (it closes its stderr) or dies; so the command
//! returns 0 only when the mount answers, and otherwise prints why it failed.

pub mod mounts;
pub mod stats;
mod unmount;

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{info, warn};

pub use unmount::{Unmounted, unmount};

use crate::catalog::DuplicatePolicy;
use crate::fs::{self, FsOptions};
use crate::tiers::stage::{Stage, StageOptions};
use crate::tiers::{FileReader, Images, Source, SourceError};

/// The line a daemon writes to its launcher once the mount answers; the launcher does not print it.
const READY_MARKER: &[u8] = b"\x01packfs-ready";

/// After a signal, open files may keep a detached mount alive; the daemon waits this long for them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Everything needed to serve one mount.
#[derive(Clone, Debug)]
pub struct MountRequest {
    pub images: Vec<String>,
    pub mountpoint: PathBuf,
    pub duplicates: DuplicatePolicy,
    pub fs: FsOptions,
    pub pid_file: Option<PathBuf>,
    /// Write the catalog built from scanned images to this index file before mounting.
    pub save_index: Option<PathBuf>,
    /// Byte budget of the RAM tier (decoded blocks and source chunks).
    pub cache_size: u64,
    /// Size of the source chunks kept in RAM and of the staged chunks.
    pub chunk_size: u64,
    /// Read stored bytes in whole chunks through the RAM tier.
    pub ram_chunks: bool,
    pub stage: Option<StageOptions>,
    /// Where the counters are written while the mount runs (`stats::default_path` when unset).
    pub stats_file: Option<PathBuf>,
}

/// Checks that `path` can take a new mount, and returns it absolute.
pub fn check_mountpoint(path: &Path) -> anyhow::Result<PathBuf> {
    let abs = mounts::absolute(path)?;
    match std::fs::metadata(&abs) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => bail!("mountpoint {} is not a directory", abs.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("mountpoint {} does not exist", abs.display())
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => bail!(
            "{} is a stale mount whose daemon died; clean it with `packfs umount {}`",
            abs.display(),
            abs.display()
        ),
        Err(e) => bail!("cannot use mountpoint {}: {e}", abs.display()),
    }
    if let Some(m) = mounts::find(&abs)? {
        // The kernel may still answer stat from cached attributes; listing shows a dead daemon.
        let stale = m.fstype.starts_with("fuse")
            && std::fs::read_dir(&abs).is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN));
        if stale {
            bail!(
                "{} is a stale mount whose daemon died; clean it with `packfs umount {}`",
                abs.display(),
                abs.display()
            );
        }
        bail!(
            "{} is already a mount point ({} from {}); unmount it first (`packfs umount {}`)",
            abs.display(),
            m.fstype,
            m.source,
            abs.display()
        );
    }
    Ok(abs)
}

/// Checks that this process can mount a FUSE file system at all. Root opens /dev/fuse itself;
/// other users go through the setuid helper fusermount3, which opens it for them.
pub fn check_fuse_available() -> anyhow::Result<()> {
    const DEV: &str = "/dev/fuse";
    if !Path::new(DEV).exists() {
        bail!(
            "{DEV} does not exist: load the fuse kernel module (modprobe fuse) or give the container the device"
        );
    }
    if nix::unistd::geteuid().is_root() {
        if let Err(e) = std::fs::OpenOptions::new().read(true).write(true).open(DEV) {
            bail!("cannot open {DEV}: {e}");
        }
    } else if !unmount::which("fusermount3") && !unmount::which("fusermount") {
        bail!("mounting as a non-root user needs fusermount3 (install the fuse3 package)");
    } else if nix::unistd::access(
        DEV,
        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
    )
    .is_err()
    {
        // Neither fuser nor fusermount3 can mount for an ordinary user then.
        bail!(
            "{DEV} is not readable and writable by this user, so no FUSE file system can be \
             mounted without root; it needs mode 0666, as the fuse3 package's udev rule sets it"
        );
    }
    Ok(())
}

/// Serves a mount in this process until it is unmounted or a signal arrives. `on_ready` runs once
/// the mount answers a stat of its root.
pub fn serve(req: &MountRequest, on_ready: impl FnOnce()) -> anyhow::Result<()> {
    let mountpoint = check_mountpoint(&req.mountpoint)?;
    check_fuse_available()?;
    raise_open_file_limit();
    let catalog = Arc::new(crate::dataset::open(&req.images, req.duplicates)?);
    if let Some(dest) = &req.save_index {
        let written = crate::catalog::index::write(&catalog, dest)?;
        info!(bytes = written.bytes, "index saved to {}", dest.display());
    }
    let source = Arc::new(Source::open(catalog.images()).map_err(|e| {
        let hint = match (&e, catalog.index_path()) {
            (SourceError::Changed { .. }, Some(index)) => format!(
                "; the index {} no longer describes it: rebuild it with `packfs index -o {} {}`",
                index.display(),
                index.display(),
                crate::dataset::show_paths(catalog.images().iter().map(|i| i.path.as_path()))
            ),
            _ => String::new(),
        };
        anyhow::anyhow!("{e}{hint}")
    })?);

    let _pid_file = req.pid_file.as_deref().map(PidFile::create).transpose()?;
    // Registered before mounting, so that a signal arriving from here on unmounts.
    let mut signals =
        Signals::new([SIGTERM, SIGINT, SIGHUP]).context("cannot install signal handlers")?;
    let stage = match &req.stage {
        Some(opts) => {
            let holder = format!(
                "pid {}: mount at {}",
                std::process::id(),
                mountpoint.display()
            );
            let stage = Stage::open(opts.clone(), source.clone(), catalog.images(), &holder)?;
            Some(Arc::new(stage))
        }
        None => None,
    };
    let images = Arc::new(Images::new(
        source.clone(),
        req.cache_size,
        req.chunk_size,
        req.ram_chunks,
        stage.clone(),
    ));
    let files = Arc::new(FileReader::new(images.clone()));
    let mut mounted = fs::mount(catalog.clone(), files.clone(), &mountpoint, &req.fs)
        .with_context(|| format!("cannot mount at {}", mountpoint.display()))?;
    if let Err(e) = std::fs::metadata(&mountpoint) {
        let _ = unmount(&mountpoint, true);
        bail!("the mount at {} does not answer: {e}", mountpoint.display());
    }
    info!(
        files = catalog.file_count(),
        images = catalog.images().len(),
        "mounted at {}",
        mountpoint.display()
    );
    // Do not pin the directory the job started in.
    let _ = std::env::set_current_dir("/");
    let stats_path = req
        .stats_file
        .clone()
        .unwrap_or_else(|| stats::default_path(&mountpoint));
    info!("counters in {}", stats_path.display());
    let stats_file = stats::StatsFile::start(stats_path, images.clone(), mountpoint.clone());
    on_ready();
    verify_in_background(catalog.clone());
    // The mount is up: a stager that cannot start leaves it serving from the source.
    let stager = stage.clone().and_then(|stage| {
        std::thread::Builder::new()
            .name("packfs-stage".into())
            .spawn(move || crate::tiers::stage::run_copier(&stage, false, None))
            .map_err(|e| warn!("cannot start the stager, serving from the source only: {e}"))
            .ok()
    });

    let (sig_tx, sig_rx) = crossbeam_channel::bounded(1);
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("packfs-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let _ = sig_tx.send(sig);
            }
        })?;
    crossbeam_channel::select! {
        recv(mounted.ended()) -> ended => {
            info!("unmounted");
            if let Ok(Err(e)) = ended {
                warn!("session ended with an error: {e}");
            }
        }
        recv(sig_rx) -> sig => {
            info!("signal {}: unmounting {}", sig.unwrap_or(0), mountpoint.display());
            match unmount(&mountpoint, true) {
                Ok(_) => {}
                Err(e) => warn!("{e:#}"),
            }
            if mounted.wait(Some(SHUTDOWN_GRACE)).is_none() {
                warn!(
                    "files under {} are still open after {} s; exiting anyway",
                    mountpoint.display(),
                    SHUTDOWN_GRACE.as_secs()
                );
            }
        }
    }
    handle.close();
    if let Some(stage) = &stage {
        stage.shut_down();
    }
    if let Some(stager) = stager {
        let _ = stager.join();
    }
    drop(stats_file);
    log_counters(&images);
    Ok(())
}

/// The final figures of every tier, at exit.
fn log_counters(images: &Images) {
    let stats = images.source().stats();
    info!(
        opens = stats.opens,
        reads = stats.reads,
        bytes = stats.bytes,
        stage_reads = stats.stage_reads,
        stage_bytes = stats.stage_bytes,
        "source operations"
    );
    let tiers = images.stats();
    info!(
        ram_bytes = tiers.ram_bytes,
        staged_bytes = tiers.staged_bytes,
        source_bytes = tiers.source_bytes,
        "bytes served by tier"
    );
    let cache = images.ram_stats();
    info!(
        budget = cache.budget,
        peak = cache.peak,
        held = cache.held,
        hits = cache.hits,
        loads = cache.loads,
        loaded_bytes = cache.loaded_bytes,
        "RAM cache"
    );
    if let Some(stage) = images.stage() {
        let st = stage.stats();
        info!(
            total_bytes = st.total_bytes,
            present_bytes = st.present_bytes,
            copied_bytes = st.copied_bytes,
            copied_from_reads = st.copied_from_reads,
            verified_chunks = st.verified_chunks,
            failed_checks = st.failed_checks,
            evicted_bytes = st.evicted_bytes,
            "staging in {}: {}",
            stage.dir().display(),
            st.status
        );
    }
}

/// Checks every chunk of a mapped index at low priority after the mount is up: damage shows in the
/// log at once instead of at the first request that meets it, and the index pages get warm.
fn verify_in_background(catalog: Arc<crate::catalog::Catalog>) {
    let Some(index) = catalog.index_path().map(Path::to_path_buf) else {
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("packfs-verify".into())
        .spawn(move || {
            // SAFETY: plain syscall; on Linux, `who = 0` is the calling thread only.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
            let started = std::time::Instant::now();
            let damaged = catalog.verify_all();
            let secs = started.elapsed().as_secs_f64();
            if damaged == 0 {
                info!("index {} verified in {secs:.3} s", index.display());
            } else {
                tracing::error!(
                    "index {}: {damaged} damaged chunk(s); the entries in them answer EIO",
                    index.display()
                );
            }
        });
    if let Err(e) = spawned {
        warn!("cannot start the index verification: {e}");
    }
}

/// Every image stays open for the life of the mount, and datasets come in thousands of shards:
/// lift the soft limit on open files to the hard one.
fn raise_open_file_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        warn!("cannot raise the open-file limit from {soft} to {hard}: {e}");
    }
}

/// The daemon's process id in a file, for as long as the daemon runs.
struct PidFile(PathBuf);

impl PidFile {
    fn create(path: &Path) -> anyhow::Result<PidFile> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write pid file {}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Re-executes this program with `child_args` as a detached daemon, relays its messages, and
/// returns once it reports the mount ready, or an error if it exits first.
pub fn spawn_background(child_args: &[OsString], mountpoint: &Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("cannot find the packfs executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(child_args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; it detaches the daemon from the job's terminal and
    // process group, so a Ctrl-C aimed at the launching shell does not reach it.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("cannot start the packfs daemon")?;
    let stderr = child.stderr.take().expect("piped");
    let mut out = std::io::stderr().lock();
    let mut ready = false;
    for line in BufReader::new(stderr).split(b'\n') {
        let Ok(line) = line else { break };
        if line == READY_MARKER {
            ready = true;
            break;
        }
        let _ = out.write_all(&line);
        let _ = out.write_all(b"\n");
    }
    drop(out);
    if !ready {
        let status = child.wait()?;
        bail!(
            "the packfs daemon exited before {} was mounted ({status})",
            mountpoint.display()
        );
    }
    Ok(())
}

/// Called in the daemon once the mount is ready: tell the launcher, then stop writing to its pipe.
/// Logs continue in the log file, if one was given.
pub fn detach_from_launcher() {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(READY_MARKER);
    let _ = err.write_all(b"\n");
    let _ = err.flush();
    drop(err);
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stderr(&null);
        let _ = nix::unistd::dup2_stdout(&null);
    }
}
