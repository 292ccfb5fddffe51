//! What an operator sees of a running mount: the ready line, `packfs status` (live and stale),
//! the daemon's default log (file or syslog), the I/O trace and its summary, `--idle-timeout`,
//! and the refusal to unmount another user's mount.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A tar of `n` small files (1-20 KB: each is read with one request) and its index.
fn dataset(dir: &Path, n: usize) -> PathBuf {
    let files: Vec<_> = (0..n)
        .map(|i| {
            (
                format!("d/f{i:03}.bin"),
                bytes(i as u64, 1000 + i * 997 % 19_000),
            )
        })
        .collect();
    indexed_tar(dir, "a", &files).index
}

fn status_json(mnt: &Path) -> (bool, Value) {
    let out = packfs()
        .args(["status", "--json"])
        .arg(mnt)
        .output()
        .unwrap();
    let parsed: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (out.status.success(), parsed[0].clone())
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ok() {
        assert!(started.elapsed() < limit, "{what}: not after {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn status_shows_counters_that_grow_as_files_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), 30);
    let mnt = dir.path().join("mnt");
    let log = dir.path().join("mount.log");
    let m = Mount::new(&[&index], &mnt, &["--log-file", log.to_str().unwrap()]);
    assert!(
        m.stderr.contains("mounted")
            && m.stderr
                .contains(&format!("packfs status {}", mnt.display())),
        "the ready line says what is mounted and how to see its status: {}",
        m.stderr
    );

    let (ok, before) = status_json(&mnt);
    assert!(ok);
    assert_eq!(before["state"], "live");
    let counters = &before["counters"];
    assert_eq!(counters["files"], 30);
    assert_eq!(counters["images"], 1);
    assert_eq!(counters["pid"], m.pid);
    let reads_before = counters["requests"]["read"]["count"].as_u64().unwrap_or(0);

    for i in 0..30 {
        std::fs::read(mnt.join(format!("d/f{i:03}.bin"))).unwrap();
    }
    let mut after = Value::Null;
    wait_for(
        "the stats file shows the reads",
        Duration::from_secs(5),
        || {
            after = status_json(&mnt).1;
            after["counters"]["requests"]["read"]["count"].as_u64() >= Some(reads_before + 30)
        },
    );
    let c = &after["counters"];
    assert!(c["served"]["source_bytes"].as_u64().unwrap() > 0);
    assert!(c["requests"]["lookup"]["count"].as_u64().unwrap() >= 30);
    assert!(c["requests"]["read"]["p99_us"].as_f64().unwrap() > 0.0);
    assert_eq!(c["errors"], 0);

    // The same for Prometheus (node_exporter's textfile collector), beside the stats file.
    let stats = PathBuf::from(after["stats_file"].as_str().unwrap());
    let prom = std::fs::read_to_string(stats.with_extension("prom")).unwrap();
    assert!(
        prom.contains("# TYPE packfs_requests_total counter"),
        "{prom}"
    );
    assert!(prom.contains("op=\"read\"}"), "{prom}");

    let text = run(packfs().arg("status").arg(&mnt));
    for want in ["live", "30 files", "requests", "read", "p99", "counters"] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    // How old the counters are (the daemon rewrites them every second), in text and JSON.
    let age_line = text.lines().next().unwrap();
    assert!(
        age_line.contains("; counters as of ") && age_line.ends_with(" s ago"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&run(packfs().args(["status", "--json"]).arg(&mnt))).unwrap();
    let age = json[0]["counters_age_s"].as_f64().unwrap();
    assert!((0.0..5.0).contains(&age), "{json}");
    // Without arguments: every mount of this user, this one among them. Other mounts on the node
    // (another test's, or a stale one a failed run left) may make it exit 1; this one is live.
    let all = packfs().arg("status").output().unwrap();
    let all = String::from_utf8_lossy(&all.stdout);
    assert!(
        all.lines()
            .any(|l| l.starts_with(&format!("{}  live", mnt.display()))),
        "{all}"
    );

    // A clean mount, read and unmount leaves no warning in the INFO log (fuser used to warn of
    // every FLUSH at close, and of its own second unmount at exit).
    drop(m);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("INFO") && !text.contains("WARN"), "{text}");
}

#[test]
fn a_mount_whose_daemon_died_is_shown_stale_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), 3);
    let mnt = dir.path().join("mnt");
    let m = Mount::new(&[&index], &mnt, &[]);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(m.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(m.wait_daemon_exit(Duration::from_secs(10)));
    let (ok, status) = status_json(&mnt);
    assert!(!ok, "status of a stale mount exits non-zero");
    assert_eq!(status["state"], "stale");
    let problem = status["problem"].as_str().unwrap();
    assert!(
        problem.contains(&format!("packfs umount {}", mnt.display())),
        "{problem}"
    );
    run(packfs().arg("umount").arg(&mnt));
    let out = packfs().arg("status").arg(&mnt).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a packfs mount"));
}

/// The default log of a daemonized mount: syslog when something listens on /dev/log, else a file
/// beside the stats file. One test for both: /dev/log is the whole node's.
#[test]
fn a_daemon_logs_info_by_default_to_syslog_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), 3);
    let mnt = dir.path().join("mnt");
    let dev_log = Path::new("/dev/log");

    if dev_log.exists() {
        eprintln!(
            "SKIPPED (syslog part): /dev/log exists here, and this test does not read the node's syslog"
        );
    } else {
        let listener = UnixDatagram::bind(dev_log).unwrap();
        struct Remove;
        impl Drop for Remove {
            fn drop(&mut self) {
                let _ = std::fs::remove_file("/dev/log");
            }
        }
        let _remove = Remove;
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let m = Mount::new(&[&index], &mnt, &[]);
        // Other tests' daemons, mounting at the same time, log here too: wait for this one's.
        let ours = format!("packfs[{}]", m.pid);
        let mut said = String::new();
        let mut buf = vec![0u8; 8192];
        loop {
            let n = listener
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("no syslog message ({e}); so far: {said}"));
            let line = String::from_utf8_lossy(&buf[..n]).into_owned();
            said.push_str(&line);
            said.push('\n');
            if line.contains(&ours) && line.contains("mounted") {
                // Facility daemon (3), severity info (6): <30>; ident and pid.
                assert!(line.starts_with("<30>"), "{line}");
                break;
            }
        }
        let (_, status) = status_json(&mnt);
        assert!(
            status["counters"]["log"]
                .as_str()
                .unwrap()
                .contains("syslog")
        );
        drop(m);
    }

    // No syslog: a file the status names. A mount that ended with nothing worth keeping in it
    // takes it along (thousands of mounts left thousands of logs in the runtime directory).
    let m = Mount::new(&[&index], &mnt, &[]);
    let (_, status) = status_json(&mnt);
    let quiet_log = PathBuf::from(status["counters"]["log"].as_str().unwrap());
    assert!(quiet_log.exists());
    std::fs::read(mnt.join("d/f002.bin")).unwrap();
    drop(m);
    assert!(
        !quiet_log.exists(),
        "{} outlived a clean mount",
        quiet_log.display()
    );

    // One with an error keeps it, with the ready line and the errors.
    let m = Mount::new(&[&index], &mnt, &[]);
    let (_, status) = status_json(&mnt);
    let log = PathBuf::from(status["counters"]["log"].as_str().unwrap());
    assert!(
        log.ends_with(".log") || log.extension().is_some_and(|e| e == "log"),
        "{log:?}"
    );
    let tar = dir.path().join("a.tar");
    truncate(&tar, 1024);
    let err = std::fs::read(mnt.join("d/f002.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO));
    drop(m);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("INFO") && text.contains("mounted"), "{text}");
    assert!(
        text.contains("ERROR") && text.contains("f002.bin"),
        "{text}"
    );
    let _ = std::fs::remove_file(&log);
}

#[test]
fn quiet_mounts_print_nothing_and_log_warnings_only() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), 2);
    let mnt = dir.path().join("mnt");
    let log = dir.path().join("quiet.log");
    let m = Mount::new(
        &[&index],
        &mnt,
        &["-q", "--log-file", log.to_str().unwrap()],
    );
    assert_eq!(m.stderr, "", "-q prints no ready line");
    drop(m);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("INFO"), "{text}");
}

#[test]
fn a_trace_holds_every_read_and_its_summary_agrees_with_the_counters() {
    let dir = tempfile::tempdir().unwrap();
    let n = 40;
    let index = dataset(dir.path(), n);
    let mnt = dir.path().join("mnt");
    let trace = dir.path().join("trace.json");
    let m = Mount::new(&[&index], &mnt, &["--trace", trace.to_str().unwrap()]);
    for i in 0..n {
        std::fs::read(mnt.join(format!("d/f{i:03}.bin"))).unwrap();
    }
    let mut counted = Value::Null;
    wait_for(
        "the stats file shows the reads",
        Duration::from_secs(5),
        || {
            counted = status_json(&mnt).1["counters"]["requests"].clone();
            counted["read"]["count"].as_u64() >= Some(n as u64)
        },
    );
    std::thread::sleep(Duration::from_millis(1100));
    counted = status_json(&mnt).1["counters"]["requests"].clone();
    drop(m);

    // The file is what Perfetto loads: one JSON array.
    let events: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let reads: Vec<&Value> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "read" && e["ph"] == "X")
        .collect();
    assert_eq!(reads.len(), n, "one read per small file");
    let mut paths: Vec<&str> = reads
        .iter()
        .map(|e| e["args"]["path"].as_str().unwrap())
        .collect();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), n);
    assert!(paths.iter().all(|p| p.starts_with("/d/f")), "{paths:?}");
    assert!(reads.iter().all(|e| e["args"]["tier"] == "source"));

    let summary: Value = serde_json::from_str(&run(packfs()
        .args(["trace", "summarize", "--json"])
        .arg(&trace)))
    .unwrap();
    assert_eq!(summary["complete"], true);
    assert_eq!(summary["dropped"], 0);
    for op in ["read", "lookup"] {
        assert_eq!(
            summary["ops"][op]["count"], counted[op]["count"],
            "{op}: trace and counters differ"
        );
    }
    assert_eq!(summary["ops"]["read"]["bytes"], counted["read"]["bytes"]);
    let text = run(packfs().args(["trace", "summarize"]).arg(&trace));
    assert!(text.contains("read") && text.contains("p99"), "{text}");
}

#[test]
fn an_idle_mount_unmounts_itself_unless_a_file_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), 2);
    let mnt = dir.path().join("mnt");
    let m = Mount::new(&[&index], &mnt, &["--idle-timeout", "1s"]);
    // An open file keeps it: the unmount would fail with EBUSY.
    let held = std::fs::File::open(mnt.join("d/f000.bin")).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(is_mounted(&mnt), "unmounted while a file was open");
    drop(held);
    wait_for("the idle mount unmounts", Duration::from_secs(10), || {
        !is_mounted(&mnt)
    });
    assert!(m.wait_daemon_exit(Duration::from_secs(10)));
}

#[test]
fn another_users_mount_is_refused_naming_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), 2);
    let mnt = dir.path().join("mnt");
    let _m = Mount::new(&[&index], &mnt, &["--allow-other"]);
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_packfs"))
        .arg("umount")
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("packfs mount of user root (uid 0)") && err.contains("only its owner or root"),
        "{err}"
    );
    assert!(is_mounted(&mnt));
}

#[test]
fn moved_and_changed_shards_say_how_to_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let shards = dir.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let mut images = Vec::new();
    for i in 0..3 {
        let name = format!("f{i}.bin");
        write_file(&src.join(&name), &bytes(i, 3000), 0o644);
        let shard = shards.join(format!("train-{i:06}.tar"));
        tar_members(&src, &shard, &[&name]);
        images.push(shard);
    }
    let index = dir.path().join("train.packfs-index");
    run(packfs()
        .arg("index")
        .arg(shards.join("train-{000000..000002}.tar"))
        .arg("-o")
        .arg(&index));
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();

    // A rewritten shard: the rebuild command names the shards as one pattern, and works.
    set_mtime(&images[1], 1_000_000_000);
    let out = mount_cmd(&[&index], &mnt, &[], None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let pattern = format!("{}/train-{{000000..000002}}.tar", shards.display());
    assert!(err.contains(&pattern), "{err}");
    let command = err
        .split('`')
        .find(|s| s.starts_with("packfs index -o"))
        .unwrap_or_else(|| panic!("no rebuild command in: {err}"));
    let rebuilt = Command::new("sh")
        .arg("-c")
        .arg(command.replacen("packfs", env!("CARGO_BIN_EXE_packfs"), 1))
        .output()
        .unwrap();
    assert_ok(&rebuilt);

    // Shards moved elsewhere: the message names each place once and the option that helps.
    let moved = dir.path().join("elsewhere");
    std::fs::rename(&shards, &moved).unwrap();
    let out = mount_cmd(&[&index], &mnt, &[], None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--images-dir"), "{err}");
    let shown = format!("{}/train-000000.tar", shards.display());
    assert_eq!(err.matches(&shown).count(), 1, "{err}");
    let m = Mount::new(&[&index], &mnt, &["--images-dir", moved.to_str().unwrap()]);
    assert_eq!(std::fs::read(m.dir.join("f2.bin")).unwrap(), bytes(2, 3000));
    // The prologue's blocking copy finds them the same way.
    let stage = dir.path().join("stage");
    run(packfs()
        .arg("stage")
        .arg(&index)
        .arg("--to")
        .arg(&stage)
        .arg("--images-dir")
        .arg(&moved));
}

/// Every file a daemon writes (counters, Prometheus file, log, pid file, trace, staged copies)
/// is its owner's only: they name datasets, paths and pids, and the log holds every error. The
/// Prometheus file is readable by the group `--metrics-group` names, for node_exporter.
#[test]
fn everything_a_daemon_writes_is_readable_by_its_owner_only() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let index = dataset(dir.path(), 5);
    let mnt = dir.path().join("mnt");
    let at = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let m = Mount::new(
        &[&index],
        &mnt,
        &[
            "--log-file",
            &at("mount.log"),
            "--trace",
            &at("trace.json"),
            "--stats-file",
            &at("stats.json"),
            "--stage",
            &at("stage"),
            "--metrics-group",
            "65534",
        ],
    );
    for i in 0..5 {
        std::fs::read(mnt.join(format!("d/f{i:03}.bin"))).unwrap();
    }
    let (_, status) = status_json(&mnt);
    let default_stats = PathBuf::from(status["stats_file"].as_str().unwrap());
    let mut private = vec![
        default_stats.clone(),
        dir.path().join("mount.log"),
        mnt.with_extension("pid"),
        dir.path().join("trace.json"),
        dir.path().join("stats.json"),
    ];
    let staged: Vec<PathBuf> = std::fs::read_dir(dir.path().join("stage"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(staged.len() >= 2, "{staged:?}");
    private.extend(staged);
    for path in &private {
        let mode = std::fs::metadata(path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600, "mode of {}", path.display());
    }
    let prom = std::fs::metadata(default_stats.with_extension("prom")).unwrap();
    assert_eq!((prom.mode() & 0o777, prom.gid()), (0o640, 65534));
    // Another user finds nothing to read.
    let out = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg("cat")
        .arg(&default_stats)
        .output()
        .unwrap();
    assert!(!out.status.success() && out.stdout.is_empty());
    drop(m);
}
