//! One damaged tar header costs the member it describes, not the shard: GNU tar skips to the next
//! valid header and goes on, and packfs lists and serves what GNU tar lists and extracts. Tars
//! written by GNU tar (gnu and pax formats, long names, symlinks, a hard link), then one byte of
//! one header flipped, many times over.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use common::*;

/// A tree of files of assorted sizes (some over a block, some empty), long names, a symlink and a
/// hard link.
fn tree(root: &Path, rng: &mut Rng) {
    for i in 0..24 {
        let dir = format!("c{}", i % 3);
        let name = if i % 7 == 3 {
            format!("{dir}/{}-{i}", "long".repeat(30))
        } else {
            format!("{dir}/f{i}")
        };
        let len = match i % 4 {
            0 => 0,
            1 => rng.below(500) as usize,
            _ => 500 + rng.below(4000) as usize,
        };
        write_file(&root.join(name), &bytes(i, len), 0o644);
    }
    std::os::unix::fs::symlink("f1", root.join("c1/link")).unwrap();
    fs::hard_link(root.join("c2/f2"), root.join("c2/hard")).unwrap();
}

/// The offsets of every header GNU tar wrote (`--block-number`), but the first: a first block
/// that is not a header is not taken for a tar at all.
fn header_offsets(tar: &Path) -> Vec<u64> {
    let out = Command::new("tar")
        .args(["--block-number", "-tvf"])
        .arg(tar)
        .output()
        .unwrap();
    assert_ok(&out);
    let mut offsets: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("block "))
        .filter_map(|l| l.split(':').next()?.trim().parse::<u64>().ok())
        .map(|b| b * 512)
        .filter(|&o| o > 0)
        .collect();
    // The extension records before a member (pax `x`, GNU `L`) are headers too.
    let bytes = fs::read(tar).unwrap();
    for at in (512..bytes.len()).step_by(512) {
        let flag = bytes[at + 156];
        if matches!(flag, b'x' | b'L' | b'K') && bytes[at + 257..at + 262] == *b"ustar" {
            offsets.push(at as u64);
        }
    }
    offsets.sort();
    offsets.dedup();
    offsets
}

/// What GNU tar extracts from `tar` (regular files and symlinks: path -> bytes or target),
/// whatever its exit status (2 after a damaged header).
fn gnu_extract(tar: &Path, into: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::create_dir_all(into).unwrap();
    let _ = Command::new("tar")
        .arg("-xf")
        .arg(tar)
        .arg("-C")
        .arg(into)
        .output()
        .unwrap();
    let mut found = BTreeMap::new();
    walk(into, into, &mut found);
    found
}

fn walk(root: &Path, dir: &Path, found: &mut BTreeMap<String, Vec<u8>>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let meta = fs::symlink_metadata(&p).unwrap();
        if meta.is_symlink() {
            let target = fs::read_link(&p).unwrap();
            found.insert(rel, target.to_string_lossy().as_bytes().to_vec());
        } else if meta.is_dir() {
            walk(root, &p, found);
        } else {
            found.insert(rel, fs::read(&p).unwrap());
        }
    }
}

/// What packfs serves of `tar` through a mount, the same way.
fn packfs_serves(tar: &Path, mnt: &Path) -> (BTreeMap<String, Vec<u8>>, String) {
    let m = Mount::new(&[tar], mnt, &[]);
    let mut found = BTreeMap::new();
    walk(&m.dir, &m.dir, &mut found);
    (found, m.stderr.clone())
}

#[test]
fn a_damaged_header_costs_its_member_as_gnu_tar_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(40);
    let src = dir.path().join("src");
    tree(&src, &mut rng);
    let (mut mutants, mut lost) = (0, 0);
    for format in ["gnu", "pax"] {
        let tar = dir.path().join(format!("{format}.tar"));
        run(Command::new("tar")
            .arg(format!("--format={format}"))
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(&src)
            .args(["c0", "c1", "c2"]));
        let clean = fs::read(&tar).unwrap();
        let offsets = header_offsets(&tar);
        assert!(offsets.len() > 20, "{offsets:?}");
        for round in 0..20 {
            let at = *rng.pick(&offsets) + rng.below(512);
            let mut bytes = clean.clone();
            bytes[at as usize] ^= 1 + rng.below(255) as u8;
            let mutant = dir.path().join(format!("{format}-{round}.tar"));
            fs::write(&mutant, &bytes).unwrap();
            let want = gnu_extract(&mutant, &dir.path().join(format!("x-{format}-{round}")));
            let (got, said) =
                packfs_serves(&mutant, &dir.path().join(format!("m-{format}-{round}")));
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                want.keys().collect::<Vec<_>>(),
                "{format} tar, byte {at} flipped: packfs serves other members than GNU tar \
                 extracts\n{said}"
            );
            assert!(
                got == want,
                "{format} tar, byte {at}: other bytes than GNU tar's"
            );
            // A damaged directory or extension header costs no file.
            lost += usize::from(want.len() < 26);
            mutants += 1;
        }
    }
    assert_eq!(mutants, 40);
    assert!(
        lost >= 10,
        "only {lost} of 40 mutants lost a file: the test damages too little"
    );
}

/// The warning names the image, the offset of the damaged header, and says what was done; `ls`
/// exits 0 and lists the other members; a header with a bad checksum is never served.
#[test]
fn a_damaged_header_is_warned_about_with_its_offset() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..3)
        .map(|i| (format!("d/f{i}"), bytes(i, 1000)))
        .collect();
    let (_, tar) = tar_of(dir.path(), "s", &files);
    let mut bytes = fs::read(&tar).unwrap();
    let at = (0..bytes.len())
        .step_by(512)
        .find(|&at| bytes[at..].starts_with(b"d/f1\0"))
        .unwrap();
    bytes[at + 124] ^= 0x04; // its size field: the checksum no longer matches
    fs::write(&tar, &bytes).unwrap();
    let out = packfs().arg("ls").arg(&tar).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let listing = String::from_utf8_lossy(&out.stdout);
    let mut names: Vec<_> = listing.lines().collect();
    names.sort();
    assert_eq!(names, ["d", "d/f0", "d/f2"]);
    assert!(
        err.contains("\"d/f1\"")
            && err.contains(&format!("offset={at}"))
            && err.contains("damaged"),
        "{err}"
    );
    assert!(err.contains(tar.to_str().unwrap()), "{err}");
}

/// `packfs status` says how many members the scan left out and how many behind a damaged header,
/// for a mount that scanned the image and for one from its index alike.
#[test]
fn status_counts_the_members_a_damaged_header_cost() {
    let dir = tempfile::tempdir().unwrap();
    let files: Vec<_> = (0..4).map(|i| (format!("d/f{i}"), bytes(i, 700))).collect();
    let (_, tar) = tar_of(dir.path(), "s", &files);
    let mut raw = fs::read(&tar).unwrap();
    for name in [&b"d/f1\0"[..], b"d/f3\0"] {
        let at = (0..raw.len())
            .step_by(512)
            .find(|&at| raw[at..].starts_with(name))
            .unwrap();
        raw[at + 130] ^= 0x01;
    }
    fs::write(&tar, &raw).unwrap();
    let index = dir.path().join("s.packfs-index");
    run(packfs().arg("index").arg(&tar).arg("-o").arg(&index));
    for (what, source) in [("image", &tar), ("index", &index)] {
        let m = Mount::new(
            &[source.as_path()],
            &dir.path().join(format!("m-{what}")),
            &[],
        );
        let text = run(packfs().arg("status").arg(&m.dir));
        assert!(
            text.contains(
                "skipped   2 member(s) left out at scan, 2 of them behind a damaged tar header"
            ),
            "{what}: {text}"
        );
        let json = run(packfs().args(["status", "--json"]).arg(&m.dir));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v[0]["counters"]["skipped_members"], 2, "{what}: {json}");
        assert_eq!(v[0]["counters"]["damaged_headers"], 2, "{what}: {json}");
    }
}
