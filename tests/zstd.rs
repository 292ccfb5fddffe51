//! zstd-compressed tars served by frame: streams written by GNU tar (`--zstd`), the zstd command
//! (one frame; `-T0 --long`; no checksum), pzstd, and frames concatenated by hand, each mounted and
//! compared with the source tree GNU tar packed (and which GNU tar extracts from each); damage
//! after indexing is an EIO for the members of the damaged frame only; a frame larger than a read
//! may decode is refused with the commands that serve the data.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::process::Command;

use common::*;

#[test]
fn tar_zst_from_every_writer_mounts_as_its_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    build_tree(&src, 300);
    write_file(&src.join("text/tokens.txt"), &text(7, 3 << 20), 0o644);
    let s = src.display();
    sh(&format!("tar -cf plain.tar -C {s} ."), d);
    sh(&format!("tar --zstd -cf gnu.tar.zst -C {s} ."), d);
    sh("zstd -q -T0 --long -c plain.tar > long.tar.zst", d);
    sh("zstd -q --no-check -c plain.tar > nocheck.tar.zst", d);
    sh("pzstd -q -p 2 -c plain.tar > pz.tar.zst", d);
    // Frames of 400 kB of tar each, concatenated: a frame boundary inside members and headers.
    sh(
        "split -b 400000 plain.tar part. && for p in part.*; do zstd -q -c $p; done > frames.tar.zst",
        d,
    );
    for name in [
        "gnu.tar.zst",
        "long.tar.zst",
        "nocheck.tar.zst",
        "pz.tar.zst",
        "frames.tar.zst",
    ] {
        let img = d.join(name);
        // GNU tar reads each the same.
        let out = d.join(format!("x-{name}"));
        fs::create_dir(&out).unwrap();
        sh(&format!("tar --zstd -xf {name} -C x-{name}"), d);
        assert_same_tree(&src, &out, &[]);
        let mnt = Mount::new(&[&img], &d.join(format!("m-{name}")), &[]);
        assert_same_tree(&src, &mnt.dir, &[]);
        let want = fs::read(src.join("text/tokens.txt")).unwrap();
        let f = fs::File::open(mnt.dir.join("text/tokens.txt")).unwrap();
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..100 {
            let x = rng.next();
            let at = (x % want.len() as u64) as usize;
            let len = ((x >> 40) as usize % 200_000).min(want.len() - at);
            let mut got = vec![0u8; len];
            f.read_exact_at(&mut got, at as u64).unwrap();
            assert!(
                got == want[at..at + len],
                "{name}: bytes {at}..{}",
                at + len
            );
        }
    }
    // The listing says where a member's bytes come from: the concatenated stream in many frames.
    let ls = run(packfs()
        .arg("ls")
        .arg("--extents")
        .arg(d.join("frames.tar.zst")));
    let line = ls.lines().find(|l| l.contains("text/tokens.txt")).unwrap();
    assert!(line.contains("zstd"), "{line}");
    assert!(count_before(line, "frames") >= 3, "{line}");
}

#[test]
fn tar_zst_index_serves_and_damage_is_eio_in_its_frame_only() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    write_file(&src.join("train/a/img 001.jpg"), &bytes(1, 3000), 0o644);
    write_file(&src.join("text/tokens.txt"), &text(9, 6 << 20), 0o644);
    // The small file in the first frame; the damage goes into a later one.
    sh(
        "tar -cf plain.tar -C src train text && split -b 1000000 plain.tar part. && \
         for p in part.*; do zstd -q -c $p; done > ds.tar.zst",
        d,
    );
    let img = d.join("ds.tar.zst");
    let index = d.join("ds.packfs-index");
    run(packfs().arg("index").arg(&img).arg("-o").arg(&index));
    let ok = run(&mut verify_data(&index));
    assert!(ok.contains("read and checked"), "{ok}");

    // One compressed byte flipped in a middle frame (size, mtime and both ends unchanged).
    let len = fs::metadata(&img).unwrap().len();
    damage_in_place(&img, len / 2, 0x55);
    let t = Command::new("zstd").arg("-t").arg(&img).output().unwrap();
    assert!(!t.status.success(), "zstd -t accepts the damage");
    let out = packfs().arg("ls").arg(&img).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("ds.tar.zst: at byte offset") && err.contains("zstd"),
        "{err}"
    );

    // Through the index made before: the small file reads, and so do the parts of the text
    // before the damaged frame; a read that needs that frame fails with EIO, named in the log.
    let log = d.join("m.log");
    let mnt = Mount::new(
        &[&index],
        &d.join("m"),
        &["--log-file", log.to_str().unwrap()],
    );
    assert_eq!(
        fs::read(mnt.dir.join("train/a/img 001.jpg")).unwrap(),
        bytes(1, 3000)
    );
    let f = fs::File::open(mnt.dir.join("text/tokens.txt")).unwrap();
    let mut head = vec![0u8; 100_000];
    f.read_exact_at(&mut head, 0).unwrap();
    assert!(head == text(9, 6 << 20)[..100_000]);
    match fs::read(mnt.dir.join("text/tokens.txt")) {
        Ok(_) => panic!("a damaged frame was served"),
        Err(err) => assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}"),
    }
    drop(mnt);
    let log = fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("ds.tar.zst") && log.contains("text/tokens.txt"),
        "{log}"
    );
}

#[test]
fn a_frame_larger_than_a_read_may_decode_is_refused_with_the_way_out() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // 70 MiB of zeros in one member, sparse on disk: a single frame of more than 64 MiB, with its
    // size in the frame header (from a file) and without (from a pipe).
    sh(
        "truncate -s 70M big.bin && tar -cf big.tar big.bin && zstd -q -c big.tar > sized.tar.zst \
         && tar -cf - big.bin | zstd -q -c > piped.tar.zst",
        d,
    );
    for name in ["sized.tar.zst", "piped.tar.zst"] {
        let out = packfs().arg("ls").arg(d.join(name)).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        assert!(
            err.contains(&format!(
                "{name}: at byte offset 0: a zstd frame larger than 64 MiB"
            )) && err.contains("zstd -d")
                && err.contains("pzstd"),
            "{name}: {err}"
        );
    }
}
