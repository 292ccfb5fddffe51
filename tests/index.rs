//! The persisted index: written, mapped back, moved with its dataset, checked against its images,
//! and rejected cleanly when damaged.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// Entries in the big directory: enough for an index of several 64 KiB chunks.
const MANY: usize = 6_000;

/// A dataset folder: the source tree, three shards of it, and an index beside them.
struct Dataset {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    dir: PathBuf,
}

impl Dataset {
    fn new() -> Dataset {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        build_tree(&src, MANY);
        let dir = tmp.path().join("dataset");
        fs::create_dir(&dir).unwrap();
        tar_members(
            &src,
            &dir.join("part-0.tar"),
            &["train", "empty.bin", "abs_link"],
        );
        tar_members(&src, &dir.join("part-1.tar"), &["many", "dangling"]);
        tar_members(
            &src,
            &dir.join("part-2.tar"),
            &["big", "deep", VERY_LONG_DIR],
        );
        Dataset {
            _tmp: tmp,
            src,
            dir,
        }
    }

    fn shards(&self) -> Vec<PathBuf> {
        (0..3)
            .map(|i| self.dir.join(format!("part-{i}.tar")))
            .collect()
    }

    fn index(&self) -> PathBuf {
        self.dir.join("ds.packfs-index")
    }

    fn build_index(&self) -> String {
        run(packfs()
            .arg("index")
            .arg(self.dir.join("part-{0..2}.tar"))
            .arg("-o")
            .arg(self.index()))
    }

    fn tmp(&self) -> &Path {
        self._tmp.path()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Fails, with an error message rather than a crash.
fn assert_clean_failure(out: &Output, what: &str) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(err.contains("packfs: error: "), "{what}: {err}");
    err
}

fn verify(index: &Path) -> Output {
    packfs().arg("verify").arg(index).output().unwrap()
}

#[test]
fn index_mount_equals_scan_mount() {
    let ds = Dataset::new();
    let summary = ds.build_index();
    assert!(
        summary.contains("files") && summary.contains("per entry"),
        "{summary}"
    );
    let shards = ds.shards();
    let shards: Vec<&Path> = shards.iter().map(PathBuf::as_path).collect();

    let from_index = Mount::new(&[&ds.index()], &ds.tmp().join("m-index"), &[]);
    let saved = ds.tmp().join("saved.packfs-index");
    let scanned = Mount::new(
        &shards,
        &ds.tmp().join("m-scan"),
        &["--save-index", saved.to_str().unwrap()],
    );
    assert_same_tree(&ds.src, &from_index.dir, &[]);
    run(Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(&from_index.dir)
        .arg(&scanned.dir));
    assert_eq!(
        fs::read_dir(from_index.dir.join("many")).unwrap().count(),
        MANY
    );

    // Listings with attributes serve the same tree.
    for mode in ["always", "auto"] {
        let mnt = Mount::new(
            &[&ds.index()],
            &ds.tmp().join(format!("m-{mode}")),
            &["--readdirplus", mode],
        );
        assert_same_tree(&ds.src, &mnt.dir, &[]);
    }

    // The index saved by the scanning mount is the same tree, byte for byte in its tables.
    let from_saved = Mount::new(&[&saved], &ds.tmp().join("m-saved"), &[]);
    assert_same_tree(&ds.src, &from_saved.dir, &[]);
    let list = |index: &Path| run(packfs().arg("ls").arg("-l").arg(index));
    assert_eq!(list(&ds.index()), list(&saved));
    assert!(list(&saved).contains("many/05999.txt"));
    let cat = packfs()
        .arg("cat")
        .arg(ds.index())
        .arg("train/cls_a/hard.jpg")
        .output()
        .unwrap();
    assert_ok(&cat);
    assert!(cat.stdout == bytes(1, 3000), "packfs cat from an index");

    // statfs counts come from the index header.
    let df = run(Command::new("stat")
        .arg("-f")
        .arg("-c")
        .arg("%c")
        .arg(&from_index.dir));
    let scan_df = run(Command::new("stat")
        .arg("-f")
        .arg("-c")
        .arg("%c")
        .arg(&scanned.dir));
    assert_eq!(df, scan_df);
    run(packfs().arg("verify").arg(ds.index()));

    // A glob that also matches the index is refused rather than scanned as a tar.
    let out = packfs()
        .arg("index")
        .arg(ds.dir.join("*"))
        .arg("-o")
        .arg(ds.tmp().join("again.packfs-index"))
        .output()
        .unwrap();
    let err = assert_clean_failure(&out, "index over a glob matching an index");
    assert!(
        err.contains("ds.packfs-index is an index file, not an image"),
        "{err}"
    );
    // An index alone, before or after -o: told it is one already, not that it is among images.
    for order in [true, false] {
        let mut cmd = packfs();
        cmd.arg("index");
        let out = ds.tmp().join("again.packfs-index");
        if order {
            cmd.arg("-o").arg(&out).arg(ds.index());
        } else {
            cmd.arg(ds.index()).arg("-o").arg(&out);
        }
        let err = assert_clean_failure(&cmd.output().unwrap(), "index of an index");
        assert!(err.contains("is an index already"), "{err}");
        assert!(!err.contains("among images"), "{err}");
    }
}

#[test]
fn moved_dataset_mounts_and_changed_images_are_caught() {
    let ds = Dataset::new();
    ds.build_index();
    // The whole folder moves (as to another cluster): images are found beside the index.
    let moved = ds.tmp().join("elsewhere/dataset");
    fs::create_dir_all(moved.parent().unwrap()).unwrap();
    fs::rename(&ds.dir, &moved).unwrap();
    let index = moved.join("ds.packfs-index");
    {
        let mnt = Mount::new(&[&index], &ds.tmp().join("m1"), &[]);
        assert_same_tree(&ds.src, &mnt.dir, &[]);
    }

    // The index alone moves: images are found where they were indexed... which is gone now, so
    // the message names both places.
    let lone = ds.tmp().join("lone.packfs-index");
    fs::copy(&index, &lone).unwrap();
    let err = assert_clean_failure(&verify(&lone), "index away from its images");
    assert!(err.contains("part-0.tar is missing"), "{err}");
    assert!(
        err.contains(&ds.dir.join("part-0.tar").display().to_string()),
        "{err}"
    );

    let mnt_dir = ds.tmp().join("m2");
    fs::create_dir(&mnt_dir).unwrap();
    let shard = moved.join("part-1.tar");
    let original = fs::read(&shard).unwrap();
    let original_mtime = fs::metadata(&shard).unwrap().modified().unwrap();
    // Writes `data` to the shard and gives it back its indexed mtime.
    let rewrite_keeping_time = |data: &[u8]| {
        fs::write(&shard, data).unwrap();
        fs::File::options()
            .write(true)
            .open(&shard)
            .unwrap()
            .set_modified(original_mtime)
            .unwrap();
    };

    // Rewritten with the same bytes but a new mtime: refused, with the way out.
    fs::write(&shard, &original).unwrap();
    let out = mount_cmd(&[&index], &mnt_dir, &[], None);
    let err = assert_clean_failure(&out, "new mtime");
    assert!(
        err.contains("part-1.tar changed since it was indexed: mtime was @"),
        "{err}"
    );
    assert!(
        err.contains("touch -d @") && err.contains("packfs index -o"),
        "{err}"
    );
    assert!(!is_mounted(&mnt_dir));

    // A byte changed near the end, time restored: the tail hash catches it.
    let mut changed = original.clone();
    let at = changed.len() - 3000;
    changed[at] ^= 0x55;
    rewrite_keeping_time(&changed);
    let err = assert_clean_failure(&mount_cmd(&[&index], &mnt_dir, &[], None), "tail");
    assert!(err.contains("its last 64 KiB differ"), "{err}");

    // Grown (a member appended): the size changed.
    let mut grown = original.clone();
    grown.extend_from_slice(&[0u8; 10240]);
    fs::write(&shard, &grown).unwrap();
    let err = assert_clean_failure(&mount_cmd(&[&index], &mnt_dir, &[], None), "size");
    assert!(err.contains("size was"), "{err}");

    rewrite_keeping_time(&original);
    run(packfs().arg("verify").arg(&index));
    let mnt = Mount::new(&[&index], &mnt_dir, &[]);
    assert_same_tree(&ds.src, &mnt.dir, &[]);
}

/// The section offsets of an index file, read from its header.
fn sections(index: &[u8]) -> [usize; 4] {
    let at = |i: usize| u64::from_le_bytes(index[i..i + 8].try_into().unwrap()) as usize;
    // entries, names, chunk table, image table
    [at(48), at(56), at(72), at(88)]
}

#[test]
fn damaged_indexes_are_rejected() {
    let ds = Dataset::new();
    ds.build_index();
    let good = fs::read(ds.index()).unwrap();
    let [entries, names, chunks, images] = sections(&good);
    assert!(
        chunks - entries > 3 * 64 * 1024,
        "want several chunks: {chunks}"
    );
    let bad = ds.dir.join("bad.packfs-index");

    // Truncated anywhere.
    for len in [
        0,
        7,
        100,
        127,
        128,
        entries + 4800,
        names + 10,
        chunks + 4,
        images,
        good.len() - 1,
    ] {
        fs::write(&bad, &good[..len]).unwrap();
        let err = assert_clean_failure(&verify(&bad), &format!("truncated at {len}"));
        assert!(err.contains("bad.packfs-index"), "{err}");
        // (An empty file is an empty tar to mount; anything longer fails as an index or a tar.)
        if len > 0 {
            let out = mount_cmd(&[&bad], &ds.tmp().join("never"), &[], None);
            assert_clean_failure(&out, &format!("mount of an index cut at {len}"));
        }
    }

    // Another version.
    let mut other = good.clone();
    other[8] = 8;
    fs::write(&bad, &other).unwrap();
    let err = assert_clean_failure(&verify(&bad), "version");
    assert!(
        err.contains("version 8, this packfs reads versions 1 to 7"),
        "{err}"
    );

    // One byte flipped anywhere: verify finds it.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..60 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % good.len() as u64) as usize;
        let mut flipped = good.clone();
        flipped[at] ^= 1 << (x >> 61);
        fs::write(&bad, &flipped).unwrap();
        assert_clean_failure(&verify(&bad), &format!("flip at {at}"));
    }
}

/// A damaged chunk in the middle of a mapped index fails only the requests that touch it: the
/// other files read correctly, none reads wrongly.
#[test]
fn damaged_chunk_fails_only_its_entries() {
    let ds = Dataset::new();
    ds.build_index();
    let mut index = fs::read(ds.index()).unwrap();
    let [entries, _names, _chunks, _images] = sections(&index);
    // An entry record in the second chunk: inside the `many` directory's children.
    let at = entries + 64 * 1024 + 100;
    index[at] ^= 0xff;
    let bad = ds.dir.join("bad.packfs-index");
    fs::write(&bad, &index).unwrap();

    let log = ds.tmp().join("daemon.log");
    let mnt = Mount::new(
        &[&bad],
        &ds.tmp().join("m"),
        &["--log-file", log.to_str().unwrap()],
    );
    let (mut ok, mut eio) = (0, 0);
    for i in 0..MANY {
        let name = format!("{i:05}.txt");
        match fs::read_to_string(mnt.dir.join("many").join(&name)) {
            Ok(text) => {
                assert_eq!(text, format!("{i}\n"), "{name} served wrong data");
                ok += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{name}: {e}");
                eio += 1;
            }
        }
    }
    // A lookup whose binary search probes the damaged chunk fails too: about half here.
    assert!(eio > 0 && ok >= MANY / 3, "ok {ok}, EIO {eio}");
    // Files whose entries live in other chunks are untouched.
    assert_same_tree(&ds.src.join("train"), &mnt.dir.join("train"), &[]);
    drop(mnt);
    let log = fs::read_to_string(&log).unwrap();
    assert!(log.contains("fails its checksum"), "{log}");
    assert!(log.contains("damaged chunk(s)"), "{log}");
}

/// `packfs status` of `mnt` once the daemon has counted the files with checksums (in the
/// background after mounting), or as it is after 20 s.
fn counted_status(mnt: &Path) -> String {
    let start = std::time::Instant::now();
    loop {
        let status = run(packfs().arg("status").arg(mnt));
        if !status.contains("being counted") || start.elapsed().as_secs() > 20 {
            return status;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `packfs index --checksums` records the CRC-32 of every stored member (one read of the data),
/// `ls --json` and `status` say they are in force, and a mount of that index catches a member
/// rewritten in place with its mtime kept on the next whole-file read (EIO), where an index
/// without them serves the new bytes: what docs/semantics.md states.
#[test]
fn an_index_with_checksums_catches_a_member_rewritten_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..20)
        .map(|i| {
            (
                format!("d/f{i:02}.bin"),
                bytes(i, 5_000 + 3_000 * i as usize),
            )
        })
        .collect();
    let (src, tar) = tar_of(tmp.path(), "t", &files);
    let plain = tmp.path().join("plain.packfs-index");
    run(packfs().arg("index").arg(&tar).arg("-o").arg(&plain));
    let checked = tmp.path().join("checked.packfs-index");
    let said = run(packfs()
        .args(["index", "--checksums"])
        .arg(&tar)
        .arg("-o")
        .arg(&checked));
    assert!(said.contains("20 files (20 with checksums)"), "{said}");

    // ls --json: how many, and each file's CRC-32 as zlib computes it.
    let listing = run(packfs().args(["ls", "--json"]).arg(&checked));
    let lines: Vec<serde_json::Value> = listing
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["checksummed_files"], 20, "{}", lines[0]);
    let victim = lines
        .iter()
        .find(|l| l["path"] == "d/f07.bin")
        .expect("listed");
    let want = format!(
        "{:08x}",
        crc32fast::hash(&fs::read(src.join("d/f07.bin")).unwrap())
    );
    assert_eq!(victim["crc32"], want.as_str());
    let plain_head = run(packfs().args(["ls", "--json"]).arg(&plain));
    assert!(
        plain_head.starts_with(r#"{"packfs_ls":1,"images":1,"entries":21,"checksummed_files":0}"#)
    );
    assert!(!plain_head.contains("crc32"));

    // The member rewritten in place, size and mtime kept.
    let at = victim["offset"].as_u64().unwrap() + 100;
    damage_in_place(&tar, at, 0xff);
    let mnt = tmp.path().join("m");
    let m = Mount::new(&[&checked], &mnt, &[]);
    let status = counted_status(&mnt);
    assert!(
        status.contains("every file's reads are checked against the index's checksums"),
        "{status}"
    );
    let err = fs::read(mnt.join("d/f07.bin")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(
        fs::read(mnt.join("d/f06.bin")).unwrap(),
        fs::read(src.join("d/f06.bin")).unwrap()
    );
    drop(m);
    let m = Mount::new(&[&plain], &mnt, &[]);
    let status = counted_status(&mnt);
    assert!(status.contains("checksums none"), "{status}");
    let served = fs::read(mnt.join("d/f07.bin")).unwrap();
    assert_ne!(
        served,
        fs::read(src.join("d/f07.bin")).unwrap(),
        "without checksums the rewritten bytes are served"
    );
    drop(m);
}
