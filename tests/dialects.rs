//! Shards written by different tar writers mount as the tree they were made from.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::*;

/// Entries in the big directory.
const MANY: usize = 20_000;

/// One source tree shared by the tests of this file (built once; the tests run in parallel),
/// removed when the test process exits, whether the tests passed or not.
fn source() -> PathBuf {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(|| {
        let dir = removed_at_exit(tempfile::tempdir().unwrap());
        build_tree(&dir.join("src"), MANY);
        dir
    })
    .join("src")
}

fn gnu_tar(format: &str, out: &Path, exclude: Option<&str>) {
    let mut cmd = Command::new("tar");
    cmd.arg(format!("--format={format}")).arg("-cf").arg(out);
    if let Some(x) = exclude {
        cmd.arg(format!("--exclude=./{x}"));
    }
    run(cmd.arg("-C").arg(source()).arg("."));
}

fn mount_and_compare(shards: &[&Path], exclude: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let mnt = Mount::new(shards, &dir.path().join("mnt"), &[]);
    assert_same_tree(&source(), &mnt.dir, exclude);
    let many = std::fs::read_dir(mnt.dir.join("many")).unwrap().count();
    assert_eq!(many, MANY);
}

fn shard_path(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

#[test]
fn gnu_tar_gnu_format() {
    let (_d, shard) = shard_path("gnu.tar");
    gnu_tar("gnu", &shard, None);
    mount_and_compare(&[&shard], &[]);
}

#[test]
fn gnu_tar_posix_format() {
    let (_d, shard) = shard_path("posix.tar");
    gnu_tar("posix", &shard, None);
    mount_and_compare(&[&shard], &[]);
}

#[test]
fn gnu_tar_ustar_format() {
    let (_d, shard) = shard_path("ustar.tar");
    gnu_tar("ustar", &shard, Some(VERY_LONG_DIR));
    mount_and_compare(&[&shard], &[VERY_LONG_DIR]);
}

#[test]
fn tar_crate() {
    let (_d, shard) = shard_path("crate.tar");
    let mut builder = tar::Builder::new(std::fs::File::create(&shard).unwrap());
    builder.follow_symlinks(false);
    builder.append_dir_all(".", source()).unwrap();
    builder.into_inner().unwrap();
    mount_and_compare(&[&shard], &[]);
}

#[test]
fn python_tarfile() {
    let (_d, shard) = shard_path("python.tar");
    run(Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, tarfile\n\
             with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as t:\n\
             \x20   t.add(sys.argv[2], arcname='.')\n",
        )
        .arg(&shard)
        .arg(source()));
    mount_and_compare(&[&shard], &[]);
}

/// The tree split over three shards, named with a brace range as job scripts do, merges back.
#[test]
fn shards_merge_into_one_tree() {
    let dir = tempfile::tempdir().unwrap();
    let groups: [&[&str]; 3] = [
        &["./train", "./deep"],
        &["./many", "./big", "./empty.bin"],
        &["./abs_link", "./dangling", &format!("./{VERY_LONG_DIR}")],
    ];
    for (i, members) in groups.iter().enumerate() {
        let shard = dir.path().join(format!("part-{i:06}.tar"));
        run(Command::new("tar")
            .arg("--format=gnu")
            .arg("-cf")
            .arg(&shard)
            .arg("-C")
            .arg(source())
            .args(*members));
    }
    let pattern = dir.path().join("part-{000000..000002}.tar");
    let mnt = Mount::new(&[&pattern], &dir.path().join("mnt"), &[]);
    assert_same_tree(&source(), &mnt.dir, &[]);
    // statfs reports the dataset: every file and directory, and the data size.
    let out = run(Command::new("stat")
        .arg("-f")
        .arg("-c")
        .arg("%c %b %S")
        .arg(&mnt.dir));
    let fields: Vec<u64> = out.split_whitespace().map(|f| f.parse().unwrap()).collect();
    let (files, blocks, bsize) = (fields[0], fields[1], fields[2]);
    assert!(files > MANY as u64, "statfs files = {files}");
    assert!(
        blocks * bsize >= 6 * 1024 * 1024,
        "statfs size = {}",
        blocks * bsize
    );
}

/// An archive written by another tool (`write ARCHIVE -C SRC .`), compared with that tool's own
/// extraction (`extract ARCHIVE -C DIR`) of the same archive.
fn other_writer(name: &str, write: &[&str], extract: &[&str], exclude: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join(format!("{name}.img"));
    let mut cmd = Command::new(write[0]);
    cmd.args(&write[1..]).arg(&archive).arg("-C").arg(source());
    for x in exclude {
        cmd.arg(format!("--exclude=./{x}"));
    }
    run(cmd.arg("."));
    let reference = dir.path().join("extracted");
    std::fs::create_dir(&reference).unwrap();
    run(Command::new(extract[0])
        .args(&extract[1..])
        .arg(&archive)
        .arg("-C")
        .arg(&reference));
    let mnt = Mount::new(&[&archive], &dir.path().join("mnt"), &[]);
    if name.starts_with("busybox") {
        // busybox sets a directory's mtime before extracting into it, so its extraction loses
        // directory mtimes the archive holds: same bytes as its extraction, same attributes as
        // the tree it was made from.
        run(Command::new("diff")
            .arg("-r")
            .arg("--no-dereference")
            .arg(&reference)
            .arg(&mnt.dir));
        assert_same_tree(&source(), &mnt.dir, exclude);
    } else {
        assert_same_tree(&reference, &mnt.dir, &[]);
    }
    let many = std::fs::read_dir(mnt.dir.join("many")).unwrap().count();
    assert_eq!(many, MANY, "{name}");
}

#[test]
fn bsdtar_ustar() {
    let (write, extract) = (["bsdtar", "--format", "ustar", "-cf"], ["bsdtar", "-xf"]);
    other_writer("bsdtar-ustar", &write, &extract, &[VERY_LONG_DIR]);
}

#[test]
fn bsdtar_pax() {
    let (write, extract) = (["bsdtar", "--format", "pax", "-cf"], ["bsdtar", "-xf"]);
    other_writer("bsdtar-pax", &write, &extract, &[]);
}

#[test]
fn bsdtar_gnutar() {
    let (write, extract) = (["bsdtar", "--format", "gnutar", "-cf"], ["bsdtar", "-xf"]);
    other_writer("bsdtar-gnutar", &write, &extract, &[]);
}

#[test]
fn bsdtar_zip() {
    let (write, extract) = (["bsdtar", "--format", "zip", "-cf"], ["bsdtar", "-xf"]);
    other_writer("bsdtar-zip", &write, &extract, &[]);
}

#[test]
fn busybox_tar() {
    let (write, extract) = (["busybox", "tar", "-cf"], ["busybox", "tar", "-xf"]);
    other_writer("busybox-tar", &write, &extract, &[]);
}

/// Go's archive/tar (PAX) and archive/zip (deflate), written by a program the test compiles: the
/// tar compared with GNU tar's extraction of it, the zip with Info-ZIP unzip's.
#[test]
fn go_archive_tar_and_zip() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("main.go"), GO_WRITER).unwrap();
    let (tar, zip) = (d.join("go.tar"), d.join("go.zip"));
    run(Command::new("go")
        .arg("run")
        .arg("main.go")
        .arg(source())
        .arg(&tar)
        .arg(&zip)
        .current_dir(d)
        .env("GOCACHE", d.join("gocache"))
        .env("GOPATH", d.join("gopath"))
        .env("GO111MODULE", "off"));
    for (archive, extract) in [
        (&tar, vec!["tar", "-xf"]),
        (&zip, vec!["unzip", "-q", "-K"]),
    ] {
        let name = archive.file_name().unwrap().to_str().unwrap();
        let reference = d.join(format!("x-{name}"));
        std::fs::create_dir(&reference).unwrap();
        let mut cmd = Command::new(extract[0]);
        cmd.args(&extract[1..]).arg(archive);
        match name.ends_with(".zip") {
            true => cmd.arg("-d").arg(&reference),
            false => cmd.arg("-C").arg(&reference),
        };
        run(&mut cmd);
        let mnt = Mount::new(&[archive], &d.join(format!("m-{name}")), &[]);
        assert_same_tree(&reference, &mnt.dir, &[]);
        let many = std::fs::read_dir(mnt.dir.join("many")).unwrap().count();
        assert_eq!(many, MANY, "{name}");
    }
}

/// Walks a tree into a PAX tar and a deflated zip: regular files, directories and symlinks with
/// their modes and mtimes, as a Go program would.
const GO_WRITER: &str = r#"package main

import (
	"archive/tar"
	"archive/zip"
	"io"
	"os"
	"path/filepath"
)

func check(err error) {
	if err != nil {
		panic(err)
	}
}

func main() {
	root := os.Args[1]
	tf, err := os.Create(os.Args[2])
	check(err)
	zf, err := os.Create(os.Args[3])
	check(err)
	tw := tar.NewWriter(tf)
	zw := zip.NewWriter(zf)
	check(filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
		check(err)
		rel, err := filepath.Rel(root, path)
		check(err)
		if rel == "." {
			return nil
		}
		link := ""
		if info.Mode()&os.ModeSymlink != 0 {
			link, err = os.Readlink(path)
			check(err)
		}
		th, err := tar.FileInfoHeader(info, link)
		check(err)
		th.Name = filepath.ToSlash(rel)
		th.Format = tar.FormatPAX
		zh, err := zip.FileInfoHeader(info)
		check(err)
		zh.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			th.Name += "/"
			zh.Name += "/"
		} else if link == "" {
			zh.Method = zip.Deflate
		}
		check(tw.WriteHeader(th))
		zw2, err := zw.CreateHeader(zh)
		check(err)
		if link != "" {
			_, err = io.WriteString(zw2, link)
			check(err)
		} else if info.Mode().IsRegular() {
			f, err := os.Open(path)
			check(err)
			_, err = io.Copy(io.MultiWriter(tw, zw2), f)
			check(err)
			f.Close()
		}
		return nil
	}))
	check(tw.Close())
	check(zw.Close())
	check(tf.Close())
	check(zf.Close())
}
"#;

/// squashfs-tools-ng: gensquashfs packing the tree, and tar2sqfs converting a GNU tar of it, each
/// compared with unsquashfs's extraction of the image.
#[test]
fn squashfs_tools_ng_images() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let packed = d.join("gen.sqfs");
    run(Command::new("gensquashfs")
        .args(["--keep-time", "--quiet", "--pack-dir"])
        .arg(source())
        .arg(&packed));
    let tar = d.join("src.tar");
    gnu_tar("gnu", &tar, None);
    let conv = d.join("tar2sqfs.sqfs");
    run(Command::new("sh").arg("-c").arg(format!(
        "tar2sqfs --quiet {} < {}",
        conv.display(),
        tar.display()
    )));
    for img in [&packed, &conv] {
        let name = img.file_name().unwrap().to_str().unwrap();
        let reference = d.join(format!("x-{name}"));
        run(Command::new("unsquashfs")
            .args(["-q", "-n", "-d"])
            .arg(&reference)
            .arg(img));
        let mnt = Mount::new(&[img], &d.join(format!("m-{name}")), &[]);
        assert_same_tree(&reference, &mnt.dir, &[]);
        let many = std::fs::read_dir(mnt.dir.join("many")).unwrap().count();
        assert_eq!(many, MANY, "{name}");
    }
}

/// Archives Python writes, then edits the way other writers do: a directory whose header carries
/// a size (some writers store the listing's size there; Python's own test archives have one), and
/// a Solaris `X` extended header. GNU tar extracts every member of both; so must packfs, with
/// the attributes the extended header gives, and without a warning.
#[test]
fn directory_with_a_size_and_solaris_extended_header() {
    let dir = tempfile::tempdir().unwrap();
    let shard = dir.path().join("odd.tar");
    let script = r#"
import io, sys, tarfile
def patched(info, fmt, edit):
    b = bytearray(info.tobuf(format=fmt))
    edit(b)
    # Headers are rewritten in place: recompute each block's checksum.
    for at in range(0, len(b), 512):
        if b[at + 156:at + 157] in (b'x', b'X', b'5', b'0'):
            b[at + 148:at + 156] = b' ' * 8
            b[at + 148:at + 156] = b'%06o\0 ' % sum(b[at:at + 512])
    return bytes(b)
def sized(b):
    b[124:136] = b'%011o\0' % 1024
def solaris(b):
    assert b[156:157] == b'x'
    b[156:157] = b'X'
def member(name, data, **kw):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = len(data), 1_700_000_000, 0o640
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti
out = io.BytesIO()
d = member('d', b'', type=tarfile.DIRTYPE, mode=0o750)
out.write(patched(d, tarfile.USTAR_FORMAT, sized))
a = member('d/a.txt', b'first file')
out.write(a.tobuf(format=tarfile.USTAR_FORMAT) + b'first file'.ljust(512, b'\0'))
link = member('d/link', b'', type=tarfile.LNKTYPE, linkname='d/a.txt')
out.write(link.tobuf(format=tarfile.USTAR_FORMAT))
sun = member('short', b'solaris', pax_headers={'path': 'd/solaris-' + 'n' * 120 + '.txt', 'mtime': '1234567890'})
out.write(patched(sun, tarfile.PAX_FORMAT, solaris) + b'solaris'.ljust(512, b'\0'))
b = member('d/b.txt', b'last')
out.write(b.tobuf(format=tarfile.USTAR_FORMAT) + b'last'.ljust(512, b'\0'))
out.write(b'\0' * 1024)
open(sys.argv[1], 'wb').write(out.getvalue())
"#;
    run(Command::new("python3").arg("-c").arg(script).arg(&shard));
    // The judge: what GNU tar extracts.
    let extracted = dir.path().join("x");
    std::fs::create_dir(&extracted).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&shard)
        .arg("-C")
        .arg(&extracted));
    let long = format!("d/solaris-{}.txt", "n".repeat(120));
    assert!(extracted.join("d/a.txt").is_file() && extracted.join(&long).is_file());
    let ls = packfs().arg("ls").arg(&shard).output().unwrap();
    assert_ok(&ls);
    let stderr = String::from_utf8_lossy(&ls.stderr);
    assert!(!stderr.contains("WARN"), "{stderr}");
    let listed = String::from_utf8_lossy(&ls.stdout);
    for name in ["d/a.txt", "d/link", "d/b.txt", &long] {
        assert!(listed.lines().any(|l| l == name), "{name} in:\n{listed}");
    }
    let mnt = Mount::new(&[&shard], &dir.path().join("mnt"), &[]);
    assert_same_tree(&extracted, &mnt.dir, &[]);
    assert_eq!(
        std::fs::read(mnt.dir.join("d/link")).unwrap(),
        b"first file"
    );
}
