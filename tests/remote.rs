//! Images behind HTTP URLs, served through a real FUSE mount: a small HTTP object server
//! (tests/support/objserver.py) on 127.0.0.1 serves them, counts what packfs asks for and injects
//! faults. Images in a real S3 store are in tests/s3.rs.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::remote::*;
use common::servers::*;
use common::*;

/// The test tree's three shards behind the object server, and the brace range naming them.
fn served_shards(dir: &Path) -> (PathBuf, Vec<PathBuf>, Server, String) {
    let (src, shards) = tree_and_shards(dir);
    let server = objserver(shards[0].parent(), None);
    let pattern = format!("{}/shard-{{000000..000002}}.tar", server.url);
    (src, shards, server, pattern)
}

#[test]
fn http_shards_named_by_a_brace_range_mount_and_a_glob_is_refused_with_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let (src, _, server, pattern) = served_shards(dir.path());
    let home = dir.path();
    let mnt = dir.path().join("mnt");
    let mut cmd = pk("http://127.0.0.1:9", home);
    cmd.arg("mount").arg(&pattern);
    let m = RemoteMount::new(cmd, &mnt);
    assert_same_tree(&src, &mnt, &[]);

    // The 5 MiB file was read in order: chunks after the second came from read-ahead.
    let counters = m.wait_for("http://127.0.0.1:9", home, |c| {
        c["served"]["read_ahead_chunks"].as_u64().unwrap() >= 2
    });
    assert!(counters["dataset"].as_str().unwrap().starts_with("http://"));
    // Reads went in whole chunks: far fewer GETs than the 60-odd files read; and over kept-alive
    // connections (a body left unread closed its connection: one per request).
    let stats = control(&server, "_stats");
    assert!(stats["gets"].as_u64().unwrap() < 40, "{stats}");
    let (requests, connections) = (
        stats["requests"].as_u64().unwrap(),
        stats["connections"].as_u64().unwrap(),
    );
    assert!(connections * 2 < requests, "{stats}");

    let out = pk("http://127.0.0.1:9", home)
        .arg("ls")
        .arg(format!("{}/*.tar", server.url))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("cannot be listed") && err.contains("{000000..000127}"),
        "{err}"
    );
}

/// `packfs cat` of one file of `url`, with the store's settings and `env`.
fn cat(url: &str, member: &str, home: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = pk("http://127.0.0.1:9", home);
    cmd.arg("cat")
        .arg(url)
        .arg(member)
        .envs(env.iter().copied());
    cmd.output().unwrap()
}

#[test]
fn store_faults_are_retried_then_reported_with_the_url_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (src, shards) = tree_and_shards(dir.path());
    let server = objserver(shards[0].parent(), None);
    let home = dir.path();
    let url = format!("{}/shard-000001.tar", server.url);
    let want = fs::read(src.join("big/odd.bin")).unwrap();
    let fast = [("PACKFS_REMOTE_BACKOFF_MS", "10")];

    // A burst of 503s: retried, the bytes are right, each retry is logged.
    control(&server, "_fault?status=503&count=3&match=shard-000001");
    let out = cat(&url, "big/odd.bin", home, &fast);
    assert_ok(&out);
    assert_eq!(out.stdout, want);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("status 503") && err.contains("retry 3 of 4") && err.contains(&url),
        "{err}"
    );

    // A stalled answer: the attempt times out and the next one succeeds.
    control(&server, "_fault?stall=4&count=1&match=shard-000001");
    let out = cat(
        &url,
        "big/odd.bin",
        home,
        &[("PACKFS_REMOTE_TIMEOUT", "1"), fast[0]],
    );
    assert_ok(&out);
    assert_eq!(out.stdout, want);
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        err.contains("timeout") || err.contains("timed out"),
        "{err}"
    );

    // Failing for good: the last attempt's reason, the URL, and the attempts made.
    control(&server, "_fault?status=500&count=100&match=shard-000001");
    let out = cat(&url, "big/odd.bin", home, &fast);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("failed after 5 attempts: status 500"), "{err}");
    control(&server, "_fault?clear=1");

    // A missing object and a refused one: said at once, without retries.
    let out = cat(
        &format!("{}/shard-000009.tar", server.url),
        "x",
        home,
        &fast,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no such object (404)") && !err.contains("retry"),
        "{err}"
    );
    control(&server, "_fault?deny=shard-000002");
    let out = cat(
        &format!("{}/shard-000002.tar", server.url),
        "many/00001.txt",
        home,
        &fast,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("access denied (403 AccessDenied)"), "{err}");
    control(&server, "_fault?clear=1");
}

#[test]
fn an_object_replaced_after_indexing_is_refused_and_one_replaced_under_a_mount_fails_its_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (_src, shards) = tree_and_shards(dir.path());
    let server = objserver(shards[0].parent(), None);
    let home = dir.path();
    let urls = format!("{}/shard-{{000000..000002}}.tar", server.url);
    let index = dir.path().join("t.packfs-index");
    run(pk("http://127.0.0.1:9", home)
        .args(["index", "-o"])
        .arg(&index)
        .arg(&urls));

    // Replaced with other bytes of the same size: the fingerprint no longer matches.
    let shard = &shards[2];
    let mut bytes = fs::read(shard).unwrap();
    let n = bytes.len();
    bytes[n - 2000] ^= 0xff;
    fs::write(shard, &bytes).unwrap();
    let mnt = dir.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let out = pk("http://127.0.0.1:9", home)
        .arg("mount")
        .arg(&index)
        .arg(&mnt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("shard-000002.tar changed since it was indexed"),
        "{err}"
    );

    // Re-indexed and mounted; then replaced again while mounted: reads fail (EIO), not serve
    // other bytes, and the log says why.
    run(pk("http://127.0.0.1:9", home)
        .args(["index", "-o"])
        .arg(&index)
        .arg(&urls));
    let log = dir.path().join("mount.log");
    let mut cmd = pk("http://127.0.0.1:9", home);
    cmd.arg("mount")
        .args(["--log-file", log.to_str().unwrap()])
        .arg(&index);
    let m = RemoteMount::new(cmd, &mnt);
    let mut bytes = fs::read(shard).unwrap();
    bytes[600] ^= 0xff;
    std::thread::sleep(Duration::from_millis(20));
    fs::write(shard, &bytes).unwrap();
    let read = fs::read(m.dir.join("many/00003.txt"));
    assert!(read.is_err(), "a replaced object must not be served");
    let logged = fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("was replaced since it was opened (its ETag changed)"),
        "{logged}"
    );
}

#[test]
fn a_stalled_object_does_not_hold_up_reads_of_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let (src, shards) = tree_and_shards(dir.path());
    let server = objserver(shards[0].parent(), None);
    let home = dir.path();
    let mnt = dir.path().join("mnt");
    let mut cmd = pk("http://127.0.0.1:9", home);
    cmd.arg("mount")
        .env("PACKFS_REMOTE_TIMEOUT", "60")
        .arg(format!("{}/shard-{{000000..000002}}.tar", server.url));
    let m = RemoteMount::new(cmd, &mnt);
    control(&server, "_fault?stall=20&count=1&match=shard-000001");
    let stalled_path = m.dir.join("big/odd.bin");
    let stalled = std::thread::spawn(move || fs::read(stalled_path));
    // Give the stalled read time to reach the server.
    let started = Instant::now();
    while control(&server, "_fault")["count"] != 0 && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let other = fs::read(m.dir.join("many/00007.txt")).unwrap();
    assert_eq!(other, fs::read(src.join("many/00007.txt")).unwrap());
    assert!(
        !stalled.is_finished(),
        "the read of the other object finished while the stalled one still waits"
    );
    assert_eq!(
        stalled.join().unwrap().unwrap(),
        fs::read(src.join("big/odd.bin")).unwrap()
    );
}

/// The commands that take images take URLs too: `verify --data` reads every byte over HTTP,
/// `pack` reshards from the server, and `stage` copies the shards, then finds them complete.
#[test]
fn verify_pack_and_stage_read_http_urls() {
    let dir = tempfile::tempdir().unwrap();
    let (src, shards, server, pattern) = served_shards(dir.path());
    let home = dir.path();

    let out = both(
        pk("http://127.0.0.1:9", home)
            .args(["verify", "--data"])
            .arg(&pattern),
    );
    assert!(
        out.contains("ok: ") && out.contains("3 images unchanged"),
        "{out}"
    );

    // Resharded into 2 shards: GNU tar extracts the source tree from them.
    let packed = dir.path().join("packed");
    run(pk("http://127.0.0.1:9", home)
        .args(["pack", "-q", "--shards", "2", "--name", "re", "-o"])
        .arg(&packed)
        .arg(&pattern));
    let extracted = dir.path().join("extracted");
    fs::create_dir_all(&extracted).unwrap();
    for i in 0..2 {
        run(Command::new("tar")
            .arg("-xf")
            .arg(packed.join(format!("re-{i:06}.tar")))
            .arg("-C")
            .arg(&extracted));
    }
    // Byte for byte (directory mtimes change as the second shard fills the directories).
    run(Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(&src)
        .arg(&extracted));

    // Staged whole, then found complete: the second run fetches no data.
    let total: u64 = shards.iter().map(|s| fs::metadata(s).unwrap().len()).sum();
    let stage = dir.path().join("stage");
    let out = both(
        pk("http://127.0.0.1:9", home)
            .args(["stage", "--to"])
            .arg(&stage)
            .arg(&pattern),
    );
    assert!(
        out.contains(&format!("staged {total} of {total} bytes of 3 image(s)")),
        "{out}"
    );
    control(&server, "_reset");
    let out = both(
        pk("http://127.0.0.1:9", home)
            .args(["stage", "--to"])
            .arg(&stage)
            .arg(&pattern),
    );
    assert!(out.contains("copied 0 bytes"), "{out}");
    let stats = control(&server, "_stats");
    // The mount-time checks (a HEAD and two fingerprint ranges per object) only.
    assert!(stats["bytes"].as_u64().unwrap() <= 3 * 2 * 65536, "{stats}");
}

/// Runs `cmd`, which must succeed; its stdout and stderr together (progress and ready lines go
/// to stderr).
fn both(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert_ok(&out);
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// An S3 listing that always answers the same truncated page, as a broken or hostile store
/// might: `packfs ls` of a glob refuses it with a message instead of listing forever.
#[test]
fn a_store_listing_that_does_not_advance_is_refused() {
    let page = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>p/</Prefix>
<MaxKeys>1000</MaxKeys><IsTruncated>true</IsTruncated><NextContinuationToken>again</NextContinuationToken>
<Contents><Key>p/a.tar</Key><Size>10</Size></Contents></ListBucketResult>"#;
    let script = format!(
        "import http.server, sys\n\
         PAGE = {page:?}.encode()\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('Content-Length', str(len(PAGE)))\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(PAGE)\n\
         \x20   def log_message(self, *a):\n\
         \x20       pass\n\
         s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)\n\
         print('PORT', s.server_address[1], flush=True)\n\
         s.serve_forever()\n"
    );
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(script);
    let server = start(cmd, false);
    let home = tempfile::tempdir().unwrap();
    let mut ls = pk(&server.url, home.path());
    ls.args(["ls", "s3://b/p/*.tar"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = ls.spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("packfs ls followed a listing that never advances for 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("s3://b/p/*") && err.contains("a second time"),
        "{err}"
    );
}

/// A shard larger than half the RAM cache is read exactly, one GET per file, unless a reader walks
/// it in archive order: then three files in a row make a stream, read in whole chunks with
/// read-ahead, and the walk costs about one GET per chunk. A random order stays one per file.
#[test]
fn a_walk_in_archive_order_is_read_in_chunks_and_a_random_one_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    // 240 files of 10-90 kB in 8 directories: 12 MB of tar, 12 chunks of 1 MiB.
    let mut names = Vec::new();
    for i in 0..240u64 {
        let name = format!("d{}/f{i:03}.bin", i % 8);
        write_file(
            &src.join(&name),
            &bytes(i, 10_000 + (i as usize * 3_331) % 80_000),
            0o644,
        );
        names.push(name);
    }
    names.sort();
    let shards = dir.path().join("shards");
    fs::create_dir(&shards).unwrap();
    let shard = shards.join("walk.tar");
    run(Command::new("tar")
        .args(["--sort=name", "--format=gnu", "-cf"])
        .arg(&shard)
        .arg("-C")
        .arg(&src)
        .args(["d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"]));
    let tar_len = fs::metadata(&shard).unwrap().len();
    let chunks = tar_len.div_ceil(1 << 20);
    let server = objserver(Some(&shards), None);
    let home = dir.path();
    let url = format!("{}/walk.tar", server.url);
    let mount_with = |name: &str, extra: &[&str]| {
        let mut cmd = pk("http://127.0.0.1:9", home);
        cmd.args(["mount", "--cache-size", "8M"])
            .args(extra)
            .arg(&url);
        RemoteMount::new(cmd, &dir.path().join(name))
    };
    let mount = |name: &str| mount_with(name, &[]);
    let gets = || control(&server, "_stats")["gets"].as_u64().unwrap();

    // In archive order (GNU tar sorted the members by name).
    let m = mount("in-order");
    let before = gets();
    for name in &names {
        assert!(fs::read(m.dir.join(name)).unwrap() == fs::read(src.join(name)).unwrap());
    }
    let walked = gets() - before;
    let counters = m.wait_for("http://127.0.0.1:9", home, |c| {
        c["served"]["streams"].as_u64().unwrap() >= 1
    });
    assert!(
        walked * 10 <= chunks * 12 + 20,
        "{walked} GETs for {chunks} chunks: {counters}"
    );
    drop(m);

    // In a random order, on a fresh mount: one GET per file.
    let m = mount("random");
    let mut order = names.clone();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let before = gets();
    for name in &order {
        assert!(fs::read(m.dir.join(name)).unwrap() == fs::read(src.join(name)).unwrap());
    }
    let random = gets() - before;
    drop(m);

    // Two readers each walking their half of the shard, file by file in turn (DataLoader workers
    // given contiguous slices): each is found (the kernel names the thread that asks), so the
    // walk still costs about one GET per chunk, not one per file.
    let m = mount("two-walkers");
    let before = gets();
    let (first, second) = names.split_at(names.len() / 2);
    let turns = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        for half in [first, second] {
            let (m, src, turns) = (&m, &src, &turns);
            scope.spawn(move || {
                for name in half {
                    turns.wait();
                    assert!(
                        fs::read(m.dir.join(name)).unwrap() == fs::read(src.join(name)).unwrap()
                    );
                }
            });
        }
    });
    let interleaved = gets() - before;
    let counters = m.wait_for("http://127.0.0.1:9", home, |c| {
        c["served"]["streams"].as_u64().unwrap() >= 2
    });
    // The chunk where the halves meet is read by the second reader first and by the first one
    // last, ten chunks later: an 8 MiB cache holds 8 chunks, so it is fetched twice. Each reader's
    // first two files are read exactly, before its walk is found (4 GETs); under load a chunk
    // fetched ahead may be evicted before its reader comes (seen once in a full run: 18).
    assert!(
        interleaved <= chunks + 1 + 4 + 2,
        "{interleaved} GETs for {chunks} chunks, two readers in turn: {counters}"
    );
    drop(m);

    // With every read in chunks (`--ram-chunks true`), the chunks read-ahead fetches are kept
    // until read as well: the same walk, about one GET per chunk.
    let m = mount_with("ram-chunks", &["--ram-chunks", "true"]);
    let before = gets();
    for name in &names {
        assert!(fs::read(m.dir.join(name)).unwrap() == fs::read(src.join(name)).unwrap());
    }
    let chunked = gets() - before;
    eprintln!(
        "archive order: {walked} GETs for {chunks} chunks; two readers in turn: {interleaved}; \
         random order: {random} GETs for {} files; --ram-chunks true: {chunked} GETs",
        names.len()
    );
    assert!(
        chunked * 10 <= chunks * 12 + 20,
        "{chunked} GETs for {chunks} chunks"
    );
    assert!(
        (names.len() as u64..=names.len() as u64 + 8).contains(&random),
        "{random} GETs for {} files in a random order",
        names.len()
    );
}

/// Six readers each walking their own shard at once, with 20 ms per request: read-ahead (two
/// threads) falls behind, and a reader reaches a chunk before the read-ahead queued for it does.
/// Read-ahead then finds the chunk the reader fetched in its window and leaves it (it fetched it
/// again: the RAM cache's cold part had let it go). The window keeps 8 chunks, fewer than six
/// readers' current chunks and the two fetched ahead of each: read-ahead pauses once chunks leave
/// it too early (before, their readers fetched them again: up to 55 GETs, and CI failed on 52;
/// `tiers::read_ahead`'s unit tests check the pause itself). About one GET per chunk.
#[test]
fn read_ahead_behind_its_readers_fetches_no_chunk_twice() {
    let dir = tempfile::tempdir().unwrap();
    let shards = dir.path().join("shards");
    fs::create_dir(&shards).unwrap();
    let mut walks = Vec::new();
    for s in 0..6u64 {
        let src = dir.path().join(format!("src{s}"));
        let mut names = Vec::new();
        for i in 0..60u64 {
            let name = format!("s{s}/f{i:03}.bin");
            let data = bytes(s * 100 + i, 40_000 + (i as usize * 7_919) % 120_000);
            write_file(&src.join(&name), &data, 0o644);
            names.push((name, data));
        }
        run(Command::new("tar")
            .args(["--sort=name", "--format=gnu", "-cf"])
            .arg(shards.join(format!("s{s}.tar")))
            .arg("-C")
            .arg(&src)
            .arg(format!("s{s}")));
        walks.push(names);
    }
    let chunks: u64 = (0..6)
        .map(|s| {
            let len = fs::metadata(shards.join(format!("s{s}.tar")))
                .unwrap()
                .len();
            len.div_ceil(1 << 20)
        })
        .sum();
    let server = objserver(Some(&shards), None);
    control(&server, "_latency?ms=20");
    let home = dir.path();
    let mut cmd = pk("http://127.0.0.1:9", home);
    // 16 MiB: 16 chunks of the 36 fit; the window keeps 8 of them.
    cmd.args(["mount", "--cache-size", "16M"]);
    for s in 0..6 {
        cmd.arg(format!("{}/s{s}.tar", server.url));
    }
    let m = RemoteMount::new(cmd, &dir.path().join("mnt"));
    let before = control(&server, "_stats")["gets"].as_u64().unwrap();
    let turns = std::sync::Barrier::new(walks.len());
    std::thread::scope(|scope| {
        for walk in &walks {
            let (m, turns) = (&m, &turns);
            scope.spawn(move || {
                for (name, data) in walk {
                    turns.wait();
                    assert!(fs::read(m.dir.join(name)).unwrap() == *data, "{name}");
                }
            });
        }
    });
    let gets = control(&server, "_stats")["gets"].as_u64().unwrap() - before;
    let counters = m.wait_for("http://127.0.0.1:9", home, |c| {
        c["served"]["streams"].as_u64().unwrap() >= 6
    });
    eprintln!("6 readers, own shards: {gets} GETs for {chunks} chunks");
    // Each chunk once, and each reader's first two files exactly (before its run is found).
    assert!(
        gets <= chunks + 2 * 6 + 3,
        "{gets} GETs for {chunks} chunks: {counters}"
    );
}

/// A store (or a proxy before it) that ignores If-Match answers a replaced object's ranges with
/// its new bytes and their new ETag: 120 of 120 such reads were served. The answer's ETag is
/// compared with the one opened, and the reads fail, saying why.
#[test]
fn a_store_that_ignores_if_match_cannot_serve_a_replaced_object() {
    let dir = tempfile::tempdir().unwrap();
    let (src, shards) = tree_and_shards(dir.path());
    let server = objserver(shards[0].parent(), None);
    let home = dir.path();
    let urls = format!("{}/shard-{{000000..000002}}.tar", server.url);
    let log = dir.path().join("mount.log");
    let mnt = dir.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let mut cmd = pk("http://127.0.0.1:9", home);
    // Each read a GET of its own (no chunk read before the change serves the rest).
    cmd.arg("mount")
        .args(["--log-file", log.to_str().unwrap(), "--ram-chunks", "false"])
        .arg(&urls);
    let m = RemoteMount::new(cmd, &mnt);
    assert_eq!(
        fs::read(m.dir.join("many/00001.txt")).unwrap(),
        fs::read(src.join("many/00001.txt")).unwrap()
    );
    control(&server, "_ifmatch?ignore=1");
    // Every shard replaced by itself with one byte changed (size kept, a new mtime: a new ETag).
    std::thread::sleep(Duration::from_millis(20));
    for shard in &shards {
        let mut bytes = fs::read(shard).unwrap();
        bytes[600] ^= 0xff;
        fs::write(shard, &bytes).unwrap();
    }
    let mut failed = 0;
    for i in 2..40 {
        let name = format!("many/{i:05}.txt");
        match fs::read(m.dir.join(&name)) {
            Ok(got) => assert_eq!(
                got,
                fs::read(src.join(&name)).unwrap(),
                "{name}: other bytes"
            ),
            Err(_) => failed += 1,
        }
    }
    assert!(
        failed > 30,
        "only {failed} of 38 reads of replaced objects failed"
    );
    let logged = fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("was replaced since it was opened (the answer's ETag is"),
        "{logged}"
    );
}
