//! Images and indexes in a real S3 store, served through a real FUSE mount: Ceph's RADOS Gateway
//! (bench/s3gw.sh, one per test process, each test its own bucket). Unlike a mock it checks every
//! signature and key, refuses with the proper S3 error codes, rotates keys as a key service does
//! and honours If-Match; the object server (tests/support/objserver.py) stands in front of it
//! where a test counts requests or injects faults.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::remote::*;
use common::servers::*;
use common::*;

/// `packfs` signing with the gateway's keys.
fn pk_rgw(rgw: &Rgw, endpoint: &str, home: &Path) -> Command {
    pk_with(endpoint, home, (&rgw.key, &rgw.secret))
}

/// The test tree's three shards uploaded as `bucket/train/shard-00000N.tar`: the tree and the
/// shards' local copies.
fn shards_in(rgw: &Rgw, dir: &Path, bucket: &str) -> (PathBuf, Vec<PathBuf>) {
    let (src, shards) = tree_and_shards(dir);
    let keys: Vec<String> = (0..3).map(|i| format!("train/shard-{i:06}.tar")).collect();
    let files: Vec<(&Path, &str)> = shards
        .iter()
        .zip(&keys)
        .map(|(p, k)| (p.as_path(), k.as_str()))
        .collect();
    rgw.upload(bucket, &files);
    (src, shards)
}

#[test]
fn shards_in_an_s3_bucket_mount_byte_for_byte_through_a_local_or_a_stored_index() {
    let Some(rgw) = rgw() else { return };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fs::create_dir_all(&home).unwrap();
    let (src, shards) = tree_and_shards(dir.path());
    let keys: Vec<String> = (0..3).map(|i| format!("train/shard-{i:06}.tar")).collect();
    let mut files: Vec<(&Path, &str)> = shards
        .iter()
        .zip(&keys)
        .map(|(p, k)| (p.as_path(), k.as_str()))
        .collect();
    // Something the prefix glob must not take.
    let readme = dir.path().join("README");
    fs::write(&readme, "not a shard\n").unwrap();
    files.push((&readme, "train/README"));
    rgw.upload("data", &files);

    // A brace range and a prefix glob name the same three objects, in key order.
    let index = dir.path().join("train.packfs-index");
    run(pk_rgw(rgw, &rgw.url, &home)
        .args(["index", "-o"])
        .arg(&index)
        .arg("s3://data/train/shard-{000000..000002}.tar"));
    let listed = run(pk_rgw(rgw, &rgw.url, &home)
        .args(["ls", "-l", "s3://data/train/*.tar"])
        .env("RUST_LOG", "info"));
    let by_range = run(pk_rgw(rgw, &rgw.url, &home).args(["ls", "-l"]).arg(&index));
    assert_eq!(listed, by_range, "s3://data/train/*.tar lists the 3 shards");

    // The index records URLs only: no credential, no local path.
    let bytes = fs::read(&index).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("s3://data/train/shard-000001.tar"));
    assert!(!text.contains(&rgw.secret) && !text.contains(&rgw.key));

    let mnt = dir.path().join("mnt");
    let mut cmd = pk_rgw(rgw, &rgw.url, &home);
    cmd.arg("mount").arg(&index);
    let m = RemoteMount::new(cmd, &mnt);
    assert_same_tree(&src, &mnt, &[]);
    let counters = m.wait_for(&rgw.url, &home, |c| c["served"]["source_bytes"] != 0);
    let store = &counters["remote"][0];
    assert_eq!(store["store"], "s3://data", "{counters}");
    assert!(store["requests"].as_u64().unwrap() > 0, "{counters}");
    assert_eq!(store["errors"], 0, "{counters}");
    drop(m);

    // The index kept in the bucket itself, with the endpoint given on the command line.
    rgw.upload("data", &[(&index, "train.packfs-index")]);
    let mnt2 = dir.path().join("mnt2");
    let mut cmd = pk_rgw(rgw, "http://127.0.0.1:9/nothing-listens-here", &home);
    cmd.args(["mount", "--endpoint-url", &rgw.url])
        .arg("s3://data/train.packfs-index");
    let _m2 = RemoteMount::new(cmd, &mnt2);
    assert_same_tree(&src, &mnt2, &[]);
}

/// Staged from the store through a proxy that fails some requests: the failures are retried,
/// staging completes, and a second epoch asks the store nothing.
#[test]
fn staged_from_the_store_a_second_epoch_makes_no_requests() {
    let Some(rgw) = rgw() else { return };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fs::create_dir_all(&home).unwrap();
    let (src, _) = shards_in(rgw, dir.path(), "stage");
    // packfs talks to the store through a counting proxy.
    let proxy = objserver(None, Some(&rgw.url));
    // A burst of 503s (a store shedding load) meets the first requests for one shard.
    control(&proxy, "_fault?status=503&count=4&match=shard-000001");
    let stage = dir.path().join("stage");
    let mnt = dir.path().join("mnt");
    let mut cmd = pk_rgw(rgw, &proxy.url, &home);
    cmd.env("PACKFS_REMOTE_BACKOFF_MS", "10")
        .arg("mount")
        .arg("--stage")
        .arg(&stage)
        .arg("s3://stage/train/*.tar");
    let m = RemoteMount::new(cmd, &mnt);
    let started = Instant::now();
    loop {
        let st = &m.status(&proxy.url, &home)["stage"];
        if st["status"] == "complete" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "staging did not complete: {st}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Epoch 1 (also during staging) and the copy itself made requests; the 503s were retried.
    let stats = control(&proxy, "_stats");
    assert!(stats["gets"].as_u64().unwrap() > 0, "{stats}");
    let store = &m.status(&proxy.url, &home)["remote"][0];
    assert!(
        store["retries"].as_u64().unwrap() >= 4 && store["errors"] == 0,
        "{store}"
    );
    control(&proxy, "_reset");
    // Epoch 2 from a cold page cache: every byte from the staged copy.
    run(Command::new("sh").args(["-c", "sync; echo 3 > /proc/sys/vm/drop_caches"]));
    assert_same_tree(&src, &mnt, &[]);
    let stats = control(&proxy, "_stats");
    assert_eq!(stats["requests"], 0, "epoch 2 asked the store: {stats}");
    m.wait_for(&proxy.url, &home, |c| {
        c["served"]["staged_bytes"].as_u64().unwrap() > 5 << 20
    });
}

/// No log line, at any level, holds a secret: not the access key id, the session token or the
/// signature of a presigned S3 URL (the HTTP client logs whole requests at debug), nor the
/// password of a URL packfs refuses. Checked in what commands print at every verbosity and in a
/// daemon's log at trace level.
#[test]
fn no_secret_reaches_any_log_at_any_level() {
    let Some(rgw) = rgw() else { return };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fs::create_dir_all(&home).unwrap();
    let (src, _) = shards_in(rgw, dir.path(), "secrets");
    // The store's real keys (the requests are logged whole at trace), and a session token.
    const TOKEN: &str = "packfsSessionTokenThatMustNotLeak";
    let secret_pk = || pk_rgw(rgw, &rgw.url, &home);
    let leaks = |what: &str, text: &str| {
        for secret in [&rgw.key, &rgw.secret, TOKEN, "secretpw"] {
            assert!(!text.contains(secret), "{what} shows {secret}:\n{text}");
        }
        // A signature shows only as REDACTED.
        for (at, _) in text.match_indices("X-Amz-Signature=") {
            let value = &text[at + "X-Amz-Signature=".len()..];
            assert!(value.starts_with("REDACTED"), "{what}: {}", &text[at..]);
        }
    };
    let pattern = "s3://secrets/train/shard-{000000..000002}.tar";
    for (env, flags) in [
        (None, &[][..]),
        (None, &["-v"][..]),
        (None, &["-vv"][..]),
        (None, &["-vvv"][..]),
        (Some("debug"), &[][..]),
        (Some("trace"), &[][..]),
        (Some("ureq=trace,rustls=trace,trace"), &[][..]),
    ] {
        let mut cmd = secret_pk();
        if let Some(spec) = env {
            cmd.env("RUST_LOG", spec);
        }
        let out = cmd.args(flags).arg("ls").arg(pattern).output().unwrap();
        assert_ok(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        leaks(&format!("ls {flags:?} RUST_LOG={env:?}"), &stderr);
        if env == Some("trace") {
            // The level took (packfs's own lines below warnings were written).
            assert!(stderr.contains("INFO"), "{stderr}");
        }
        let mut cmd = secret_pk();
        if let Some(spec) = env {
            cmd.env("RUST_LOG", spec);
        }
        let out = cmd
            .env("AWS_SESSION_TOKEN", TOKEN)
            .args(flags)
            .arg("ls")
            .arg(pattern)
            .output()
            .unwrap();
        // The gateway, without STS, ignores the token; it is sent (and logged at trace) all the
        // same.
        assert_ok(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        leaks(
            &format!("ls with a session token {flags:?} RUST_LOG={env:?}"),
            &stderr,
        );
    }
    // A URL with a password is refused without showing it, at any level.
    for spec in ["warn", "trace"] {
        let out = secret_pk()
            .env("RUST_LOG", spec)
            .args([
                "ls",
                "https://user:secretpw@127.0.0.1:9/x.tar?X-Amz-Signature=abc",
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("credentials in the URL"), "{stderr}");
        leaks("a refused URL", &stderr);
        assert!(!stderr.contains("=abc"), "{stderr}");
    }
    // A daemon's log at trace level, through a mount, a read of every file and the unmount.
    let log = dir.path().join("daemon.log");
    let mnt = dir.path().join("mnt");
    let mut cmd = secret_pk();
    cmd.env("RUST_LOG", "trace")
        .arg("mount")
        .arg("--log-file")
        .arg(&log)
        .arg(pattern);
    let mount = RemoteMount::new(cmd, &mnt);
    assert_same_tree(&src, &mount.dir, &[]);
    drop(mount);
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.lines().count() > 20, "{text}");
    leaks("the daemon's log", &text);
}

/// A wrong secret, an unknown key and anonymous requests are refused by the store, each with
/// its own S3 error code; packfs says which credential was refused and why (the first request
/// is a HEAD, whose refusal carries no code), shows the key id by its last 4 characters and the
/// secret never, and does not try again.
#[test]
fn a_refused_credential_is_named_with_the_reason_the_store_gave() {
    let Some(rgw) = rgw() else { return };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fs::create_dir_all(&home).unwrap();
    shards_in(rgw, dir.path(), "refuse");
    let url = "s3://refuse/train/shard-000000.tar";
    let refused = |keys: Option<(&str, &str)>, words: &[&str]| {
        let signed = || {
            let mut cmd = pk_rgw(rgw, &rgw.url, &home);
            if let Some((id, secret)) = keys {
                cmd.env("AWS_ACCESS_KEY_ID", id)
                    .env("AWS_SECRET_ACCESS_KEY", secret);
            } else {
                cmd.env_remove("AWS_ACCESS_KEY_ID")
                    .env_remove("AWS_SECRET_ACCESS_KEY")
                    .env("AWS_EC2_METADATA_DISABLED", "true");
            }
            cmd
        };
        let mnt = dir.path().join("mnt");
        fs::create_dir_all(&mnt).unwrap();
        let _guard = UnmountOnDrop(mnt.clone());
        for args in [&["ls", url][..], &["mount", url, mnt.to_str().unwrap()][..]] {
            let out = signed().args(args).output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{args:?} was let in: {stderr}");
            for w in words {
                assert!(stderr.contains(w), "{args:?}: {w:?} in {stderr}");
            }
            assert!(
                !stderr.contains(&rgw.secret) && !stderr.contains("retry"),
                "{stderr}"
            );
        }
    };
    let tail = &rgw.key[rgw.key.len() - 4..];
    refused(
        Some((&rgw.key, "not-the-secret")),
        &[
            "SignatureDoesNotMatch",
            &format!("the secret key is not the one of access key id ...{tail}"),
        ],
    );
    refused(
        Some(("PACKFSNOSUCHKEY01234", &rgw.secret)),
        &[
            "InvalidAccessKeyId",
            "the store knows no access key id ...1234",
        ],
    );
    refused(None, &["AccessDenied", "anonymous requests may not read"]);
}

/// The store's keys rotated under a living mount, as a key service does it: a new key is made,
/// handed out by `credential_process`, and the old one removed. The read that meets the refusal
/// of the old key fetches the new one and is answered; the mount never fails a read.
#[test]
fn keys_rotated_at_the_store_under_a_mount_are_fetched_again() {
    let Some(rgw) = rgw() else { return };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fs::create_dir_all(home.join(".aws")).unwrap();
    let (src, _) = shards_in(rgw, dir.path(), "rotate");
    let creds = dir.path().join("creds.json");
    let hand_out = |id: &str, secret: &str| {
        fs::write(
            &creds,
            format!(r#"{{"Version": 1, "AccessKeyId": "{id}", "SecretAccessKey": "{secret}"}}"#),
        )
        .unwrap();
    };
    let (old, old_secret) = ("PACKFSROTATEOLD00001", "rotate-old-secret-0001");
    let (new, new_secret) = ("PACKFSROTATENEW00002", "rotate-new-secret-0002");
    rgw.key("add", old, old_secret);
    hand_out(old, old_secret);
    let process = dir.path().join("creds.sh");
    fs::write(&process, format!("#!/bin/sh\ncat {}\n", creds.display())).unwrap();
    fs::set_permissions(&process, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(
        home.join(".aws/config"),
        format!("[default]\ncredential_process = {}\n", process.display()),
    )
    .unwrap();
    let mut cmd = pk_rgw(rgw, &rgw.url, &home);
    cmd.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .args(["mount", "--ram-chunks", "false"])
        .arg("s3://rotate/train/shard-000002.tar");
    let m = RemoteMount::new(cmd, &dir.path().join("mnt"));
    let read = |name: &str| {
        assert_eq!(
            fs::read(m.dir.join(name)).unwrap(),
            fs::read(src.join(name)).unwrap(),
            "{name}"
        );
    };
    read("many/00001.txt");
    rgw.key("add", new, new_secret);
    hand_out(new, new_secret);
    rgw.key("rm", old, "");
    // The daemon still holds the old key: this read is refused once, then signed anew.
    read("many/00002.txt");
    read("many/00003.txt");
    let counters = m.wait_for(&rgw.url, &home, |c| {
        c["credentials"]["renewals"].as_u64().unwrap() >= 1
    });
    let c = &counters["credentials"];
    assert!(
        c["from"]
            .as_str()
            .unwrap()
            .starts_with("credential_process")
            && c["failures"] == 0,
        "{c}"
    );
    assert_eq!(counters["remote"][0]["errors"], 0, "{counters}");
}

/// An object replaced in the bucket after it was indexed is refused at mount; one replaced under
/// a mount fails its reads (the store answers If-Match with 412), never serving the new bytes
/// as the old files.
#[test]
fn an_object_replaced_in_the_bucket_is_never_served_as_the_indexed_one() {
    let Some(rgw) = rgw() else { return };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    fs::create_dir_all(&home).unwrap();
    let (_, shards) = shards_in(rgw, dir.path(), "replace");
    let urls = "s3://replace/train/shard-{000000..000002}.tar";
    let index = dir.path().join("t.packfs-index");
    let index_now = || {
        run(pk_rgw(rgw, &rgw.url, &home)
            .args(["index", "-o"])
            .arg(&index)
            .arg(urls));
    };
    // Other bytes of the same size, put again under the same key.
    let replace = |at: usize| {
        let mut bytes = fs::read(&shards[2]).unwrap();
        bytes[at] ^= 0xff;
        let other = dir.path().join("other.tar");
        fs::write(&other, &bytes).unwrap();
        rgw.upload("replace", &[(&other, "train/shard-000002.tar")]);
    };
    index_now();
    let n = fs::metadata(&shards[2]).unwrap().len() as usize;
    replace(n - 2000);
    let mnt = dir.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let _guard = UnmountOnDrop(mnt.clone());
    let out = pk_rgw(rgw, &rgw.url, &home)
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

    index_now();
    let log = dir.path().join("mount.log");
    let mut cmd = pk_rgw(rgw, &rgw.url, &home);
    cmd.args(["mount", "--ram-chunks", "false", "--log-file"])
        .arg(&log)
        .arg(&index);
    let m = RemoteMount::new(cmd, &mnt);
    replace(600);
    let read = fs::read(m.dir.join("many/00003.txt"));
    assert!(read.is_err(), "a replaced object must not be served");
    let logged = fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("was replaced since it was opened (its ETag changed)"),
        "{logged}"
    );
}
