//! The Python package (`python/packfs`) tested with pytest against the binary built here:
//! `cargo test` runs `python -m pytest python/tests` with PACKFS_BIN naming this build and the
//! package taken from the source tree. pytest, torch, torchvision and hypothesis come from the venv
//! `.ci/run` makes; a skipped test fails unless PACKFS_ALLOW_SKIP names python:torch.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

#[test]
fn the_python_package_passes_its_pytest_suite() {
    let Some(python) = python_with("pytest", "pytest") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests",
        ])
        .current_dir(root.join("python"))
        .env("PACKFS_BIN", env!("CARGO_BIN_EXE_packfs"))
        .env("PYTHONPATH", root.join("python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The suite ran (pytest exits 5, not 0, when it collects nothing; this is belt and braces).
    assert!(stdout.contains(" passed"), "{stdout}");
    // The torch tests skip where torch is not installed: allowed only if PACKFS_ALLOW_SKIP says so.
    if required("python:torch") {
        assert!(
            !stdout.contains("skipped"),
            "pytest skipped tests (torch or hypothesis missing?); install them into \
             target/test-venv, or set PACKFS_ALLOW_SKIP=python:torch:\n{stdout}"
        );
    }
}
