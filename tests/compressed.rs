//! Deflate served at any offset through restart checkpoints: gzip-compressed tars written by GNU
//! tar, bsdtar, Python and gzip itself (several members back to back), and zip members deflated
//! beyond one checkpoint interval. Each mount is compared with the source tree and with random
//! reads across the checkpoints; damage after indexing is an EIO for the reads it touches.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// The shared tree plus 13 MiB of text (four checkpoint intervals) and a sparse file with a hard
/// link to it.
fn source(tmp: &Path) -> PathBuf {
    let src = tmp.join("src");
    build_tree(&src, 500);
    write_file(&src.join("text/log.txt"), &text(9, 13 << 20), 0o644);
    let sparse = src.join("text/holes.bin");
    let f = fs::File::create(&sparse).unwrap();
    f.set_len(3 << 20).unwrap();
    f.write_all_at(&bytes(10, 5000), 1 << 20).unwrap();
    f.write_all_at(&bytes(11, 7000), 2 << 20).unwrap();
    drop(f);
    fs::hard_link(&sparse, src.join("text/holes-link.bin")).unwrap();
    src
}

/// The checkpoint count in a `packfs ls --extents` line.
fn checkpoints(line: &str) -> usize {
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "checkpoints").unwrap();
    words[at - 1].parse().unwrap()
}

/// Random ranges of `file` in the mount read with pread match the source's.
fn assert_random_reads(src: &Path, mnt: &Path, file: &str) {
    let want = fs::read(src.join(file)).unwrap();
    let f = fs::File::open(mnt.join(file)).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..200 {
        let x = rng.next();
        let at = (x % want.len() as u64) as usize;
        let len = ((x >> 40) as usize % 300_000).min(want.len() - at);
        let mut got = vec![0u8; len];
        f.read_exact_at(&mut got, at as u64).unwrap();
        assert!(
            got == want[at..at + len],
            "{file}: bytes {at}..{}",
            at + len
        );
    }
}

#[test]
fn tar_gz_from_every_writer_mounts_as_its_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let src = source(tmp.path());
    let d = tmp.path();
    let s = src.display();
    // GNU tar -z; bsdtar -z; Python's tarfile; a tar cut in two and gzipped as two members
    // (what `cat a.gz b.gz` and pigz --independent-like writers make), with zero padding after.
    sh(&format!("tar -czf gnu.tar.gz -C {s} ."), d);
    sh(&format!("bsdtar -czf bsd.tgz -C {s} ."), d);
    sh(
        &format!(
            "python3 -c 'import tarfile,sys; t=tarfile.open(\"py.tar.gz\",\"w:gz\",format=tarfile.PAX_FORMAT); t.add(\"{s}\", arcname=\".\"); t.close()'"
        ),
        d,
    );
    sh(
        &format!(
            "tar -cf plain.tar -C {s} . && head -c 5000000 plain.tar | gzip -1 > two.tar.gz && \
             tail -c +5000001 plain.tar | gzip -9 >> two.tar.gz && head -c 1024 /dev/zero >> two.tar.gz"
        ),
        d,
    );
    // Sparse members (old GNU and PAX 1.0), the hard link to one sharing its map.
    sh(
        &format!("tar --sparse --format=gnu -czf sparse-gnu.tar.gz -C {s} ."),
        d,
    );
    sh(
        &format!("tar --sparse --format=posix -czf sparse-pax.tar.gz -C {s} ."),
        d,
    );
    for name in [
        "gnu.tar.gz",
        "bsd.tgz",
        "py.tar.gz",
        "two.tar.gz",
        "sparse-gnu.tar.gz",
        "sparse-pax.tar.gz",
    ] {
        let img = d.join(name);
        let log = d.join(format!("{name}.log"));
        let mnt = Mount::new(
            &[&img],
            &d.join(format!("m-{name}")),
            &["--log-file", log.to_str().unwrap()],
        );
        assert_same_tree(&src, &mnt.dir, &[]);
        assert_random_reads(&src, &mnt.dir, "text/log.txt");
        assert_random_reads(&src, &mnt.dir, "big/blob.bin");
        // Eight readers at once, on members spread over the intervals.
        std::thread::scope(|s| {
            for t in 0..8 {
                let (src, mnt) = (&src, &mnt.dir);
                s.spawn(move || {
                    for f in ["text/log.txt", "big/odd.bin", "text/holes-link.bin"] {
                        let f = if t % 2 == 0 { f } else { "text/holes.bin" };
                        assert!(fs::read(mnt.join(f)).unwrap() == fs::read(src.join(f)).unwrap());
                    }
                });
            }
        });
        drop(mnt);
        if name == "two.tar.gz" {
            let log = fs::read_to_string(&log).unwrap();
            assert!(
                log.contains("zero bytes follow the last gzip member"),
                "{log}"
            );
        }
    }
    // The listing says where a member's bytes come from.
    let ls = run(packfs()
        .arg("ls")
        .arg("--extents")
        .arg(d.join("gnu.tar.gz")));
    let line = ls.lines().find(|l| l.contains("text/log.txt")).unwrap();
    assert!(checkpoints(line) >= 5, "{line}");
    let ls = run(packfs()
        .arg("ls")
        .arg("--extents")
        .arg(d.join("sparse-pax.tar.gz")));
    for file in ["text/holes.bin", "text/holes-link.bin"] {
        let line = ls.lines().find(|l| l.contains(file)).unwrap();
        assert!(line.contains("sparse, 2 data segments, inflated"), "{line}");
    }
}

#[test]
fn tar_gz_index_serves_and_damage_is_eio_where_it_lies() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    write_file(&src.join("train/cls_a/img 001.jpg"), &bytes(1, 3000), 0o644);
    write_file(&src.join("text/log.txt"), &text(9, 13 << 20), 0o644);
    // The small file first, in the first interval; the damage goes into a later one.
    sh("tar -czf ds.tar.gz -C src train text", d);
    let img = d.join("ds.tar.gz");
    let index = d.join("ds.packfs-index");
    run(packfs().arg("index").arg(&img).arg("-o").arg(&index));
    let ok = run(&mut verify_data(&index));
    assert!(ok.contains("read and checked"), "{ok}");
    {
        let mnt = Mount::new(&[&index], &d.join("m1"), &[]);
        assert_same_tree(&src, &mnt.dir, &[]);
    }

    // Flip one compressed byte in the text file's data (size, mtime and ends unchanged).
    let len = fs::metadata(&img).unwrap().len();
    damage_in_place(&img, len * 3 / 4, 0x55);
    // `gzip -t` rejects the file; scanning it names the compressed offset.
    let t = Command::new("gzip").arg("-t").arg(&img).output().unwrap();
    assert!(!t.status.success());
    let out = packfs().arg("ls").arg(&img).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("ds.tar.gz: at byte offset") && err.contains("gzip"),
        "{err}"
    );

    // Through the index made before the damage: small files elsewhere still read; the reads
    // that need the damaged interval fail with EIO, logged with the image.
    let log = d.join("m2.log");
    let mnt = Mount::new(
        &[&index],
        &d.join("m2"),
        &["--log-file", log.to_str().unwrap()],
    );
    assert_eq!(
        fs::read(mnt.dir.join("train/cls_a/img 001.jpg")).unwrap(),
        bytes(1, 3000)
    );
    match fs::read(mnt.dir.join("text/log.txt")) {
        Ok(_) => panic!("a damaged interval was served"),
        Err(err) => assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}"),
    }
    drop(mnt);
    let log = fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("ds.tar.gz") && log.contains("text/log.txt"),
        "{log}"
    );
    let out = verify_data(&index).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("text/log.txt"));
}

#[test]
fn damaged_and_foreign_gzip_files_are_refused_with_the_offset() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    write_file(&src.join("a.txt"), &text(1, 3 << 20), 0o644);
    write_file(&src.join("b.bin"), &bytes(2, 1 << 20), 0o644);
    sh("tar -czf full.tar.gz -C src .", d);
    let full = fs::read(d.join("full.tar.gz")).unwrap();
    // Cut in the middle: gzip says "unexpected end of file"; packfs names where the data ends.
    fs::write(d.join("cut.tar.gz"), &full[..full.len() / 2]).unwrap();
    // Not a tar inside.
    sh("gzip -c src/b.bin > notatar.gz", d);
    // A sound gzip stream around a tar cut inside a member.
    sh(
        "tar -cf - -C src . | head -c 2000000 | gzip > cuttar.tar.gz",
        d,
    );
    for (name, want) in [
        ("cut.tar.gz", "cut short"),
        ("notatar.gz", "whose content is not a tar archive"),
        ("cuttar.tar.gz", "runs past the end of the decompressed tar"),
        ("cuttar.tar.gz", "(the offset is in the decompressed tar)"),
    ] {
        let out = packfs().arg("ls").arg(d.join(name)).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: {err}");
        assert!(
            err.contains(&format!("{name}: at byte offset")) && err.contains(want),
            "{name}: {err}"
        );
    }
}

#[test]
fn zip_members_deflated_beyond_one_interval() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    write_file(&src.join("big/log.txt"), &text(3, 21 << 20), 0o644);
    write_file(&src.join("big/random.bin"), &bytes(4, 9 << 20), 0o644);
    write_file(&src.join("small.txt"), &text(5, 100_000), 0o644);
    run(Command::new("zip")
        .args(["-q", "-r", "-6", "a.zip", "."])
        .current_dir(&src));
    let img = src.join("a.zip");
    let moved = d.join("a.zip");
    fs::rename(&img, &moved).unwrap();
    let mnt = Mount::new(&[&moved], &d.join("m"), &[]);
    assert_same_tree(&src, &mnt.dir, &[]);
    assert_random_reads(&src, &mnt.dir, "big/log.txt");
    assert_random_reads(&src, &mnt.dir, "big/random.bin");
    drop(mnt);
    let ls = run(packfs().arg("ls").arg("--extents").arg(&moved));
    let line = ls.lines().find(|l| l.contains("big/log.txt")).unwrap();
    assert!(checkpoints(line) >= 5, "{line}");

    // One byte flipped inside log.txt's deflate data: unzip -t finds it; packfs skips that
    // member with a warning naming it, and serves the others.
    let raw = fs::read(&moved).unwrap();
    let at = raw.len() / 8;
    let f = fs::File::options().write(true).open(&moved).unwrap();
    f.write_all_at(&[raw[at] ^ 0x20], at as u64).unwrap();
    drop(f);
    let t = Command::new("unzip")
        .arg("-t")
        .arg(&moved)
        .output()
        .unwrap();
    assert!(!t.status.success(), "{t:?}");
    let out = packfs().arg("ls").arg(&moved).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("big/log.txt"), "{stderr}");
    assert!(
        !stdout.contains("log.txt") && stdout.contains("random.bin"),
        "{stdout}"
    );
}
