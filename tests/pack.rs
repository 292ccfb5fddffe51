//! `packfs pack`: shards written from trees and images, read back by packfs mounts, GNU tar,
//! bsdtar, Python's tarfile and webdataset; determinism, grouping, balance, resume; and the
//! `imagefolder` layout over shards written by webdataset's own ShardWriter.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

fn pack(args: &[&OsStr]) -> String {
    run(packfs().arg("pack").args(args))
}

fn os<S: AsRef<OsStr> + ?Sized>(s: &S) -> &OsStr {
    s.as_ref()
}

/// The shard files of `dir`, in name order.
/// Waits until a running pack has completed its first shard in `out`.
fn wait_for_a_shard(out: &Path) {
    let started = Instant::now();
    while shards(out).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no shard after 60 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn shards(dir: &Path) -> Vec<PathBuf> {
    let Ok(listing) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = listing
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .collect();
    v.sort();
    v
}

/// No temporary shard file is left in `dir`, nor the lock of a pack that ended.
fn assert_no_partials(dir: &Path) {
    for e in fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name();
        let name = name.to_string_lossy();
        assert!(
            !name.ends_with(".partial") && !name.ends_with(".pack-lock"),
            "{name:?} left behind"
        );
    }
}

/// A flat dataset of `n` samples, each `KEY.jpg` (random size), `KEY.cls` and `KEY.json`.
fn flat_samples(dir: &Path, n: usize, seed: u64) {
    let mut rng = Rng(seed);
    for i in 0..n {
        let size = 2000 + rng.below(30_000) as usize;
        write_file(
            &dir.join(format!("s{i:05}.jpg")),
            &bytes(seed + i as u64, size),
            0o644,
        );
        write_file(
            &dir.join(format!("s{i:05}.cls")),
            format!("{}\n", i % 7).as_bytes(),
            0o644,
        );
        write_file(
            &dir.join(format!("s{i:05}.json")),
            format!("{{\"label\": {}}}", i % 7).as_bytes(),
            0o644,
        );
    }
}

#[test]
fn packed_tree_mounts_and_extracts_identical_to_the_source() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("data");
    build_tree(&src, 300);
    // What build_tree lacks: a name that is not UTF-8, a symlink target over 100 bytes, an mtime
    // before 1970 (all need PAX records), and a sparse file (packed as data, holes as zeros).
    use std::os::unix::ffi::OsStrExt;
    let latin = src.join("odd").join(OsStr::from_bytes(b"caf\xe9.bin"));
    write_file(&latin, b"latin-1 name\n", 0o644);
    std::os::unix::fs::symlink("t/".repeat(60) + "target", src.join("odd/long_link")).unwrap();
    let old = fs::File::options().write(true).open(&latin).unwrap();
    old.set_modified(std::time::UNIX_EPOCH - Duration::from_secs(86_400))
        .unwrap();
    let sparse = fs::File::create(src.join("odd/sparse.bin")).unwrap();
    sparse.set_len(3 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"middle", 1 << 20).unwrap();
    drop(sparse);
    let out = tmp.path().join("out");
    let summary = pack(&[os(&src), os("-o"), os(&out), os("--shards"), os("4")]);
    assert!(summary.contains("into 4 shard(s)"), "{summary}");
    let found = shards(&out);
    assert_eq!(found.len(), 4);
    let index = out.join("data.packfs-index");
    assert!(index.exists() && out.join("data.json").exists());
    // No temporary file left behind.
    assert_no_partials(&out);

    // Mounted from the index pack wrote: the same tree, attributes and all (the hard link is
    // packed as a second copy of the data).
    let mnt = tmp.path().join("mnt");
    let _m = Mount::new(&[&index], &mnt, &[]);
    assert_same_tree(&src, &mnt.join("data"), &[]);
    // Every member carries a CRC-32 that verify --data checks.
    let verified = run(&mut verify_data(&index));
    assert!(verified.contains("all"), "{verified}");

    // GNU tar and bsdtar extract the shards to the same tree.
    for tool in ["tar", "bsdtar"] {
        let x = tmp.path().join(format!("x-{tool}"));
        fs::create_dir_all(&x).unwrap();
        for shard in &found {
            run(Command::new(tool).arg("-C").arg(&x).arg("-xpf").arg(shard));
        }
        run(Command::new("diff")
            .arg("-r")
            .arg("--no-dereference")
            .arg(&src)
            .arg(x.join("data")));
    }
    // Python's tarfile reads every member, with the source's bytes.
    let checked = python(
        Path::new("python3"),
        r#"
import os, sys, tarfile
src, shards = sys.argv[1], sys.argv[2:]
base = os.path.dirname(os.fsencode(src))
n = 0
for shard in shards:
    with tarfile.open(shard) as t:
        for m in t:
            path = os.path.join(base, os.fsencode(m.name))
            if m.isfile():
                assert t.extractfile(m).read() == open(path, "rb").read(), m.name
                n += 1
            elif m.issym():
                assert os.fsencode(m.linkname) == os.readlink(path), m.name
            assert m.uid == 0 and m.gid == 0 and m.uname == "" and m.gname == "", m.name
print(n)
"#,
        &std::iter::once(src.as_os_str())
            .chain(found.iter().map(|p| p.as_os_str()))
            .collect::<Vec<_>>(),
    );
    let files = fs::read_dir(src.join("many")).unwrap().count() + 13;
    assert_eq!(checked.trim().parse::<usize>().unwrap(), files);
}

#[test]
fn same_seed_same_bytes_other_seed_other_assignment() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 300, 1);
    let packed = |dir: &str, seed: &str| {
        let out = tmp.path().join(dir);
        pack(&[
            os(&src),
            os("-o"),
            os(&out),
            os("--shards"),
            os("5"),
            os("--shuffle"),
            os("--seed"),
            os(seed),
        ]);
        shards(&out)
    };
    let a = packed("a", "7");
    let b = packed("b", "7");
    let c = packed("c", "8");
    for (x, y) in a.iter().zip(&b) {
        assert!(
            fs::read(x).unwrap() == fs::read(y).unwrap(),
            "{} and {} differ",
            x.display(),
            y.display()
        );
    }
    assert!(
        a.iter()
            .zip(&c)
            .any(|(x, z)| fs::read(x).unwrap() != fs::read(z).unwrap())
    );
    // Same contents whatever the seed: both mount to the source tree.
    for dir in ["a", "c"] {
        let index = tmp.path().join(dir).join("flat.packfs-index");
        let mnt = tmp.path().join(format!("mnt-{dir}"));
        let _m = Mount::new(&[&index], &mnt, &[]);
        run(Command::new("diff")
            .arg("-r")
            .arg(&src)
            .arg(mnt.join("flat")));
    }
    // The shards as listed by GNU tar differ between seeds, their union does not.
    let listing = |shards: &[PathBuf]| {
        let mut names: Vec<String> = shards
            .iter()
            .flat_map(|s| {
                run(Command::new("tar").arg("-tf").arg(s))
                    .lines()
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .collect();
        names.sort();
        names
    };
    assert_eq!(listing(&a), listing(&c));
}

#[test]
fn samples_stay_together_and_shards_are_balanced() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 2000, 2);
    let out = tmp.path().join("out");
    pack(&[
        os(&src),
        os("-o"),
        os(&out),
        os("--shards"),
        os("8"),
        os("--shuffle"),
        os("--seed"),
        os("3"),
    ]);
    let found = shards(&out);
    // Member order per shard, as Python's tarfile reads it.
    let listing = python(
        Path::new("python3"),
        r#"
import sys, tarfile
for shard in sys.argv[1:]:
    with tarfile.open(shard) as t:
        for m in t:
            print(shard, m.name, m.size if m.isfile() else -1)
"#,
        &found.iter().map(|p| p.as_os_str()).collect::<Vec<_>>(),
    );
    let mut seen: std::collections::HashMap<String, String> = Default::default();
    let mut last_key = String::new();
    let mut per_shard: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for line in listing.lines() {
        let mut f = line.split(' ');
        let (shard, name, size) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
        if size == "-1" {
            continue;
        }
        let key = name.split_once('.').unwrap().0.to_string();
        if key != last_key {
            // A key seen before must not come back: its members are adjacent, in one shard.
            assert!(
                seen.insert(key.clone(), shard.to_string()).is_none(),
                "{key} split"
            );
            per_shard.entry(shard.to_string()).or_default().0 += 1;
            last_key = key;
        }
    }
    assert_eq!(seen.len(), 2000);
    for shard in &found {
        per_shard.get_mut(&shard.display().to_string()).unwrap().1 =
            fs::metadata(shard).unwrap().len();
    }
    let n = per_shard.len() as f64;
    let mean_samples = 2000.0 / n;
    let mean_bytes = per_shard.values().map(|v| v.1).sum::<u64>() as f64 / n;
    for (shard, (samples, bytes)) in &per_shard {
        assert!(
            (*samples as f64) <= mean_samples * 1.03,
            "{shard}: {samples} samples, mean {mean_samples}"
        );
        assert!(
            (*bytes as f64) <= mean_bytes * 1.01,
            "{shard}: {bytes} bytes, mean {mean_bytes}"
        );
    }
    // The manifest counts them as wids expects.
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("flat.json")).unwrap()).unwrap();
    assert_eq!(manifest["shardlist"].as_array().unwrap().len(), 8);
    let total: u64 = manifest["shardlist"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["nsamples"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 2000);
    assert_eq!(manifest["shuffle_seed"], 3);
    assert_eq!(manifest["deal"], 2);
}

/// A pack begun with the first deal (as every packfs before deals had versions wrote them) and
/// resumed keeps that deal: with the current one, its kept shards no longer matched the plan.
/// `--deal 1` makes such a pack's shards again from its seed, byte for byte.
#[test]
fn a_resumed_pack_keeps_the_deal_it_began_with() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 600, 5);
    let args = |out: &Path, deal: Option<&str>| -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = ["--shards", "6", "--shuffle", "--seed", "4"]
            .iter()
            .map(|s| s.into())
            .collect();
        if let Some(d) = deal {
            a.extend(["--deal".into(), d.into()]);
        }
        a.extend([
            src.clone().into_os_string(),
            "-o".into(),
            out.as_os_str().into(),
        ]);
        a
    };
    let old = tmp.path().join("old");
    run(packfs().arg("pack").args(args(&old, Some("1"))));
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(old.join("flat.json")).unwrap()).unwrap();
    assert_eq!(manifest["deal"], 1);
    let fresh_v1: Vec<Vec<u8>> = shards(&old).iter().map(|s| fs::read(s).unwrap()).collect();
    let fresh_v2 = tmp.path().join("v2");
    run(packfs().arg("pack").args(args(&fresh_v2, None)));
    let v2: Vec<Vec<u8>> = shards(&fresh_v2)
        .iter()
        .map(|s| fs::read(s).unwrap())
        .collect();
    assert_ne!(fresh_v1, v2, "the two deals differ on this input");
    // As an older packfs leaves a pack cut short: some shards, no index, manifest or state.
    for shard in &shards(&old)[3..] {
        fs::remove_file(shard).unwrap();
    }
    for f in ["flat.json", "flat.packfs-index", ".flat.pack-state"] {
        fs::remove_file(old.join(f)).unwrap();
    }
    let resumed = run(packfs().arg("pack").arg("--resume").args(args(&old, None)));
    assert!(resumed.contains("3 complete shard(s) kept"), "{resumed}");
    let again: Vec<Vec<u8>> = shards(&old).iter().map(|s| fs::read(s).unwrap()).collect();
    assert!(again == fresh_v1, "resumed with another deal");
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(old.join("flat.json")).unwrap()).unwrap();
    assert_eq!(manifest["deal"], 1);
}

#[test]
fn an_interrupted_pack_resumes_to_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 1500, 4);
    let out = tmp.path().join("out");
    let args = |out: &Path| -> Vec<std::ffi::OsString> {
        [
            "--shards",
            "12",
            "--jobs",
            "1",
            "--readers",
            "1",
            "--shuffle",
            "--seed",
            "9",
        ]
        .iter()
        .map(|s| s.into())
        .chain([
            src.clone().into_os_string(),
            "-o".into(),
            out.as_os_str().into(),
        ])
        .collect()
    };
    let mut child = packfs().arg("pack").args(args(&out)).spawn().unwrap();
    // Kill it once the first shard is complete.
    wait_for_a_shard(&out);
    child.kill().unwrap();
    child.wait().unwrap();
    let kept = shards(&out);
    assert!(
        kept.len() < 12 && !out.join("flat.packfs-index").exists(),
        "the pack finished before it was killed"
    );
    // What is left: complete shards under their names; any other file is hidden and `.partial`.
    for shard in &kept {
        run(Command::new("tar").arg("-tf").arg(shard));
    }
    for e in fs::read_dir(&out).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(name.ends_with(".tar") || name.starts_with('.'), "{name}");
    }
    // A rerun without --resume refuses, naming the way out.
    let refused = packfs().arg("pack").args(args(&out)).output().unwrap();
    assert!(!refused.status.success());
    let msg = String::from_utf8_lossy(&refused.stderr);
    assert!(msg.contains("--resume") && msg.contains("--force"), "{msg}");
    let resumed = run(packfs().arg("pack").arg("--resume").args(args(&out)));
    assert!(resumed.contains("complete shard(s) kept"), "{resumed}");
    assert_no_partials(&out);
    // Byte for byte what an uninterrupted pack writes.
    let fresh = tmp.path().join("fresh");
    pack(
        &args(&fresh)
            .iter()
            .map(|s| s.as_os_str())
            .collect::<Vec<_>>(),
    );
    let (a, b) = (shards(&out), shards(&fresh));
    assert_eq!(a.len(), 12);
    for (x, y) in a.iter().zip(&b) {
        assert!(
            fs::read(x).unwrap() == fs::read(y).unwrap(),
            "{} differs from {}",
            x.display(),
            y.display()
        );
    }
    let index = out.join("flat.packfs-index");
    run(&mut verify_data(&index));
    let mnt = tmp.path().join("mnt");
    let _m = Mount::new(&[&index], &mnt, &[]);
    run(Command::new("diff")
        .arg("-r")
        .arg(&src)
        .arg(mnt.join("flat")));
}

#[test]
fn refuses_to_write_into_the_source_or_over_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 20, 5);
    let inside = packfs()
        .arg("pack")
        .arg(&src)
        .arg("-o")
        .arg(src.join("out"))
        .output()
        .unwrap();
    assert!(!inside.status.success());
    assert!(
        String::from_utf8_lossy(&inside.stderr).contains("never writes into"),
        "{}",
        String::from_utf8_lossy(&inside.stderr)
    );
    assert!(!src.join("out").join("flat-000000.tar").exists());
    let out = tmp.path().join("out");
    pack(&[os(&src), os("-o"), os(&out)]);
    let before = fs::read(out.join("flat-000000.tar")).unwrap();
    let again = packfs()
        .arg("pack")
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .arg("--mtime")
        .arg("0")
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert_eq!(fs::read(out.join("flat-000000.tar")).unwrap(), before);
    pack(&[
        os(&src),
        os("-o"),
        os(&out),
        os("--mtime"),
        os("0"),
        os("--force"),
    ]);
    assert_ne!(fs::read(out.join("flat-000000.tar")).unwrap(), before);
}

#[test]
fn images_are_resharded_and_converted() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("data");
    flat_samples(&src.join("flat"), 200, 6);
    write_file(&src.join("other/readme.txt"), b"hello\n", 0o600);
    // A zip of one part and a .tar.gz of the other, packed into 3 plain tar shards.
    run(Command::new("zip")
        .arg("-qr")
        .arg(tmp.path().join("a.zip"))
        .arg("flat")
        .current_dir(&src));
    run(Command::new("tar")
        .arg("-czf")
        .arg(tmp.path().join("b.tar.gz"))
        .arg("-C")
        .arg(&src)
        .arg("other"));
    let out = tmp.path().join("out");
    pack(&[
        os(&tmp.path().join("a.zip")),
        os(&tmp.path().join("b.tar.gz")),
        os("-o"),
        os(&out),
        os("--shards"),
        os("3"),
        os("--name"),
        os("mixed"),
    ]);
    assert_eq!(shards(&out).len(), 3);
    let mnt = tmp.path().join("mnt");
    let _m = Mount::new(&[&out.join("mixed.packfs-index")], &mnt, &[]);
    run(Command::new("diff").arg("-r").arg(&src).arg(&mnt));
    // And those shards resharded again, from their index, into 5.
    let out5 = tmp.path().join("out5");
    pack(&[
        os(&out.join("mixed.packfs-index")),
        os("-o"),
        os(&out5),
        os("--shards"),
        os("5"),
    ]);
    let mnt5 = tmp.path().join("mnt5");
    let _m5 = Mount::new(&[&out5.join("mixed.packfs-index")], &mnt5, &[]);
    run(Command::new("diff").arg("-r").arg(&src).arg(&mnt5));
}

#[test]
fn webdataset_and_wids_read_the_shards() {
    let Some(py) = python_with("webdataset", "webdataset") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 300, 7);
    let out = tmp.path().join("out");
    pack(&[
        os(&src),
        os("-o"),
        os(&out),
        os("--shards"),
        os("4"),
        os("--shuffle"),
    ]);
    let report = python(
        &py,
        r#"
import glob, json, os, sys
import webdataset as wds
src, out = sys.argv[1], sys.argv[2]
urls = sorted(glob.glob(os.path.join(out, "flat-*.tar")))
n = 0
for sample in wds.WebDataset(urls, shardshuffle=False):
    key = os.path.basename(sample["__key__"])
    for ext in ("jpg", "cls", "json"):
        assert sample[ext] == open(os.path.join(src, key + "." + ext), "rb").read(), (key, ext)
    n += 1
manifest = json.load(open(os.path.join(out, "flat.json")))
assert manifest["__kind__"] == "wids-shard-index-v1"
assert sum(s["nsamples"] for s in manifest["shardlist"]) == n
try:
    import wids  # a package of its own (webdataset 1.0 no longer carries it); needs torch
except ImportError:
    if not {"python:wids", "all"} & set(os.environ.get("PACKFS_ALLOW_SKIP", "").split(",")):
        raise
    print("SKIPPED (python:wids): wids is not installed: the manifest was checked by its fields", file=sys.stderr)
else:
    # The raw bytes (no decoding: these .jpg are not images), cached under the test's directory.
    ds = wids.ShardListDataset(os.path.join(out, "flat.json"), transformations=[],
                               cache_dir=os.path.join(out, "wids-cache"))
    assert len(ds) == n, (len(ds), n)
    s = ds[len(ds) - 1]
    assert s[".jpg"].read() == open(os.path.join(src, os.path.basename(s["__key__"]) + ".jpg"), "rb").read()
print(n)
"#,
        &[src.as_os_str(), out.as_os_str()],
    );
    assert_eq!(report.trim(), "300");
}

/// The classes and labels torchvision's ImageFolder would find under `root` (its scan, without
/// torchvision): checks that each image's label is its `.cls` content; prints the class count.
const IMAGEFOLDER_SCAN: &str = r#"
import os, sys
root, field = sys.argv[1], sys.argv[2]
classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
index = {c: i for i, c in enumerate(classes)}
n = 0
for c in classes:
    for dirpath, _, files in sorted(os.walk(os.path.join(root, c))):
        for f in sorted(files):
            if not f.endswith(".jpg"):
                continue
            key = os.path.join(dirpath, f[: -len(".jpg")])
            if field == "cls":
                want = int(open(key + ".cls").read())
            else:
                import json
                want = json.load(open(key + ".json"))[field]
            assert index[c] == want, (f, c, index[c], want)
            n += 1
print(len(classes), n)
"#;

#[test]
fn imagefolder_layout_over_shardwriter_shards() {
    let Some(py) = python_with("webdataset", "webdataset") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let shards_dir = tmp.path().join("wds");
    fs::create_dir_all(&shards_dir).unwrap();
    // 12 classes, so that sorting "10" before "2" would show.
    python(
        &py,
        r#"
import os, sys, json
import webdataset as wds
out = sys.argv[1]
with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=100) as sink:
    for i in range(360):
        sink.write({"__key__": "sample%05d" % i, "jpg": os.urandom(500 + i), "cls": i % 12,
                    "json": {"label": i % 12}})
"#,
        &[shards_dir.as_os_str()],
    );
    let pattern = shards_dir.join("shard-*.tar");
    let pattern = pattern.to_str().unwrap();
    for extra in [
        &["--layout", "imagefolder"][..],
        &["--layout", "imagefolder", "--class-field", "label"],
    ] {
        let mnt = tmp.path().join(format!("mnt{}", extra.len()));
        let shards: Vec<PathBuf> = glob_shards(&shards_dir);
        let shard_refs: Vec<&Path> = shards.iter().map(|p| p.as_path()).collect();
        let _m = Mount::new(&shard_refs, &mnt, extra);
        let field = if extra.len() == 2 { "cls" } else { "label" };
        let found = python(&py, IMAGEFOLDER_SCAN, &[mnt.as_os_str(), os(field)]);
        assert_eq!(found.trim(), "12 360", "{extra:?}");
    }
    // Converted by pack into class-directory shards: the default layout of those is ImageFolder's.
    let conv = tmp.path().join("conv");
    run(packfs()
        .args([
            "pack",
            "--layout",
            "imagefolder",
            "--name",
            "byclass",
            pattern,
            "-o",
        ])
        .arg(&conv));
    let mnt = tmp.path().join("mnt-conv");
    let _c = Mount::new(&[&conv.join("byclass.packfs-index")], &mnt, &[]);
    let found = python(&py, IMAGEFOLDER_SCAN, &[mnt.as_os_str(), os("cls")]);
    assert_eq!(found.trim(), "12 360");
    // Baked into an index: mounts as it is; asking again at mount is refused with the reason.
    let index = tmp.path().join("wds.packfs-index");
    run(packfs()
        .args(["index", "--layout", "imagefolder", pattern, "-o"])
        .arg(&index));
    let mnt = tmp.path().join("mnt-index");
    let _m = Mount::new(&[&index], &mnt, &[]);
    let found = python(&py, IMAGEFOLDER_SCAN, &[mnt.as_os_str(), os("cls")]);
    assert_eq!(found.trim(), "12 360");
    let no = tmp.path().join("mnt-no");
    fs::create_dir_all(&no).unwrap();
    let refused = mount_cmd(&[&index], &no, &["--layout", "imagefolder"], None);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("packfs index"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

fn glob_shards(dir: &Path) -> Vec<PathBuf> {
    shards(dir)
}

#[test]
fn shard_size_sets_the_number_of_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 400, 8);
    let total: u64 = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    let out = tmp.path().join("out");
    // About a quarter of the data per shard: 4 or 5 shards (headers add a little).
    let size = (total / 4).to_string();
    pack(&[os(&src), os("-o"), os(&out), os("--shard-size"), os(&size)]);
    let n = shards(&out).len();
    assert!((4..=5).contains(&n), "{n} shards");
    // Smaller than a sample: one shard per sample, not an error.
    let one = tmp.path().join("one");
    let small = flat_samples_dir(&tmp.path().join("few"), 3);
    pack(&[os(&small), os("-o"), os(&one), os("--shard-size"), os("1")]);
    assert_eq!(shards(&one).len(), 3);
    // More shards than samples: refused, saying so.
    let refused = packfs()
        .arg("pack")
        .arg(&small)
        .arg("-o")
        .arg(tmp.path().join("many"))
        .args(["--shards", "9"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("9 shards for 3 samples"));
}

fn flat_samples_dir(dir: &Path, n: usize) -> PathBuf {
    flat_samples(dir, n, 9);
    dir.to_path_buf()
}

/// Ctrl-C during a pack says, then and there, what is kept and how to go on (it exited 130 without
/// a word, and the next run was the first to mention --resume).
#[test]
fn ctrl_c_during_a_pack_says_how_to_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 1500, 4);
    let out = tmp.path().join("out");
    let child = packfs()
        .arg("pack")
        .args(["--shards", "12", "--jobs", "1", "--readers", "1"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_a_shard(&out);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let done = child.wait_with_output().unwrap();
    let msg = String::from_utf8_lossy(&done.stderr);
    if shards(&out).len() == 12 && done.status.success() {
        panic!("the pack finished before the signal: {msg}");
    }
    assert_eq!(done.status.code(), Some(130), "{msg}");
    assert!(
        msg.contains("pack interrupted") && msg.contains("--resume"),
        "{msg}"
    );
}

/// A pack and a scan in a batch job write their progress to a log file, where no bar is drawn:
/// a line every PACKFS_PROGRESS_EVERY seconds (30 by default) instead of nothing.
#[test]
fn progress_goes_to_a_log_as_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("flat");
    flat_samples(&src, 200, 5);
    let out = tmp.path().join("out");
    let log = tmp.path().join("job.log");
    let to_log = || std::process::Stdio::from(fs::File::create(&log).unwrap());
    let status = packfs()
        .env("PACKFS_PROGRESS_EVERY", "0")
        .args(["pack", "--shards", "2"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .stderr(to_log())
        .status()
        .unwrap();
    assert!(status.success());
    let said = fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("packfs: packing: ") && said.contains(" members"),
        "{said}"
    );
    let status = packfs()
        .env("PACKFS_PROGRESS_EVERY", "0")
        .arg("index")
        .args(shards(&out))
        .arg("-o")
        .arg(tmp.path().join("again.packfs-index"))
        .stderr(to_log())
        .status()
        .unwrap();
    assert!(status.success());
    let said = fs::read_to_string(&log).unwrap();
    assert!(said.contains("read (100%), 2 of 2 images"), "{said}");

    // Inside one image: a compressed tar of 256 MiB is scanned for seconds, and the lines say
    // how far in bytes (they said "0 of 1 images, 0 members" until it was done), from `index`
    // and from a mount's daemon, to its log too.
    let big = tmp.path().join("big.tar.gz");
    let made = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd {0} && truncate -s 256M zeros && tar -cf - zeros | gzip -1 > big.tar.gz && rm zeros",
            tmp.path().display()
        ))
        .status()
        .unwrap();
    assert!(made.success());
    let inside = |said: &str| {
        said.lines().any(|l| {
            l.contains("scanning: ") && l.contains(" read (") && l.contains("%), 0 of 1 images")
        })
    };
    let status = packfs()
        .env("PACKFS_PROGRESS_EVERY", "0")
        .arg("index")
        .arg(&big)
        .arg("-o")
        .arg(tmp.path().join("big.packfs-index"))
        .stderr(to_log())
        .status()
        .unwrap();
    assert!(status.success());
    let said = fs::read_to_string(&log).unwrap();
    assert!(inside(&said), "{said}");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let daemon_log = tmp.path().join("daemon.log");
    let mounted = packfs()
        .env("PACKFS_PROGRESS_EVERY", "0")
        .args(["mount", "--log-file"])
        .arg(&daemon_log)
        .arg(&big)
        .arg(&mnt)
        .stderr(to_log())
        .status()
        .unwrap();
    let _unmount = UnmountOnDrop(mnt.clone());
    assert!(mounted.success());
    let relayed = fs::read_to_string(&log).unwrap();
    assert!(inside(&relayed), "{relayed}");
    assert!(inside(&fs::read_to_string(&daemon_log).unwrap()));
}

/// The `.json` manifest given to `mount` (it sits beside the shards, with the dataset's name)
/// said "tar checksum error"; it now says what it is and what to mount.
#[test]
fn the_manifest_given_to_mount_says_what_to_mount() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("flat");
    flat_samples(&src, 20, 1);
    let out = dir.path().join("out");
    pack(&[os(&src), os("-o"), os(&out), os("--shards"), os("2")]);
    let manifest = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("pack writes a manifest");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let said = packfs()
        .arg("mount")
        .arg(&manifest)
        .arg(&mnt)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&said.stderr);
    assert!(!said.status.success());
    assert!(stderr.contains("JSON manifest"), "{stderr}");
    assert!(stderr.contains("packfs-index"), "{stderr}");
    assert!(!stderr.contains("checksum"), "{stderr}");
}

/// `--labels cls` on an ImageFolder tree: every sample gets its class number, ImageFolder's
/// (directories in name order), as a `.cls` member in its shard, where GNU tar and webdataset's
/// `to_tuple("jpg", "cls")` find it. Before, the label was only in the key.
#[test]
fn labels_go_beside_the_samples_of_an_imagefolder_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("train");
    for (class, n) in [("dog", 3), ("cat", 4), ("emu", 2)] {
        for i in 0..n {
            write_file(
                &src.join(class).join(format!("{class}{i}.jpg")),
                &bytes(i, 100 + i as usize),
                0o644,
            );
        }
    }
    let out = tmp.path().join("out");
    pack(&[
        os(&src),
        os("-o"),
        os(&out),
        os("--shards"),
        os("2"),
        os("--labels"),
        os("cls"),
    ]);
    let x = tmp.path().join("x");
    std::fs::create_dir(&x).unwrap();
    for shard in shards(&out) {
        run(Command::new("tar").arg("-xf").arg(&shard).arg("-C").arg(&x));
    }
    for (class, label, n) in [("cat", "0", 4), ("dog", "1", 3), ("emu", "2", 2)] {
        for i in 0..n {
            let cls = x.join(format!("train/{class}/{class}{i}.cls"));
            assert_eq!(
                std::fs::read_to_string(&cls).unwrap(),
                label,
                "{}",
                cls.display()
            );
        }
    }
    let Some(py) = python_with("webdataset", "webdataset") else {
        return;
    };
    let report = python(
        &py,
        r#"
import glob, os, sys
import webdataset as wds
urls = sorted(glob.glob(os.path.join(sys.argv[1], "train-*.tar")))
seen = {}
for key, jpg, cls in wds.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "jpg", "cls"):
    assert len(jpg) > 0
    seen[os.path.basename(key)] = int(cls)
print(sorted(seen.items()))
"#,
        &[out.as_os_str()],
    );
    let expected = "[('cat0', 0), ('cat1', 0), ('cat2', 0), ('cat3', 0), ('dog0', 1), ('dog1', 1), \
                    ('dog2', 1), ('emu0', 2), ('emu1', 2)]";
    assert_eq!(report.trim(), expected);
}
