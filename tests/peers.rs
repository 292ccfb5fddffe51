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
    let (mut args, stats) = node_args(dir, name, share, peers, secret);
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let refs: Vec<&Path> = images.iter().map(|p| p.as_path()).collect();
    let mount = Mount::new(&refs, &dir.join(name), &args);
    Node { mount, stats }
}

/// A node's mount options: its stage, share, the job's nodes and secret, its stats file.
fn node_args(
    dir: &Path,
    name: &str,
    share: &str,
    peers: &str,
    secret: &Path,
) -> (Vec<String>, PathBuf) {
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
    (args.iter().map(|a| a.to_string()).collect(), stats)
}

/// A node whose daemon has `env` in its environment.
fn node_env(
    dir: &Path,
    name: &str,
    images: &[PathBuf],
    share: &str,
    peers: &str,
    secret: &Path,
    env: &[(&str, &str)],
) -> Node {
    let (args, stats) = node_args(dir, name, share, peers, secret);
    let mnt = dir.join(name);
    fs::create_dir_all(&mnt).unwrap();
    let pid_file = mnt.with_extension("pid");
    let out = packfs()
        .envs(env.iter().copied())
        .arg("mount")
        .args(&args)
        .arg("--pid-file")
        .arg(&pid_file)
        .args(images)
        .arg(&mnt)
        .output()
        .unwrap();
    assert_ok(&out);
    let mount = Mount {
        dir: mnt,
        pid: read_pid(&pid_file),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
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
    damage_stage(&dir.path().join("stage-b"));
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

/// A node of the job whose staged copy changed after its own check serves wrong ranges. Files
/// with a CRC-32 in the index (here `packfs index --checksums`) catch them: the asking node stops
/// asking that node, reads its share from the source, and every byte is right with no error
/// (the reads failed with EIO, where docs/semantics.md promised the source).
#[test]
fn a_peer_whose_bytes_fail_the_index_checksums_costs_source_reads_not_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (images, files) = images(dir.path());
    let index = dir.path().join("data.packfs-index");
    run(packfs()
        .args(["index", "--checksums", "-q", "-o"])
        .arg(&index)
        .args(&images));
    let job = secret(dir.path(), "job", "a-secret-of-this-job-only\n");
    let (pa, pb) = (free_port(), free_port());
    let peers = format!("127.0.0.1:{pa},127.0.0.1:{pb}");
    let indexed = [index.clone()];
    let a = node(dir.path(), "a", &indexed, "0/2", &peers, &job);
    let b = node(dir.path(), "b", &indexed, "1/2", &peers, &job);
    staged(&a);
    staged(&b);
    // Every chunk of b's read back once (b checks each on its first read back), then b's disk
    // changes under it: b trusts what it checked, and sends the changed bytes.
    read_all(&a, &files);
    damage_stage(&dir.path().join("stage-b"));
    drop(a);
    let a = node(dir.path(), "a", &indexed, "0/2", &peers, &job);
    read_all(&a, &files);
    let c = fresh(&a);
    eprintln!("a lying peer: {}", c["peers"]);
    assert_eq!(c["errors"], 0, "{c}");
    assert!(
        c["peers"]["fallbacks"]["mismatch"].as_u64().unwrap() >= 1,
        "{c}"
    );
    assert!(c["peers"]["source_bytes"].as_u64().unwrap() > 0, "{c}");
    drop(b);
}

/// Changes a node's staged copy under it: a byte in every 4 KiB of its first image's data.
fn damage_stage(stage: &Path) {
    let damaged = fs::read_dir(stage)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .unwrap();
    let mut bytes_now = fs::read(&damaged).unwrap();
    for byte in bytes_now.iter_mut().step_by(4096) {
        *byte ^= 0xff;
    }
    fs::write(&damaged, &bytes_now).unwrap();
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

/// A relay in front of a node's port that keeps every byte crossing it: each connection's
/// requests apart, all answers together.
struct Tap {
    port: u16,
    requests: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    answers: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

fn tap(to: u16) -> Tap {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let answers: Arc<Mutex<Vec<u8>>> = Arc::default();
    let (reqs, ans) = (requests.clone(), answers.clone());
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let Ok(mut server) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                continue;
            };
            let at = {
                let mut r = reqs.lock().unwrap();
                r.push(Vec::new());
                r.len() - 1
            };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let reqs = reqs.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 << 10];
                while let Ok(n) = client.read(&mut buf) {
                    if n == 0 || server.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    reqs.lock().unwrap()[at].extend_from_slice(&buf[..n]);
                }
                let _ = server.shutdown(std::net::Shutdown::Write);
            });
            let ans = ans.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 64 << 10];
                while let Ok(n) = s2.read(&mut buf) {
                    if n == 0 || c2.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    ans.lock().unwrap().extend_from_slice(&buf[..n]);
                }
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    Tap {
        port,
        requests,
        answers,
    }
}

/// One request on a fresh connection to `port`; the answer's head (status line and headers).
fn ask_once(port: u16, request: &[u8]) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether any 32 bytes from the middle of any of `files` occur in `seen`.
fn shows_any(seen: &[u8], files: &[&(String, Vec<u8>)]) -> Option<String> {
    let needles: std::collections::HashMap<[u8; 32], &str> = files
        .iter()
        .map(|(name, data)| {
            let mid = data.len() / 2;
            (data[mid..mid + 32].try_into().unwrap(), name.as_str())
        })
        .collect();
    seen.windows(32)
        .find_map(|w| needles.get(w).map(|name| name.to_string()))
}

/// Listens where a proxy would, and counts who comes.
fn proxy_trap() -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let came = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = came.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(conn);
        }
    });
    (port, came)
}

/// Everything an attacker on the node or the network can do without the job's secret gets
/// nothing readable and denies nothing: node a's daemon has proxies in its environment (never
/// used); a tap between a and b keeps every byte of an epoch, in which no file's bytes show;
/// every captured request sent again, to b or to a, is refused; and meanwhile a stranger on
/// a's own address opens 600 connections and sends a stream of unsigned and stale requests to
/// b, which leaves a's reads of b's share all from b and b's log without a line per request.
#[test]
fn a_stranger_on_the_node_or_the_wire_reads_nothing_and_denies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (images, files) = images(dir.path());
    let job = secret(dir.path(), "job", "a-secret-of-this-job-only\n");
    let (pa, pb) = (free_port(), free_port());
    let wire = tap(pb);
    // Both nodes name b at the tap: what a sends b goes through it.
    let peers = format!("127.0.0.1:{pa},127.0.0.1:{}", wire.port);
    let b_log = dir.path().join("b.log");
    let b_listen = format!("127.0.0.1:{pb}");
    let b = node_with(
        dir.path(),
        "b",
        &images,
        "1/2",
        &peers,
        &job,
        &[
            "--peer-listen",
            &b_listen,
            "--log-file",
            b_log.to_str().unwrap(),
        ],
    );
    let (proxy_port, proxied) = proxy_trap();
    let proxy = format!("http://127.0.0.1:{proxy_port}");
    let a = node_env(
        dir.path(),
        "a",
        &images,
        "0/2",
        &peers,
        &job,
        &[
            ("http_proxy", &proxy),
            ("HTTP_PROXY", &proxy),
            ("https_proxy", &proxy),
            ("ALL_PROXY", &proxy),
            ("all_proxy", &proxy),
        ],
    );
    staged(&a);
    staged(&b);

    // The stranger, from a's own address: 600 connections that never finish a request, and
    // requests that are not signed, or stale and signed with something else.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let held = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            for _ in 0..600 {
                if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", pb)) {
                    let _ = std::io::Write::write_all(&mut s, b"GET /v2/x/0/0 HTTP/1.1\r\n");
                    open.push(s);
                }
            }
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            open.len()
        })
    };
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // Each answered with its refusal, or closed unanswered to make room for newer
            // connections (the stranger's own 600 among them).
            let (mut unsigned, mut stale) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let head = ask_once(pb, b"GET /v2/x/0/0 HTTP/1.1\r\nHost: b\r\n\r\n");
                assert!(
                    head.is_empty() || head.contains("x-packfs-why: unsigned"),
                    "{head}"
                );
                unsigned += !head.is_empty() as u64;
                let old = now_secs() - 3600;
                let forged = format!(
                    "GET /v2/x/0/0 HTTP/1.1\r\nHost: 127.0.0.1:{pb}\r\nx-packfs-time: {old}\r\n\
                     x-packfs-nonce: {}\r\nx-packfs-signature: {}\r\n\r\n",
                    "ab".repeat(16),
                    "cd".repeat(32)
                );
                let head = ask_once(pb, forged.as_bytes());
                assert!(
                    head.is_empty() || head.contains("x-packfs-why: signature"),
                    "{head}"
                );
                stale += !head.is_empty() as u64;
            }
            (unsigned, stale)
        })
    };
    std::thread::sleep(Duration::from_millis(500));

    // A global epoch on node a, shuffled, while the stranger floods b.
    let mut shuffled = files.clone();
    shuffled.sort_by_key(|(name, _)| xxhash_rust::xxh3::xxh3_64(name.as_bytes()));
    read_all(&a, &shuffled);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (unsigned, stale) = flood.join().unwrap();
    let opened = held.join().unwrap();
    let c = fresh(&a);
    eprintln!(
        "under a flood of {opened} connections, {unsigned} unsigned and {stale} stale requests: \
         node a {}",
        c["peers"]
    );
    assert!(opened >= 550 && unsigned > 20, "{opened} {unsigned}");
    assert_eq!(c["peers"]["source_bytes"], 0, "{c}");
    assert_eq!(c["errors"], 0, "{c}");
    assert_eq!(proxied.load(std::sync::atomic::Ordering::SeqCst), 0);

    // What crossed the wire: b's share's bytes, all sealed.
    let theirs: Vec<&(String, Vec<u8>)> = files
        .iter()
        .filter(|(name, _)| name.starts_with("s1/") || name.starts_with("s3/"))
        .collect();
    let share: usize = theirs.iter().map(|(_, d)| d.len()).sum();
    let seen = wire.answers.lock().unwrap().clone();
    assert!(seen.len() >= share, "{} bytes seen of {share}", seen.len());
    assert_eq!(
        shows_any(&seen, &theirs),
        None,
        "a file's bytes crossed in clear"
    );

    // Every captured request sent again: to b, refused as a replay; to a, as another node's.
    let captured: Vec<Vec<u8>> = wire
        .requests
        .lock()
        .unwrap()
        .iter()
        .flat_map(|conn| {
            String::from_utf8_lossy(conn)
                .split_inclusive("\r\n\r\n")
                .filter(|r| r.ends_with("\r\n\r\n"))
                .map(|r| r.as_bytes().to_vec())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        captured.len() >= theirs.len(),
        "{} requests",
        captured.len()
    );
    for request in &captured {
        let head = ask_once(pb, request);
        assert!(
            head.starts_with("HTTP/1.1 403") && head.contains("x-packfs-why: replay"),
            "{head}"
        );
    }
    let head = ask_once(pa, &captured[0]);
    assert!(head.contains("x-packfs-why: other-node"), "{head}");
    let from_b = fresh(&b);
    let refusals = &from_b["peers"]["refusals"];
    assert_eq!(refusals["replay"], captured.len() as u64, "{from_b}");
    assert!(
        refusals["unsigned"].as_u64().unwrap() >= unsigned,
        "{from_b}"
    );
    assert!(refusals["signature"].as_u64().unwrap() >= stale, "{from_b}");
    assert!(
        from_b["peers"]["evicted_connections"].as_u64().unwrap() >= 500,
        "{from_b}"
    );
    // b's log: no line per request; the flood of connections said once.
    let log = fs::read_to_string(&b_log).unwrap();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("WARN")).collect();
    assert!(warnings.len() <= 1, "{log}");
    assert!(!log.contains("refused"), "{log}");
    // The one line, read as a sentence (its continuation lines once came as runs of spaces).
    assert!(
        warnings
            .iter()
            .all(|w| w.contains("to make room") && !w.contains("    ")),
        "{log}"
    );
    let text = run(packfs().arg("status").arg(&b.mount.dir));
    assert!(
        text.contains("replay") && text.contains("closed before a signed request"),
        "{text}"
    );
}

/// A node of the job whose clock is off (its requests signed with the job's secret, an hour
/// old) is refused as stale, counted every time, and said once in the log, in a line that reads
/// as one sentence (its continuation lines once came as runs of spaces).
#[test]
fn a_job_node_off_the_clock_is_said_once_in_one_readable_line() {
    let dir = tempfile::tempdir().unwrap();
    let (images, _) = images(dir.path());
    let job = secret(dir.path(), "job", "a-secret-of-this-job-only\n");
    let (pa, pb) = (free_port(), free_port());
    let peers = format!("127.0.0.1:{pa},127.0.0.1:{pb}");
    let b_log = dir.path().join("b.log");
    let b = node_with(
        dir.path(),
        "b",
        &images,
        "1/2",
        &peers,
        &job,
        &["--log-file", b_log.to_str().unwrap()],
    );
    let key = packfs::peers::auth::Secret::load(&job).unwrap();
    let host = format!("127.0.0.1:{pb}");
    for _ in 0..3 {
        let nonce = packfs::peers::auth::new_nonce();
        let what = packfs::peers::server::signed_part("/v2/x/0/0", None);
        let time = now_secs() - 3600;
        let signature = key.sign_request(&packfs::peers::auth::SignedRequest {
            host: &host,
            what: &what,
            time,
            nonce: &nonce,
        });
        let request = format!(
            "GET /v2/x/0/0 HTTP/1.1\r\nHost: {host}\r\nx-packfs-time: {time}\r\n\
             x-packfs-nonce: {nonce}\r\nx-packfs-signature: {signature}\r\n\r\n"
        );
        let head = ask_once(pb, request.as_bytes());
        assert!(head.contains("x-packfs-why: stale"), "{head}");
    }
    assert_eq!(fresh(&b)["peers"]["refusals"]["stale"], 3);
    let log = fs::read_to_string(&b_log).unwrap();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("off this node's clock"))
        .collect();
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].contains("(more than 60 s)") && !said[0].contains("    "),
        "{}",
        said[0]
    );
}

/// A port another process holds does not fail the mount: the node serves its share to none
/// and says why, and the node that asks it reads that share from the source after one
/// answer that does not open (whatever holds the port cannot seal one), every byte right.
#[test]
fn a_taken_port_does_not_fail_the_mount() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (images, files) = images(dir.path());
    let job = secret(dir.path(), "job", "a-secret-of-this-job-only\n");
    // Another user's listener on b's port: answers anything, as a server would.
    let squatter = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let pb = squatter.local_addr().unwrap().port();
    let asked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = asked.clone();
    std::thread::spawn(move || {
        for conn in squatter.incoming() {
            let Ok(mut conn) = conn else { continue };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nx-packfs-xxh3: 0\r\nx-packfs-salt: 00\r\n\
                  content-length: 5\r\nconnection: close\r\n\r\nhello",
            );
        }
    });
    let pa = free_port();
    let peers = format!("127.0.0.1:{pa},127.0.0.1:{pb}");
    let b = node(dir.path(), "b", &images, "1/2", &peers, &job);
    let a = node_with(
        dir.path(),
        "a",
        &images,
        "0/2",
        &peers,
        &job,
        &["--ram-chunks", "true"],
    );
    staged(&a);
    staged(&b);
    let from_b = fresh(&b);
    let why = from_b["peers"]["not_serving"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("{pb}")) && why.contains("ss -ltnp"),
        "{from_b}"
    );
    let text = run(packfs().arg("status").arg(&b.mount.dir));
    assert!(text.contains("not serving this node's share"), "{text}");
    read_all(&a, &files);
    let c = fresh(&a);
    assert_eq!(c["errors"], 0, "{c}");
    assert!(c["peers"]["source_bytes"].as_u64().unwrap() > 0, "{c}");
    let fell = &c["peers"]["fallbacks"];
    let forged = fell["forged"].as_u64().unwrap() + fell["other"].as_u64().unwrap();
    assert!(forged >= 1, "{c}");
    // The node that answered as no node of the job would is left alone, not asked per read.
    assert!(asked.load(std::sync::atomic::Ordering::SeqCst) <= 3, "{c}");
}
