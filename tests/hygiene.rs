//! Tests clean up after themselves: data shared by the tests of one file is removed when the test
//! process exits, also when a test failed.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

/// Runs as a child of `shared_data_is_removed_at_exit`: makes a shared directory, prints its path,
/// and fails when asked to.
#[test]
fn child_makes_shared_data() {
    let Ok(mode) = std::env::var("PACKFS_HYGIENE_CHILD") else {
        return;
    };
    let dir = removed_at_exit(tempfile::tempdir().unwrap());
    std::fs::write(dir.join("data"), b"x").unwrap();
    println!("SHARED={}", dir.display());
    assert_ne!(mode, "fail", "failing on purpose");
}

#[test]
fn shared_data_is_removed_at_exit() {
    for mode in ["pass", "fail"] {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_makes_shared_data", "--nocapture"])
            .env("PACKFS_HYGIENE_CHILD", mode)
            .output()
            .unwrap();
        assert_eq!(out.status.success(), mode == "pass", "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let dir: PathBuf = stdout
            .lines()
            .find_map(|l| l.strip_prefix("SHARED="))
            .unwrap_or_else(|| panic!("no path printed:\n{stdout}"))
            .into();
        assert!(!dir.exists(), "{} left behind ({mode})", dir.display());
    }
}
