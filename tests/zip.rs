//! Zip images (stored, deflated, zip64) mount as the tree they were made from, alone or mixed with
//! tar shards, from a scan or from an index.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const MANY: usize = 2_000;

fn source(tmp: &Path) -> PathBuf {
    let src = tmp.join("src");
    build_tree(&src, MANY);
    src
}

/// `zip -r -y` (symlinks kept as links) of `members` of `src`; `-0` stores instead of deflating.
fn zip(src: &Path, out: &Path, stored: bool, members: &[&str]) {
    let mut cmd = Command::new("zip");
    cmd.arg("-q").arg("-r").arg("-y");
    if stored {
        cmd.arg("-0");
    }
    run(cmd.arg(out).args(members).current_dir(src));
}

#[test]
fn stored_and_deflated_zips_mount_as_their_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    for stored in [true, false] {
        let img = tmp.path().join(if stored { "s.zip" } else { "d.zip" });
        zip(&src, &img, stored, &["."]);
        let mnt = Mount::new(&[&img], &tmp.path().join(format!("m-{stored}")), &[]);
        assert_same_tree(&src, &mnt.dir, &[]);
        // Many readers on the same deflated members at once get the same bytes.
        let blob = fs::read(src.join("big/blob.bin")).unwrap();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| assert!(fs::read(mnt.dir.join("big/blob.bin")).unwrap() == blob));
            }
        });
    }
}

#[test]
fn zip64_with_more_than_65535_members() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("big.zip");
    run(Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, zipfile\n\
         with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:\n\
         \x20   for i in range(70000):\n\
         \x20       z.writestr(f'd{i // 1000:03d}/f{i:05d}.txt', f'{i}\\n')\n",
        )
        .arg(&img));
    let mnt = Mount::new(&[&img], &tmp.path().join("m"), &[]);
    let count: usize = fs::read_dir(&mnt.dir)
        .unwrap()
        .map(|d| fs::read_dir(d.unwrap().path()).unwrap().count())
        .sum();
    assert_eq!(count, 70_000);
    for i in [0, 65_535, 65_536, 69_999] {
        let path = mnt.dir.join(format!("d{:03}/f{i:05}.txt", i / 1000));
        assert_eq!(fs::read_to_string(path).unwrap(), format!("{i}\n"));
    }
}

#[test]
fn tar_and_zip_mix_in_one_mount_and_one_index() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let tar = tmp.path().join("part.tar");
    tar_members(&src, &tar, &["train", "big", "empty.bin"]);
    let zipped = tmp.path().join("part.zip");
    zip(
        &src,
        &zipped,
        false,
        &["many", "deep", VERY_LONG_DIR, "abs_link", "dangling"],
    );
    let index = tmp.path().join("mixed.packfs-index");
    run(packfs()
        .arg("index")
        .arg(&tar)
        .arg(&zipped)
        .arg("-o")
        .arg(&index));
    let from_index = Mount::new(&[&index], &tmp.path().join("m-index"), &[]);
    assert_same_tree(&src, &from_index.dir, &[]);
    let scanned = Mount::new(&[&tar, &zipped], &tmp.path().join("m-scan"), &[]);
    assert_same_tree(&src, &scanned.dir, &[]);
}
