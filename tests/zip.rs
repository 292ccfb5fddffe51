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

/// Writes `img` with a Python script (zipfile, sometimes patched where no tool writes the odd
/// layout a test needs).
fn python_zip(script: &str, img: &Path) {
    run(Command::new("python3").arg("-c").arg(script).arg(img));
}

/// Extracts `img` with Info-ZIP unzip (`args` before the archive) into `dir`; unzip's exit codes
/// for warnings and skipped members (1 to 3) are accepted, and returned.
fn unzip_into(img: &Path, dir: &Path, args: &[&str]) -> Option<i32> {
    let out = Command::new("unzip")
        .arg("-q")
        .args(args)
        .arg(img)
        .arg("-d")
        .arg(dir)
        .output()
        .unwrap();
    assert!(matches!(out.status.code(), Some(0..=3)), "{out:?}");
    out.status.code()
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

#[test]
fn names_that_are_not_utf8_are_served_as_stored() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    // Latin-1 and Shift-JIS bytes, as old Windows zip tools store them.
    let names: [&[u8]; 2] = [b"caf\xe9.txt", b"\x93\xfa\x96\x7b.txt"];
    for (i, name) in names.iter().enumerate() {
        write_file(
            &src.join("legacy").join(OsStr::from_bytes(name)),
            format!("{i}\n").as_bytes(),
            0o644,
        );
    }
    let img = tmp.path().join("legacy.zip");
    zip(&src, &img, false, &["legacy"]);
    let mnt = Mount::new(&[&img], &tmp.path().join("m"), &[]);
    assert_same_tree(&src, &mnt.dir, &[]);
    for (i, name) in names.iter().enumerate() {
        let path = mnt.dir.join("legacy").join(OsStr::from_bytes(name));
        assert_eq!(fs::read_to_string(path).unwrap(), format!("{i}\n"));
    }
}

/// A zip64 archive with a stored member of over 4 GiB and a member after it (local header past
/// 4 GiB), written by hand as a sparse file: the member is zeros but for a marker at its end.
#[test]
fn zip64_members_over_4_gib() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("huge.zip");
    let size: u64 = (4 << 30) + 4096 + 7;
    run(Command::new("python3")
        .arg("-c")
        .arg(ZIP64_WRITER)
        .arg(&img)
        .arg(size.to_string()));
    assert!(fs::metadata(&img).unwrap().len() > size);
    let mnt = Mount::new(&[&img], &tmp.path().join("m"), &[]);
    let huge = mnt.dir.join("data/huge.bin");
    assert_eq!(fs::metadata(&huge).unwrap().len(), size);
    let f = fs::File::open(&huge).unwrap();
    use std::os::unix::fs::FileExt;
    let mut tail = [0u8; 16];
    f.read_exact_at(&mut tail, size - 16).unwrap();
    assert_eq!(&tail, b"\0\0\0\0\0\0END-OF-BIG");
    let mut middle = [1u8; 4096];
    f.read_exact_at(&mut middle, 3 << 30).unwrap();
    assert!(middle.iter().all(|&b| b == 0));
    assert_eq!(
        fs::read_to_string(mnt.dir.join("after.txt")).unwrap(),
        "after the big one\n"
    );
}

const ZIP64_WRITER: &str = r#"
import struct, sys, zlib
path, size = sys.argv[1], int(sys.argv[2])
marker = b"END-OF-BIG"
crc, left, zeros = 0, size - len(marker), bytes(64 << 20)
while left:
    n = min(left, len(zeros)); crc = zlib.crc32(zeros[:n], crc); left -= n
crc = zlib.crc32(marker, crc)
small = b"after the big one\n"
members = [(b"data/huge.bin", size, crc, None), (b"after.txt", len(small), zlib.crc32(small), small)]
central = b""
with open(path, "wb") as f:
    for name, n, c, body in members:
        offset = f.tell()
        big = n >= 0xFFFFFFFF
        extra = struct.pack("<HHQQ", 1, 16, n, n) if big else b""
        f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0x21, c,
                            0xFFFFFFFF if big else n, 0xFFFFFFFF if big else n,
                            len(name), len(extra)) + name + extra)
        if body is None:
            f.seek(n - len(marker), 1); f.write(marker)
        else:
            f.write(body)
        cextra = struct.pack("<HHQQ", 1, 16, n, n) if big else b""
        if offset >= 0xFFFFFFFF:
            cextra += struct.pack("<HHQ", 1, 8, offset)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0x031E, 45, 0, 0, 0, 0x21, c,
                               0xFFFFFFFF if big else n, 0xFFFFFFFF if big else n, len(name),
                               len(cextra), 0, 0, 0, 0o100644 << 16,
                               min(offset, 0xFFFFFFFF)) + name + cextra
    cd_start = f.tell()
    f.write(central)
    eocd64 = f.tell()
    f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 0x031E, 45, 0, 0, 2, 2, len(central), cd_start))
    f.write(struct.pack("<IIQI", 0x07064B50, 0, eocd64, 1))
    f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2, len(central), 0xFFFFFFFF, 0))
"#;

/// Self-extracting and padded zips (bytes before the first local header), as unzip reads them:
/// offsets relative to the shifted start, and offsets adjusted with `zip -A`.
#[test]
fn zips_with_bytes_before_the_archive() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_file(&src.join("d/a.txt"), b"hello\n", 0o644);
    write_file(&src.join("d/b.bin"), &bytes(3, 30_000), 0o600);
    let plain = tmp.path().join("plain.zip");
    zip(&src, &plain, false, &["d"]);
    let mut sfx = bytes(9, 10_000);
    sfx.extend(fs::read(&plain).unwrap());
    for adjusted in [false, true] {
        let img = tmp.path().join(format!("sfx-{adjusted}.zip"));
        fs::write(&img, &sfx).unwrap();
        if adjusted {
            run(Command::new("zip").arg("-q").arg("-A").arg(&img));
        }
        let reference = tmp.path().join(format!("unzipped-{adjusted}"));
        // unzip warns about the leading bytes (exit 1) but extracts everything.
        assert!(unzip_into(&img, &reference, &[]).is_some_and(|c| c <= 1));
        let mnt = Mount::new(&[&img], &tmp.path().join(format!("m-{adjusted}")), &[]);
        assert_same_tree(&reference, &mnt.dir, &[]);
    }
}

/// Modes as `unzip -K` restores them: Unix modes with setuid, setgid and sticky bits; members
/// made on MS-DOS/Windows get 0644 (0444 read-only), directories 0755; a FIFO is skipped with a
/// warning, as in tar images.
#[test]
fn modes_as_unzip_restores_them() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("modes.zip");
    python_zip(
        "import stat, sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1], 'w') as z:\n\
             \x20   def add(name, data, system, attr):\n\
             \x20       zi = zipfile.ZipInfo(name, (2024, 2, 29, 13, 14, 16))\n\
             \x20       zi.create_system = system; zi.external_attr = attr\n\
             \x20       z.writestr(zi, data)\n\
             \x20   add('dos.txt', b'dos', 0, 0x20)\n\
             \x20   add('dosro.txt', b'ro', 0, 0x21)\n\
             \x20   add('dosdir', b'', 0, 0x10)\n\
             \x20   add('dosdir2/', b'', 0, 0x10)\n\
             \x20   add('unix.txt', b'u', 3, (stat.S_IFREG | 0o640) << 16)\n\
             \x20   add('suid.sh', b'#!/bin/sh\\n', 3, (stat.S_IFREG | 0o4755) << 16)\n\
             \x20   add('sticky/', b'', 3, (stat.S_IFDIR | 0o1777) << 16 | 0x10)\n\
             \x20   add('fifo', b'', 3, (stat.S_IFIFO | 0o644) << 16)\n",
        &img,
    );
    let reference = tmp.path().join("unzipped");
    assert_eq!(unzip_into(&img, &reference, &["-K"]), Some(0));
    // unzip makes the FIFO an empty regular file; packfs leaves it out, as for tar.
    fs::remove_file(reference.join("fifo")).unwrap();
    let mnt = Mount::new(&[&img], &tmp.path().join("m"), &[]);
    assert_same_tree(&reference, &mnt.dir, &[]);
    assert!(!mnt.dir.join("fifo").exists());
    assert!(
        mnt.stderr
            .contains("skipping member \"fifo\": FIFOs are not served"),
        "{}",
        mnt.stderr
    );
}

/// A central directory entry that points past the end of the file skips only that member, as
/// unzip does ("bad zipfile offset"), with a warning naming the central directory's offset.
#[test]
fn a_bad_central_directory_entry_skips_only_its_member() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("bad-entry.zip");
    python_zip(
        "import struct, sys, zipfile\n\
             with zipfile.ZipFile(sys.argv[1], 'w') as z:\n\
             \x20   for n in 'abc':\n\
             \x20       z.writestr(f'{n}.txt', n * 3)\n\
             b = bytearray(open(sys.argv[1], 'rb').read())\n\
             i = b.find(b'PK\\x01\\x02'); i = b.find(b'PK\\x01\\x02', i + 4)\n\
             struct.pack_into('<I', b, i + 42, 0x7fffff00)\n\
             open(sys.argv[1], 'wb').write(b)\n",
        &img,
    );
    let reference = tmp.path().join("unzipped");
    assert_ne!(
        unzip_into(&img, &reference, &[]),
        Some(0),
        "unzip accepted the bad entry"
    );
    let mnt = Mount::new(&[&img], &tmp.path().join("m"), &[]);
    assert_same_tree(&reference, &mnt.dir, &[]);
    assert!(!mnt.dir.join("b.txt").exists());
    assert!(
        mnt.stderr
            .contains("skipping member \"b.txt\": entry 2 of the central directory"),
        "{}",
        mnt.stderr
    );
}

/// A member whose bytes do not match its CRC-32 (`unzip -t`: "bad CRC") fails with EIO: a
/// deflated member each time it is inflated, a stored one on every read (it is checked whole
/// before its first read). The log names the image and the CRC.
#[test]
fn members_with_a_bad_crc_fail_with_eio() {
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_file(&src.join("s/good.bin"), &bytes(1, 5000), 0o644);
    write_file(&src.join("s/bad.bin"), &bytes(2, 5000), 0o644);
    let stored = tmp.path().join("stored.zip");
    zip(&src, &stored, true, &["s"]);
    let deflated = tmp.path().join("deflated.zip");
    zip(&src, &deflated, false, &["s"]);
    // Stored: flip a data byte of bad.bin, found by its content.
    let raw = fs::read(&stored).unwrap();
    let at = raw
        .windows(64)
        .position(|w| w == &bytes(2, 5000)[..64])
        .unwrap();
    fs::File::options()
        .write(true)
        .open(&stored)
        .unwrap()
        .write_all_at(&[raw[at + 100] ^ 0xff], (at + 100) as u64)
        .unwrap();
    // Deflated: a wrong CRC in bad.bin's local and central headers (the stream stays valid).
    python_zip(
        "import struct, sys\n\
             b = bytearray(open(sys.argv[1], 'rb').read())\n\
             for sig, crc_at in ((b'PK\\x03\\x04', 14), (b'PK\\x01\\x02', 16)):\n\
             \x20   i = 0\n\
             \x20   while (i := b.find(sig, i)) >= 0:\n\
             \x20       name_at = 30 if sig == b'PK\\x03\\x04' else 46\n\
             \x20       if b[i + name_at:i + name_at + 9] == b's/bad.bin':\n\
             \x20           struct.pack_into('<I', b, i + crc_at, 0x12345678)\n\
             \x20       i += 4\n\
             open(sys.argv[1], 'wb').write(b)\n",
        &deflated,
    );
    for img in [&stored, &deflated] {
        let test = Command::new("unzip").arg("-t").arg(img).output().unwrap();
        assert!(
            String::from_utf8_lossy(&test.stdout).contains("bad CRC"),
            "{test:?}"
        );
        let name = img.file_stem().unwrap().to_str().unwrap();
        let log = tmp.path().join(format!("{name}.log"));
        let mnt = Mount::new(
            &[img],
            &tmp.path().join(format!("m-{name}")),
            &["--log-file", log.to_str().unwrap()],
        );
        assert_eq!(
            fs::read(mnt.dir.join("s/good.bin")).unwrap(),
            bytes(1, 5000)
        );
        let err = fs::read(mnt.dir.join("s/bad.bin")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}");
        drop(mnt);
        let log = fs::read_to_string(&log).unwrap();
        let line = log
            .lines()
            .find(|l| l.contains("bad CRC-32"))
            .unwrap_or_else(|| panic!("{name}: no CRC error logged:\n{log}"));
        assert!(
            line.contains(&format!("{name}.zip")) && line.contains("s/bad.bin"),
            "{line}"
        );
    }
}

/// `packfs verify --data` reads every file through packfs's readers and names the ones that fail
/// their checks; without `--data` only the index and the fingerprints are checked.
#[test]
fn verify_data_finds_damaged_members() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_file(&src.join("s/good.bin"), &bytes(1, 5000), 0o644);
    write_file(&src.join("s/bad.bin"), &bytes(2, 1_000_000), 0o644);
    write_file(&src.join("t/plain.txt"), b"plain\n", 0o644);
    let img = tmp.path().join("stored.zip");
    zip(&src, &img, true, &["s"]);
    let tar = tmp.path().join("plain.tar");
    tar_members(&src, &tar, &["t"]);
    let index = tmp.path().join("ds.packfs-index");
    run(packfs()
        .arg("index")
        .arg(&img)
        .arg(&tar)
        .arg("-o")
        .arg(&index));
    let good = run(&mut verify_data(&index));
    assert!(
        good.contains("all 1005006 bytes read and checked"),
        "{good}"
    );
    // Damage inside bad.bin's data; size, mtime and both ends of the image are unchanged.
    let raw = fs::read(&img).unwrap();
    let at = raw
        .windows(64)
        .position(|w| w == &bytes(2, 1_000_000)[..64])
        .unwrap()
        + 500_000;
    damage_in_place(&img, at as u64, 1);
    run(packfs().arg("verify").arg(&index));
    let out = verify_data(&index).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("s/bad.bin") && err.contains("bad CRC-32") && err.contains("1 of 3 files"),
        "{err}"
    );
    assert!(!err.contains("good.bin"), "{err}");
}

/// A Deflate64 member (7-Zip's `-mm=Deflate64`) is refused by name, with the command that
/// re-packs it; the other members are served.
#[test]
fn deflate64_members_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("deflate64.zip");
    // Method 9 in both headers of one member: what 7-Zip writes for Deflate64.
    python_zip(
        "import struct, sys, zipfile\n\
         with zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z:\n\
         \x20   z.writestr('d64.bin', b'x' * 1000)\n\
         \x20   z.writestr('ok.txt', b'ok')\n\
         b = bytearray(open(sys.argv[1], 'rb').read())\n\
         for sig, at, name_at in ((b'PK\\x03\\x04', 8, 30), (b'PK\\x01\\x02', 10, 46)):\n\
         \x20   i = b.find(sig)\n\
         \x20   assert b[i + name_at:i + name_at + 7] == b'd64.bin'\n\
         \x20   struct.pack_into('<H', b, i + at, 9)\n\
         open(sys.argv[1], 'wb').write(b)\n",
        &img,
    );
    let out = packfs().arg("ls").arg(&img).output().unwrap();
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok.txt\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("skipping member \"d64.bin\": compression method Deflate64 is not supported")
            && err.contains("-mm=Deflate"),
        "{err}"
    );
}

/// Zips written by 7-Zip: the default (deflate) serves what unzip extracts; with
/// `-mm=Deflate64` (which unzip 6.0 inflates, packfs not yet) the member is refused by name with
/// the command that re-packs it, and the rest is served.
#[test]
fn seven_zip_archives() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write_file(&src.join("d/a.txt"), b"hello\n", 0o644);
    write_file(&src.join("d/b.bin"), &bytes(5, 300_000), 0o644);
    let text: String = (0..100_000).map(|i| format!("{i}\n")).collect();
    write_file(&src.join("d/c.txt"), text.as_bytes(), 0o644);
    for (name, extra) in [("7z", &[][..]), ("7z-deflate64", &["-mm=Deflate64"][..])] {
        let img = tmp.path().join(format!("{name}.zip"));
        run(Command::new("7zz")
            .args(["a", "-bd", "-tzip"])
            .args(extra)
            .arg(&img)
            .arg("d")
            .current_dir(&src));
        let reference = tmp.path().join(format!("unzipped-{name}"));
        let code = unzip_into(&img, &reference, &[]);
        let mnt = Mount::new(&[&img], &tmp.path().join(format!("m-{name}")), &[]);
        if extra.is_empty() {
            assert_eq!(code, Some(0));
            assert_same_tree(&reference, &mnt.dir, &[]);
        } else {
            // Only c.txt compresses, so only it is Deflate64.
            assert_eq!(code, Some(0));
            assert!(!mnt.dir.join("d/c.txt").exists());
            assert_eq!(fs::read(mnt.dir.join("d/a.txt")).unwrap(), b"hello\n");
            assert!(
                mnt.stderr
                    .contains("\"d/c.txt\": compression method Deflate64 is not supported"),
                "{}",
                mnt.stderr
            );
        }
    }
}

/// An Info-ZIP Unicode Path extra field names the member only when its CRC-32 matches the
/// header's name (APPNOTE 4.6.9): unzip keeps the header's name otherwise, and so does packfs.
#[test]
fn a_unicode_path_field_with_a_bad_crc_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("unicode.zip");
    python_zip(
        r#"
import struct, sys, zipfile, zlib
def unicode_path(header_name, name, good):
    crc = zlib.crc32(header_name.encode()) ^ (0 if good else 1)
    body = struct.pack('<BI', 1, crc) + name.encode()
    return struct.pack('<HH', 0x7075, len(body)) + body
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    for header, name, good in [('good.txt', 'g\u00f6\u00f6d.txt', True), ('bad.txt', 'b\u00e4d.txt', False)]:
        info = zipfile.ZipInfo(header, (2020, 1, 1, 0, 0, 0))
        info.extra = unicode_path(header, name, good)
        z.writestr(info, header)
"#,
        &img,
    );
    let extracted = dir.path().join("x");
    unzip_into(&img, &extracted, &[]);
    let mut names: Vec<_> = fs::read_dir(&extracted)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["bad.txt", "g\u{f6}\u{f6}d.txt"]);
    let mnt = Mount::new(&[&img], &dir.path().join("mnt"), &[]);
    assert_same_tree(&extracted, &mnt.dir, &[]);
}
