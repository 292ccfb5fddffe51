//! The benchmarks' parallel-file-system simulator (bench/pfssim) in tests: built once per test
//! process, mounted over a directory with a latency profile, its counters read back.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::run;

/// The simulator's binary, built once per test process (its own crate, its own target dir).
fn pfssim() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target = root.join("target/pfssim");
        run(Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--manifest-path"])
            .arg(root.join("bench/pfssim/Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target));
        target.join("debug/pfssim")
    })
}

pub struct Sim {
    child: Child,
    pub mnt: PathBuf,
    stats: PathBuf,
}

impl Sim {
    pub fn start(backing: &Path, mnt: &Path, args: &[&str]) -> Sim {
        fs::create_dir_all(mnt).unwrap();
        let stats = mnt.with_extension("json");
        let child = Command::new(pfssim())
            .args(args)
            .arg("--allow-other")
            .arg("--stats")
            .arg(&stats)
            .arg(backing)
            .arg(mnt)
            .spawn()
            .expect("start pfssim");
        let start = Instant::now();
        while !(is_fuse_mount(mnt) && stats.exists()) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "pfssim did not mount"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Sim {
            child,
            mnt: mnt.to_path_buf(),
            stats,
        }
    }

    /// The counters once every reply sent so far is in them (rewritten every 100 ms).
    pub fn counters(&self) -> serde_json::Value {
        std::thread::sleep(Duration::from_millis(300));
        serde_json::from_slice(&fs::read(&self.stats).unwrap()).unwrap()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = self.child.wait();
    }
}

fn is_fuse_mount(path: &Path) -> bool {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    text.lines()
        .any(|l| l.split(' ').nth(4) == Some(path) && l.contains("fuse.pfssim"))
}
