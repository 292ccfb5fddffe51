//! Archive fidelity: what the reference extractor (GNU tar) extracts, a mount serves, byte for
//! byte, with the same names, types, modes and mtimes. Each test is one class of archive that
//! packfs once served differently or refused.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// Extracts `archive` with GNU tar into a fresh directory under `work`.
fn gnu_extract(archive: &Path, work: &Path) -> PathBuf {
    let out = work.join("extracted");
    fs::create_dir_all(&out).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&out));
    out
}

/// The mount of `archive` holds what GNU tar extracts from it.
fn serves_what_gnu_tar_extracts(archive: &Path, work: &Path) -> Mount {
    let reference = gnu_extract(archive, work);
    let mnt = Mount::new(&[archive], &work.join("mnt"), &[]);
    assert_same_tree(&reference, &mnt.dir, &[]);
    mnt
}

/// Writes `archive` with the Python script `script` (for header layouts no current tool writes).
fn python_archive(script: &str, archive: &Path) {
    run(Command::new("python3").arg("-c").arg(script).arg(archive));
}

/// Helpers for crafted ustar headers, prepended to the scripts below.
const CRAFT: &str = r#"
import io, sys, tarfile
def header(name, typ, size, mtime=1700000000, mode=0o644, link=""):
    ti = tarfile.TarInfo(name); ti.type = typ; ti.size = size; ti.mode = mode
    ti.mtime = mtime; ti.linkname = link
    return bytearray(ti.tobuf(format=tarfile.USTAR_FORMAT))
def checksum(h):
    h[148:156] = b"        "; h[148:156] = b"%06o\0 " % sum(h[:512])
def pad(data):
    return data + b"\0" * (-len(data) % 512)
def pax(records):
    body = b""
    for key, value in records:
        rec = b" " + key + b"=" + value + b"\n"
        n = len(rec) + 1
        while len(str(n)) + len(rec) != n:
            n += 1
        body += str(n).encode() + rec
    return body
"#;

/// Several PAX headers in a row: only the last applies (GNU tar, Go); the first one's path must
/// not rename the member.
#[test]
fn only_the_last_of_consecutive_pax_headers_applies() {
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("pax2.tar");
    python_archive(
        &format!(
            "{CRAFT}
out = b''
for recs in ([(b'path', b'renamed.txt')], [(b'mtime', b'1600000000')]):
    d = pax(recs)
    out += bytes(header('PaxHeaders/x', tarfile.XHDTYPE, len(d))) + pad(d)
out += bytes(header('b.txt', tarfile.REGTYPE, 3)) + pad(b'bbb')
open(sys.argv[1], 'wb').write(out + b'\\0' * 1024)
"
        ),
        &archive,
    );
    let mnt = serves_what_gnu_tar_extracts(&archive, work.path());
    assert_eq!(fs::read(mnt.dir.join("b.txt")).unwrap(), b"bbb");
}

/// Numeric fields that are all NULs read as 0; one leading NUL is skipped, as GNU tar does.
#[test]
fn numeric_fields_with_nuls_read_as_gnu_tar_reads_them() {
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("nul.tar");
    python_archive(
        &format!(
            "{CRAFT}
h = header('empty.txt', tarfile.REGTYPE, 0)
h[124:136] = b'\\0' * 12
h[136:148] = b'\\0' + b'1' * 10 + b'\\0'
checksum(h)
out = bytes(h) + bytes(header('after.txt', tarfile.REGTYPE, 2)) + pad(b'ok')
open(sys.argv[1], 'wb').write(out + b'\\0' * 1024)
"
        ),
        &archive,
    );
    serves_what_gnu_tar_extracts(&archive, work.path());
}

/// A V7-style directory: a regular-file type whose name ends in '/'.
#[test]
fn old_style_directories_are_directories() {
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("old.tar");
    python_archive(
        &format!(
            "{CRAFT}
h = header('olddir/', tarfile.DIRTYPE, 0, mode=0o750)
h[156] = ord('0')
checksum(h)
out = bytes(h) + bytes(header('olddir/a.txt', tarfile.REGTYPE, 2)) + pad(b'ab')
open(sys.argv[1], 'wb').write(out + b'\\0' * 1024)
"
        ),
        &archive,
    );
    let mnt = serves_what_gnu_tar_extracts(&archive, work.path());
    assert!(fs::metadata(mnt.dir.join("olddir")).unwrap().is_dir());
}

/// Old tars wrote a hard link's target size in its header; no data follows it.
#[test]
fn hard_link_headers_with_a_size_carry_no_data() {
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("hl.tar");
    python_archive(
        &format!(
            "{CRAFT}
out = bytes(header('f', tarfile.REGTYPE, 10)) + pad(b'0123456789')
h = header('link', tarfile.LNKTYPE, 0, link='f')
h[124:136] = b'%011o\\0' % 10
checksum(h)
out += bytes(h) + bytes(header('after.txt', tarfile.REGTYPE, 5)) + pad(b'after')
open(sys.argv[1], 'wb').write(out + b'\\0' * 1024)
"
        ),
        &archive,
    );
    let mnt = serves_what_gnu_tar_extracts(&archive, work.path());
    assert_eq!(fs::read(mnt.dir.join("link")).unwrap(), b"0123456789");
}

/// A hard link gets the version of its target that came before it in the archive, not one
/// appended later under the same name.
#[test]
fn hard_links_take_the_target_before_them() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    write_file(&src.join("f"), b"version 1\n", 0o644);
    fs::hard_link(src.join("f"), src.join("link")).unwrap();
    let archive = work.path().join("appended.tar");
    let tar = |mode: &str, members: &[&str]| {
        run(Command::new("tar")
            .arg(mode)
            .arg(&archive)
            .arg("-C")
            .arg(&src)
            .args(members));
    };
    tar("-cf", &["f", "link"]);
    // A new file of the same name, appended: extraction replaces f, the link keeps version 1.
    fs::remove_file(src.join("f")).unwrap();
    write_file(&src.join("f"), b"version 2, longer\n", 0o644);
    tar("-rf", &["f"]);
    let mnt = serves_what_gnu_tar_extracts(&archive, work.path());
    assert_eq!(fs::read(mnt.dir.join("link")).unwrap(), b"version 1\n");
    assert_eq!(fs::read(mnt.dir.join("f")).unwrap(), b"version 2, longer\n");
}

/// PAX records are read by their length, so names and binary xattr values may hold newlines.
#[test]
fn newlines_in_pax_values() {
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    write_file(&src.join("dir/new\nline.txt"), b"one\n", 0o644);
    write_file(&src.join("dir/plain.txt"), b"two\n", 0o644);
    // A binary extended attribute whose value holds newlines, NULs and '=' (GNU tar stores it
    // raw in a SCHILY.xattr record).
    run(Command::new("python3")
        .arg("-c")
        .arg("import os, sys; os.setxattr(sys.argv[1], 'user.bin', b'\\x00\\n\\xff=\\n 12 x\\n')")
        .arg(src.join("dir/plain.txt")));
    let archive = work.path().join("posix.tar");
    run(Command::new("tar")
        .args([
            "--xattrs",
            "--xattrs-include=user.*",
            "--format=posix",
            "-cf",
        ])
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("dir"));
    let mnt = serves_what_gnu_tar_extracts(&archive, work.path());
    assert_eq!(
        fs::read(mnt.dir.join("dir/new\nline.txt")).unwrap(),
        b"one\n"
    );
}

/// Sparse files (1, 4, 5 and 300 data segments, and one all hole) in every sparse format GNU tar
/// writes: old GNU (with extension blocks past 4 segments) and PAX 0.0, 0.1 and 1.0. They are
/// served as GNU tar extracts them, holes as zeros, and the members after them are found.
#[test]
fn sparse_members_in_every_gnu_format_are_served() {
    use std::os::unix::fs::FileExt;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(&src).unwrap();
    for segments in [0u64, 1, 4, 5, 300] {
        let f = fs::File::create(src.join(format!("sparse-{segments}.bin"))).unwrap();
        f.set_len(segments.max(1) * 16384 + 8192).unwrap();
        for k in 0..segments {
            f.write_all_at(&bytes(k, 4096), k * 16384 + 8192).unwrap();
        }
    }
    write_file(&src.join("after.txt"), b"after the sparse ones\n", 0o644);
    for (format, version) in [
        ("gnu", None),
        ("posix", Some("0.0")),
        ("posix", Some("0.1")),
        ("posix", Some("1.0")),
    ] {
        let name = format!("{format}-{}", version.unwrap_or("old"));
        let dir = work.path().join(&name);
        fs::create_dir(&dir).unwrap();
        let archive = dir.join("sparse.tar");
        let mut tar = Command::new("tar");
        tar.arg(format!("--format={format}")).arg("--sparse");
        if let Some(v) = version {
            tar.arg(format!("--sparse-version={v}"));
        }
        run(tar.arg("-cf").arg(&archive).arg("-C").arg(&src).arg("."));
        let mnt = serves_what_gnu_tar_extracts(&archive, &dir);
        assert_eq!(
            fs::read(mnt.dir.join("after.txt")).unwrap(),
            b"after the sparse ones\n",
            "{name}"
        );
        let listed = run(packfs().arg("ls").arg("--extents").arg(&archive));
        assert!(
            listed.contains("sparse, 300 data segments"),
            "{name}:\n{listed}"
        );
    }
}

/// A name that is a file in one member and a directory in another of the same shard: members
/// are taken in archive order, and what GNU tar cannot extract ("Not a directory", "File
/// exists") is left out with a warning; the rest of the shard is served. A directory named twice
/// keeps the last one's mode.
#[test]
fn file_and_directory_clashes_inside_one_shard_skip_only_those_members() {
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("clash.tar");
    python_archive(
        &format!(
            "{CRAFT}
out = b''
def add(name, typ, mode, data=b''):
    global out
    out += bytes(header(name, typ, len(data), mode=mode)) + pad(data)
add('d', tarfile.DIRTYPE, 0o700)
add('d/f', tarfile.REGTYPE, 0o644, b'x')
add('d', tarfile.DIRTYPE, 0o750)
add('x', tarfile.REGTYPE, 0o644, b'file')
add('x/1', tarfile.REGTYPE, 0o644, b'1')
add('y/1', tarfile.REGTYPE, 0o644, b'1')
add('y', tarfile.REGTYPE, 0o644, b'yfile')
add('y/2', tarfile.REGTYPE, 0o644, b'2')
add('z', tarfile.REGTYPE, 0o644, b'z1')
add('z/1', tarfile.REGTYPE, 0o644, b'blocked')
add('z', tarfile.DIRTYPE, 0o755)
open(sys.argv[1], 'wb').write(out + b'\\0' * 1024)
"
        ),
        &archive,
    );
    let reference = gnu_extract_allowing_errors(&archive, work.path());
    let mnt = Mount::new(&[&archive], &work.path().join("mnt"), &[]);
    let listing = |root: &Path| {
        run(Command::new("find")
            .arg(".")
            .arg("-printf")
            .arg("%p %y %m %s\n")
            .current_dir(root))
        .lines()
        .map(str::to_string)
        .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(listing(&mnt.dir), listing(&reference));
    assert_eq!(fs::read(mnt.dir.join("x")).unwrap(), b"file");
    for (name, why) in [
        ("x/1", "\"x\", earlier in this image, is a file"),
        (
            "y",
            "a directory of that name, earlier in this image, holds members",
        ),
        ("z/1", "\"z\", earlier in this image, is a file"),
    ] {
        let line = format!("skipping member \"{name}\": {why}");
        assert!(
            mnt.stderr.contains(&line),
            "no {line:?} in:\n{}",
            mnt.stderr
        );
    }
}

/// A name component longer than NAME_MAX (255 bytes) cannot be extracted (GNU tar: "File name
/// too long") nor looked up; that member is skipped, the rest is served.
#[test]
fn members_with_overlong_names_are_skipped_alone() {
    let work = tempfile::tempdir().unwrap();
    let archive = work.path().join("long.tar");
    python_archive(
        "import io, sys, tarfile\n\
         with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as t:\n\
         \x20   for name in ('d/' + 'n' * 300 + '/f.txt', 'd/' + 'm' * 70000, 'd/ok.txt'):\n\
         \x20       info = tarfile.TarInfo(name); info.size = 2\n\
         \x20       t.addfile(info, io.BytesIO(b'ok'))\n",
        &archive,
    );
    let out = packfs().arg("ls").arg(&archive).output().unwrap();
    assert_ok(&out);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "d\nd/ok.txt\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("a name component is longer than 255 bytes")
            .count(),
        2,
        "{err}"
    );
}

/// GNU tar's extraction, which exits 2 when it could not extract some members.
fn gnu_extract_allowing_errors(archive: &Path, work: &Path) -> PathBuf {
    let out = work.join("extracted");
    fs::create_dir_all(&out).unwrap();
    let done = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(&out)
        .output()
        .unwrap();
    assert!(matches!(done.status.code(), Some(0 | 2)), "{done:?}");
    out
}

/// Files around the 8 GiB limit of the octal size field (sparse, so cheap): GNU tar writes their
/// sizes in base-256 (gnu, oldgnu) or PAX records (posix); each is served at its full size with
/// its data where GNU tar puts it on extraction.
#[test]
fn sizes_around_8_gib_in_every_gnu_format() {
    use std::os::unix::fs::FileExt;
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let limit = 8u64 << 30;
    let sizes = [limit - 1, limit, limit + 513];
    for size in sizes {
        let f = fs::File::create(src.join(format!("big-{size}.bin"))).unwrap();
        f.set_len(size).unwrap();
        f.write_all_at(&bytes(size, 4096), 0).unwrap();
        f.write_all_at(&bytes(size + 1, 300), size - 300).unwrap();
    }
    write_file(&src.join("after.txt"), b"after\n", 0o644);
    for format in ["gnu", "oldgnu", "posix"] {
        let dir = work.path().join(format);
        fs::create_dir(&dir).unwrap();
        let archive = dir.join("big.tar");
        run(Command::new("tar")
            .arg(format!("--format={format}"))
            .arg("--sparse")
            .arg("-cf")
            .arg(&archive)
            .arg("-C")
            .arg(&src)
            .arg("."));
        let reference = gnu_extract(&archive, &dir);
        let mnt = Mount::new(&[&archive], &dir.join("mnt"), &[]);
        assert_eq!(fs::read(mnt.dir.join("after.txt")).unwrap(), b"after\n");
        for size in sizes {
            let name = format!("big-{size}.bin");
            let (a, b) = (reference.join(&name), mnt.dir.join(&name));
            assert_eq!(fs::metadata(&a).unwrap().len(), size, "{format} {name}");
            assert_eq!(fs::metadata(&b).unwrap().len(), size, "{format} {name}");
            let (a, b) = (fs::File::open(a).unwrap(), fs::File::open(b).unwrap());
            // Both data segments, a stretch of hole, and the bytes across the 8 GiB mark.
            for (at, len) in [
                (0, 4096),
                (size - 300, 300),
                (1 << 32, 8192),
                (limit - 4096, 4096),
            ] {
                let len = len.min(size - at) as usize;
                let (mut x, mut y) = (vec![0u8; len], vec![1u8; len]);
                a.read_exact_at(&mut x, at).unwrap();
                b.read_exact_at(&mut y, at).unwrap();
                assert!(x == y, "{format} {name}: bytes {at}..+{len}");
            }
        }
    }
}
