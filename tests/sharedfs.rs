//! packfs on real shared file systems: MooseFS, GlusterFS and CephFS, their servers in a network
//! namespace of their own and their FUSE clients on the host (`bench/sharedfs.sh`), shards and
//! index stored on them as on a cluster. What is counted is what the metadata service is asked
//! (MooseFS's master per mount, GlusterFS's bricks by operation, CephFS's MDS by client request):
//! a mount costs a bounded number of requests once, a sample none, an idle mount none; and a
//! shard truncated or replaced under a running mount never serves a wrong byte (on MooseFS).
//! Latency profiles stay in tests/pfssim.rs (no netem here).

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::*;

/// Shards of the test dataset.
const SHARDS: u64 = 8;

/// A shared file system's instance (bench/sharedfs.sh), torn down when dropped.
struct SharedFs {
    kind: &'static str,
    dir: tempfile::TempDir,
}

/// The file systems the script starts: name, the tools each needs, and its Debian packages.
const KINDS: [(&str, &[&str], &str); 3] = [
    (
        "moosefs",
        &["mfsmaster", "mfschunkserver", "mfsmount", "mfscli"],
        "moosefs-master moosefs-chunkserver moosefs-client moosefs-cli",
    ),
    (
        "glusterfs",
        &["glusterd", "gluster", "glusterfs"],
        "glusterfs-server glusterfs-client",
    ),
    (
        "cephfs",
        &["ceph-mon", "ceph-osd", "ceph-mds", "ceph-fuse", "ceph"],
        "ceph-mon ceph-osd ceph-mds ceph-common ceph-fuse",
    ),
];

impl SharedFs {
    /// A new instance of `kind` (each test its own: they run at once), or `None` if this machine
    /// cannot run one (and the skip is allowed).
    fn up(kind: &'static str) -> Option<SharedFs> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        if unsafe { libc::geteuid() } != 0 {
            skip(
                kind,
                &format!("starting {kind} servers in a network namespace needs root"),
            );
            return None;
        }
        let has = |tool: &str| {
            Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let (_, tools, packages) = KINDS.iter().find(|k| k.0 == kind).unwrap();
        if let Some(tool) = tools.iter().find(|tool| !has(tool)) {
            skip(
                kind,
                &format!("{tool} is missing (apt-get install {packages})"),
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        // Instances numbered by this process's tests, offset by its pid: test binaries of
        // another run on the machine take other numbers (1-240; bench/pfs.py takes 250).
        let n = (std::process::id() % 24) * 10 + NEXT.fetch_add(1, Ordering::Relaxed) % 10 + 1;
        run(Command::new("bash")
            .arg(script())
            .args(["up", kind])
            .arg(dir.path())
            .arg(n.to_string()));
        Some(SharedFs { kind, dir })
    }

    /// Where the client mounts it.
    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// The servers' counts of operations since the instance came up, by name (`total` among
    /// them: what a metadata server answers; bench/sharedfs.sh counts across MooseFS's hourly
    /// resets).
    fn ops(&self) -> BTreeMap<String, u64> {
        let out = run(Command::new("bash")
            .arg(script())
            .args(["ops", self.kind])
            .arg(self.dir.path()));
        serde_json::from_str(&out).unwrap()
    }
}

impl Drop for SharedFs {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["down", self.kind])
            .arg(self.dir.path())
            .status();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/sharedfs.sh")
}

/// Operations the counters gained while `f` ran: names with a change only.
fn during(mfs: &SharedFs, f: impl FnOnce()) -> BTreeMap<String, u64> {
    let before = mfs.ops();
    f();
    // An operation first counted during `f` is missing from `before` (GlusterFS's profile
    // lists a FOP only once it has been seen): it started from 0.
    mfs.ops()
        .into_iter()
        .map(|(k, v)| (k.clone(), v - before.get(&k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

fn total(ops: &BTreeMap<String, u64>) -> u64 {
    ops.get("total").copied().unwrap_or(0)
}

/// 8 classes of 50 JPEG-sized files in a local tree, packed by `packfs pack` (in path order:
/// archive order is path order) into 8 shards and an index on the shared file system. Returns
/// the tree's `train` directory and the index.
fn dataset(local: &Path, mfs: &SharedFs) -> (PathBuf, PathBuf) {
    let train = local.join("tree/train");
    let mut rng = Rng(0x5eed_cafe);
    for c in 0..8 {
        for i in 0..50u64 {
            let len = 10_000 + rng.below(30_000) as usize;
            write_file(
                &train.join(format!("c{c}/{i:03}.jpg")),
                &bytes(c * 1000 + i, len),
                0o644,
            );
        }
    }
    let out = mfs.mnt().join("ds");
    run(packfs().arg("pack").arg(&train).arg("-o").arg(&out).args([
        "--shards",
        &SHARDS.to_string(),
        "-q",
    ]));
    (train, out.join("train.packfs-index"))
}

/// Every file of the tree, relative to `train`'s parent (as the mount shows them), sorted.
fn files(train: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for class in fs::read_dir(train).unwrap() {
        let class = class.unwrap().path();
        for f in fs::read_dir(&class).unwrap() {
            let f = f.unwrap().path();
            names.push(
                f.strip_prefix(train.parent().unwrap())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    names.sort();
    names
}

fn shuffled(mut names: Vec<String>, seed: u64) -> Vec<String> {
    let mut rng = Rng(seed);
    for i in (1..names.len()).rev() {
        names.swap(i, rng.below(i as u64 + 1) as usize);
    }
    names
}

/// Reads every file of `names` through the mount and checks its bytes.
fn epoch(mnt: &Path, tree: &Path, names: &[String]) {
    for name in names {
        assert!(
            fs::read(mnt.join(name)).unwrap() == fs::read(tree.join(name)).unwrap(),
            "{name} differs"
        );
    }
}

/// ImageFolder's scan: a listing of the root and of each class, and a stat of every file.
fn imagefolder_scan(root: &Path) -> usize {
    let mut n = 0;
    for class in fs::read_dir(root).unwrap() {
        let class = class.unwrap();
        assert!(class.file_type().unwrap().is_dir());
        for f in fs::read_dir(class.path()).unwrap() {
            let meta = fs::metadata(f.unwrap().path()).unwrap();
            assert!(meta.is_file() && meta.len() > 0);
            n += 1;
        }
    }
    n
}

fn drop_caches() {
    let _ = Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

/// A mount of shards and index stored on MooseFS asks its master a bounded number of things once;
/// an ImageFolder scan, a cold epoch in random order and one in archive order ask it nothing per
/// sample (only the image watcher's check of each shard read, at most one a second); every
/// byte is right.
#[test]
fn an_epoch_from_moosefs_costs_its_master_nothing_per_sample() {
    an_epoch_costs_the_metadata_service_nothing_per_sample("moosefs");
}

/// The same on GlusterFS, where the bricks answer the metadata too (every operation but reads
/// and writes counted).
#[test]
fn an_epoch_from_glusterfs_costs_its_bricks_no_metadata_per_sample() {
    an_epoch_costs_the_metadata_service_nothing_per_sample("glusterfs");
}

/// The same on CephFS, where the MDS answers the metadata (its client requests counted) and the
/// OSD the data.
#[test]
fn an_epoch_from_cephfs_costs_its_mds_nothing_per_sample() {
    an_epoch_costs_the_metadata_service_nothing_per_sample("cephfs");
}

fn an_epoch_costs_the_metadata_service_nothing_per_sample(kind: &'static str) {
    let Some(mfs) = SharedFs::up(kind) else {
        return;
    };
    let local = tempfile::tempdir().unwrap();
    let (train, index) = dataset(local.path(), &mfs);
    let names = files(&train);
    let tree = train.parent().unwrap();
    let mnt = local.path().join("mnt");
    let mut mount = None;
    let mounted = during(&mfs, || mount = Some(Mount::new(&[&index], &mnt, &[])));
    // Lookups of the index and the shards, an open of each, the index's head: 32 measured.
    assert!(
        total(&mounted) <= 10 + 5 * SHARDS,
        "a mount asked {kind} {mounted:?}"
    );
    let scan = during(&mfs, || {
        assert_eq!(imagefolder_scan(&mnt.join("train")), names.len())
    });
    assert_eq!(total(&scan), 0, "an ImageFolder scan asked {kind} {scan:?}");
    for (order, names) in [
        ("random", shuffled(names.clone(), 7)),
        ("archive", names.clone()),
    ] {
        drop_caches();
        let read = during(&mfs, || epoch(&mnt, tree, &names));
        // Nothing per sample: at most the watcher's one check of each shard read, and a chunk
        // location per shard.
        assert!(
            total(&read) <= 2 * SHARDS,
            "a cold epoch of {} samples in {order} order asked {kind} {read:?}",
            names.len()
        );
    }
    drop(mount);
}

/// An idle mount asks the master nothing for a minute; a staged mount, once staged, serves an
/// epoch without asking it anything. (The watcher used to stat every shard every 2 s: 8 shards
/// made 120 master requests in 30 s, staged or not.)
#[test]
fn an_idle_or_staged_mount_on_moosefs_asks_its_master_nothing() {
    let Some(mfs) = SharedFs::up("moosefs") else {
        return;
    };
    let local = tempfile::tempdir().unwrap();
    let (train, index) = dataset(local.path(), &mfs);
    let names = files(&train);
    let tree = train.parent().unwrap();
    let stage = local.path().join("stage");
    let stats = local.path().join("stats.json");
    let mnt = local.path().join("mnt");
    let m = Mount::new(
        &[&index],
        &mnt,
        &[
            "--stage",
            stage.to_str().unwrap(),
            "--stats-file",
            stats.to_str().unwrap(),
        ],
    );
    let staged = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        fs::read_to_string(&stats)
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .is_some_and(|s| s["stage"]["status"] == "complete")
    });
    assert!(
        staged,
        "staging did not complete in 60 s: {:?}",
        fs::read_to_string(&stats)
    );
    // The watcher checks each shard the stager read, one a second, then nothing.
    std::thread::sleep(Duration::from_secs(SHARDS + 2));
    let idle = during(&mfs, || std::thread::sleep(Duration::from_secs(60)));
    assert_eq!(
        total(&idle),
        0,
        "an idle mount asked the master {idle:?} in 60 s"
    );
    drop_caches();
    let read = during(&mfs, || epoch(&mnt, tree, &shuffled(names.clone(), 3)));
    assert_eq!(total(&read), 0, "a staged epoch asked the master {read:?}");
    drop(m);
}

/// Shards changed under a running mount on the shared file system, mid-epoch: one truncated,
/// one overwritten in place with another shard's bytes, one replaced by rename. No read serves a
/// wrong byte: the truncated and overwritten shards' files fail with EIO (at once, or from the
/// watcher's check on), the renamed one's old file is still read, and right.
#[test]
fn shards_truncated_or_replaced_on_moosefs_mid_epoch_never_serve_a_wrong_byte() {
    let Some(mfs) = SharedFs::up("moosefs") else {
        return;
    };
    let local = tempfile::tempdir().unwrap();
    let (train, index) = dataset(local.path(), &mfs);
    let tree = train.parent().unwrap();
    let listing = run(packfs().arg("ls").arg("--json").arg(&index));
    let mut image_of = BTreeMap::new();
    let mut shard = BTreeMap::new();
    for line in listing.lines().skip(1) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        match v["kind"].as_str() {
            Some("file") => {
                image_of.insert(
                    v["path"].as_str().unwrap().to_string(),
                    v["image"].as_u64().unwrap(),
                );
            }
            Some("image") => {
                shard.insert(
                    v["image"].as_u64().unwrap(),
                    PathBuf::from(v["path"].as_str().unwrap()),
                );
            }
            _ => {}
        }
    }
    let order = shuffled(files(&train), 11);
    let (first, rest) = order.split_at(order.len() / 2);
    let mnt = local.path().join("mnt");
    let m = Mount::new(&[&index], &mnt, &[]);
    epoch(&mnt, tree, first);
    // Truncated to half; overwritten in place (cp truncates and writes: a new size and mtime);
    // replaced by rename (the mount holds the old file open).
    let (truncated, overwritten, renamed) = (2, 5, 6);
    let half = fs::metadata(&shard[&truncated]).unwrap().len() / 2;
    truncate(&shard[&truncated], half);
    fs::copy(&shard[&0], &shard[&overwritten]).unwrap();
    let new = shard[&renamed].with_extension("new");
    fs::copy(&shard[&1], &new).unwrap();
    fs::rename(&new, &shard[&renamed]).unwrap();
    let mut failed: BTreeMap<u64, usize> = BTreeMap::new();
    let mut served: BTreeMap<u64, usize> = BTreeMap::new();
    for name in rest {
        let image = image_of[name];
        match fs::read(mnt.join(name)) {
            Ok(data) => {
                assert!(
                    data == fs::read(tree.join(name)).unwrap(),
                    "{name} (shard {image}) served wrong bytes"
                );
                *served.entry(image).or_default() += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{name}: {e}");
                assert!(
                    image == truncated || image == overwritten,
                    "{name} of shard {image} failed: {e}"
                );
                *failed.entry(image).or_default() += 1;
            }
        }
    }
    assert!(
        failed.contains_key(&truncated) && failed.contains_key(&overwritten),
        "failed {failed:?}, served {served:?}"
    );
    assert!(
        served.contains_key(&renamed),
        "the renamed shard's old file: {served:?}"
    );
    assert!(m.daemon_alive());
}

/// The master counts by the hour; `ops` counts since `up` across the hours: a count lower than
/// the one seen before is a new hour, whose first part is the last hour's count beyond it. (A
/// benchmark pass across 19:00 read -136 967 operations.) The master is played by a script
/// printing its lines, so the test needs no hour to pass.
#[test]
fn operation_counts_go_on_across_the_masters_hourly_reset() {
    let dir = tempfile::tempdir().unwrap();
    let cli = dir.path().join("mfscli");
    let (current, last) = (dir.path().join("current"), dir.path().join("last"));
    let line = |total: u64| {
        let mut counts = vec![0u64; 16];
        counts[1] = total;
        counts.push(total);
        let counts: Vec<String> = counts.iter().map(u64::to_string).collect();
        format!(
            "active mounts, operations: 10.77.1.1 {}/mnt {}\n",
            dir.path().display(),
            counts.join(" ")
        )
    };
    fs::write(
        &cli,
        format!(
            "#!/bin/sh\ncase \"$*\" in *'-m 1'*) cat {};; *) cat {};; esac\n",
            current.display(),
            last.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&cli, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ops = |now: u64, before: u64| {
        fs::write(&current, line(now)).unwrap();
        fs::write(&last, line(before)).unwrap();
        let out = run(Command::new("bash")
            .arg(script())
            .args(["ops", "moosefs"])
            .arg(dir.path())
            .env("PACKFS_MFSCLI", &cli));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        (v["getattr"].as_u64().unwrap(), v["total"].as_u64().unwrap())
    };
    assert_eq!(ops(10, 0), (0, 0));
    assert_eq!(ops(15, 0), (5, 5));
    // A new hour: 20 in the last one (5 since the count of 15), 3 in this one.
    assert_eq!(ops(3, 20), (13, 13));
    assert_eq!(ops(7, 20), (17, 17));
}

/// An instance number is claimed by the directory that brought it up until that directory's
/// `down`: a second `up` of the number fails (exit 3) instead of sharing the address, and a late
/// `down` of an older directory (a test process's watcher finishing while the next process
/// already runs its own instance) leaves the newer namespace standing. Before the claims, that
/// late `down` removed the newer instance's namespace mid-start and its OSD met another
/// monitor ('wrong fsid').
#[test]
fn a_late_down_of_an_old_instance_leaves_a_newer_one_standing() {
    if unsafe { libc::geteuid() } != 0 {
        skip("netns", "network namespaces need root");
        return;
    }
    let (old, new) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let n = 200 + std::process::id() % 50;
    let netns = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/netns.sh");
    let call = |dir: &Path, what: &str| {
        Command::new("bash")
            .arg("-c")
            .arg(format!(
                "set -e; . \"$0\"; netns_init tst 10.81 \"$1\" {n}; {what}"
            ))
            .arg(&netns)
            .arg(dir)
            .output()
            .unwrap()
    };
    let ns = PathBuf::from(format!("/run/netns/packfs-tst-{n}"));
    // The old directory had the number once (its `up` and `down` done); the new one has it now.
    assert_ok(&call(old.path(), "netns_up \"$1\"; netns_down \"$1\""));
    assert_ok(&call(new.path(), "netns_up \"$1\""));
    assert!(ns.exists());
    // The old directory's late `down` (its instance file still names n).
    assert_ok(&call(old.path(), "netns_down \"$1\""));
    let standing = ns.exists();
    // A second `up` of the claimed number is refused.
    let second = call(old.path(), "netns_up \"$1\"");
    assert_ok(&call(new.path(), "netns_down \"$1\""));
    assert!(standing, "the late down removed the newer namespace");
    assert_eq!(second.status.code(), Some(3), "{second:?}");
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("is in use by"),
        "{second:?}"
    );
    assert!(!ns.exists());
}
