//! Smoke test of the benchmarks' parallel-file-system simulator (bench/pfssim): it builds, serves
//! a tree byte for byte, counts what it is asked, holds replies back by its latency, and packfs
//! over tar shards on it makes no metadata operation per sample.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::pfssim::Sim;
use common::*;

fn op(c: &serde_json::Value, name: &str) -> u64 {
    c["ops"][name].as_u64().unwrap()
}

fn sample_tree(root: &Path, files: usize) -> u64 {
    let mut total = 0;
    for i in 0..files {
        let data = bytes(i as u64, 1000 + 37 * i);
        total += data.len() as u64;
        write_file(
            &root.join(format!("train/c{}/s{i:03}.jpg", i % 4)),
            &data,
            0o644,
        );
    }
    // One time for the directories: a shard that holds train/c0 but not train makes packfs
    // synthesize train with c0's time, which differed by a second from the tree's when the
    // files were written across a second boundary (a flaky CI run).
    let dirs: Vec<PathBuf> = ["train/c0", "train/c1", "train/c2", "train/c3", "train"]
        .iter()
        .map(|d| root.join(d))
        .filter(|d| d.exists())
        .collect();
    run(Command::new("touch")
        .args(["-d", "@1700000000"])
        .args(&dirs));
    total
}

#[test]
fn serves_the_tree_and_counts_every_operation() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let total = sample_tree(&backing, 40);
    let sim = Sim::start(&backing, &dir.path().join("pfs"), &["--profile", "none"]);
    let before = sim.counters();
    assert_same_tree(&backing, &sim.mnt, &[]);
    let after = sim.counters();
    let delta = |name| op(&after, name) - op(&before, name);
    // diff opened and read every file once: one open and one release each, all bytes read.
    assert_eq!(delta("open"), 40);
    assert_eq!(delta("release"), 40);
    assert!(delta("lookup") >= 40, "lookups: {}", delta("lookup"));
    assert_eq!(
        after["read_bytes"].as_u64().unwrap() - before["read_bytes"].as_u64().unwrap(),
        total
    );
    assert_eq!(after["errors"], 0);
    // Read-only, like a dataset directory should be mounted.
    assert!(fs::write(sim.mnt.join("train/new"), b"x").is_err());
}

#[test]
fn replies_wait_for_their_simulated_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    sample_tree(&backing, 8);
    // One metadata RPC in flight at a time, 50 ms each: four parallel stats of new names take at
    // least four round trips, whatever the machine's speed (replies are never early).
    let sim = Sim::start(
        &backing,
        &dir.path().join("pfs"),
        &[
            "--profile",
            "none",
            "--meta-us",
            "50000",
            "--meta-in-flight",
            "1",
        ],
    );
    let _ = fs::metadata(sim.mnt.join("train/c0")).unwrap();
    let start = Instant::now();
    let stats: Vec<_> = (0..4)
        .map(|i| {
            let p = sim.mnt.join(format!("train/c{}/s{i:03}.jpg", i % 4));
            std::thread::spawn(move || fs::metadata(p).unwrap().len())
        })
        .collect();
    for s in stats {
        assert!(s.join().unwrap() > 0);
    }
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "4 queued lookups took {:?}",
        start.elapsed()
    );
}

#[test]
fn packfs_over_shards_on_it_asks_no_metadata_per_sample() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    sample_tree(&src, 60);
    let backing = dir.path().join("backing");
    fs::create_dir_all(&backing).unwrap();
    tar_members(
        &src,
        &backing.join("train-0.tar"),
        &["train/c0", "train/c1"],
    );
    tar_members(
        &src,
        &backing.join("train-1.tar"),
        &["train/c2", "train/c3"],
    );
    let sim = Sim::start(&backing, &dir.path().join("pfs"), &["--profile", "fast"]);
    let shards: Vec<PathBuf> = ["train-0.tar", "train-1.tar"]
        .iter()
        .map(|s| sim.mnt.join(s))
        .collect();
    let index = dir.path().join("ds.packfs-index");
    run(packfs()
        .args(["index", "-q", "-o"])
        .arg(&index)
        .args(&shards));
    let mnt = Mount::new(&[&index], &dir.path().join("mnt"), &[]);
    let before = sim.counters();
    assert_same_tree(&src, &mnt.dir, &[]);
    let after = sim.counters();
    let meta = |c: &serde_json::Value| c["metadata_ops"].as_u64().unwrap();
    // 60 samples read whole through packfs: the shards stay open, so the simulated file system
    // sees reads only; a plain tree would have cost at least 3 metadata RPCs per sample.
    assert_eq!(meta(&after) - meta(&before), 0, "{after:#}");
    assert!(op(&after, "read") > op(&before, "read"));
    assert_eq!(after["errors"], 0);
}

#[test]
fn a_sample_over_128k_costs_one_source_read() {
    if !nix::unistd::geteuid().is_root() {
        skip("root", "raising the kernel readahead needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let samples: Vec<String> = (0..10).map(|i| format!("train/big{i}.jpg")).collect();
    for (i, s) in samples.iter().enumerate() {
        write_file(&src.join(s), &bytes(100 + i as u64, 300_000), 0o644);
    }
    let backing = dir.path().join("backing");
    fs::create_dir_all(&backing).unwrap();
    tar_members(&src, &backing.join("train-0.tar"), &["train"]);
    let sim = Sim::start(&backing, &dir.path().join("pfs"), &["--profile", "none"]);
    let mnt = Mount::new(
        &[&sim.mnt.join("train-0.tar")],
        &dir.path().join("mnt"),
        &[],
    );
    let before = sim.counters();
    for s in &samples {
        // One read(2) of the whole file, as Python's f.read() does.
        assert_eq!(
            fs::read(mnt.dir.join(s)).unwrap(),
            fs::read(src.join(s)).unwrap()
        );
    }
    let after = sim.counters();
    // With the kernel's 128 KiB readahead each 300 kB sample took three READs, each one a read
    // of the shard: three round trips to a parallel file system instead of one.
    assert_eq!(
        op(&after, "read") - op(&before, "read"),
        samples.len() as u64
    );
}

/// A 1 MiB read into a buffer that starts inside a page (as one from malloc does) spans 257 pages;
/// FUSE direct I/O sends at most 256 per request and so cuts it in two. The simulator counts one
/// RPC, as a parallel file system client moving the 1 MiB extent would (counted twice, every
/// chunk packfs fetched cost two, the second for 16 bytes). Reads of adjacent ranges stay one RPC
/// each.
#[test]
fn a_read_cut_at_the_kernels_page_limit_is_one_rpc() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    write_file(&backing.join("big.bin"), &bytes(5, 4 << 20), 0o644);
    let sim = Sim::start(&backing, &dir.path().join("pfs"), &["--profile", "none"]);
    let file = fs::File::open(sim.mnt.join("big.bin")).unwrap();
    let reads = |c: &serde_json::Value| c["data_ops"].as_u64().unwrap();
    let before = sim.counters();
    // 16 bytes into a page-aligned allocation: the buffer starts inside a page.
    let mut buf = vec![0u8; (2 << 20) + 4096];
    let at = 4096 - (buf.as_ptr() as usize % 4096) + 16;
    let whole = &mut buf[at..at + (1 << 20)];
    file.read_exact_at(whole, 1 << 20).unwrap();
    assert_eq!(whole, &bytes(5, 4 << 20)[1 << 20..2 << 20]);
    let after = sim.counters();
    assert_eq!(reads(&after) - reads(&before), 1, "{after}");
    assert_eq!(after["local"]["split_tail"], 1, "{after}");
    // Two small reads, one right after the other: two RPCs.
    let mut small = [0u8; 4000];
    file.read_exact_at(&mut small, 0).unwrap();
    file.read_exact_at(&mut small, 4000).unwrap();
    assert_eq!(reads(&sim.counters()) - reads(&after), 2);
}

/// Mounting shards that sit on the parallel file system opens each one three times: the
/// launcher's check before it forks, the daemon's scan, and the daemon's source. Each open is a
/// metadata RPC; the daemon checked the images too before it scanned them (4 per shard).
#[test]
fn a_mount_opens_each_shard_three_times() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    sample_tree(&src, 20);
    let backing = dir.path().join("backing");
    fs::create_dir_all(&backing).unwrap();
    tar_members(&src, &backing.join("a.tar"), &["train/c0", "train/c1"]);
    tar_members(&src, &backing.join("b.tar"), &["train/c2", "train/c3"]);
    let sim = Sim::start(&backing, &dir.path().join("pfs"), &["--profile", "none"]);
    let before = sim.counters();
    let mnt = Mount::new(
        &[&sim.mnt.join("a.tar"), &sim.mnt.join("b.tar")],
        &dir.path().join("mnt"),
        &[],
    );
    let after = sim.counters();
    assert_eq!(op(&after, "open") - op(&before, "open"), 3 * 2, "{after:#}");
    drop(mnt);
}
