//! Serving one mount in this process: open the catalog and the tiers, mount, report readiness,
//! run the stager and the stats writer, and unmount on a signal or when the kernel ends the
//! session.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tracing::{debug, info, warn};

use super::preflight::{check_fuse_available, check_mountpoint, raise_open_file_limit};
use super::{MountError, hints, stats, unmount};
use crate::catalog::Catalog;
use crate::dataset::OnScan;
use crate::engine::{Engine, EngineOptions};
use crate::fs::{self, Core, FsOptions, Mounted};
use crate::source::{StoreOptions, Stores};

/// After a signal, open files may keep a detached mount alive; the daemon waits this long for them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Everything needed to serve one mount.
#[derive(Clone, Debug)]
pub struct MountRequest {
    /// The engine the mount serves (its stage's holder is the daemon: `serve` names it).
    pub engine: EngineOptions,
    pub mountpoint: PathBuf,
    pub fs: FsOptions,
    pub pid_file: Option<PathBuf>,
    /// Kernel readahead for the mount in bytes (0: the kernel's default).
    pub readahead: u64,
    /// Where the counters are written while the mount runs (`stats::default_path` when unset).
    pub stats_file: Option<PathBuf>,
    /// The group that may read the Prometheus file (0640 instead of 0600).
    pub metrics_group: Option<u32>,
    /// Mount over a directory that has files in it (hiding them).
    pub nonempty: bool,
    /// Write every request to this file (Chrome trace-event JSON), up to the byte limit.
    pub trace: Option<(PathBuf, u64)>,
    /// Unmount after no request came in for this long (and no file is open).
    pub idle_timeout: Option<Duration>,
    /// The processes whose life the mount serves (`--owner`, `--users`): it ends with them.
    pub owners: super::owners::Owners,
    /// Where the log goes, for the stats file and `packfs status`.
    pub log: String,
    /// How to reach the object stores (`--endpoint-url`).
    pub stores: StoreOptions,
    /// Remove the stage directory when the mount ends (one `--stage-in` made).
    pub discard_stage: bool,
    /// Remove the mountpoint directory when the mount ends, if empty (one made for the mount).
    pub remove_mountpoint: bool,
}

impl MountRequest {
    /// The engine this mount serves, its stage held in the mount's name (this daemon's pid).
    fn engine_options(&self, mountpoint: &Path) -> EngineOptions {
        EngineOptions {
            holder: format!(
                "pid {}: mount at {}",
                std::process::id(),
                mountpoint.display()
            ),
            ..self.engine.clone()
        }
    }
}

/// Sends panic messages to the log: a daemon's stderr goes nowhere once it is ready. (A panic in a
/// request fails only that request, see `fs::error::guarded`; elsewhere it ends the daemon with a
/// non-zero status.)
fn log_panics() {
    std::panic::set_hook(Box::new(|info| {
        tracing::error!(
            "panic in thread {}: {info}",
            std::thread::current().name().unwrap_or("?")
        );
    }));
}

/// What can fail before anything is mounted, for `packfs mount` to check before it forks the
/// daemon: the mountpoint, FUSE, the stats directory (`mount_checks`), the stage directory and
/// the local images.
pub fn preflight(req: &MountRequest) -> Result<(), MountError> {
    mount_checks(req)?;
    // The daemon's Stage::open checks it again, when it opens it.
    if let Some(stage) = &req.engine.stage {
        crate::util::safe_file::private_dir_all(&stage.dir, 0o700).map_err(MountError::StageDir)?;
    }
    crate::dataset::check_local_images(&req.engine.images, &Stores::network(req.stores.clone()))?;
    Ok(())
}

/// The mountpoint (returned absolute), FUSE and the stats directory. `serve` checks only these:
/// it opens the images next anyway (on a parallel file system, each open is a metadata RPC).
fn mount_checks(req: &MountRequest) -> Result<PathBuf, MountError> {
    let mountpoint = check_mountpoint(&req.mountpoint, req.nonempty)?;
    if let Some(dest) = &req.engine.save_index {
        crate::catalog::index::check_replaceable(dest, false)?;
    }
    check_fuse_available()?;
    stats::check_default_dir().map_err(MountError::StatsDir)?;
    Ok(mountpoint)
}

/// Serves a mount in this process until it is unmounted or a signal arrives. `on_scan` hears of
/// a scan's progress; `on_ready` runs once the mount answers a stat of its root, with the line
/// that says what is mounted where.
pub fn serve(
    req: &MountRequest,
    on_scan: OnScan,
    on_ready: impl FnOnce(String),
) -> Result<(), MountError> {
    let mountpoint = mount_checks(req)?;
    // Before the scan: a mount whose owner is already gone is refused, not made and dropped.
    let owners = (!req.owners.is_empty())
        .then(|| req.owners.open())
        .transpose()?;
    raise_open_file_limit();
    log_panics();
    let stores = Stores::network(req.stores.clone());
    let engine = Engine::open(
        &req.engine_options(&mountpoint),
        stores,
        Some(fs::page_cache::probe(mountpoint.clone())),
        on_scan,
    )?;
    let engine = Arc::new(engine);
    let (catalog, files) = (engine.catalog().clone(), engine.files().clone());
    let _pid_file = req.pid_file.as_deref().map(PidFile::create).transpose()?;
    // Registered before mounting, so that a signal arriving from here on unmounts.
    let signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(MountError::Signals)?;

    let trace = match &req.trace {
        Some((path, limit)) => Some(
            fs::trace::Trace::create(path, *limit, catalog.clone()).map_err(|error| {
                MountError::Trace {
                    path: path.clone(),
                    error,
                }
            })?,
        ),
        None => None,
    };
    let observer = Arc::new(fs::Observer {
        trace,
        ..fs::Observer::default()
    });

    let core = Arc::new(Core::new(catalog.clone(), files.clone(), req.fs.owner()));
    let mounted = mount_and_check(core, &mountpoint, &req.fs, observer.clone())?;
    set_readahead(&mountpoint, req.readahead, mounted.max_read());
    // Do not pin the directory the job started in.
    let _ = std::env::set_current_dir("/");
    // This daemon's mount, as the kernel numbers it: its runtime files are named by it too.
    let device = super::mounts::packfs_device(&mountpoint).unwrap_or_default();
    let hints = engine.lookahead().and_then(|la| {
        let memory = files.images().ram().memory().clone();
        let serves = req.fs.owner().uid;
        hints::HintsSocket::start(
            &mountpoint,
            &device,
            catalog.clone(),
            la.clone(),
            memory,
            serves,
        )
        .map_err(|e| warn!("{e}: samplers cannot send hints to this mount"))
        .ok()
    });
    let default_stats = stats::default_path(&mountpoint, &device);
    let mut stats_paths = vec![default_stats.clone()];
    stats_paths.extend(req.stats_file.clone().filter(|p| *p != default_stats));
    let mut about = about(req, &catalog);
    about.transport = mounted.transport().name().to_string();
    about.hints = hints
        .as_ref()
        .map(|h| h.path().to_string_lossy().into_owned());
    let what = format!(
        "mounted {} at {}: {} files in {} image(s){}",
        about.dataset,
        mountpoint.display(),
        about.files,
        about.images,
        about.inside()
    );
    let counters_at = stats_paths.last().expect("one path");
    info!("{what}; counters in {}", counters_at.display());
    let ready_line = format!(
        "{what}; `packfs status {}` shows its counters",
        mountpoint.display()
    );
    let sources = || stats::Sources {
        engine: engine.clone(),
        requests: observer.requests.clone(),
        about: about.clone(),
    };
    let stats_file = stats::StatsFile::start(
        stats_paths,
        sources(),
        mountpoint.clone(),
        req.metrics_group,
    );
    on_ready(ready_line);
    engine.start();

    if let Some(owners) = owners {
        // As on SIGTERM: the mount is detached and the daemon ends.
        owners.watch(&mountpoint, |_| {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
        });
    }
    let idle = req
        .idle_timeout
        .map(|limit| unmount_when_idle(observer.requests.clone(), limit, mountpoint.clone()));
    wait_for_the_end(mounted, signals, &mountpoint)?;
    drop(idle);
    drop(hints);
    engine.stop();
    drop(stats_file);
    // The failures counted but not yet summarized, before the final counters.
    observer
        .errors
        .flush(std::time::Instant::now() + fs::error_log::WINDOW);
    stats::log_counters(&sources());
    if let Some(stage) = engine.stage().filter(|_| req.discard_stage) {
        match crate::tiers::stage::per_node::discard(stage) {
            Ok(bytes) => info!(
                "stage directory {} removed ({bytes} bytes)",
                stage.dir().display()
            ),
            Err(e) => warn!(
                "could not remove stage directory {}: {e}; remove it by hand (rm -r)",
                stage.dir().display()
            ),
        }
    }
    if let Some(trace) = &observer.trace {
        trace.finish();
    }
    if req.remove_mountpoint {
        let _ = std::fs::remove_dir(&mountpoint);
    }
    if let Some(users) = &req.owners.users {
        super::leftovers::leave_place(users);
    }
    Ok(())
}

/// The user (and group) a mount is made for, when not the daemon's (`--uid`): its group is the
/// one given, or the user's own.
fn served_for(req: &MountRequest) -> Option<(u32, u32)> {
    let uid = req
        .fs
        .uid
        .filter(|&u| u != nix::unistd::geteuid().as_raw())?;
    let gid = req.fs.gid.or_else(|| {
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.gid.as_raw())
    })?;
    Some((uid, gid))
}

/// What the stats file says of the mount besides its counters.
fn about(req: &MountRequest, catalog: &Catalog) -> stats::About {
    stats::About {
        version: env!("CARGO_PKG_VERSION").to_string(),
        dataset: req.fs.fsname.clone(),
        images: catalog
            .images()
            .iter()
            .filter(|i| i.within.is_none())
            .count() as u64,
        inner_archives: catalog
            .images()
            .iter()
            .filter(|i| i.within.is_some())
            .count() as u64,
        files: catalog.file_count(),
        bytes: catalog.file_bytes(),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        log: req.log.clone(),
        trace: req
            .trace
            .as_ref()
            .map(|(p, _)| p.to_string_lossy().into_owned()),
        idle_timeout_s: req.idle_timeout.map(|d| d.as_secs()),
        uid: nix::unistd::geteuid().as_raw(),
        served_uid: served_for(req).map(|(uid, _)| uid),
        served_gid: served_for(req).map(|(_, gid)| gid),
        stage_goes: req.discard_stage,
        // Known once mounted.
        transport: String::new(),
        skipped_members: catalog.skipped().members,
        damaged_headers: catalog.skipped().damaged_headers,
        checksummed_files: None,
        // Known once listening.
        hints: None,
    }
}

/// `--idle-timeout`: checks every second whether no request came in for `limit`, and then
/// unmounts, unless a file is open under the mount (the unmount fails with EBUSY and is retried
/// at the next idle period). Stops when the returned sender is dropped.
fn unmount_when_idle(
    requests: Arc<fs::requests::Requests>,
    limit: Duration,
    mountpoint: PathBuf,
) -> Option<crossbeam_channel::Sender<()>> {
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    std::thread::Builder::new()
        .name("packfs-idle".into())
        .spawn(move || {
            let mut busy_until = std::time::Instant::now();
            while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(Duration::from_secs(1))
            {
                if requests.idle_for() < limit || std::time::Instant::now() < busy_until {
                    continue;
                }
                match super::unmount_if_unused(&mountpoint) {
                    Ok(true) => {
                        info!(
                            "no request for {} s: unmounted {} (--idle-timeout)",
                            limit.as_secs(),
                            mountpoint.display()
                        );
                        return;
                    }
                    Ok(false) => {
                        info!("idle, but files are open under the mount; trying again later");
                        busy_until = std::time::Instant::now() + limit;
                    }
                    Err(e) => {
                        warn!("idle, but cannot unmount: {e}");
                        return;
                    }
                }
            }
        })
        .map_err(|e| warn!("cannot start the idle timer: {e}"))
        .ok()?;
    Some(stop)
}

/// Mounts, and checks that the mount answers through the kernel; unmounts again if not.
fn mount_and_check(
    core: Arc<Core>,
    mountpoint: &Path,
    opts: &FsOptions,
    observer: Arc<fs::Observer>,
) -> Result<Mounted, MountError> {
    let mounted = fs::mount(core, mountpoint, opts, observer)
        .map_err(|error| super::preflight::mount_failed(mountpoint, error))?;
    if let Err(error) = std::fs::metadata(mountpoint) {
        let _ = unmount(mountpoint, true, false);
        return Err(MountError::NotAnswering {
            path: mountpoint.to_path_buf(),
            error,
        });
    }
    Ok(mounted)
}

/// Raises the kernel's readahead for the mount where allowed; the mount works either way. With
/// READs capped at `max_read`, the readahead is a multiple of it: 1 MiB of readahead in READs of
/// 254 pages was a READ of 254 pages and one of 2, twice the requests.
fn set_readahead(mountpoint: &Path, bytes: u64, max_read: Option<u32>) {
    if bytes == 0 {
        return;
    }
    let whole_reads = match max_read.map(u64::from) {
        Some(max) if bytes >= max => bytes - bytes % max,
        _ => bytes,
    };
    match fs::kernel_readahead::set(mountpoint, whole_reads) {
        Ok(now) => debug!(bytes = now, "kernel readahead set"),
        Err(e) => {
            // Nothing to fix where the mount runs without root or with /sys read-only (a
            // container): said, not warned.
            let why = if e.kind() == std::io::ErrorKind::PermissionDenied {
                format!("raising it to {} KiB needs root", bytes / 1024)
            } else if e.raw_os_error() == Some(libc::EROFS) {
                "/sys is read-only here, as in a container".to_string()
            } else {
                warn!(
                    "cannot set the kernel readahead for {}: {e}",
                    mountpoint.display()
                );
                return;
            };
            info!(
                "kernel readahead stays at {} KiB ({why}): samples over that size take one \
                 request per {0} KiB",
                fs::kernel_readahead::get(mountpoint).map_or(128, |b| b / 1024)
            );
        }
    }
}

/// Serves until the kernel ends the session (an unmount) or a signal asks to unmount.
fn wait_for_the_end(
    mut mounted: Mounted,
    mut signals: Signals,
    mountpoint: &Path,
) -> Result<(), MountError> {
    let (sig_tx, sig_rx) = crossbeam_channel::bounded(1);
    let handle = signals.handle();
    std::thread::Builder::new()
        .name("packfs-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let _ = sig_tx.send(sig);
            }
        })
        .map_err(MountError::Thread)?;
    crossbeam_channel::select! {
        recv(mounted.ended()) -> ended => {
            let ended = ended.unwrap_or_else(|_| Err(std::io::Error::other("session thread died")));
            if let Err(error) = ended {
                handle.close();
                return Err(MountError::Session {
                    path: mountpoint.to_path_buf(),
                    error,
                });
            }
            info!("unmounted");
        }
        recv(sig_rx) -> sig => {
            info!("signal {}: unmounting {}", sig.unwrap_or(0), mountpoint.display());
            if let Err(e) = unmount(mountpoint, true, false) {
                warn!("{e}");
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
    Ok(())
}

/// The daemon's process id in a file, for as long as the daemon runs.
struct PidFile(PathBuf);

impl PidFile {
    fn create(path: &Path) -> Result<PidFile, MountError> {
        let pid = format!("{}\n", std::process::id());
        crate::util::safe_file::replace(path, pid.as_bytes(), crate::util::safe_file::PRIVATE)
            .map_err(|error| MountError::PidFile {
                path: path.to_path_buf(),
                error,
            })?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    /// Removes the file if it still names this process: `packfs umount` returns before the old
    /// daemon exits, and a new mount may have written its own pid there meanwhile.
    fn drop(&mut self) {
        let ours = format!("{}\n", std::process::id());
        let still_ours = crate::util::safe_file::no_follow()
            .read(true)
            .open(&self.0)
            .and_then(|mut f| {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut f, &mut text).map(|_| text)
            })
            .is_ok_and(|text| text == ours);
        if still_ours {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
