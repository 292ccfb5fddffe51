//! The mount's counters: one snapshot type, rendered to a small JSON file rewritten every second
//! while the daemon runs (so scripts, and a later `packfs status MOUNT`, read them without asking
//! the daemon), and to the log at exit.
//!
//! The file is replaced by rename, so a reader never sees half of it; it is removed at exit.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tracing::{info, warn};

use crate::fs::requests::{OpFigures, Requests};
use crate::tiers::stage::StageStats;
use crate::tiers::{RamStats, SourceStats, TierStats};
use indexmap::IndexMap;

const PERIOD: Duration = Duration::from_secs(1);

/// Where the stats of the mount at `mountpoint` (absolute) whose file system is `device`
/// (`major:minor`, `mounts::MountEntry::device`) are written by default: `/run/packfs` for root,
/// `$XDG_RUNTIME_DIR/packfs` or `/tmp/packfs-UID` for others, then the mount point's name, a
/// hash of its whole path and the device. The device is the daemon's own (one per FUSE
/// connection): a daemon that outlives its unmount, serving a copy of the mount in another
/// mount namespace, keeps its files apart from the next mount at the same place (they shared
/// one stats file and one hints socket).
pub fn default_path(mountpoint: &Path, device: &str) -> PathBuf {
    default_dir().0.join(format!(
        "{}.{}.json",
        base_name(mountpoint),
        device.replace(':', "-")
    ))
}

/// Where the log of a mount at `mountpoint` goes when it has nowhere else (no syslog, no
/// `--log-file`): beside the stats files, one per mount point.
pub fn log_path(mountpoint: &Path) -> PathBuf {
    default_dir()
        .0
        .join(format!("{}.log", base_name(mountpoint)))
}

/// The mount point's name and a hash of its whole path.
fn base_name(mountpoint: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let hash = xxhash_rust::xxh3::xxh3_64(mountpoint.as_os_str().as_bytes());
    let name: String = mountpoint
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{name}.{hash:016x}")
}

/// Where a daemon run by `uid` may have written the stats of `mountpoint` by default, for
/// `packfs status` (the user's runtime directory is only known to their own processes).
pub fn candidate_paths(mountpoint: &Path, device: &str, uid: u32) -> Vec<PathBuf> {
    let mine = default_path(mountpoint, device);
    let name = mine.file_name().expect("a file name").to_os_string();
    let mut paths = vec![];
    if uid == nix::unistd::getuid().as_raw() {
        paths.push(mine);
    }
    if uid == 0 {
        paths.push(Path::new("/run/packfs").join(&name));
    } else {
        paths.push(PathBuf::from(format!("/run/user/{uid}/packfs")).join(&name));
        paths.push(PathBuf::from(format!("/tmp/packfs-{uid}")).join(&name));
    }
    paths.dedup();
    paths
}

/// The directory of the default stats files and the mode it is made with: readable by all for
/// root's (`/run/packfs`), private for a user's.
pub fn default_dir() -> (PathBuf, u32) {
    let uid = nix::unistd::getuid();
    // Root of a user namespace (a rootless container) is a user outside: /run/packfs is the real
    // root's, so it takes a user's directory, named by its uid outside (which owns it, and
    // which it sees as its own).
    let outer = crate::util::userns::outer_uid();
    if uid.is_root() && outer.is_none() {
        (PathBuf::from("/run/packfs"), 0o755)
    } else if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR") {
        (PathBuf::from(run).join("packfs"), 0o700)
    } else {
        (
            PathBuf::from(format!("/tmp/packfs-{}", outer.unwrap_or(uid.as_raw()))),
            0o700,
        )
    }
}

/// Makes or checks the default stats directory: in a shared /tmp another user could have made
/// it first, to read or redirect what the daemon writes there.
pub fn check_default_dir() -> Result<(), crate::util::safe_file::DirError> {
    let (dir, mode) = default_dir();
    crate::util::safe_file::private_dir(&dir, mode)
}

/// Removes the stats file a daemon that died left for `mountpoint` (found at the default path;
/// the file names its pid, which must no longer run), and gives its counters (what that daemon
/// was doing: its stage, to remove).
pub fn remove_if_orphaned(mountpoint: &Path, device: &str) -> Option<Counters> {
    let path = default_path(mountpoint, device);
    let text = std::fs::read_to_string(&path).ok()?;
    let value = serde_json::from_str::<serde_json::Value>(&text).ok();
    let pid = value
        .as_ref()
        .and_then(|v| v.get("pid").and_then(|p| p.as_i64()));
    if pid.is_none_or(|pid| pid > 0 && !alive(pid)) {
        let _ = std::fs::remove_file(&path);
        // Metrics of a dead daemon would show it up to a dashboard forever.
        let _ = std::fs::remove_file(path.with_extension("prom"));
        // Parsed once: the counters from the value already read.
        return value.and_then(|v| serde_json::from_value(v).ok());
    }
    None
}

/// The pid of the daemon serving `mountpoint`, from its stats file at the default path, if it
/// runs.
pub fn daemon_pid(mountpoint: &Path, device: &str) -> Option<i64> {
    let text = std::fs::read_to_string(default_path(mountpoint, device)).ok()?;
    let value = serde_json::from_str::<serde_json::Value>(&text).ok()?;
    let pid = value.get("pid")?.as_i64()?;
    (pid > 0 && alive(pid)).then_some(pid)
}

/// Whether process `pid` runs (a killed daemon may stay a zombie for long: its parent is
/// whoever adopted it).
pub fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat.rsplit(')').next().unwrap_or("").trim_start();
        !state.starts_with('Z') && !state.starts_with('X')
    })
}

impl About {
    /// " (N archives inside them served as directories)" when there are some.
    pub fn inside(&self) -> String {
        match self.inner_archives {
            0 => String::new(),
            n => format!(" ({n} archives inside them served as directories)"),
        }
    }
}

/// What a mount is, fixed while it runs: written into every snapshot, so `packfs status` needs
/// nothing but the stats file.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct About {
    pub version: String,
    /// The index or first image, and how many more (the source column of /proc/mounts).
    pub dataset: String,
    /// Images given (files or objects), and archives inside them served as directories.
    pub images: u64,
    pub inner_archives: u64,
    pub files: u64,
    /// Bytes of all files.
    pub bytes: u64,
    /// Seconds since the Unix epoch when the mount became ready.
    pub started_unix: u64,
    /// Where the daemon logs (`syslog`, a file, or `stderr`).
    pub log: String,
    pub trace: Option<String>,
    pub idle_timeout_s: Option<u64>,
    /// The uid that owns the daemon (who can unmount it, besides root).
    pub uid: u32,
    /// The user and group a mount was made for (`--uid`, `--gid` of a root prolog), when not
    /// the daemon's own: that group may read these counters, so the job's user sees the mount
    /// in `packfs status`.
    pub served_uid: Option<u32>,
    pub served_gid: Option<u32>,
    /// The stage directory goes with the mount (`--stage-in` without `--keep-stage`): what
    /// `packfs umount` removes too when the daemon was killed.
    pub stage_goes: bool,
    /// How FUSE requests reach the daemon: `classic` or `uring` (the one in use, after any
    /// fallback).
    pub transport: String,
    /// Members the scan (or `packfs index`) left out with a warning; of those, damaged tar headers.
    pub skipped_members: u64,
    pub damaged_headers: u64,
    /// Files whose reads are checked against a checksum in the catalog (`Catalog::
    /// checksummed_files`); the others are served as their image holds them now. Counted in
    /// the background once mounted (a walk of every entry, which a mount from an index must
    /// not wait for): `None` until then.
    pub checksummed_files: Option<u64>,
    /// The socket samplers send their hints to (absent: hints are off).
    pub hints: Option<String>,
}

/// Every counter of a mount at one moment (docs/metrics.md says what each means). Written by the
/// daemon and read back, typed, by `packfs status`; a field a file lacks (another version's)
/// reads as its default.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Counters {
    /// As text (lossy for a non-UTF-8 path, which JSON cannot carry).
    pub mountpoint: String,
    pub pid: u32,
    pub uptime_s: f64,
    #[serde(flatten)]
    pub about: About,
    /// Bytes delivered to readers by each tier.
    pub served: TierStats,
    /// Operations on the backing files.
    pub source: SourceStats,
    pub ram: RamStats,
    pub stage: Option<StageStats>,
    /// Chunks served to the job's other nodes and read from them (absent without --peers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peers: Option<crate::peers::stats::PeerStats>,
    /// Requests to object stores and HTTP servers, per store (empty for files).
    pub remote: Vec<crate::source::remote::StoreStats>,
    /// The S3 credentials: where from, until when, renewals (absent without S3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<crate::source::remote::CredentialStats>,
    /// FUSE requests by operation (in `Op::ALL` order): count, errors, bytes and latency
    /// percentiles.
    pub requests: IndexMap<String, OpFigures>,
    /// Requests answered with an error (not counting "no such file" and refused ioctls).
    pub errors: u64,
    /// Requests that came through FUSE-over-io_uring rings (0 with the classic transport).
    pub ring_requests: u64,
    /// What samplers' hints did (absent: hints are off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lookahead: Option<crate::tiers::lookahead::HintStats>,
    /// The readers (processes) that waited on storage longest, most first (at most
    /// `READERS_SHOWN`; pid 0: the others).
    #[serde(default)]
    pub readers_waiting: Vec<ReaderWait>,
}

/// Readers shown by their wait on storage.
const READERS_SHOWN: usize = 16;

/// One reader's wait on storage.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReaderWait {
    pub pid: u32,
    pub wait_ns: u64,
}

/// What the counters are read from.
pub struct Sources {
    pub engine: Arc<crate::engine::Engine>,
    pub requests: Arc<Requests>,
    pub about: About,
}

impl Counters {
    pub fn of(src: &Sources, mountpoint: &Path, started: Instant) -> Counters {
        let images = src.engine.files().images();
        let mut requests = IndexMap::new();
        let mut errors = 0;
        for (op, figures) in src.requests.figures() {
            errors += figures.errors;
            requests.insert(op.name().to_string(), figures);
        }
        Counters {
            mountpoint: mountpoint.to_string_lossy().into_owned(),
            pid: std::process::id(),
            uptime_s: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
            about: About {
                checksummed_files: src.engine.checksummed().get().copied(),
                ..src.about.clone()
            },
            served: images.stats(),
            source: images.source().stats(),
            ram: images.ram_stats(),
            stage: images.stage().map(|s| s.stats()),
            peers: src.engine.peer_stats(),
            remote: src.engine.stores().stats(),
            credentials: src.engine.stores().credential_stats(),
            requests,
            errors,
            ring_requests: src.requests.through_rings(),
            lookahead: src.engine.lookahead().map(|h| h.stats()),
            readers_waiting: images
                .waits()
                .by_reader()
                .into_iter()
                .take(READERS_SHOWN)
                .map(|(pid, wait_ns)| ReaderWait { pid, wait_ns })
                .collect(),
        }
    }

    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("counters serialize");
        text.push('\n');
        text
    }

    /// One log line per group, `title key=value ...`, with the same names as the JSON.
    pub fn log(&self) {
        info!("source operations {}", fields(&self.source));
        info!("bytes served by tier {}", fields(&self.served));
        info!("RAM cache {}", fields(&self.ram));
        for (op, figures) in &self.requests {
            info!("requests {op} {}", fields(figures));
        }
        if let Some(st) = &self.stage {
            info!("staging in {}: {} {}", st.dir, st.status, fields(st));
        }
        if let Some(h) = &self.lookahead {
            info!("hints {}", fields(h));
        }
    }
}

/// The numeric fields of a group as `key=value` pairs.
fn fields(group: &impl Serialize) -> String {
    let value = serde_json::to_value(group).expect("counters serialize");
    let Some(map) = value.as_object() else {
        return String::new();
    };
    map.iter()
        .filter(|(_, v)| v.is_number())
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The final figures of every tier and operation, at exit.
pub fn log_counters(src: &Sources) {
    Counters::of(src, Path::new(""), Instant::now()).log();
}

/// Rewrites the stats files every second until dropped; then removes them.
pub struct StatsFile {
    paths: Vec<PathBuf>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatsFile {
    /// Writes to every path in `paths` (the default one, where `packfs status` looks, and the
    /// one `--stats-file` asked for). The first write is done before returning, so a `packfs
    /// status` right after the mount's ready line finds the counters.
    /// `metrics_group` may read the Prometheus file.
    pub fn start(
        paths: Vec<PathBuf>,
        src: Sources,
        mountpoint: PathBuf,
        metrics_group: Option<u32>,
    ) -> StatsFile {
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut warned = vec![false; paths.len()];
        write_once(
            &paths,
            &src,
            &mountpoint,
            started,
            metrics_group,
            &mut warned,
        );
        let (ps, flag) = (paths.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("packfs-stats".into())
            .spawn(move || {
                loop {
                    let until = Instant::now() + PERIOD;
                    while !flag.load(Ordering::Relaxed) && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    write_once(&ps, &src, &mountpoint, started, metrics_group, &mut warned);
                }
            })
            .map_err(|e| warn!("cannot start the stats writer: {e}"))
            .ok();
        StatsFile {
            paths,
            stop,
            thread,
        }
    }
}

/// One rewrite of the stats files (and the Prometheus file beside the default one); a path that
/// cannot be written is warned of once.
fn write_once(
    paths: &[PathBuf],
    src: &Sources,
    mountpoint: &Path,
    started: Instant,
    metrics_group: Option<u32>,
    warned: &mut [bool],
) {
    let counters = Counters::of(src, mountpoint, started);
    let text = counters.to_json();
    // Beside the default stats file: node_exporter's textfile collector reads every *.prom of
    // the directory it is given.
    if let Some(default) = paths.first() {
        let prom = default.with_extension("prom");
        let mode = match metrics_group {
            Some(_) => 0o640,
            None => crate::util::safe_file::PRIVATE,
        };
        let prom_text = counters.to_prometheus();
        let _ =
            crate::util::safe_file::replace_for(&prom, prom_text.as_bytes(), mode, metrics_group);
    }
    // Counters name the dataset, its paths and the daemon's pid: the owner's only, and the
    // group of the user the mount serves (a job's, mounted by root).
    let (mode, group) = match counters.about.served_gid {
        Some(gid) => (0o640, Some(gid)),
        None => (crate::util::safe_file::PRIVATE, None),
    };
    for (p, warned) in paths.iter().zip(warned.iter_mut()) {
        let written = crate::util::safe_file::replace_for(p, text.as_bytes(), mode, group);
        if let Err(e) = written
            && !*warned
        {
            warn!("cannot write the stats file {}: {e}", p.display());
            *warned = true;
        }
    }
}

impl Drop for StatsFile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
        if let Some(default) = self.paths.first() {
            let _ = std::fs::remove_file(default.with_extension("prom"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{DuplicatePolicy, build};
    use crate::fs::requests::Op;

    /// The counters of an empty dataset with a 1 MiB RAM budget.
    fn empty_sources() -> Sources {
        let catalog = Arc::new(build(&[], DuplicatePolicy::Error).unwrap());
        let opts = crate::engine::EngineOptions {
            cache_size: 1 << 20,
            ..crate::engine::EngineOptions::one_shot(vec![], DuplicatePolicy::Error.into())
        };
        let stores = crate::source::Stores::default();
        let engine = crate::engine::Engine::over(catalog, &opts, stores, None).unwrap();
        Sources {
            engine: Arc::new(engine),
            requests: Arc::new(Requests::default()),
            about: About::default(),
        }
    }

    #[test]
    fn counters_of_a_mount_with_a_non_utf8_path_are_json() {
        use std::os::unix::ffi::OsStrExt;
        let odd = Path::new(std::ffi::OsStr::from_bytes(b"/tmp/caf\xe9"));
        let src = empty_sources();
        src.requests.record(Op::Read, Instant::now(), 10, true);
        let json = Counters::of(&src, odd, Instant::now()).to_json();
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["mountpoint"], "/tmp/caf\u{fffd}");
        assert_eq!(parsed["ram"]["budget"], 1 << 20);
        assert_eq!(parsed["stage"], serde_json::Value::Null);
        assert_eq!(parsed["requests"]["read"]["count"], 1);
        assert_eq!(parsed["requests"]["read"]["bytes"], 10);
        assert_eq!(parsed["errors"], 1);
        // `packfs status` reads back, typed, what the daemon wrote, field for field.
        let back: Counters = serde_json::from_str(&json).unwrap();
        assert_eq!(back.requests["read"].count, 1);
        assert_eq!(back.ram.budget, 1 << 20);
        assert_eq!(back.to_json(), json);
        let counters = Counters::of(&src, odd, Instant::now());
        let prom = counters.to_prometheus();
        assert!(
            prom.contains("packfs_requests_total{mountpoint=\"/tmp/caf\u{fffd}\",op=\"read\"} 1\n"),
            "{prom}"
        );
        assert!(prom.contains("# TYPE packfs_served_bytes_total counter\n"));
        assert!(prom.contains("tier=\"source\"} 0\n"));
    }
    /// `packfs mount && packfs status MNT` in a prologue: the counters are there when the ready
    /// line is (the first file used to be written by the thread, a moment later).
    #[test]
    fn the_stats_file_exists_when_start_returns() {
        let src = empty_sources();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mnt.json");
        let file = StatsFile::start(vec![path.clone()], src, dir.path().join("mnt"), None);
        let parsed: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(parsed["pid"], std::process::id());
        assert!(path.with_extension("prom").exists());
        drop(file);
        assert!(!path.exists(), "removed when the mount ends");
    }
}
