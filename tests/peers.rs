//! Nodes of one job reading each other's staged shares (`--peers`), here as mounts on one
//! machine, each with its own share, stage and port: after staging, a read of another share
//! comes from the node that staged it, checked, with no byte from the source; a node of another
//! job (another secret) is refused and reads the source; a killed node and a node serving
//! damaged bytes cost fallbacks to the source, never a wrong byte or an error.
//! (The 4-node run in network namespaces is bench/peers.py.)

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// Two shards per share of two: 4 tars of about 1 MiB of incompressible files each.
fn images(dir: &Path) -> (Vec<PathBuf>, Vec<(String, Vec<u8>)>) {
    let mut images = Vec::new();
    let mut files = Vec::new();
    for s in 0..4 {
        let mut members = Vec::new();
        for n in 0..12 {
            let name = format!("s{s}/f{n:02}.bin");
            let data = bytes((s * 100 + n) as u64, 40_000 + (n * 7_919) % 90_000);
            members.push((name.clone(), data.clone()));
            files.push((name, data));
        }
        images.push(
            tar_of(
                &dir.join(format!("src{s}")),
                &format!("shard-{s}"),
                &members,
            )
            .1,
        );
    }
    (images, files)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn secret(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, text).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    path
}

struct Node {
    mount: Mount,
    stats: PathBuf,
}

fn node(
    dir: &Path,
    name: &str,
    images: &[PathBuf],
    share: &str,
    peers: &str,
    secret: &Path,
) -> Node {
    let stats = dir.join(format!("{name}.json"));
    let stage = dir.join(format!("stage-{name}"));
    let args = [
        "--stage",
        stage.to_str().unwrap(),
        "--stage-share",
        share,
        "--chunk-size",
        "64K",
        "--peers",
        peers,
        "--peer-secret",
        secret.to_str().unwrap(),
        "--stats-file",
        stats.to_str().unwrap(),
    ];
    let refs: Vec<&Path> = images.iter().map(|p| p.as_path()).collect();
    let mount = Mount::new(&refs, &dir.join(name), &args);
    Node { mount, stats }
}

fn counters(node: &Node) -> serde_json::Value {
    serde_json::from_str(&fs::read_to_string(&node.stats).unwrap()).unwrap()
}

fn staged(node: &Node) {
    let start = Instant::now();
    loop {
        let c = counters(node);
        if c["stage"]["state"] == "complete" {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "not staged: {c}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads every file through `node` and compares it with what was packed.
fn read_all(node: &Node, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        let got = fs::read(node.mount.dir.join(name)).unwrap();
        assert!(got == *data, "{name} differs");
    }
}

/// The counters once the daemon has rewritten them (every second).
fn fresh(node: &Node) -> serde_json::Value {
    let before = counters(node)["uptime_s"].as_f64().unwrap();
    let start = Instant::now();
    loop {
        let c = counters(node);
        if c["uptime_s"].as_f64().unwrap() > before + 1.0 || start.elapsed().as_secs() > 5 {
            return c;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_node_reads_the_other_share_from_its_peer_and_falls_back_on_any_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (images, files) = images(dir.path());
    let total: u64 = images.iter().map(|p| fs::metadata(p).unwrap().len()).sum();
    let job = secret(dir.path(), "job", "a-secret-of-this-job-only\n");
    let (pa, pb) = (free_port(), free_port());
    let peers = format!("127.0.0.1:{pa},127.0.0.1:{pb}");
    let a = node(dir.path(), "a", &images, "0/2", &peers, &job);
    let b = node(dir.path(), "b", &images, "1/2", &peers, &job);
    staged(&a);
    staged(&b);

    // A global epoch on node a: its own share from its stage, the other from node b.
    read_all(&a, &files);
    let c = fresh(&a);
    // The images' reads count what the peers gave too: the rest came from the source.
    let fetched = c["peers"]["fetched_bytes"].as_u64().unwrap();
    let source = c["source"]["bytes"].as_u64().unwrap() - fetched;
    assert!(source <= total / 100, "{source} bytes from the source: {c}");
    assert!(fetched > total / 3, "{c}");
    eprintln!(
        "epoch on a: {source} bytes from the source, {fetched} from b, of {total}: {}",
        c["peers"]
    );
    assert_eq!(c["peers"]["fallbacks"]["mismatch"], 0, "{c}");
    assert_eq!(c["peers"]["source_bytes"], 0, "{c}");
    let text = run(packfs().arg("status").arg(&a.mount.dir));
    assert!(
        text.contains("fell back: never") && text.contains("    node 1: 32 requests"),
        "{text}"
    );
    assert!(fresh(&b)["peers"]["served_chunks"].as_u64().unwrap() > 0);

    // A node of another job (another secret) is refused, and reads the source: right bytes.
    let other = secret(dir.path(), "other", "another-job-entirely-here\n");
    let pc = free_port();
    let c_node = node(
        dir.path(),
        "c",
        &images,
        "0/2",
        &format!("127.0.0.1:{pc},127.0.0.1:{pb}"),
        &other,
    );
    read_all(&c_node, &files);
    let c = fresh(&c_node);
    assert!(
        c["peers"]["fallbacks"]["refused"].as_u64().unwrap() > 0,
        "{c}"
    );
    assert_eq!(c["peers"]["fetched_bytes"], 0, "{c}");
    assert!(fresh(&b)["peers"]["refused"].as_u64().unwrap() > 0);
    drop(c_node);

    // Node b serving damaged bytes (its disk changed after its check): caught on node a,
    // counted, and read from the source instead.
    let damaged = fs::read_dir(dir.path().join("stage-b"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .unwrap();
    let mut bytes_now = fs::read(&damaged).unwrap();
    for b in bytes_now.iter_mut().step_by(4096) {
        *b ^= 0xff;
    }
    fs::write(&damaged, &bytes_now).unwrap();
    drop(a);
    let a = node(dir.path(), "a", &images, "0/2", &peers, &job);
    read_all(&a, &files);
    let c = fresh(&a);
    assert!(
        c["peers"]["fallbacks"]["mismatch"].as_u64().unwrap() > 0,
        "{c}"
    );

    // Node b gone: its share comes from the source, no error reaches the reader.
    drop(b);
    drop(a);
    let a = node(dir.path(), "a", &images, "0/2", &peers, &job);
    read_all(&a, &files);
    let c = fresh(&a);
    assert!(
        c["peers"]["fallbacks"]["unreachable"].as_u64().unwrap() > 0,
        "{c}"
    );
    assert!(
        c["peers"]["source_bytes"].as_u64().unwrap() > total / 3,
        "{c}"
    );
    assert_eq!(c["errors"], 0, "{c}");
}
