//! Hints: a sampler's order sent to the mount's socket, and the samples fetched ahead of the
//! readers. Over the simulated parallel file system (bench/pfssim: every read of a shard reaches
//! it and is counted), a random epoch with hints reads each sample from storage once, with the
//! right bytes, 8 readers at a time, and the window of samples fetched ahead stays within its
//! budget; readers that stop, skip or die leave the daemon idle; samples the kernel's page cache
//! holds are not fetched again; only the mount's owner and the user it serves may send, and
//! bad messages are answered and bounded.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::pfssim::Sim;
use common::*;
use serde_json::{Value, json};

/// `n` files of 8-48 KB in 8 classes, tarred by GNU tar as `dir/backing/d.tar`; returns the
/// source tree, the tar and the files' relative paths in a shuffled order.
fn dataset(dir: &Path, n: usize, seed: u64) -> (PathBuf, PathBuf, Vec<String>) {
    let mut rng = Rng(seed);
    let files: Vec<(String, Vec<u8>)> = (0..n)
        .map(|i| {
            let len = 8_000 + rng.below(40_000) as usize;
            (
                format!("train/c{}/s{i:04}.jpg", i % 8),
                bytes(seed + i as u64, len),
            )
        })
        .collect();
    let backing = dir.join("backing");
    fs::create_dir_all(&backing).unwrap();
    let (src, tar) = tar_of(&backing, "d", &files);
    let mut order: Vec<String> = files.into_iter().map(|(p, _)| p).collect();
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    (src, tar, order)
}

/// `n` samples (`dataset`) on the simulated parallel file system, reads 2 ms each, mounted by
/// packfs with `extra` options: (source tree, shuffled order, the simulator, the mount).
fn over_pfs(dir: &Path, n: usize, seed: u64, extra: &[&str]) -> (PathBuf, Vec<String>, Sim, Mount) {
    let (src, tar, order) = dataset(dir, n, seed);
    let sim = Sim::start(
        tar.parent().unwrap(),
        &dir.join("pfs"),
        &["--profile", "none", "--read-us", "2000"],
    );
    let mount = Mount::new(&[&sim.mnt.join("d.tar")], &dir.join("mnt"), extra);
    (src, order, sim, mount)
}

/// The mount's counters once `done` holds of them (the lookahead works in the background), or
/// after 15 s, whatever they are then.
fn counters_when(mnt: &Path, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let c = counters(mnt);
        if done(&c) || start.elapsed() > Duration::from_secs(15) {
            return c;
        }
    }
}

fn socket_of(mnt: &Path) -> PathBuf {
    let c = counters(mnt);
    PathBuf::from(c["hints"].as_str().expect("the mount takes hints"))
}

/// Sends one message on a fresh connection and returns the answer line.
fn send(socket: &Path, message: &Value) -> Value {
    let mut stream = UnixStream::connect(socket).unwrap();
    let mut line = serde_json::to_vec(message).unwrap();
    line.push(b'\n');
    stream.write_all(&line).unwrap();
    let mut answer = String::new();
    BufReader::new(stream).read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

fn list(stream: &str, rank: u32, paths: &[String]) -> Value {
    json!({"stream": stream, "rank": rank, "epoch": 1, "paths": paths})
}

/// Reads `order` with `readers` threads taking the next file in turn, checking every byte.
fn read_all(mnt: &Path, src: &Path, order: &[String], readers: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(order.to_vec());
    let threads: Vec<_> = (0..readers)
        .map(|_| {
            let (next, order) = (next.clone(), order.clone());
            let (mnt, src) = (mnt.to_path_buf(), src.to_path_buf());
            std::thread::spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(path) = order.get(i) else { return };
                    let got = fs::read(mnt.join(path)).unwrap();
                    assert!(got == fs::read(src.join(path)).unwrap(), "{path} differs");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn n(c: &Value, group: &str, key: &str) -> u64 {
    c[group][key]
        .as_u64()
        .unwrap_or_else(|| panic!("{group}.{key} in {c}"))
}

/// A random epoch over a store with 2 ms reads, 8 readers: the samples are fetched ahead, each
/// read from storage once (the bytes the shard holds for them, and the 512-byte headers between
/// the ones fetched together), every byte right, and the window never over its budget.
#[test]
fn a_random_epoch_with_hints_reads_each_sample_once_ahead_of_eight_readers() {
    let dir = tempfile::tempdir().unwrap();
    let (src, order, sim, m) = over_pfs(
        dir.path(),
        400,
        1,
        &["--cache-size", "16M", "--lookahead", "4M"],
    );
    let mnt = m.dir.clone();
    let sample_bytes: u64 = order
        .iter()
        .map(|p| fs::metadata(src.join(p)).unwrap().len())
        .sum();
    let before = sim.counters();
    let answer = send(&socket_of(&mnt), &list("train", 0, &order));
    assert_eq!(answer["ok"], true, "{answer}");
    assert_eq!(answer["samples"], 400);
    read_all(&mnt, &src, &order, 8);
    let after = sim.counters();
    let c = counters(&mnt);
    let read = after["read_bytes"].as_u64().unwrap() - before["read_bytes"].as_u64().unwrap();
    assert!(
        read <= sample_bytes + 400 * 1024,
        "{read} bytes read from storage for {sample_bytes} bytes of samples: some twice: {c}"
    );
    assert!(read >= sample_bytes, "{read} < {sample_bytes}");
    assert_eq!(n(&c, "lookahead", "first_reads"), 400, "{c}");
    // Fetched ahead: in time, or in flight when its reader came (8 readers outrun 16 fetches
    // of 2 ms); a reader reads a sample itself only when it got there before its fetch began.
    let missed = n(&c, "lookahead", "missed");
    assert!(missed <= 40, "{missed} of 400 read by their readers: {c}");
    assert!(n(&c, "served", "ahead_bytes") > sample_bytes / 2, "{c}");
    assert!(
        n(&c, "lookahead", "window_peak") <= 4 << 20,
        "the window held {} bytes, over its 4 MiB",
        c["lookahead"]["window_peak"]
    );
    assert_eq!(n(&c, "lookahead", "window_held"), 0, "all read: {c}");
}

/// Readers that stop fetch nothing more once their share of the window is fetched; a reader that
/// skips far ahead moves the fetching there, not through what it skipped.
#[test]
fn readers_that_stop_or_skip_leave_the_daemon_fetching_nothing_beyond_them() {
    let dir = tempfile::tempdir().unwrap();
    let (src, order, sim, m) = over_pfs(dir.path(), 400, 2, &["--lookahead", "512K"]);
    let mnt = m.dir.clone();
    let before = sim.counters()["read_bytes"].as_u64().unwrap();
    send(&socket_of(&mnt), &list("train", 0, &order));
    read_all(&mnt, &src, &order[..10], 1);
    // Nobody reads on: what was fetched stays what one window ahead of sample 10 holds.
    let stopped = counters(&mnt);
    let fetched = n(&stopped, "lookahead", "fetched");
    let missed = n(&stopped, "lookahead", "missed");
    assert!(
        (10..=10 + 512 * 1024 / 8_000 + 1).contains(&fetched),
        "{fetched} samples fetched for a reader that read 10"
    );
    let read_then = sim.counters()["read_bytes"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        sim.counters()["read_bytes"].as_u64().unwrap(),
        read_then,
        "the daemon read on with no reader"
    );
    assert!(read_then - before <= 10 * 48_000 + (512 << 10) + 64 * 1024);
    // A jump to sample 300: fetched from there, not from 11 to 299.
    read_all(&mnt, &src, &order[300..310], 1);
    let skipped = counters(&mnt);
    let more = n(&skipped, "lookahead", "fetched") - fetched;
    assert!(
        more <= 10 + 512 * 1024 / 8_000 + 1,
        "{more} samples fetched after the jump"
    );
    // The jump's first read is missed (and perhaps the next, read before its fetch began).
    let jumped = n(&skipped, "lookahead", "missed") - missed;
    assert!(
        (1..=2).contains(&jumped),
        "{jumped} missed after the jump: {skipped}"
    );
}

/// A rank killed mid-epoch leaves its list idle: the daemon fetches nothing more for it.
#[test]
fn a_rank_that_dies_leaves_the_daemon_fetching_nothing() {
    let Some(python) = python_with("json", "python3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_src, order, sim, m) = over_pfs(dir.path(), 300, 3, &["--lookahead", "512K"]);
    let mnt = m.dir.clone();
    let socket = socket_of(&mnt);
    let rank = r#"
import json, os, socket, sys, time
mnt, sock, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
s = socket.socket(socket.AF_UNIX); s.connect(sock)
s.sendall((json.dumps({"stream": "train", "rank": 3, "paths": paths}) + "\n").encode())
s.makefile().readline()
for p in paths[:20]:
    open(os.path.join(mnt, p), "rb").read()
print("read", flush=True)
time.sleep(60)
"#;
    let mut child = std::process::Command::new(python)
        .arg("-c")
        .arg(rank)
        .arg(&mnt)
        .arg(&socket)
        .args(&order)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "read");
    child.kill().unwrap();
    child.wait().unwrap();
    let dead = counters(&mnt);
    let read_then = sim.counters()["read_bytes"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(sim.counters()["read_bytes"].as_u64().unwrap(), read_then);
    let fetched = n(&dead, "lookahead", "fetched");
    assert!(
        fetched <= 20 + 512 * 1024 / 8_000 + 1,
        "{fetched} fetched for a rank that read 20"
    );
    assert_eq!(n(&counters(&mnt), "lookahead", "fetched"), fetched);
}

/// A shuffled epoch over a shard the window covers (5 MB of samples, a 32 MiB window): samples
/// that lie next to each other in the shard are fetched in one request, far fewer requests than
/// samples, each byte read from storage once and every byte right.
#[test]
fn a_shuffled_epoch_the_window_covers_fetches_neighbours_in_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let (src, order, sim, m) = over_pfs(dir.path(), 200, 5, &["--cache-size", "64M"]);
    let sample_bytes: u64 = order
        .iter()
        .map(|p| fs::metadata(src.join(p)).unwrap().len())
        .sum();
    let before = sim.counters();
    send(&socket_of(&m.dir), &list("train", 0, &order));
    read_all(&m.dir, &src, &order, 1);
    let c = counters(&m.dir);
    let after = sim.counters();
    let (fetched, requests) = (
        n(&c, "lookahead", "fetched"),
        n(&c, "lookahead", "requests"),
    );
    assert!(fetched >= 150, "{fetched} of 200 fetched ahead: {c}");
    assert!(
        requests * 4 <= fetched,
        "{requests} requests for {fetched} samples: {c}"
    );
    let read = after["read_bytes"].as_u64().unwrap() - before["read_bytes"].as_u64().unwrap();
    assert!(
        (sample_bytes..=sample_bytes + 200 * 1024).contains(&read),
        "{read} bytes read from storage for {sample_bytes} bytes of samples"
    );
}

/// Samples the kernel's page cache of the mount holds are not fetched again: an epoch hinted a
/// second time fetches nothing, and after 20 are dropped from the page cache, those 20.
#[test]
fn samples_in_the_page_cache_are_not_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let (src, tar, order) = dataset(dir.path(), 100, 4);
    let mnt = dir.path().join("mnt");
    let _m = Mount::new(&[&tar], &mnt, &[]);
    let socket = socket_of(&mnt);
    send(&socket, &list("train", 0, &order));
    read_all(&mnt, &src, &order, 4);
    let first = counters(&mnt);
    let fetched = n(&first, "lookahead", "fetched");
    assert_eq!(n(&first, "lookahead", "in_page_cache"), 0);
    send(&socket, &list("train", 0, &order));
    let again = counters_when(&mnt, |c| n(c, "lookahead", "in_page_cache") >= 100);
    assert_eq!(n(&again, "lookahead", "in_page_cache"), 100, "{again}");
    assert_eq!(
        n(&again, "source", "bytes"),
        n(&first, "source", "bytes"),
        "read from storage again"
    );
    for path in &order[..20] {
        let f = fs::File::open(mnt.join(path)).unwrap();
        // SAFETY: an advice on an open file.
        let done = unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        assert_eq!(done, 0);
    }
    let dropped: u64 = order[..20]
        .iter()
        .map(|p| fs::metadata(src.join(p)).unwrap().len())
        .sum();
    send(&socket, &list("train", 0, &order));
    let third = counters_when(&mnt, |c| {
        n(c, "lookahead", "in_page_cache") >= 176
            && n(c, "source", "bytes") - n(&again, "source", "bytes") >= dropped
    });
    // Samples back to back in the shard are fetched together: a cached one with a dropped one.
    let cached = n(&third, "lookahead", "in_page_cache") - 100;
    assert!((76..=80).contains(&cached), "{third}");
    assert_eq!(n(&third, "lookahead", "fetched"), fetched + 200, "{third}");
    let source = n(&third, "source", "bytes") - n(&again, "source", "bytes");
    assert!(
        source >= dropped && source <= dropped + (80 - cached) * 48_000 + 20 * 1024,
        "{source} bytes fetched for the {dropped} dropped from the page cache"
    );
}

/// The socket is the mount owner's (0600) in the private stats directory; a mount made by root
/// for a user (`--uid`) gives it to that user; anyone else is refused.
#[test]
fn only_the_mounts_owner_and_the_user_it_serves_may_send_hints() {
    let Some(python) = python_with("json", "python3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_src, tar, order) = dataset(dir.path(), 20, 5);
    fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let script = dir.path().join("send.py");
    fs::write(
        &script,
        "import json, socket, sys\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.connect(sys.argv[1])\n\
         s.sendall((json.dumps({'paths': sys.argv[2:]}) + '\\n').encode())\n\
         print(s.makefile().readline())\n",
    )
    .unwrap();
    fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let try_as = |uid: u32, socket: &Path| {
        let mut args = vec![script.to_str().unwrap(), socket.to_str().unwrap()];
        args.extend(order[..3].iter().map(String::as_str));
        as_user(uid, &python, &args)
    };
    let mnt = dir.path().join("mnt");
    {
        let _m = Mount::new(&[&tar], &mnt, &[]);
        let socket = socket_of(&mnt);
        let meta = fs::symlink_metadata(&socket).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600));
        let other = try_as(65534, &socket);
        assert!(!other.status.success());
        assert!(
            String::from_utf8_lossy(&other.stderr).contains("PermissionError"),
            "{other:?}"
        );
    }
    let _m = Mount::new(
        &[&tar],
        &mnt,
        &["--allow-other", "--uid", "65534", "--gid", "65534"],
    );
    let socket = socket_of(&mnt);
    assert_eq!(fs::symlink_metadata(&socket).unwrap().uid(), 65534);
    // The served user reads the counters of the mount made for them (their group may) and finds
    // the socket (what packfs.Hints asks).
    let status = as_user(
        65534,
        env!("CARGO_BIN_EXE_packfs"),
        &["status", "--json", mnt.to_str().unwrap()],
    );
    let seen: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(seen[0]["hints"], socket.to_str().unwrap(), "{seen}");
    assert_eq!(seen[0]["counters"]["served_uid"], 65534, "{seen}");
    let served = try_as(65534, &socket);
    assert!(served.status.success(), "{served:?}");
    assert!(String::from_utf8_lossy(&served.stdout).contains("\"samples\":3"));
    let stranger = try_as(65533, &socket);
    assert!(!stranger.status.success());
}

/// Bad JSON is answered and the connection closed; paths that name no file are counted and the
/// first one named; an overlong path, stream name or list is refused or cut; `end` drops a list.
#[test]
fn bad_messages_are_answered_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (_src, tar, order) = dataset(dir.path(), 10, 6);
    let mnt = dir.path().join("mnt");
    let _m = Mount::new(&[&tar], &mnt, &[]);
    let socket = socket_of(&mnt);

    let mut s = UnixStream::connect(&socket).unwrap();
    s.write_all(b"{\"paths\": [\"a\",,]}\n").unwrap();
    let mut answer = String::new();
    let mut r = BufReader::new(s.try_clone().unwrap());
    r.read_line(&mut answer).unwrap();
    let v: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(v["ok"], false);
    assert!(
        v["error"].as_str().unwrap().contains("not a hints message"),
        "{v}"
    );
    answer.clear();
    assert_eq!(
        r.read_line(&mut answer).unwrap(),
        0,
        "closed after bad JSON"
    );

    let mut paths = order.clone();
    paths.push("train/nope.jpg".into());
    paths.push(mnt.join(&order[0]).to_string_lossy().into_owned());
    paths.push("/elsewhere/x".into());
    let v = send(&socket, &list("train", 0, &paths));
    assert_eq!(
        (v["samples"].as_u64(), v["unknown"].as_u64()),
        (Some(11), Some(2)),
        "{v}"
    );
    assert_eq!(v["first_unknown"], "train/nope.jpg");

    let long = "x".repeat(70 << 10);
    let v = send(&socket, &json!({"paths": [long]}));
    assert_eq!(v["ok"], false, "{v}");
    let v = send(&socket, &json!({"stream": "s".repeat(300), "paths": []}));
    assert_eq!(v["ok"], false, "{v}");
    let v = send(&socket, &json!({"rank": 1}));
    assert_eq!(v["ok"], false, "{v}");

    // At most four times the files, plus 1 024.
    let many: Vec<&String> = order.iter().cycle().take(10 * 4 + 1024 + 500).collect();
    let v = send(&socket, &json!({"stream": "big", "paths": many}));
    assert_eq!(v["samples"], 10 * 4 + 1024, "{v}");
    assert_eq!(v["truncated"], true);

    assert_eq!(n(&counters(&mnt), "lookahead", "active_lists"), 2);
    let v = send(&socket, &json!({"stream": "big", "rank": 0, "end": true}));
    assert_eq!(v["ok"], true);
    assert_eq!(n(&counters(&mnt), "lookahead", "active_lists"), 1);
}

/// `--lookahead 0`: no socket, no hints in the counters, and reads as before.
#[test]
fn a_mount_without_lookahead_has_no_hints_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (src, tar, order) = dataset(dir.path(), 10, 7);
    let mnt = dir.path().join("mnt");
    let _m = Mount::new(&[&tar], &mnt, &["--lookahead", "0"]);
    let c = counters(&mnt);
    assert!(c["hints"].is_null() && c["lookahead"].is_null(), "{c}");
    read_all(&mnt, &src, &order, 2);
    let abs = packfs::daemon::mounts::absolute(&mnt).unwrap();
    let device = packfs::daemon::mounts::packfs_device(&abs).unwrap();
    let sock = packfs::daemon::hints::socket_path(&abs, &device);
    assert!(!sock.exists());
}

/// A daemon killed with SIGKILL cannot remove its socket; `packfs umount` of its mount does, as it
/// removes the stats file (tests left one socket per killed daemon in /run/packfs).
#[test]
fn a_killed_daemons_socket_goes_with_its_mount() {
    let dir = tempfile::tempdir().unwrap();
    let (_, tar, _) = dataset(dir.path(), 20, 9);
    let mnt = dir.path().join("mnt");
    let m = Mount::new(&[&tar], &mnt, &[]);
    let sock = socket_of(&mnt);
    assert!(sock.exists());
    unsafe { libc::kill(m.pid, libc::SIGKILL) };
    assert!(m.wait_daemon_exit(Duration::from_secs(10)));
    assert!(sock.exists(), "a killed daemon removes nothing");
    assert_ok(&packfs().arg("umount").arg(&mnt).output().unwrap());
    assert!(!sock.exists(), "{} left behind", sock.display());
}

/// A daemon whose socket file was removed while it served (its runtime directory cleaned, as a
/// test or a tmp cleaner does) still exits after its unmount: it woke its accepting thread by
/// connecting to the path, found nothing there, and waited forever (a CI run left one daemon
/// of tests/unprivileged.rs behind).
#[test]
fn a_daemon_whose_socket_was_removed_exits_after_its_unmount() {
    let dir = tempfile::tempdir().unwrap();
    let (_, tar, _) = dataset(dir.path(), 20, 10);
    let mnt = dir.path().join("mnt");
    let m = Mount::new(&[&tar], &mnt, &[]);
    let sock = socket_of(&mnt);
    std::fs::remove_file(&sock).unwrap();
    assert_ok(&packfs().arg("umount").arg(&mnt).output().unwrap());
    let exited = m.wait_daemon_exit(Duration::from_secs(10));
    if !exited {
        unsafe { libc::kill(m.pid, libc::SIGKILL) };
    }
    assert!(exited, "the daemon still runs 10 s after its unmount");
}

/// Senders that stop in the middle of a list (a sampler under SIGSTOP or a debugger, or a user
/// doing it on purpose) hold only what they had: 40 of them on a `.tar.gz` mounted with
/// `--cache-size 16M` (each took 1 MiB of the budget at its first path, and readers queued
/// behind them: no read in 130 s) and every sample is still read, right, by 4 readers. A sender
/// stalled mid-message is cut off after 10 s; one quiet between messages is not.
#[test]
fn stalled_hint_senders_never_stall_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (src, tar, order) = dataset(dir.path(), 300, 11);
    let gz = dir.path().join("d.tar.gz");
    run(Command::new("gzip").arg("-k").arg("-9").arg(&tar));
    fs::rename(tar.with_extension("tar.gz"), &gz).unwrap();
    let mnt = dir.path().join("mnt");
    let _m = Mount::new(&[&gz], &mnt, &["--cache-size", "16M"]);
    let socket = socket_of(&mnt);
    let stalled: Vec<UnixStream> = (0..40)
        .map(|i| {
            let mut s = UnixStream::connect(&socket).unwrap();
            let head = format!("{{\"stream\": \"s{i}\", \"paths\": [\"{}\", ", order[i]);
            s.write_all(head.as_bytes()).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (m, s, o) = (mnt.clone(), src.clone(), order.clone());
    std::thread::spawn(move || {
        read_all(&m, &s, &o, 4);
        let _ = done_tx.send(());
    });
    // A hang, not a speed, is what this looks for: the reads take a second or two.
    assert!(
        done_rx.recv_timeout(Duration::from_secs(120)).is_ok(),
        "the readers made no progress behind 40 stalled hint senders"
    );
    // A quiet connection between two messages is kept...
    let mut quiet = UnixStream::connect(&socket).unwrap();
    let mut answers = BufReader::new(quiet.try_clone().unwrap());
    let mut line = serde_json::to_vec(&list("quiet", 0, &order[..5])).unwrap();
    line.push(b'\n');
    quiet.write_all(&line).unwrap();
    let mut answer = String::new();
    answers.read_line(&mut answer).unwrap();
    assert!(answer.contains("\"ok\":true"), "{answer}");
    std::thread::sleep(Duration::from_secs(12));
    quiet.write_all(&line).unwrap();
    answer.clear();
    answers.read_line(&mut answer).unwrap();
    assert!(answer.contains("\"ok\":true"), "kept while quiet: {answer}");
    // ... and the ones stalled in the middle of a message were cut off, with a word why.
    for s in &stalled {
        let mut answer = String::new();
        BufReader::new(s.try_clone().unwrap())
            .read_line(&mut answer)
            .unwrap();
        assert!(answer.contains("stalled for 10 s"), "{answer}");
    }
}
