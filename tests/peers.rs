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
    let mut images = Vec::new();
    let mut files = Vec::new();
    for s in 0..8 {
        let mut members = Vec::new();
        for n in 0..8 {
            let name = format!("s{s}/f{n:02}.bin");
            let data = bytes((s * 100 + n) as u64, 60_000 + (n * 7_919) % 90_000);
            members.push((name.clone(), data.clone()));
            files.push((name, data));
        }
        images.push(
            tar_of(
                &dir.path().join(format!("src{s}")),
                &format!("shard-{s}"),
                &members,
            )
            .1,
        );
    }
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
    for (name, data) in &files {
        assert!(
            fs::read(nodes[0].0.0.join(name)).unwrap() == *data,
            "{name}"
        );
    }
    std::thread::sleep(Duration::from_millis(1200));
    let c = counters(0);
    let fetched = c["peers"]["fetched_bytes"].as_u64().unwrap();
    let source = c["source"]["bytes"].as_u64().unwrap() - fetched;
    eprintln!(
        "4 nodes: node 0 read {fetched} bytes from its peers, {source} from the source, of {total}"
    );
    assert!(source <= total / 100, "{c}");
    assert!(fetched >= total / 2, "{c}");
    for k in 1..4 {
        assert!(counters(k)["peers"]["served_chunks"].as_u64().unwrap() > 0);
    }
    for (mnt, _) in &nodes {
        assert_ok(&packfs().arg("umount").arg(&mnt.0).output().unwrap());
    }
}
