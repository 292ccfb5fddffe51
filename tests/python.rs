//! The Python package (`python/packfs`) tested with pytest against the binary built here:
//! `cargo test` runs `python -m pytest python/tests` with PACKFS_BIN naming this build, the
//! package taken from the source tree and its native module from this build (PACKFS_NATIVE).
//! pytest, torch, torchvision, fsspec and hypothesis come from the venv `.ci/run` makes; a
//! skipped test fails unless PACKFS_ALLOW_SKIP names python:torch.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// The module `packfs._native` as this build made it: the library's cdylib, beside the
/// binary's dependencies.
fn native_module() -> std::path::PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_packfs"));
    let lib = bin.parent().unwrap().join("deps").join("libpackfs.so");
    assert!(lib.is_file(), "no {} (the library's cdylib)", lib.display());
    lib
}

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
        // The native module: the library this test build compiled (it is a cdylib too).
        .env("PACKFS_NATIVE", native_module())
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
