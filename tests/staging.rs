//! Node-local staging through real mounts: the copy runs while the mount serves, resumes after a
//! kill, never serves a corrupt chunk, survives a full or vanished stage directory, and stages
//! only this node's share of the images.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// A tree split over `shards` tar images: the usual odd files in the first, and in every shard a
/// few incompressible files of 40-300 KiB, about `per_shard` bytes in all.
fn dataset(root: &Path, shards: usize, per_shard: usize) -> (PathBuf, Vec<PathBuf>) {
    let src = root.join("src");
    build_tree(&src, 20);
    let first: Vec<String> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // All files first, so that directory mtimes are final before any tar records them.
    let mut members: Vec<Vec<String>> = Vec::new();
    for s in 0..shards {
        let mut mine = vec![format!("samples/s{s:02}")];
        if s == 0 {
            mine.insert(0, "samples".into());
        }
        let mut bytes_in = 0;
        let mut n = 0;
        while bytes_in < per_shard {
            let len = 40_000 + (n * 37_813 + s * 7_919) % 260_000;
            let rel = format!("samples/s{s:02}/f{n:04}.bin");
            write_file(&src.join(&rel), &bytes((s * 1000 + n) as u64, len), 0o644);
            mine.push(rel);
            bytes_in += len;
            n += 1;
        }
        members.push(mine);
    }
    let mut images = Vec::new();
    for (s, mine) in members.iter().enumerate() {
        let shard = root.join(format!("shard-{s:02}.tar"));
        let mut tar = Command::new("tar");
        tar.arg("-cf").arg(&shard).arg("-C").arg(&src);
        if s == 0 {
            tar.args(&first);
        }
        run(tar.arg("--no-recursion").args(mine));
        images.push(shard);
    }
    (src, images)
}

fn size_of(images: &[PathBuf]) -> u64 {
    images.iter().map(|p| fs::metadata(p).unwrap().len()).sum()
}

/// Bytes the daemon served from one tier (`ram_bytes`, `staged_bytes`, `source_bytes`), from its
/// exit log.
fn served(log: &str, tier: &str) -> u64 {
    log_field(log, "bytes served by tier", tier)
}

fn refs(paths: &[PathBuf]) -> Vec<&Path> {
    paths.iter().map(PathBuf::as_path).collect()
}

/// The digits right after `pat` in `text`, as a number.
fn number_after(text: &str, pat: &str) -> u64 {
    let at = text
        .find(pat)
        .unwrap_or_else(|| panic!("no {pat:?} in {text}"))
        + pat.len();
    let digits = text[at..].split(|c: char| !c.is_ascii_digit()).next();
    digits
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no number after {pat:?} in {text}"))
}

/// The number after `"key": ` in the stats JSON.
fn field(json: &str, key: &str) -> u64 {
    number_after(json, &format!("\"{key}\": "))
}

fn uptime(json: &str) -> f64 {
    let at = json.find("\"uptime_s\": ").expect("uptime") + 12;
    json[at..]
        .split(',')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn status(json: &str) -> String {
    let at = json.find("\"status\": \"").expect("status") + 11;
    json[at..].split('"').next().unwrap().to_string()
}

/// Polls the stats file until `done` holds for it; panics after `secs` seconds.
fn wait_stats(path: &Path, secs: u64, what: &str, done: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(secs) {
        if let Ok(text) = fs::read_to_string(path) {
            if done(&text) {
                return text;
            }
            last = text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("waited {secs} s for {what}; last stats:\n{last}");
}

/// The daemon's log, once it has exited (after the mount guard is dropped).
fn log_of(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_default()
}

/// `key=N` in the last log line that contains `marker`.
fn log_field(log: &str, marker: &str, key: &str) -> u64 {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no {marker:?} in the log:\n{log}"));
    number_after(line, &format!("{key}="))
}

fn mount_staged(
    images: &[PathBuf],
    mnt: &Path,
    stage: &Path,
    name: &str,
    extra: &[&str],
) -> (Mount, PathBuf, PathBuf) {
    let stats = mnt.with_extension(format!("{name}.json"));
    let log = mnt.with_extension(format!("{name}.log"));
    let _ = fs::remove_file(&log);
    let mut args = vec![
        "-v",
        "--stage",
        stage.to_str().unwrap(),
        "--chunk-size",
        "64K",
        "--stats-file",
        stats.to_str().unwrap(),
        "--log-file",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let m = Mount::new(&refs(images), mnt, &args);
    (m, stats, log)
}

#[test]
fn diff_is_clean_while_staging_and_staged_reads_skip_the_source() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, images) = dataset(tmp.path(), 4, 2 << 20);
    let stage = tmp.path().join("stage");
    let mnt = tmp.path().join("mnt");
    let total = size_of(&images);
    {
        // 3 MB/s: the copy takes a few seconds, and the diff runs inside it.
        let (m, stats, log) = mount_staged(&images, &mnt, &stage, "a", &["--stage-rate", "3M"]);
        let mounted = Instant::now();
        let during = wait_stats(&stats, 10, "the stats file", |_| true);
        assert_eq!(field(&during, "total_bytes"), total);
        assert_same_tree(&src, &mnt, &[]);
        // The file is rewritten every second: wait for one written after the diff.
        let diff_done = mounted.elapsed().as_secs_f64();
        let after_diff = wait_stats(&stats, 10, "fresh stats", |s| uptime(s) >= diff_done);
        assert!(
            field(&after_diff, "present_bytes") < total,
            "staging finished before the diff did; slow it down:\n{after_diff}"
        );
        assert!(field(&after_diff, "source_bytes") > 0, "{after_diff}");
        let done = wait_stats(&stats, 60, "staging to complete", |s| {
            status(s) == "complete"
        });
        assert_eq!(field(&done, "present_bytes"), total);
        assert_eq!(field(&done, "failed_checks"), 0);
        drop(m);
        assert!(
            log_of(&log).contains("staging complete"),
            "{}",
            log_of(&log)
        );
        assert!(!stats.exists(), "the stats file outlives the daemon");
    }
    // A new mount finds the staged copy complete: no byte comes from the source.
    let (m, stats, log) = mount_staged(&images, &mnt, &stage, "b", &[]);
    assert_same_tree(&src, &mnt, &[]);
    let text = wait_stats(&stats, 10, "the stats file", |s| status(s) == "complete");
    assert_eq!(field(&text, "copied_bytes"), 0, "{text}");
    drop(m);
    let log = log_of(&log);
    assert!(
        log.contains(&format!("{total} of {total} bytes already staged")),
        "{log}"
    );
    assert_eq!(log_field(&log, "source operations", "reads"), 0, "{log}");
    assert_eq!(
        log_field(&log, "source operations", "stage_reads"),
        0,
        "{log}"
    );
    assert_eq!(served(&log, "source_bytes"), 0, "{log}");
    assert_eq!(served(&log, "ram_bytes"), 0, "{log}");
    assert!(served(&log, "staged_bytes") > 1 << 20, "{log}");
    assert!(
        log_field(&log, "staging in", "verified_chunks") > 16,
        "{log}"
    );
}

#[test]
fn a_killed_daemon_resumes_staging_where_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, images) = dataset(tmp.path(), 4, 3 << 20);
    let stage = tmp.path().join("stage");
    let mnt = tmp.path().join("mnt");
    let total = size_of(&images);
    let staged_at_kill;
    {
        let (m, stats, _) = mount_staged(&images, &mnt, &stage, "a", &["--stage-rate", "4M"]);
        let seen = wait_stats(&stats, 30, "a third staged", |s| {
            field(s, "present_bytes") > total / 3
        });
        staged_at_kill = field(&seen, "present_bytes");
        assert!(staged_at_kill < total, "{seen}");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(m.pid), nix::sys::signal::SIGKILL)
            .unwrap();
        assert!(m.wait_daemon_exit(Duration::from_secs(10)));
        run(packfs().arg("umount").arg(&mnt));
    }
    let (m, stats, log) = mount_staged(&images, &mnt, &stage, "b", &[]);
    let done = wait_stats(&stats, 60, "staging to complete", |s| {
        status(s) == "complete"
    });
    let copied = field(&done, "copied_bytes");
    assert!(
        copied <= total - staged_at_kill,
        "copied {copied} bytes again, but {staged_at_kill} of {total} were staged before the kill"
    );
    assert!(copied > 0);
    assert_same_tree(&src, &mnt, &[]);
    drop(m);
    let log = log_of(&log);
    let before = log_field(&log, "already staged", "present_bytes");
    assert!(
        before >= staged_at_kill && before + copied == total,
        "{log}"
    );
    assert_eq!(log_field(&log, "staging in", "failed_checks"), 0, "{log}");
}

#[test]
fn corrupt_staged_bytes_are_detected_and_read_from_the_source() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, images) = dataset(tmp.path(), 2, 1 << 20);
    let stage = tmp.path().join("stage");
    let mnt = tmp.path().join("mnt");
    // Stage with the blocking command first.
    let mut stage_cmd = packfs();
    stage_cmd
        .arg("stage")
        .args(&images)
        .arg("--to")
        .arg(&stage)
        .args(["--chunk-size", "64K"]);
    let out = stage_cmd.output().unwrap();
    assert_ok(&out);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("of 2 image(s)"), "{said}");

    // Flip a byte in the middle of big/blob.bin (shard 0) and of one sample of shard 1.
    let offset_of = |path: &str| -> u64 {
        let listing = run(packfs().arg("ls").arg("--extents").args(&images));
        let line = listing
            .lines()
            .find(|l| l.starts_with(&format!("{path}\t")))
            .unwrap_or_else(|| panic!("{path} not listed:\n{listing}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let data_file = |shard: usize| -> PathBuf {
        let name = images[shard]
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        fs::read_dir(&stage)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with(&name) && n.ends_with(".data")
            })
            .expect("staged data file")
    };
    let targets = [
        (0, offset_of("big/blob.bin") + 3_000_000),
        (1, offset_of("samples/s01/f0002.bin") + 20_000),
    ];
    for &(shard, at) in &targets {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(data_file(shard))
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[!b[0]], at).unwrap();
    }

    let (m, stats, log) = mount_staged(&images, &mnt, &stage, "a", &[]);
    assert_same_tree(&src, &mnt, &[]);
    // The stager puts the dropped chunks back.
    let done = wait_stats(&stats, 30, "the refetch", |s| {
        status(s) == "complete" && field(s, "copied_bytes") > 0
    });
    assert_eq!(field(&done, "failed_checks"), 2, "{done}");
    assert_eq!(field(&done, "copied_bytes"), 2 * 64 * 1024, "{done}");
    drop(m);
    let log = log_of(&log);
    assert_eq!(log.matches("fails its checksum").count(), 2, "{log}");
    assert!(log.contains(&images[0].display().to_string()), "{log}");
    // The local copy holds the source's bytes again.
    for &(shard, at) in &targets {
        let (mut a, mut b) = ([0u8; 1], [0u8; 1]);
        fs::File::open(&images[shard])
            .unwrap()
            .read_exact_at(&mut a, at)
            .unwrap();
        fs::File::open(data_file(shard))
            .unwrap()
            .read_exact_at(&mut b, at)
            .unwrap();
        assert_eq!(a, b, "byte {at} of shard {shard} was not staged again");
    }
}

/// A tmpfs of `size` mounted at `dir` for the life of the guard.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(dir: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(dir).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir));
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_or_vanished_stage_directory_stops_staging_not_the_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, images) = dataset(tmp.path(), 4, 1 << 20);
    let mnt = tmp.path().join("mnt");
    {
        let tiny = Tmpfs::new(&tmp.path().join("tiny"), "1m");
        let stage = tiny.0.join("stage");
        let (m, stats, log) = mount_staged(&images, &mnt, &stage, "full", &[]);
        let stopped = wait_stats(&stats, 30, "staging to stop", |s| {
            status(s).starts_with("stopped")
        });
        assert!(status(&stopped).contains("is full"), "{stopped}");
        assert_same_tree(&src, &mnt, &[]);
        // A second mount may not share the stage directory.
        let other = tmp.path().join("other");
        fs::create_dir_all(&other).unwrap();
        let refused = mount_cmd(
            &refs(&images),
            &other,
            &["--stage", stage.to_str().unwrap()],
            None,
        );
        assert!(!refused.status.success());
        let msg = String::from_utf8_lossy(&refused.stderr);
        assert!(
            msg.contains("is in use by another packfs process")
                && msg.contains(&format!("mount at {}", mnt.display())),
            "{msg}"
        );
        drop(m);
        assert!(
            log_of(&log).contains("No space left on device"),
            "{}",
            log_of(&log)
        );
    }
    // The stage directory is removed while the copy runs.
    let stage = tmp.path().join("stage-gone");
    let (m, stats, _) = mount_staged(&images, &mnt, &stage, "gone", &["--stage-rate", "2M"]);
    wait_stats(&stats, 10, "some staging", |s| {
        field(s, "present_bytes") > 0
    });
    fs::remove_dir_all(&stage).unwrap();
    let stopped = wait_stats(&stats, 10, "staging to stop", |s| {
        status(s).starts_with("stopped")
    });
    assert!(status(&stopped).contains("vanished"), "{stopped}");
    assert_same_tree(&src, &mnt, &[]);
    drop(m);
}

#[test]
fn a_share_stages_exactly_the_assigned_images() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, images) = dataset(tmp.path(), 8, 200_000);
    let stage = tmp.path().join("stage");
    let mnt = tmp.path().join("mnt");
    let out = packfs()
        .arg("stage")
        .args(&images)
        .arg("--to")
        .arg(&stage)
        .args(["--stage-share", "1/4", "--chunk-size", "64K"])
        .output()
        .unwrap();
    assert_ok(&out);
    let mut staged: Vec<String> = fs::read_dir(&stage)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".data"))
        .map(|n| n.split('.').next().unwrap().to_string())
        .collect();
    staged.sort();
    assert_eq!(staged, vec!["shard-01", "shard-05"]);
    let assigned =
        fs::metadata(&images[1]).unwrap().len() + fs::metadata(&images[5]).unwrap().len();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!(
            "staged {assigned} of {assigned} bytes of 2 image(s)"
        )),
        "{said}"
    );

    let (m, stats, log) = mount_staged(&images, &mnt, &stage, "a", &["--stage-share", "1/4"]);
    assert_same_tree(&src, &mnt, &[]);
    let text = wait_stats(&stats, 10, "the stats file", |s| status(s) == "complete");
    assert_eq!(field(&text, "total_bytes"), assigned);
    assert_eq!(field(&text, "copied_bytes"), 0);
    drop(m);
    let log = log_of(&log);
    assert!(served(&log, "staged_bytes") > 0, "{log}");
    assert!(served(&log, "source_bytes") > 0, "{log}");
}

#[test]
fn lazy_staging_keeps_touched_chunks_within_its_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, images) = dataset(tmp.path(), 4, 1 << 20);
    let stage = tmp.path().join("stage");
    let mnt = tmp.path().join("mnt");
    let budget = 1u64 << 20;
    let (m, stats, log) = mount_staged(
        &images,
        &mnt,
        &stage,
        "lazy",
        &["--stage-mode", "lazy", "--stage-budget", "1M"],
    );
    assert_same_tree(&src, &mnt, &[]);
    let text = wait_stats(&stats, 10, "evictions", |s| field(s, "evicted_bytes") > 0);
    assert!(field(&text, "present_bytes") <= budget, "{text}");
    assert!(status(&text).starts_with("lazy"), "{text}");
    let on_disk: u64 = fs::read_dir(&stage)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".data"))
        .map(|e| std::os::unix::fs::MetadataExt::blocks(&e.metadata().unwrap()) * 512)
        .sum();
    assert!(
        on_disk <= budget + (64 << 10),
        "{on_disk} bytes allocated under a {budget}-byte budget"
    );
    drop(m);
    let log = log_of(&log);
    assert!(
        log_field(&log, "staging in", "copied_from_reads") > 0,
        "{log}"
    );
}

/// Once staging has stopped (here: its budget is reached at once), small reads fetch exactly
/// their bytes again: they used to fetch a whole 1 MiB chunk each for a stager that no longer
/// takes any (11.8 GB read to serve 270 MB).
#[test]
fn reads_are_exact_once_staging_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let names: Vec<String> = (0..2000).map(|i| format!("small/{i:04}.bin")).collect();
    for (i, name) in names.iter().enumerate() {
        write_file(&src.join(name), &bytes(i as u64, 3000), 0o644);
    }
    let shard = tmp.path().join("small.tar");
    tar_members(&src, &shard, &["small"]);
    let mnt = tmp.path().join("mnt");
    let stats = tmp.path().join("stats.json");
    let stage = tmp.path().join("stage");
    let m = Mount::new(
        &[&shard],
        &mnt,
        &[
            "--stage",
            stage.to_str().unwrap(),
            "--stage-budget",
            "64K",
            "--stats-file",
            stats.to_str().unwrap(),
        ],
    );
    let before = wait_stats(&stats, 10, "staging to stop", |s| {
        status(s).starts_with("stopped")
    });
    let counters: serde_json::Value = serde_json::from_str(&before).unwrap();
    assert_eq!(counters["stage"]["state"], "stopped", "{before}");
    assert_eq!(counters["stage"]["stopped"], "budget", "{before}");
    let mut served = 0;
    for (i, name) in names.iter().enumerate().step_by(20) {
        let data = fs::read(m.dir.join(name)).unwrap();
        assert_eq!(data, bytes(i as u64, 3000), "{name}");
        served += data.len() as u64;
    }
    let t0 = uptime(&before);
    let after = wait_stats(&stats, 10, "a fresh snapshot", |s| uptime(s) > t0 + 1.0);
    let read = field(&after, "bytes") - field(&before, "bytes");
    assert!(
        read <= 3 * served,
        "{read} bytes read from the source to serve {served}:\n{after}"
    );
    drop(m);
}

/// Eager staging while reads fetch whole chunks: every chunk a read fetched is kept, even while
/// the walk waits on a slow source read, so no byte is read from the source twice. Before, offers
/// were only taken between the walk's runs, overflowed their queue of 32 and were fetched again
/// by the walk (issue 17: 5.99 GB read from the PFS for 2.62 GB).
#[test]
fn chunks_reads_fetched_are_staged_without_a_second_source_read() {
    use packfs::source::read_at::ReadAt;
    use packfs::tiers::faults::{Fault, Faulty, Gate};
    use packfs::tiers::stage::{StageMode, run_copier};
    use packfs::tiers::{Fetch, Images, ReadRequest};
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;
    let size = 64 * MIB;
    let data: Arc<dyn ReadAt> = Arc::new(bytes(11, size as usize));
    // The walk's first run (the first 8 MiB) waits at the gate; reads elsewhere do not.
    let gate = Arc::new(Gate::default());
    let slow = Faulty::new(data, vec![(0..8 * MIB, Fault::Stall(gate.clone()))]);
    let (source, stage, _dir) = staged_source(11, size, Arc::new(slow), StageMode::Eager, MIB);
    let images = Images::new(source.clone(), 256 * MIB, MIB, true, Some(stage.clone()));
    std::thread::scope(|scope| {
        let copier = scope.spawn(|| run_copier(&stage, true, None));
        // Wait until the walk is stuck in its first run.
        let started = Instant::now();
        while source.stats().stage_reads == 0 && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        // 48 reads of 4 KiB in 48 other chunks: each fetches its chunk whole and offers it. They
        // come at the pace of a source with some latency (a store, a busy PFS), not all at once.
        let mut buf = vec![0u8; 4096];
        for chunk in 16..64 {
            images
                .read_exact_at(
                    &ReadRequest::waiting(),
                    0,
                    chunk * MIB + 100,
                    &mut buf,
                    Fetch::Chunks,
                )
                .unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        // Let the offers be taken before the walk goes on.
        let offered = Instant::now();
        while stage.stats().copied_from_reads < 48 * MIB
            && offered.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        gate.open();
        copier.join().unwrap();
    });
    let st = source.stats();
    assert_eq!(stage.stats().status, "complete");
    assert_eq!(st.bytes, 48 * MIB, "the reads fetched their 48 chunks");
    assert_eq!(
        st.bytes + st.stage_bytes,
        size,
        "every byte came from the source once ({} by reads, {} by the walk)",
        st.bytes,
        st.stage_bytes
    );
    assert_eq!(stage.stats().copied_from_reads, 48 * MIB);
}

/// Source bytes read so far, from a stats file.
fn source_bytes_read(stats: &str) -> u64 {
    source_counter(stats, "bytes")
}

/// A counter of the stats file's `source` section (`reads`, `bytes`).
fn source_counter(stats: &str, name: &str) -> u64 {
    let parsed: serde_json::Value = serde_json::from_str(stats).unwrap();
    parsed["source"][name].as_u64().unwrap()
}

#[test]
fn images_of_other_shares_are_read_exactly_not_in_chunks() {
    // A node reading a sample of another node's share (the share sampler's remote q) must not
    // fetch the whole chunk around it: its stage will not keep it. This read 7.6x the dataset
    // per epoch with 4 nodes and 1 MiB chunks before the fix.
    let tmp = tempfile::tempdir().unwrap();
    let (src, images) = dataset(tmp.path(), 4, 300_000);
    let stage = tmp.path().join("stage");
    let mnt = tmp.path().join("mnt");
    let (m, stats, _) = mount_staged(&images, &mnt, &stage, "other", &["--stage-share", "1/4"]);
    let staged = wait_stats(&stats, 10, "staging", |s| status(s) == "complete");
    let before = source_bytes_read(&staged);
    // shard 0 belongs to share 0: its first sample is 40 000 bytes, less than a 64 KiB chunk.
    let rel = "samples/s00/f0000.bin";
    assert_eq!(
        fs::read(mnt.join(rel)).unwrap(),
        fs::read(src.join(rel)).unwrap()
    );
    let after = wait_stats(&stats, 10, "the read counted", |s| {
        source_bytes_read(s) > before
    });
    assert_eq!(source_bytes_read(&after) - before, 40_000, "{after}");
    drop(m);
}

#[test]
fn a_sample_of_another_share_across_a_chunk_boundary_is_one_source_read() {
    // Exact reads of an image the stage does not keep are not cut at chunk boundaries: a
    // sample that straddles one cost two reads of the source (11% more requests than samples
    // with 4 nodes, 1 MiB chunks and ImageNet-sized samples).
    let tmp = tempfile::tempdir().unwrap();
    let (src, images) = dataset(tmp.path(), 4, 300_000);
    let stage = tmp.path().join("stage");
    let mnt = tmp.path().join("mnt");
    let (m, stats, _) = mount_staged(&images, &mnt, &stage, "straddle", &["--stage-share", "1/4"]);
    let staged = wait_stats(&stats, 10, "staging", |s| status(s) == "complete");
    // shard 0 (share 0): its second sample, 77 813 bytes, lies across the 64 KiB mark.
    let rel = "samples/s00/f0001.bin";
    let size = fs::metadata(src.join(rel)).unwrap().len();
    assert_eq!(size, 77_813);
    assert_eq!(
        fs::read(mnt.join(rel)).unwrap(),
        fs::read(src.join(rel)).unwrap()
    );
    let after = wait_stats(&stats, 10, "the read counted", |s| {
        source_bytes_read(s) >= source_bytes_read(&staged) + size
    });
    assert_eq!(
        source_bytes_read(&after) - source_bytes_read(&staged),
        size,
        "{after}"
    );
    assert_eq!(
        source_counter(&after, "reads") - source_counter(&staged, "reads"),
        1,
        "{after}"
    );
    drop(m);
}

/// A source that records every read it answers.
struct Recording {
    inner: std::sync::Arc<dyn packfs::source::read_at::ReadAt>,
    reads: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl packfs::source::read_at::ReadAt for Recording {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let n = self.inner.read_at(buf, offset)?;
        self.reads.lock().unwrap().push((offset, n as u64));
        Ok(n)
    }
}

/// One image of `size` bytes (`bytes(seed, size)`), read through `data` by a source with a stage
/// of `mode` in a temporary directory; the stage's copier is not started.
fn staged_source(
    seed: u64,
    size: u64,
    data: std::sync::Arc<dyn packfs::source::read_at::ReadAt>,
    mode: packfs::tiers::stage::StageMode,
    chunk_size: u64,
) -> (
    std::sync::Arc<packfs::tiers::OpenedImages>,
    std::sync::Arc<packfs::tiers::stage::Stage>,
    tempfile::TempDir,
) {
    use packfs::catalog::ImageInfo;
    use packfs::source::Fingerprint;
    use packfs::tiers::stage::{Stage, StageOptions};
    use packfs::tiers::{OpenedImage, OpenedImages};
    use std::sync::Arc;

    let plain = bytes(seed, size as usize);
    let fingerprint = Fingerprint::of_read_at(&plain, size, 0, 0).unwrap();
    let path = PathBuf::from("/nowhere/shard.tar");
    let source = Arc::new(OpenedImages::new(vec![OpenedImage {
        path: path.clone(),
        data,
        size,
    }]));
    let dir = tempfile::tempdir().unwrap();
    let opts = StageOptions {
        dir: dir.path().join("stage"),
        mode,
        budget: None,
        rate: None,
        share: None,
        chunk_size,
    };
    let infos = [ImageInfo {
        location: packfs::source::ImageLocation::File(path),
        fingerprint,
        stream: None,
        within: None,
    }];
    // The memory budget of the tiers the tests stack over it (a RAM cache of 256 MiB).
    let memory = packfs::tiers::budget::MemoryBudget::for_cache(256 << 20);
    let stage =
        Arc::new(Stage::open(opts, source.clone(), &infos, "this test", Some(memory)).unwrap());
    (source, stage, dir)
}

/// Readers from mount time, each reading its part of a shuffled epoch of samples, while the stage
/// copies (eager) or keeps what reads touch (lazy); returns the reads the source answered.
fn epoch_while_staging(
    mode: packfs::tiers::stage::StageMode,
    readers: usize,
) -> (u64, u64, Vec<(u64, u64)>) {
    use packfs::tiers::faults::{Fault, Faulty};
    use packfs::tiers::stage::{StageMode, run_copier};
    use packfs::tiers::{Fetch, Images, ReadRequest};
    use std::sync::Arc;

    const CHUNK: u64 = 256 << 10;
    let size: u64 = 64 << 20;
    let want = bytes(17, size as usize);
    let recording = Arc::new(Recording {
        inner: Arc::new(want.clone()),
        reads: Default::default(),
    });
    // Each read answered after a latency (a store, a busy PFS).
    let slow = Faulty::new(
        recording.clone(),
        vec![(0..size, Fault::Latency(Duration::from_micros(500)))],
    );
    let (source, stage, _dir) = staged_source(17, size, Arc::new(slow), mode, CHUNK);
    let images = Images::new(source.clone(), 256 << 20, CHUNK, false, Some(stage.clone()));
    // Samples of 20-180 kB laid end to end, in a shuffled order dealt to the readers.
    let mut samples = Vec::new();
    let mut at = 0u64;
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    while at < size {
        let len = (20_000 + rng.below(160_000)).min(size - at);
        samples.push((at, len));
        at += len;
    }
    for k in (1..samples.len()).rev() {
        samples.swap(k, rng.below(k as u64 + 1) as usize);
    }
    std::thread::scope(|scope| {
        let copier = scope.spawn(|| run_copier(&stage, mode == StageMode::Eager, None));
        let readers: Vec<_> = (0..readers)
            .map(|r| {
                let (images, samples, want) = (&images, &samples, &want);
                scope.spawn(move || {
                    for &(at, len) in samples.iter().skip(r).step_by(readers) {
                        let mut buf = vec![0u8; len as usize];
                        images
                            .read_exact_at(&ReadRequest::waiting(), 0, at, &mut buf, Fetch::Chunks)
                            .unwrap();
                        assert!(
                            buf == want[at as usize..(at + len) as usize],
                            "bytes at {at}"
                        );
                    }
                })
            })
            .collect();
        for r in readers {
            r.join().unwrap();
        }
        if mode == StageMode::Lazy {
            // Every chunk was touched: wait until the stager kept them all, then stop it.
            let started = Instant::now();
            while stage.stats().present_bytes < size && started.elapsed() < Duration::from_secs(20)
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            stage.shut_down();
        }
        copier.join().unwrap();
    });
    assert_eq!(stage.stats().present_bytes, size, "{:?}", stage.stats());
    let reads = recording.reads.lock().unwrap().clone();
    (size, CHUNK, reads)
}

/// How many whole-chunk source reads (alone or in a run) covered each chunk, and the bytes of
/// the other (exact) reads.
fn chunk_loads(size: u64, chunk: u64, reads: &[(u64, u64)]) -> (Vec<u32>, u64) {
    let mut loads = vec![0u32; size.div_ceil(chunk) as usize];
    let mut exact = 0;
    for &(at, len) in reads {
        if at % chunk == 0 && (len % chunk == 0 || at + len == size) && len > 0 {
            for i in at / chunk..(at + len).div_ceil(chunk) {
                loads[i as usize] += 1;
            }
        } else {
            exact += len;
        }
    }
    (loads, exact)
}

#[test]
fn staging_with_concurrent_readers_reads_each_chunk_of_the_source_once() {
    use packfs::tiers::stage::StageMode;
    let mut failed = Vec::new();
    for mode in [StageMode::Eager, StageMode::Lazy] {
        for readers in [1, 16, 32] {
            let (size, chunk, reads) = epoch_while_staging(mode, readers);
            let (loads, exact) = chunk_loads(size, chunk, &reads);
            let total: u64 = reads.iter().map(|r| r.1).sum();
            let twice: Vec<usize> = (0..loads.len()).filter(|&i| loads[i] > 1).collect();
            let line = format!(
                "{mode:?}, {readers} readers: {} source reads, {total} bytes for {size} ({:.3}x), \
                 {exact} bytes read exactly, chunks read whole more than once: {twice:?}",
                reads.len(),
                total as f64 / size as f64,
            );
            eprintln!("{line}");
            // Each chunk whole once (the stage needs it whole). Exact reads come only from
            // reads that met chunks the stager was copying: the eager walk holds up to three runs
            // of 8 MiB at a time (being read, queued, being written), a large part of this small
            // image (a few per mille of a real dataset's); lazy staging reads nothing else.
            let exact_bound = match mode {
                StageMode::Eager => 24 << 20,
                StageMode::Lazy => 0,
            };
            if !twice.is_empty() || loads.contains(&0) || exact > exact_bound {
                failed.push(line);
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// A stager that lags (its queue full: here it never runs) costs no second source read: a read
/// that fetches a chunk whole while the queue is full stores it itself. Before, such reads read
/// exactly what they asked and left the chunk to be fetched whole again when staged: 16 readers
/// on the simulated parallel file system read 1.16x the dataset (4,235 such reads), now 1.01x.
#[test]
fn reads_store_their_chunks_when_the_stagers_queue_is_full() {
    use packfs::source::read_at::ReadAt;
    use packfs::source::read_at::Wait;
    use packfs::tiers::stage::StageMode;
    use packfs::tiers::{Fetch, Images, ReadRequest};
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;
    // 2 MiB chunks: the stager's queue admits 32 (64 MiB); 40 chunks.
    let (chunk, chunks) = (2 * MIB, 40);
    let size = chunk * chunks;
    let plain = bytes(21, size as usize);
    let data: Arc<dyn ReadAt> = Arc::new(plain.clone());
    let (source, stage, _dir) = staged_source(21, size, data, StageMode::Lazy, chunk);
    let images = Images::new(source.clone(), 256 * MIB, chunk, true, Some(stage.clone()));
    // Chunks 7 apart, so no two misses in a row start read-ahead (whose threads would claim
    // chunks too, at their own pace): what is queued and what is stored is these reads' alone.
    let order: Vec<u64> = (0..chunks).map(|k| k * 7 % chunks).collect();
    let mut buf = vec![0u8; 4096];
    for &i in &order {
        images
            .read_exact_at(
                &ReadRequest::waiting(),
                0,
                i * chunk + 100,
                &mut buf,
                Fetch::Chunks,
            )
            .unwrap();
        assert_eq!(buf, plain[(i * chunk + 100) as usize..][..4096]);
    }
    let st = stage.stats();
    assert_eq!(st.lagged_reads, 0, "{st:?}");
    // The 8 chunks read after the queue filled are local now, each read from the source once,
    // whole.
    let mut local = vec![0u8; 4096];
    for &i in &order[32..] {
        assert!(
            stage
                .read(0, i as usize, 100, &mut local, Wait::May)
                .unwrap(),
            "chunk {i}: {st:?}"
        );
    }
    assert_eq!(st.copied_from_reads, 8 * chunk, "{st:?}");
    assert_eq!(source.stats().bytes, size, "each chunk read once, whole");
}

/// A staged chunk out of the page cache is not damaged: a read that may not wait (a FUSE ring's
/// queue thread) hands it to the read pool and the chunk stays staged. Before, the local read's
/// "would block" counted as a failed read: the chunk was dropped, logged as an error and fetched
/// from the source again, for every staged chunk the kernel had evicted.
#[test]
fn a_staged_chunk_out_of_the_page_cache_stays_staged() {
    use packfs::source::read_at::{ReadAt, Wait};
    use packfs::tiers::stage::StageMode;
    use packfs::tiers::{Fetch, Images, ReadRequest};
    use std::sync::Arc;

    const MIB: u64 = 1 << 20;
    // The stager never runs here: its queue takes the first 32 chunks, reads store the rest.
    let (chunk, chunks) = (2 * MIB, 34);
    let size = chunk * chunks;
    let plain = bytes(22, size as usize);
    let data: Arc<dyn ReadAt> = Arc::new(plain.clone());
    let (source, stage, dir) = staged_source(22, size, data, StageMode::Lazy, chunk);
    let images = Images::new(source.clone(), 256 * MIB, chunk, true, Some(stage.clone()));
    let mut buf = vec![0u8; 4096];
    for i in (0..chunks).map(|k| k * 7 % chunks) {
        let req = ReadRequest::waiting();
        images
            .read_exact_at(&req, 0, i * chunk, &mut buf, Fetch::Chunks)
            .unwrap();
    }
    let stored = stage.stats().present_bytes;
    assert_eq!(stored, 2 * chunk, "{:?}", stage.stats());
    let staged: Vec<u64> = (32..chunks)
        .map(|k| (0..chunks).map(|j| j * 7 % chunks).nth(k as usize).unwrap())
        .collect();
    let mut local = vec![0u8; 4096];
    for &i in &staged {
        // Out of the page cache: written back, then dropped. The hint may leave pages that
        // sit in another CPU's batch (a loaded machine), so it is given until the read that
        // may not wait finds the chunk out of memory; as the last resort, every clean page
        // of the machine goes (root).
        let mut tries = 0;
        let err = loop {
            evict(dir.path(), tries >= 50);
            match stage.read(0, i as usize, 100, &mut local, Wait::Never) {
                Err(err) => break err,
                Ok(true) if tries < 60 => tries += 1,
                Ok(found) => panic!("chunk {i}: read as {found} after {tries} evictions"),
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
    }
    let st = stage.stats();
    assert_eq!(st.present_bytes, stored, "kept: {st:?}");
    assert_eq!(st.failed_checks, 0, "{st:?}");
    for &i in &staged {
        assert!(
            stage
                .read(0, i as usize, 100, &mut local, Wait::May)
                .unwrap()
        );
        assert_eq!(local, plain[(i * chunk + 100) as usize..][..4096]);
    }
}

/// Writes back the files under `dir` and drops them from the page cache; with `all`, every
/// clean page of the machine (`drop_caches`, root).
fn evict(dir: &Path, all: bool) {
    use std::os::fd::AsRawFd;
    for entry in walkdir(dir) {
        let file = fs::File::open(&entry).unwrap();
        file.sync_all().unwrap();
        // SAFETY: a plain hint on a descriptor this test owns.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    if all {
        let _ = fs::write("/proc/sys/vm/drop_caches", "1");
    }
}

/// The regular files under `dir`, at any depth.
fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(walkdir(&path));
        } else if path.is_file() {
            found.push(path);
        }
    }
    found
}

/// `packfs umount` returns once the daemon has ended and released its stage: a job step that
/// mounts the same stage right after does not find it held (it failed for 1.2-1.7 s after the
/// unmount returned, every time).
#[test]
fn a_stage_can_be_mounted_again_as_soon_as_umount_returns() {
    let dir = tempfile::tempdir().unwrap();
    let (_, images) = dataset(dir.path(), 2, 3 << 20);
    let (mnt, stage) = (dir.path().join("mnt"), dir.path().join("stage"));
    fs::create_dir_all(&mnt).unwrap();
    let _unmount = UnmountOnDrop(mnt.clone());
    for round in 0..3 {
        let mounted = packfs()
            .arg("mount")
            .arg("--stage")
            .arg(&stage)
            .args(&images)
            .arg(&mnt)
            .output()
            .unwrap();
        assert!(
            mounted.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&mounted.stderr)
        );
        // Something to do on the way out: the stager copying, a file read.
        let first = fs::read_dir(mnt.join("samples/s00"))
            .unwrap()
            .next()
            .unwrap();
        fs::read(first.unwrap().path()).unwrap();
        assert_ok(&packfs().arg("umount").arg(&mnt).output().unwrap());
    }
}

/// `--stage-in BASE`: packfs makes BASE/packfs-UID/NAME-HASH (0700), the same for every mount
/// of the same images by the same user, removes it when the mount ends, keeps it with
/// --keep-stage (the next mount resumes from it), and refuses a per-user directory another user
/// made first, naming the owner.
#[test]
fn a_stage_packfs_makes_is_one_per_dataset_and_goes_with_the_mount() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let (_, images) = dataset(dir.path(), 2, 1 << 20);
    let (mnt, base) = (dir.path().join("mnt"), dir.path().join("shm"));
    fs::create_dir_all(&mnt).unwrap();
    fs::create_dir_all(&base).unwrap();
    fs::set_permissions(&base, fs::Permissions::from_mode(0o1777)).unwrap();
    let mine = base.join(format!("packfs-{}", nix::unistd::geteuid()));
    let stats = dir.path().join("stats.json");
    let stage_of =
        |m: &Path| -> PathBuf { PathBuf::from(counters(m)["stage"]["dir"].as_str().unwrap()) };
    let base_arg = base.to_str().unwrap();
    let stats_arg = stats.to_str().unwrap();
    let m = Mount::new(&refs(&images), &mnt, &["--stage-in", base_arg]);
    let stage = stage_of(&mnt);
    assert_eq!(stage.parent().unwrap(), mine);
    assert_eq!(fs::metadata(&stage).unwrap().mode() & 0o777, 0o700);
    assert_eq!(fs::metadata(&mine).unwrap().mode() & 0o777, 0o700);
    let name = stage.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("shard-00.tar-"), "{name}");
    drop(m);
    assert!(!stage.exists(), "the staged copy outlived its mount");

    // Kept when asked, and the same directory next time.
    let m = Mount::new(
        &refs(&images),
        &mnt,
        &[
            "--stage-in",
            base_arg,
            "--keep-stage",
            "--stats-file",
            stats_arg,
        ],
    );
    assert_eq!(stage_of(&mnt), stage);
    let total = size_of(&images);
    wait_stats(&stats, 60, "staging to complete", |s| {
        status(s) == "complete"
    });
    drop(m);
    assert!(stage.join("packfs.lock").exists(), "kept");
    let m = Mount::new(
        &refs(&images),
        &mnt,
        &["--stage-in", base_arg, "--stats-file", stats_arg],
    );
    let resumed = wait_stats(&stats, 10, "the stats file", |s| status(s) == "complete");
    assert_eq!(field(&resumed, "present_bytes"), total);
    assert_eq!(field(&resumed, "copied_bytes"), 0, "{resumed}");
    drop(m);
    assert!(!stage.exists());

    // Its daemon killed: `packfs umount` of the stale mount removes the copy (it stayed, in
    // /dev/shm's RAM, until the dataset was mounted there again).
    let m = Mount::new(&refs(&images), &mnt, &["--stage-in", base_arg]);
    assert_eq!(stage_of(&mnt), stage);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    m.wait_daemon_exit(Duration::from_secs(10));
    assert!(stage.exists());
    assert_ok(&packfs().arg("umount").arg(&mnt).output().unwrap());
    assert!(
        !stage.exists(),
        "a killed daemon's staged copy outlived umount"
    );
    drop(m);

    // Another user's per-user directory, made first: refused, naming the owner.
    fs::remove_dir(&mine).unwrap();
    fs::create_dir(&mine).unwrap();
    std::os::unix::fs::chown(&mine, Some(65534), Some(65534)).unwrap();
    let out = packfs()
        .args(["mount", "--stage-in", base_arg])
        .args(&images)
        .arg(&mnt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("65534") || err.contains("nobody"), "{err}");
    assert!(!is_mounted(&mnt));
}
