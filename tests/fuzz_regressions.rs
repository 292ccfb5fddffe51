//! Every input the fuzzers found a crash or a hang with, run again through the same checks as
//! the fuzz targets (fuzz/fuzz_targets/common.rs): scanned catalogs consistent and readable,
//! crafted indexes served without a panic. The inputs live in fuzz/regressions/<target>/.

#[path = "../fuzz/fuzz_targets/common.rs"]
mod common;

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// The inputs of one target, by file name.
fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(target);
    let mut found: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    found.sort();
    found
}

/// Runs `check` on every input of `target`; one that hung the fuzzer fails here instead of
/// stalling the test run.
fn replay(target: &'static str, check: fn(&[u8])) {
    for (name, bytes) in inputs(target) {
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            check(&bytes);
            let _ = done.send(());
        });
        match finished.recv_timeout(Duration::from_secs(120)) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("{target}/{name} still runs after 120 s")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{target}/{name} panicked"),
        }
    }
}

#[test]
fn tar_inputs() {
    replay("scan_tar", |b| common::run(b, packfs::archive::tar::scan));
}

#[test]
fn gzip_inputs() {
    replay("scan_gzip", |b| {
        common::run(b, packfs::archive::tar::GZIP_TAR.scan)
    });
}

#[test]
fn zstd_inputs() {
    replay("scan_zstd", |b| {
        common::run(b, packfs::archive::tar::ZSTD_TAR.scan)
    });
}

#[test]
fn xz_inputs() {
    replay("scan_xz", |b| {
        common::run(b, packfs::archive::tar::XZ_TAR.scan)
    });
}

#[test]
fn bzip2_inputs() {
    replay("scan_bzip2", |b| {
        common::run(b, packfs::archive::tar::BZIP2_TAR.scan)
    });
}

#[test]
fn zip_inputs() {
    replay("scan_zip", |b| common::run(b, packfs::archive::zip::scan));
}

#[test]
fn squashfs_inputs() {
    replay("scan_squashfs", |b| {
        common::run(b, packfs::archive::squashfs::scan)
    });
}

#[test]
fn index_inputs() {
    replay("index", common::run_index);
}
