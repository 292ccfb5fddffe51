//! The mount's counters as a small JSON file, rewritten every second while the daemon runs, so
//! that scripts (and a later `packfs status MOUNT`) can read them without asking the daemon.
//!
//! The file is replaced by rename, so a reader never sees half of it; it is removed at exit, when
//! the log gets the final figures.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tracing::warn;

use crate::tiers::Images;

const PERIOD: Duration = Duration::from_secs(1);

/// Where the stats of the mount at `mountpoint` (absolute) are written by default:
/// `/run/packfs` for root, `$XDG_RUNTIME_DIR/packfs` or `/tmp/packfs-UID` for others, then the
/// mount point's name and a hash of its whole path.
pub fn default_path(mountpoint: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let uid = nix::unistd::getuid();
    let dir = if uid.is_root() {
        PathBuf::from("/run/packfs")
    } else if let Some(run) = std::env::var_os("XDG_RUNTIME_DIR") {
        PathBuf::from(run).join("packfs")
    } else {
        PathBuf::from(format!("/tmp/packfs-{uid}"))
    };
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
    dir.join(format!("{name}.{hash:016x}.json"))
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The counters as JSON.
pub fn render(images: &Images, mountpoint: &Path, started: Instant) -> String {
    let tiers = images.stats();
    let src = images.source().stats();
    let ram = images.ram_stats();
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\n  \"mountpoint\": {},\n  \"pid\": {},\n  \"uptime_s\": {:.1},\n",
        json_str(&mountpoint.to_string_lossy()),
        std::process::id(),
        started.elapsed().as_secs_f64()
    );
    let _ = writeln!(
        s,
        "  \"served\": {{\"ram_bytes\": {}, \"staged_bytes\": {}, \"source_bytes\": {}}},",
        tiers.ram_bytes, tiers.staged_bytes, tiers.source_bytes
    );
    let _ = writeln!(
        s,
        "  \"source\": {{\"opens\": {}, \"reads\": {}, \"bytes\": {}, \"stage_reads\": {}, \"stage_bytes\": {}}},",
        src.opens, src.reads, src.bytes, src.stage_reads, src.stage_bytes
    );
    let _ = writeln!(
        s,
        "  \"ram\": {{\"budget\": {}, \"held\": {}, \"peak\": {}, \"hits\": {}, \"loads\": {}, \"loaded_bytes\": {}}},",
        ram.budget, ram.held, ram.peak, ram.hits, ram.loads, ram.loaded_bytes
    );
    match images.stage() {
        None => s.push_str("  \"stage\": null\n"),
        Some(stage) => {
            let st = stage.stats();
            let _ = writeln!(
                s,
                "  \"stage\": {{\"dir\": {}, \"mode\": {}, \"status\": {}, \"images\": {}, \
                 \"total_bytes\": {}, \"present_bytes\": {}, \"copied_bytes\": {}, \
                 \"copied_from_reads\": {}, \"verified_chunks\": {}, \"failed_checks\": {}, \
                 \"evicted_bytes\": {}}}",
                json_str(&stage.dir().to_string_lossy()),
                json_str(&format!("{:?}", stage.mode()).to_lowercase()),
                json_str(&st.status),
                st.images,
                st.total_bytes,
                st.present_bytes,
                st.copied_bytes,
                st.copied_from_reads,
                st.verified_chunks,
                st.failed_checks,
                st.evicted_bytes
            );
        }
    }
    s.push_str("}\n");
    s
}

/// Rewrites the stats file every second until dropped; then removes it.
pub struct StatsFile {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatsFile {
    pub fn start(path: PathBuf, images: Arc<Images>, mountpoint: PathBuf) -> StatsFile {
        let stop = Arc::new(AtomicBool::new(false));
        if let Some(dir) = path.parent()
            && let Err(e) = std::fs::create_dir_all(dir)
        {
            warn!("cannot create {} for the stats file: {e}", dir.display());
        }
        let (p, flag) = (path.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("packfs-stats".into())
            .spawn(move || {
                let started = Instant::now();
                let tmp = p.with_extension("json.tmp");
                let mut warned = false;
                while !flag.load(Ordering::Relaxed) {
                    let text = render(&images, &mountpoint, started);
                    let written =
                        std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &p));
                    if let Err(e) = written
                        && !warned
                    {
                        warn!("cannot write the stats file {}: {e}", p.display());
                        warned = true;
                    }
                    let until = Instant::now() + PERIOD;
                    while !flag.load(Ordering::Relaxed) && Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            })
            .map_err(|e| warn!("cannot start the stats writer: {e}"))
            .ok();
        StatsFile { path, stop, thread }
    }
}

impl Drop for StatsFile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
