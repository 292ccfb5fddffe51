//! What the tests of remote images share: a `packfs` with only the test store's configuration,
//! the test tree in three shards, and a mount of URLs unmounted on drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

/// `packfs` with credentials for the test store and no other configuration.
pub fn pk(endpoint: &str, home: &Path) -> Command {
    pk_with(endpoint, home, servers::MOTO_KEYS)
}

/// `packfs` signing with `keys` (access key id, secret) for the store at `endpoint`, and no other
/// configuration.
pub fn pk_with(endpoint: &str, home: &Path, keys: (&str, &str)) -> Command {
    let mut cmd = packfs();
    cmd.env("AWS_ACCESS_KEY_ID", keys.0)
        .env("AWS_SECRET_ACCESS_KEY", keys.1)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("HOME", home)
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL_S3")
        .env_remove("AWS_SESSION_TOKEN");
    cmd
}

/// The test tree in `dir/src` and three GNU tar shards of it in `dir/shards`.
pub fn tree_and_shards(dir: &Path) -> (PathBuf, Vec<PathBuf>) {
    let src = dir.join("src");
    build_tree(&src, 40);
    let shards_dir = dir.join("shards");
    fs::create_dir_all(&shards_dir).unwrap();
    let mut groups: [Vec<String>; 3] = Default::default();
    for entry in fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let at = match name.as_str() {
            "big" => 1,
            "many" => 2,
            _ => 0,
        };
        groups[at].push(name);
    }
    let shards: Vec<PathBuf> = (0..3)
        .map(|i| shards_dir.join(format!("shard-{i:06}.tar")))
        .collect();
    for (shard, members) in shards.iter().zip(&groups) {
        tar_members(&src, shard, members);
    }
    (src, shards)
}

/// A mount made with `cmd` (a `packfs mount ...` without the pid file); unmounted on drop.
pub struct RemoteMount {
    pub dir: PathBuf,
    pub pid: i32,
    _guard: UnmountOnDrop,
}

impl RemoteMount {
    pub fn new(mut cmd: Command, dir: &Path) -> RemoteMount {
        fs::create_dir_all(dir).unwrap();
        let pid_file = dir.with_extension("pid");
        let guard = UnmountOnDrop(dir.to_path_buf());
        let out = cmd
            .arg(dir)
            .arg("--pid-file")
            .arg(&pid_file)
            .output()
            .unwrap();
        assert_ok(&out);
        RemoteMount {
            dir: dir.to_path_buf(),
            pid: read_pid(&pid_file),
            _guard: guard,
        }
    }

    pub fn status(&self, endpoint: &str, home: &Path) -> Value {
        let out = pk(endpoint, home)
            .args(["status", "--json"])
            .arg(&self.dir)
            .output()
            .unwrap();
        let all: Value = serde_json::from_slice(&out.stdout).unwrap();
        all[0]["counters"].clone()
    }

    /// The counters once `ok` holds of them (the daemon rewrites them every second).
    pub fn wait_for(&self, endpoint: &str, home: &Path, ok: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let counters = self.status(endpoint, home);
            if ok(&counters) {
                return counters;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "{counters}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for RemoteMount {
    fn drop(&mut self) {
        if is_mounted(&self.dir) {
            let _ = packfs().arg("umount").arg(&self.dir).output();
        }
        let started = Instant::now();
        while Path::new(&format!("/proc/{}", self.pid)).exists()
            && started.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
