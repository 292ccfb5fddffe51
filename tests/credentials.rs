//! S3 credentials from every source of the AWS CLI's chain, against local stand-ins: the object
//! server plays EC2 instance metadata (IMDSv2), the container endpoint and the SSO portal, and
//! checks that every store request is signed with keys it issued that have not expired; moto
//! plays STS for web identity. A mount lives across several rotations of short-lived keys.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::servers::*;
use common::*;
use serde_json::Value;

/// `packfs` with no AWS configuration but the store's endpoint: every `AWS_*` variable of the
/// test's environment removed, and a `HOME` of its own.
fn bare(endpoint: &str, home: &Path) -> Command {
    let mut cmd = packfs();
    for (name, _) in std::env::vars() {
        if name.starts_with("AWS_") {
            cmd.env_remove(name);
        }
    }
    cmd.env("AWS_REGION", "us-east-1")
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("HOME", home);
    cmd
}

/// Files of `size` bytes each in one shard under `root/bucket/shard.tar`; the files' tree.
fn shard_in(root: &Path, dir: &Path, count: usize, size: usize) -> PathBuf {
    let files: Vec<(String, Vec<u8>)> = (0..count)
        .map(|i| (format!("f/{i:02}.bin"), bytes(i as u64 + 7, size)))
        .collect();
    let (src, tar) = tar_of(dir, "shard", &files);
    fs::create_dir_all(root.join("bucket")).unwrap();
    fs::rename(&tar, root.join("bucket/shard.tar")).unwrap();
    src
}

fn stats(server: &Server) -> Value {
    control(server, "_stats")
}

/// The key ids the store saw, and how many requests each signed.
fn keys_used(server: &Server) -> Vec<(String, u64)> {
    let s = stats(server);
    let mut keys: Vec<(String, u64)> = s["keys"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
        .collect();
    keys.sort();
    keys
}

/// A mount of `s3://bucket/shard.tar` that reads exactly (a GET per read, no chunk cache), so
/// every file read later is a request signed then.
fn mount(mut cmd: Command, mnt: &Path, log: &Path) -> UnmountOnDrop {
    fs::create_dir_all(mnt).unwrap();
    let guard = UnmountOnDrop(mnt.to_path_buf());
    cmd.args(["mount", "--ram-chunks", "false", "--log-file"])
        .arg(log)
        .arg("s3://bucket/shard.tar")
        .arg(mnt);
    assert_ok(&cmd.output().unwrap());
    guard
}

/// EC2 instance metadata hands out keys that last 4 seconds; the store refuses them once expired.
/// A mount reads one file a second for 12 seconds: every read is answered, the keys are renewed
/// before they expire (the store refuses none), and the reads are signed by several of them.
#[test]
fn instance_metadata_keys_are_renewed_before_they_expire_under_a_living_mount() {
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("root"), dir.path().join("home"));
    fs::create_dir_all(&home).unwrap();
    let src = shard_in(&root, dir.path(), 12, 300_000);
    let store = objserver(Some(&root), None);
    control(&store, "_creds?ttl=4&require=1");

    let mut cmd = bare(&store.url, &home);
    cmd.env("AWS_EC2_METADATA_SERVICE_ENDPOINT", &store.url)
        .env("RUST_LOG", "trace");
    let (mnt, log) = (dir.path().join("mnt"), dir.path().join("daemon.log"));
    let _mounted = mount(cmd, &mnt, &log);
    for i in 0..12 {
        let name = format!("f/{i:02}.bin");
        let got = fs::read(mnt.join(&name)).unwrap_or_else(|e| {
            panic!(
                "{name}: {e}\n{}",
                fs::read_to_string(&log).unwrap_or_default()
            )
        });
        assert_eq!(got, fs::read(src.join(&name)).unwrap(), "{name}");
        std::thread::sleep(Duration::from_secs(1));
    }
    let s = stats(&store);
    assert_eq!(s["refused"], 0, "requests with expired keys: {s}");
    let keys = keys_used(&store);
    assert!(
        keys.len() >= 3,
        "12 s of reads with 4 s keys are signed by at least 3 of them: {keys:?}"
    );
    // `status` says where the keys come from and how often they were renewed.
    let status = run(packfs().args(["status", "--json"]).arg(&mnt));
    let status: Value = serde_json::from_str(&status).unwrap();
    let creds = &status[0]["counters"]["credentials"];
    assert!(
        creds["from"]
            .as_str()
            .unwrap()
            .starts_with("EC2 instance metadata")
            && creds["renewals"].as_u64().unwrap() >= 2
            && creds["failures"] == 0
            && creds["expires"].as_str().unwrap().ends_with('Z'),
        "{creds}"
    );
    let text = run(packfs().arg("status").arg(&mnt));
    assert!(text.contains("creds     EC2 instance metadata"), "{text}");
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("S3 credentials from EC2 instance metadata") && text.contains("renewed"),
        "{text}"
    );
    assert!(
        !text.contains("ASIAPACKFS") && !text.contains("tok-"),
        "{text}"
    );
}

/// Keys the store stops taking before their announced expiry (revoked, rotated early) are
/// fetched again, and the read that met the refusal is answered.
#[test]
fn keys_a_store_refuses_before_their_expiry_are_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("root"), dir.path().join("home"));
    fs::create_dir_all(&home).unwrap();
    let src = shard_in(&root, dir.path(), 4, 50_000);
    let store = objserver(Some(&root), None);
    control(&store, "_creds?ttl=3600&require=1");
    let mut cmd = bare(&store.url, &home);
    cmd.env("AWS_EC2_METADATA_SERVICE_ENDPOINT", &store.url);
    let (mnt, log) = (dir.path().join("mnt"), dir.path().join("daemon.log"));
    let _mounted = mount(cmd, &mnt, &log);
    let read = |i: usize| {
        let name = format!("f/{i:02}.bin");
        assert_eq!(
            fs::read(mnt.join(&name)).unwrap(),
            fs::read(src.join(&name)).unwrap()
        );
    };
    read(0);
    control(&store, "_creds?revoke=1");
    read(1);
    let s = stats(&store);
    assert_eq!(s["refused"], 1, "{s}");
    assert_eq!(s["issued"], 2, "{s}");
}

/// moto with the shard of `count` files in `bucket/shard.tar`, behind the object server that
/// checks keys: (moto, the object server, the files' tree), or `None` (after `skip`).
fn moto_behind_objserver(
    dir: &Path,
    count: usize,
    size: usize,
) -> Option<(Server, Server, PathBuf)> {
    let (s3, python) = moto()?;
    let root = dir.join("root");
    let src = shard_in(&root, dir, count, size);
    upload(
        &python,
        &s3.url,
        MOTO_KEYS,
        "bucket",
        &[(&root.join("bucket/shard.tar"), "shard.tar")],
    );
    let store = objserver(None, Some(&s3.url));
    control(&store, "_creds?require=1");
    Some((s3, store, src))
}

/// Web identity (EKS IRSA): the token file and role are exchanged at STS (moto's) for keys that
/// sign every request; the token never reaches a log.
#[test]
fn web_identity_keys_come_from_sts() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_s3, store, src)) = moto_behind_objserver(dir.path(), 6, 40_000) else {
        return;
    };
    let home = dir.path().join("home");
    fs::create_dir_all(&home).unwrap();
    let token_file = dir.path().join("token");
    const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.packfs-web-identity-token.c2lnbmF0dXJl";
    fs::write(&token_file, TOKEN).unwrap();

    let mut cmd = bare(&store.url, &home);
    cmd.env("AWS_WEB_IDENTITY_TOKEN_FILE", &token_file)
        .env(
            "AWS_ROLE_ARN",
            "arn:aws:iam::123456789012:role/packfs-reader",
        )
        .env("RUST_LOG", "trace");
    let (mnt, log) = (dir.path().join("mnt"), dir.path().join("daemon.log"));
    let _mounted = mount(cmd, &mnt, &log);
    assert_same_tree(&src, &mnt, &[]);
    let s = stats(&store);
    assert_eq!(
        s["sts"],
        serde_json::json!(["AssumeRoleWithWebIdentity"]),
        "{s}"
    );
    assert_eq!(s["refused"], 0, "{s}");
    let keys = keys_used(&store);
    assert!(keys.len() == 1 && keys[0].0.starts_with("ASIA"), "{keys:?}");
    let text = fs::read_to_string(&log).unwrap();
    assert!(text.contains("web identity (role arn:aws:iam::123456789012:role/packfs-reader)"));
    assert!(
        !text.contains(TOKEN) && !text.contains(&keys[0].0),
        "{text}"
    );
}

/// A profile that assumes a role with another profile's keys (`role_arn` + `source_profile`):
/// STS AssumeRole (moto's), signed with the source profile's keys, gives the keys that sign the
/// store's requests.
#[test]
fn a_profile_assumes_its_role_with_the_keys_of_its_source_profile() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_s3, store, _)) = moto_behind_objserver(dir.path(), 3, 1000) else {
        return;
    };
    let home = dir.path().join("home");
    fs::create_dir_all(home.join(".aws")).unwrap();
    fs::write(
        home.join(".aws/credentials"),
        "[base]\naws_access_key_id = AKIAPACKFSBASE000001\naws_secret_access_key = base-secret\n",
    )
    .unwrap();
    fs::write(
        home.join(".aws/config"),
        "[profile ml]\nrole_arn = arn:aws:iam::123456789012:role/ml-reader\n\
         source_profile = base\nrole_session_name = job-42\n",
    )
    .unwrap();
    let out = bare(&store.url, &home)
        .env("AWS_PROFILE", "ml")
        .args(["ls", "s3://bucket/shard.tar"])
        .output()
        .unwrap();
    assert_ok(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("f/02.bin"));
    let s = stats(&store);
    assert_eq!(s["sts"], serde_json::json!(["AssumeRole"]), "{s}");
    assert_eq!(
        s["sts_signers"],
        serde_json::json!(["AKIAPACKFSBASE000001"]),
        "{s}"
    );
    assert_eq!(s["refused"], 0, "{s}");
    let keys = keys_used(&store);
    assert!(
        keys.len() == 1 && keys[0].0.starts_with("ASIA"),
        "the store saw only the assumed role's key: {keys:?}"
    );
}

/// `packfs ls` of the shard with `env` set: its output.
fn ls(store: &Server, home: &Path, env: &[(&str, &Path)]) -> std::process::Output {
    let mut cmd = bare(&store.url, home);
    cmd.env("AWS_EC2_METADATA_DISABLED", "true");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(["ls", "s3://bucket/shard.tar"]).output().unwrap()
}

/// The container endpoint, an SSO login and `credential_process` each sign requests with keys
/// the store issued; a wrong token, an expired SSO login and a failing process are refused with a
/// message that names the source and what to do.
#[test]
fn container_sso_and_process_credentials_sign_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (root, home) = (dir.path().join("root"), dir.path().join("home"));
    fs::create_dir_all(home.join(".aws/sso/cache")).unwrap();
    shard_in(&root, dir.path(), 3, 1000);
    let store = objserver(Some(&root), None);
    control(&store, "_creds?require=1&bearer=bearer-42");
    let listed = |out: &std::process::Output| {
        assert_ok(out);
        assert!(String::from_utf8_lossy(&out.stdout).contains("f/02.bin"));
    };
    let refused = |out: &std::process::Output, words: &[&str]| {
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        for w in words {
            assert!(stderr.contains(w), "{w:?} in {stderr}");
        }
        assert!(!stderr.contains("bearer-42"), "{stderr}");
    };

    // The container endpoint, with the token in a file.
    let token = dir.path().join("container-token");
    fs::write(&token, "bearer-42\n").unwrap();
    let container_url = PathBuf::from(format!("{}/_container", store.url));
    let container = [
        (
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            container_url.as_path(),
        ),
        ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", token.as_path()),
    ];
    listed(&ls(&store, &home, &container));
    fs::write(&token, "wrong").unwrap();
    refused(
        &ls(&store, &home, &container),
        &["the container credentials endpoint", "status 403"],
    );

    // SSO: an `[sso-session]` profile and the token cache `aws sso login` writes.
    let config = home.join(".aws/config");
    fs::write(
        &config,
        "[profile lab]\nsso_session = corp\nsso_account_id = 111122223333\n\
         sso_role_name = ML\n\n[sso-session corp]\nsso_region = us-east-1\n\
         sso_start_url = https://corp.awsapps.com/start\n",
    )
    .unwrap();
    // sha1("corp")
    let cache = home.join(".aws/sso/cache/ee0bfd2552fbd840c02cc48b6e823320543c450f.json");
    let profile = PathBuf::from("lab");
    let sso = [("AWS_PROFILE", profile.as_path())];
    fs::write(
        &cache,
        r#"{"accessToken": "bearer-42", "expiresAt": "2099-01-01T00:00:00Z"}"#,
    )
    .unwrap();
    listed(&ls(&store, &home, &sso));
    fs::write(
        &cache,
        r#"{"accessToken": "bearer-42", "expiresAt": "2020-01-01T00:00:00UTC"}"#,
    )
    .unwrap();
    refused(
        &ls(&store, &home, &sso),
        &["SSO (profile lab)", "aws sso login --profile lab"],
    );

    // credential_process: a program that fetches keys and prints them as the AWS CLI expects.
    let program = dir.path().join("creds.py");
    fs::write(
        &program,
        format!(
            "import json, sys, urllib.request\n\
             req = urllib.request.Request('{}/_container', headers={{'Authorization': sys.argv[1]}})\n\
             c = json.load(urllib.request.urlopen(req))\n\
             print(json.dumps({{'Version': 1, 'AccessKeyId': c['AccessKeyId'],\n\
                 'SecretAccessKey': c['SecretAccessKey'], 'SessionToken': c['Token'],\n\
                 'Expiration': c['Expiration']}}))\n",
            store.url
        ),
    )
    .unwrap();
    let with_process = |arg: &str| {
        format!(
            "[profile lab]\ncredential_process = python3 \"{}\" {arg}\n",
            program.display()
        )
    };
    fs::write(&config, with_process("bearer-42")).unwrap();
    listed(&ls(&store, &home, &sso));
    fs::write(&config, with_process("wrong")).unwrap();
    refused(
        &ls(&store, &home, &sso),
        &["credential_process (profile lab)", "failed"],
    );
    let s = stats(&store);
    assert_eq!(s["refused"], 0, "no request went out unsigned: {s}");
}
