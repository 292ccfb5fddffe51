//! Nodes of one job reading each other's staged shares (`--peers`), here as mounts on one
//! machine, each with its own share, stage and port: after staging, a read of another share
//! comes from the node that staged it, checked, with no byte from the source; a node of another
//! job (another secret) is refused and reads the source; a killed node and a node serving
//! damaged bytes cost fallbacks to the source, never a wrong byte or an error; a node still
//! staging gives only chunks it holds and checked; hints fetch ahead from the peers. Four nodes
//! in network namespaces read a global epoch from each other, one of them killed half way.
//! (The 4-node benchmark on a simulated parallel file system is bench/nodes.py.)

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

/// `shards` tars of `per_shard` incompressible files from `smallest` bytes up.
fn shards(
    dir: &Path,
    shards: usize,
    per_shard: usize,
    smallest: usize,
) -> (Vec<PathBuf>, Vec<(String, Vec<u8>)>) {
    let mut images = Vec::new();
    let mut files = Vec::new();
    for s in 0..shards {
        let mut members = Vec::new();
        for n in 0..per_shard {
            let name = format!("s{s}/f{n:02}.bin");
            let data = bytes((s * 100 + n) as u64, smallest + (n * 7_919) % 90_000);
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

/// Two shards per share of two: 4 tars of about 1 MiB of incompressible files each.
fn images(dir: &Path) -> (Vec<PathBuf>, Vec<(String, Vec<u8>)>) {
    shards(dir, 4, 12, 40_000)
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
    node_with(dir, name, images, share, peers, secret, &[])
}

fn node_with(
    dir: &Path,
    name: &str,
    images: &[PathBuf],
    share: &str,
    peers: &str,
    secret: &Path,
    extra: &[&str],
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
    let args: Vec<&str> = args.iter().chain(extra).copied().collect();
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

    // A global epoch on node a, shuffled: its own share from its stage, the other from b.
    let mut shuffled = files.clone();
    shuffled.sort_by_key(|(name, _)| xxhash_rust::xxh3::xxh3_64(name.as_bytes()));
    read_all(&a, &shuffled);
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
        text.contains("fell back: never") && text.contains("    node 1: "),
        "{text}"
    );
    // The files' bytes crossed, not the whole chunks around them.
    let theirs: u64 = files
        .iter()
        .filter(|(name, _)| name.starts_with("s1/") || name.starts_with("s3/"))
        .map(|(_, d)| d.len() as u64)
        .sum();
    assert!(
        fetched <= theirs + 64 * 1024,
        "{fetched} bytes for {theirs}: {c}"
    );
    assert!(fresh(&b)["peers"]["served_chunks"].as_u64().unwrap() > 0);

    // Another user, without the job's secret (a file only its owner reads): an unsigned
    // request is refused, and says why.
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", pb)).unwrap();
    std::io::Write::write_all(
        &mut plain,
        b"GET /v1/any/0/0 HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut plain, &mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 401") && answer.contains("x-packfs-why: unsigned"),
        "{answer}"
    );

    // A client that never finishes its request is dropped after 5 s, not held.
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", pb)).unwrap();
    std::io::Write::write_all(&mut slow, b"GET /v1/any/0/0 HTTP/1.1\r\nHost: b\r\n").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let started = Instant::now();
    let mut rest = Vec::new();
    let closed = std::io::Read::read_to_end(&mut slow, &mut rest);
    assert!(
        closed.is_ok() && started.elapsed() < Duration::from_secs(15),
        "{closed:?} after {:?}",
        started.elapsed()
    );

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

    // Node b's disk changed after its check (it then trusts the chunks, as its own reads do).
    // A whole chunk goes with the source's record: node a, reading in whole chunks, catches the
    // damage end to end, counts it, and reads the source instead.
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
    let whole = ["--ram-chunks", "true"];
    let a = node_with(dir.path(), "a", &images, "0/2", &peers, &job, &whole);
    read_all(&a, &shuffled);
    let c = fresh(&a);
    assert!(
        c["peers"]["fallbacks"]["mismatch"].as_u64().unwrap() > 0,
        "{c}"
    );
    assert_eq!(c["errors"], 0, "{c}");

    // Node b started again over its damaged stage: a chunk is checked whole before it is first
    // sent, so b finds the damage itself, says so (and stages the chunk again); node a counts a
    // mismatch and reads the source. Ranges of samples, every byte right.
    drop(a);
    drop(b);
    let b = node(dir.path(), "b", &images, "1/2", &peers, &job);
    let a = node(dir.path(), "a", &images, "0/2", &peers, &job);
    read_all(&a, &shuffled);
    let c = fresh(&a);
    assert!(
        c["peers"]["fallbacks"]["mismatch"].as_u64().unwrap() > 0,
        "{c}"
    );
    let from_b = fresh(&b);
    assert!(from_b["peers"]["damaged"].as_u64().unwrap() > 0, "{from_b}");
    assert_eq!(c["errors"], 0, "{c}");

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

/// Nodes a (share 0/2) and b (1/2, with `b_extra`) of one job on this machine, and the files.
fn two_nodes(dir: &Path, b_extra: &[&str]) -> (Vec<(String, Vec<u8>)>, Node, Node) {
    let (images, files) = images(dir);
    let job = secret(dir, "job", "a-secret-of-this-job-only\n");
    let (pa, pb) = (free_port(), free_port());
    let peers = format!("127.0.0.1:{pa},127.0.0.1:{pb}");
    let a = node(dir, "a", &images, "0/2", &peers, &job);
    let b = node_with(dir, "b", &images, "1/2", &peers, &job, b_extra);
    (files, a, b)
}

/// A node still staging answers only the chunks it holds and has checked: the others are "not
/// staged", read from the source by the asking node, and every byte is right.
#[test]
fn a_node_still_staging_gives_only_what_it_has_checked() {
    let dir = tempfile::tempdir().unwrap();
    // About 2 MiB to stage at 128 KiB/s: b stages for 15 s.
    let (files, a, b) = two_nodes(dir.path(), &["--stage-rate", "128K"]);
    staged(&a);
    let start = Instant::now();
    while counters(&b)["stage"]["present_bytes"].as_u64().unwrap_or(0) == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{}",
            counters(&b)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    read_all(&a, &files);
    let c = fresh(&a);
    let from_b = fresh(&b);
    assert_ne!(
        from_b["stage"]["state"], "complete",
        "staged too fast: {from_b}"
    );
    assert!(
        c["peers"]["fallbacks"]["not_staged"].as_u64().unwrap() > 0,
        "{c}"
    );
    assert!(
        from_b["peers"]["not_staged"].as_u64().unwrap() > 0,
        "{from_b}"
    );
    // What b had staged it gave (checked on the way out), the rest a read from the source.
    assert!(c["peers"]["fetched_bytes"].as_u64().unwrap() > 0, "{c}");
    assert!(c["peers"]["source_bytes"].as_u64().unwrap() > 0, "{c}");
    assert_eq!(c["peers"]["fallbacks"]["mismatch"], 0, "{c}");
    assert_eq!(c["errors"], 0, "{c}");
}

/// Hints reach across the peer tier: the order of an epoch of the other share, sent to node a
/// before any read, is fetched ahead from node b (checked), and the epoch then reads nothing
/// from the source.
#[test]
fn hints_fetch_the_other_share_ahead_from_its_peer() {
    let dir = tempfile::tempdir().unwrap();
    let (files, a, b) = two_nodes(dir.path(), &[]);
    staged(&a);
    staged(&b);
    // Share 1 holds images 1 and 3 (i mod 2): shards s1 and s3, in a shuffled order.
    let mut theirs: Vec<&(String, Vec<u8>)> = files
        .iter()
        .filter(|(name, _)| name.starts_with("s1/") || name.starts_with("s3/"))
        .collect();
    theirs.sort_by_key(|(name, _)| xxhash_rust::xxh3::xxh3_64(name.as_bytes()));
    let paths: Vec<&str> = theirs.iter().map(|(name, _)| name.as_str()).collect();
    let socket = counters(&a)["hints"].as_str().unwrap().to_string();
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let mut line = serde_json::to_vec(
        &serde_json::json!({"stream": "train", "rank": 0, "epoch": 1, "paths": paths}),
    )
    .unwrap();
    line.push(b'\n');
    std::io::Write::write_all(&mut stream, &line).unwrap();
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stream), &mut answer).unwrap();
    assert!(answer.contains("\"ok\":true"), "{answer}");
    // Fetched ahead from b before anything is read.
    let share_bytes: u64 = theirs.iter().map(|(_, d)| d.len() as u64).sum();
    let start = Instant::now();
    let ahead = loop {
        let c = counters(&a);
        let got = c["peers"]["fetched_bytes"].as_u64().unwrap();
        if got >= share_bytes || start.elapsed() > Duration::from_secs(15) {
            break c;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        ahead["peers"]["fetched_bytes"].as_u64().unwrap() >= share_bytes,
        "fetched ahead from b: {ahead}"
    );
    for (name, data) in &theirs {
        assert!(fs::read(a.mount.dir.join(name)).unwrap() == *data, "{name}");
    }
    let c = fresh(&a);
    assert_eq!(c["peers"]["source_bytes"], 0, "{c}");
    assert_eq!(c["peers"]["fallbacks"]["mismatch"], 0, "{c}");
    assert!(c["lookahead"]["fetched"].as_u64().unwrap() > 0, "{c}");
    drop(b);
}

/// Four "nodes" in network namespaces of their own (each daemon started with `nsenter --net`,
/// its mount in the host's table), joined by a bridge in a fifth: a global-shuffle epoch on
/// node 0 once every node has staged its share reads under 1% of the dataset from the source.
struct Net {
    id: u32,
}

impl Net {
    fn up(id: u32) -> Net {
        let net = Net { id };
        net.down();
        let sw = net.switch();
        let mut script = format!(
            "set -e; ip netns add {sw}; ip -n {sw} link add br0 type bridge; ip -n {sw} link set br0 up\n"
        );
        for k in 0..4 {
            let (node, a, b) = (net.node(k), format!("pp{id}n{k}"), format!("pp{id}s{k}"));
            script += &format!(
                "ip netns add {node}; ip link add {a} type veth peer name {b}\n\
                 ip link set {a} netns {node}; ip link set {b} netns {sw}\n\
                 ip -n {sw} link set {b} master br0; ip -n {sw} link set {b} up\n\
                 ip -n {node} addr add {} /24 dev {a}; ip -n {node} link set {a} up\n\
                 ip -n {node} link set lo up\n",
                net.addr(k)
            )
            .replace(" /24", "/24");
        }
        run(std::process::Command::new("bash").arg("-c").arg(script));
        net
    }

    fn switch(&self) -> String {
        format!("pfsp{}sw", self.id)
    }

    fn node(&self, k: u32) -> String {
        format!("pfsp{}n{k}", self.id)
    }

    fn addr(&self, k: u32) -> String {
        format!("10.77.{}.{}", self.id, k + 1)
    }

    fn down(&self) {
        for ns in (0..4).map(|k| self.node(k)).chain([self.switch()]) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &ns])
                .status();
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.down();
    }
}

#[test]
fn four_nodes_in_network_namespaces_read_a_global_epoch_from_each_other() {
    let dir = tempfile::tempdir().unwrap();
    // Eight shards, two per node.
    let (images, files) = shards(dir.path(), 8, 8, 60_000);
    let total: u64 = images.iter().map(|p| fs::metadata(p).unwrap().len()).sum();
    let job = secret(dir.path(), "job", "the-four-node-job-secret\n");
    let net = Net::up(std::process::id() % 200 + 20);
    let peers: Vec<String> = (0..4).map(|k| format!("{}:7797", net.addr(k))).collect();
    let peers = peers.join(",");
    let mut nodes = Vec::new();
    for k in 0..4u32 {
        let mnt = dir.path().join(format!("node{k}"));
        fs::create_dir(&mnt).unwrap();
        let stats = dir.path().join(format!("node{k}.json"));
        let stage = dir.path().join(format!("stage{k}"));
        let out = std::process::Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", net.node(k)))
            .arg(env!("CARGO_BIN_EXE_packfs"))
            .arg("mount")
            .args(["--stage", stage.to_str().unwrap(), "--chunk-size", "64K"])
            .args(["--stage-share", &format!("{k}/4"), "--peers", &peers])
            .args(["--peer-secret", job.to_str().unwrap()])
            .args(["--stats-file", stats.to_str().unwrap()])
            .args(&images)
            .arg(&mnt)
            .output()
            .unwrap();
        assert_ok(&out);
        nodes.push((UnmountOnDrop(mnt), stats));
    }
    let counters = |k: usize| -> serde_json::Value {
        serde_json::from_str(&fs::read_to_string(&nodes[k].1).unwrap()).unwrap()
    };
    let start = Instant::now();
    while (0..4).any(|k| counters(k)["stage"]["state"] != "complete") {
        assert!(start.elapsed() < Duration::from_secs(60), "{}", counters(0));
        std::thread::sleep(Duration::from_millis(100));
    }
    // The first half of a global epoch on node 0 (shards 0-3, one of each node's share).
    let half = files.len() / 2;
    let read = |part: &[(String, Vec<u8>)]| {
        for (name, data) in part {
            assert!(
                fs::read(nodes[0].0.0.join(name)).unwrap() == *data,
                "{name}"
            );
        }
    };
    read(&files[..half]);
    std::thread::sleep(Duration::from_millis(1200));
    let c = counters(0);
    let fetched = c["peers"]["fetched_bytes"].as_u64().unwrap();
    let source = c["source"]["bytes"].as_u64().unwrap() - fetched;
    let first: u64 = images[..4]
        .iter()
        .map(|p| fs::metadata(p).unwrap().len())
        .sum();
    eprintln!(
        "4 nodes: node 0 read {fetched} bytes from its peers, {source} from the source, of {first}"
    );
    assert!(source <= first / 100, "{c}");
    assert!(fetched >= first / 2, "{c}");
    for k in 1..4 {
        assert!(counters(k)["peers"]["served_chunks"].as_u64().unwrap() > 0);
    }
    // Node 3 killed half way: the rest of its share (shard 7) comes from the source, every
    // byte right, no error; nothing else changes.
    let pid = counters(3)["pid"].as_i64().unwrap() as i32;
    unsafe { libc::kill(pid, libc::SIGKILL) };
    read(&files[half..]);
    std::thread::sleep(Duration::from_millis(1200));
    let c = counters(0);
    let fetched = c["peers"]["fetched_bytes"].as_u64().unwrap();
    let source = c["source"]["bytes"].as_u64().unwrap() - fetched;
    let shard7 = fs::metadata(&images[7]).unwrap().len();
    eprintln!("node 3 killed: node 0 then read {source} bytes from the source (shard 7: {shard7})");
    assert!(source <= shard7 + total / 100, "{c}");
    assert!(fetched >= total / 2, "{c}");
    assert!(
        c["peers"]["fallbacks"]["unreachable"].as_u64().unwrap() > 0,
        "{c}"
    );
    assert_eq!(c["errors"], 0, "{c}");
    for (mnt, _) in &nodes {
        assert_ok(&packfs().arg("umount").arg(&mnt.0).output().unwrap());
    }
}
