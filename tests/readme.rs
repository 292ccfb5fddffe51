//! The README's quickstart, run as written: the block under "## Quickstart", with this build's
//! `packfs` first on PATH. A step that no longer works as printed fails here.

mod common;

use std::path::Path;
use std::process::Command;

use common::packfs;

/// The first ```sh block after the heading `heading` in `text`.
fn block_after(text: &str, heading: &str) -> String {
    let rest = &text[text.find(heading).expect("the heading")..];
    let start = rest.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let len = rest[start..].find("```").expect("the block's end");
    rest[start..start + len].to_string()
}

#[test]
fn the_readme_quickstart_runs_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let script = block_after(&readme, "## Quickstart");
    // Its paths are fixed (/tmp/qs): a run that failed halfway leaves them; start clean.
    let _ = packfs()
        .args(["umount", "--if-mounted", "/tmp/qs/mnt"])
        .status();
    let _ = std::fs::remove_dir_all("/tmp/qs");
    let bin = Path::new(env!("CARGO_BIN_EXE_packfs")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = packfs()
        .args(["umount", "--if-mounted", "/tmp/qs/mnt"])
        .status();
    let _ = std::fs::remove_dir_all("/tmp/qs");
    assert!(out.status.success(), "{script}\n{stdout}\n{stderr}");
    // What the comments promise: the file's bytes through the mount, then its status.
    assert!(stdout.lines().any(|l| l == "meow"), "{stdout}");
    assert!(stdout.contains("/tmp/qs/mnt  live"), "{stdout}");
}
