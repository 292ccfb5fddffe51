//! `packfs pack --compress zstd`: shards in the zstd seekable format that the zstd command, GNU
//! tar and pyzstd's seekable reader read as ordinary `.tar.zst`, that mount through the index
//! `pack` wrote (and through one `packfs index` makes of them) as the source tree, with frames cut
//! at members; `--resume` keeps complete compressed shards; a seekable file another writer made
//! (pyzstd) mounts too.

mod common;

use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

#[test]
fn compressed_packs_read_everywhere_and_mount_as_their_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("ds");
    build_tree(&src, 300);
    write_file(&src.join("text/tokens.txt"), &text(21, 3 << 20), 0o644);
    let out = d.join("out");
    let report = run(packfs().arg("pack").arg(&src).arg("-o").arg(&out).args([
        "--shards",
        "3",
        "--compress",
        "zstd:6",
        "--frame-size",
        "64K",
    ]));
    assert!(report.contains("3 shard(s)"), "{report}");
    let shards: Vec<_> = (0..3)
        .map(|k| out.join(format!("ds-00000{k}.tar.zst")))
        .collect();
    let manifest = fs::read_to_string(out.join("ds.json")).unwrap();
    assert!(
        manifest.contains("\"compression\": \"zstd:6\""),
        "{manifest}"
    );
    assert!(manifest.contains("ds-000002.tar.zst"), "{manifest}");
    // The zstd command checks every frame; GNU tar extracts each shard, and every file it
    // extracts is the source's (times and modes are compared through the mount below: directory
    // times of a tree extracted shard by shard are those of the last extraction).
    let mut extracted = 0;
    for (k, s) in shards.iter().enumerate() {
        run(Command::new("zstd").arg("-q").arg("-t").arg(s));
        let x = d.join(format!("x{k}"));
        fs::create_dir(&x).unwrap();
        run(Command::new("tar")
            .arg("--zstd")
            .arg("-xf")
            .arg(s)
            .arg("-C")
            .arg(&x));
        extracted += same_files(&x.join("ds"), &src);
    }
    assert_eq!(extracted, same_files(&src, &src));
    // Through the index pack wrote, and through one made from the shards: the same tree.
    let index = out.join("ds.packfs-index");
    let mnt = Mount::new(&[&index], &d.join("m"), &[]);
    assert_same_tree(&src, &mnt.dir.join("ds"), &[]);
    drop(mnt);
    let rescanned = d.join("again.packfs-index");
    let mut cmd = packfs();
    cmd.arg("index").args(&shards).arg("-o").arg(&rescanned);
    run(&mut cmd);
    let listing = |i: &Path| run(packfs().arg("ls").arg("--extents").arg(i));
    let (written, scanned) = (listing(&index), listing(&rescanned));
    assert_eq!(
        written, scanned,
        "pack's index and a scan's place members differently"
    );
    let line = written
        .lines()
        .find(|l| l.contains("text/tokens.txt"))
        .unwrap();
    assert!(line.contains("zstd, at offset"), "{line}");
    let ok = run(&mut verify_data(&index));
    assert!(ok.contains("read and checked"), "{ok}");

    // pyzstd's reader of the seekable format finds the seek table and reads each member where
    // the tar says it is; the frames, by the seek table, are cut at members: a member smaller
    // than a frame lies in one frame.
    let Some(py) = python_with("pyzstd", "pyzstd") else {
        return;
    };
    let probe = r#"
import struct, sys, tarfile, pyzstd
path, frame = sys.argv[1], int(sys.argv[2])
# The seek table, read by hand: where each frame ends in the decoded tar.
raw = open(path, "rb").read()
count, _, magic = struct.unpack("<IBI", raw[-9:])
assert magic == 0x8F92EAB1, hex(magic)
ends, at = [], 0
for i in range(count):
    _, size = struct.unpack("<II", raw[len(raw) - 9 - 8 * (count - i):][:8])
    at += size
    ends.append(at)
with pyzstd.SeekableZstdFile(path, "r") as f:
    t = tarfile.open(fileobj=f, mode="r:")
    for m in t.getmembers():
        end = m.offset_data + (m.size + 511) // 512 * 512
        cut = [e for e in ends if m.offset < e < end]
        assert end - m.offset > frame or not cut, (m.name, m.offset, end, cut)
        if m.isfile():
            f.seek(m.offset_data)
            data = f.read(m.size)
            assert data == t.extractfile(m).read(), m.name
    print(len(t.getmembers()))
"#;
    let mut members = 0;
    for s in &shards {
        let n: usize = python(&py, probe, &[s.as_os_str(), "65536".as_ref()])
            .trim()
            .parse()
            .unwrap();
        members += n;
    }
    assert_eq!(members, written.lines().count(), "{written}");
}

/// Checks that every regular file under `got` is the file of the same path under `want`; how
/// many there are.
fn same_files(got: &Path, want: &Path) -> usize {
    let mut n = 0;
    for entry in fs::read_dir(got).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let other = want.join(entry.file_name());
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            n += same_files(&path, &other);
        } else if kind.is_file() {
            assert!(
                fs::read(&path).unwrap() == fs::read(&other).unwrap(),
                "{}",
                path.display()
            );
            n += 1;
        }
    }
    n
}

#[test]
fn resume_keeps_complete_compressed_shards() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("ds");
    build_tree(&src, 120);
    let out = d.join("out");
    let pack = |extra: &[&str]| {
        let mut cmd = packfs();
        cmd.arg("pack")
            .arg(&src)
            .arg("-o")
            .arg(&out)
            .args(["--shards", "2", "--compress", "zstd"])
            .args(extra);
        run(&mut cmd)
    };
    pack(&[]);
    let first = fs::read(out.join("ds-000000.tar.zst")).unwrap();
    fs::remove_file(out.join("ds-000001.tar.zst")).unwrap();
    fs::remove_file(out.join("ds.packfs-index")).unwrap();
    let report = pack(&["--resume"]);
    assert!(report.contains("1 complete shard(s) kept"), "{report}");
    assert!(fs::read(out.join("ds-000000.tar.zst")).unwrap() == first);
    let mnt = Mount::new(&[&out.join("ds.packfs-index")], &d.join("m"), &[]);
    assert_same_tree(&src, &mnt.dir.join("ds"), &[]);
}

#[test]
fn a_seekable_file_from_another_writer_mounts() {
    let Some(py) = python_with("pyzstd", "pyzstd") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    build_tree(&src, 150);
    sh("tar -cf plain.tar -C src .", d);
    let img = d.join("py.tar.zst");
    let write = r#"
import sys, pyzstd
with open(sys.argv[1], "rb") as i, pyzstd.SeekableZstdFile(sys.argv[2], "w", max_frame_content_size=50000) as o:
    o.write(i.read())
"#;
    python(
        &py,
        write,
        &[d.join("plain.tar").as_os_str(), img.as_os_str()],
    );
    let ls = run(packfs().arg("ls").arg("--extents").arg(&img));
    assert!(ls.contains("zstd, at offset"), "{ls}");
    let mnt = Mount::new(&[&img], &d.join("m"), &[]);
    assert_same_tree(&src, &mnt.dir, &[]);
}
