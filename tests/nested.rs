//! Archives inside archives, served as directories of their members: ImageNet's training set as
//! downloaded (one tar of class tars), tars, zips and compressed tars inside tars, and hostile
//! nesting. The judge is what the real tools give when the inner archives are extracted one by
//! one: GNU tar, unzip.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// `n` classes of `per` JPEG-sized samples in `dir/classes/<class>/`, each class packed by GNU
/// tar as ImageNet's are (`<class>.tar`, its files at the top, no directory entry), and all the
/// class tars in `dir/train.tar`. Returns the outer tar and the classes' tree.
fn imagenet_shaped(dir: &Path, n: usize, per: usize) -> (PathBuf, PathBuf) {
    let classes = dir.join("classes");
    let tars = dir.join("tars");
    fs::create_dir_all(&tars).unwrap();
    let mut names = Vec::new();
    for c in 0..n {
        let class = format!("n{:08}", 1_440_764 + c * 1_000);
        let mut files = Vec::new();
        for i in 0..per {
            let name = format!("{class}_{i}.JPEG");
            let len = 3_000 + (c * 7_919 + i * 104_729) % 40_000;
            write_file(
                &classes.join(&class).join(&name),
                &bytes((c * 1000 + i) as u64, len),
                0o644,
            );
            files.push(name);
        }
        let tar = tars.join(format!("{class}.tar"));
        run(Command::new("tar")
            .arg("--format=gnu")
            .arg("-cf")
            .arg(&tar)
            .arg("-C")
            .arg(classes.join(&class))
            .args(&files));
        names.push(format!("{class}.tar"));
    }
    let outer = dir.join("train.tar");
    run(Command::new("tar")
        .arg("--format=gnu")
        .arg("-cf")
        .arg(&outer)
        .arg("-C")
        .arg(&tars)
        .args(&names));
    (outer, classes)
}

/// What GNU tar gives: `outer` extracted into `into`, then each of its members that is a tar
/// (by name) extracted, one by one, into a directory named as the member (without `.tar` when
/// `strip`), the member itself removed; the directory has the member's time.
fn extracted_one_by_one(outer: &Path, into: &Path, strip: bool) {
    fs::create_dir_all(into).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(outer)
        .arg("-C")
        .arg(into));
    for entry in fs::read_dir(into).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if !name.ends_with(".tar") {
            continue;
        }
        let dir = match strip {
            true => into.join(name.trim_end_matches(".tar")),
            false => into.join(format!("{name}.d")),
        };
        fs::create_dir_all(&dir).unwrap();
        run(Command::new("tar")
            .arg("-xf")
            .arg(&path)
            .arg("-C")
            .arg(&dir));
        // The directory takes the archive member's time (its mode, made searchable: 0755).
        run(Command::new("touch").arg("-r").arg(&path).arg(&dir));
        fs::remove_file(&path).unwrap();
        if !strip {
            fs::rename(&dir, &path).unwrap();
        }
    }
}

/// ImageNet's training tar as downloaded mounts as its classes: with --strip-inner-extension the
/// tree is what GNU tar gives when the class tars are extracted one by one, `ImageFolder` finds
/// every class and sample, an index of it remounts to the same tree, `ls --json` gives each
/// sample's real position in the outer tar (its bytes are there), staging copies the outer tar
/// once and serves a cold epoch, and `pack` repacks it into shards.
#[test]
fn imagenet_as_downloaded_mounts_as_its_classes() {
    let dir = tempfile::tempdir().unwrap();
    let (outer, _) = imagenet_shaped(dir.path(), 12, 15);
    let reference = dir.path().join("ref");
    extracted_one_by_one(&outer, &reference, true);

    let mnt = dir.path().join("mnt");
    let m = Mount::new(&[&outer], &mnt, &["--strip-inner-extension"]);
    assert_same_tree(&reference, &mnt, &[]);
    drop(m);

    // Without stripping, each class is a directory named as its tar.
    let kept = dir.path().join("kept");
    extracted_one_by_one(&outer, &kept, false);
    let m = Mount::new(&[&outer], &mnt, &[]);
    assert_same_tree(&kept, &mnt, &[]);
    drop(m);

    // As files, when asked.
    let m = Mount::new(&[&outer], &mnt, &["--inner-archives", "none"]);
    let plain = dir.path().join("plain");
    fs::create_dir_all(&plain).unwrap();
    run(Command::new("tar")
        .arg("-xf")
        .arg(&outer)
        .arg("-C")
        .arg(&plain));
    assert_same_tree(&plain, &mnt, &[]);
    drop(m);

    // The index holds the flattened tree.
    let index = dir.path().join("train.packfs-index");
    run(packfs()
        .args(["index", "--strip-inner-extension", "-q", "-o"])
        .arg(&index)
        .arg(&outer));
    let m = Mount::new(&[&index], &mnt, &[]);
    assert_same_tree(&reference, &mnt, &[]);

    if let Some(interpreter) = python_with("torchvision", "torchvision") {
        let out = python(
            &interpreter,
            "import sys, torchvision\n\
             ds = torchvision.datasets.ImageFolder(sys.argv[1])\n\
             print(len(ds.classes), len(ds.samples), ds.classes[0])\n",
            &[mnt.as_os_str()],
        );
        assert_eq!(out.trim(), "12 180 n01440764", "{out}");
    }
    // One open of the outer tar: the class tars are windows of it (status said 13).
    assert_eq!(counters(&mnt)["source"]["opens"], 1);
    drop(m);

    // Real positions: every sample's bytes are at its offset in the outer tar.
    let listing = run(packfs().args(["ls", "--json"]).arg(&index));
    let tar = fs::read(&outer).unwrap();
    let mut files = 0;
    for line in listing.lines().skip(1) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["kind"] != "file" {
            continue;
        }
        files += 1;
        assert_eq!(v["image"], 0, "{v}");
        let (at, size) = (
            v["offset"].as_u64().unwrap() as usize,
            v["size"].as_u64().unwrap() as usize,
        );
        let want = fs::read(reference.join(v["path"].as_str().unwrap())).unwrap();
        assert_eq!(&tar[at..at + size], &want[..], "{v}");
    }
    assert_eq!(files, 180);

    // Staged: the stage holds the outer tar, once; a cold epoch reads it from there.
    let stage = dir.path().join("stage");
    let m = Mount::new(&[&index], &mnt, &["--stage", stage.to_str().unwrap()]);
    let started = std::time::Instant::now();
    while !run(packfs().args(["status"]).arg(&mnt)).contains("staging   complete") {
        assert!(started.elapsed().as_secs() < 30, "staging did not complete");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let staged: Vec<String> = fs::read_dir(&stage)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".data"))
        .collect();
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert!(staged[0].starts_with("train.tar."), "{staged:?}");
    run(Command::new("sh").args(["-c", "sync; echo 3 > /proc/sys/vm/drop_caches"]));
    assert_same_tree(&reference, &mnt, &[]);
    drop(m);

    // `pack` takes it as its input: shards of the class members, nothing extracted.
    let packed = dir.path().join("packed");
    run(packfs()
        .args([
            "pack",
            "--strip-inner-extension",
            "--shards",
            "3",
            "-q",
            "-o",
        ])
        .arg(&packed)
        .arg(&outer));
    let m = Mount::new(&[&packed.join("train.packfs-index")], &mnt, &[]);
    let mut compared = 0;
    for class in fs::read_dir(&reference).unwrap() {
        let class = class.unwrap().path();
        for f in fs::read_dir(&class).unwrap() {
            let f = f.unwrap().path();
            let rel = f.strip_prefix(&reference).unwrap();
            assert_eq!(fs::read(mnt.join(rel)).unwrap(), fs::read(&f).unwrap());
            compared += 1;
        }
    }
    assert_eq!(compared, 180);
    drop(m);

    // Nesting is chosen when images are scanned: an index refuses it, whatever the value (the
    // default's own value too: accepted, it would read as obeyed).
    for given in [
        &["--inner-archives", "none"][..],
        &["--inner-archives", "tar"],
        &["--inner-depth", "4"],
        &["--strip-inner-extension"],
    ] {
        let out = packfs().arg("ls").args(given).arg(&index).output().unwrap();
        assert!(!out.status.success(), "{given:?} accepted with an index");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("give --inner-archives"),
            "{given:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Expands, in place and recursively up to `depth` levels, the archives of `dir` as the real
/// tools extract them: tars (plain, gzip, zstd) with GNU tar, and with `zips` zips with unzip
/// and squashfs images with unsquashfs; each into a directory named as the archive.
fn extract_recursively(dir: &Path, zips: bool, depth: u32) {
    if depth == 0 {
        return;
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let meta = fs::symlink_metadata(&path).unwrap();
        if meta.is_dir() {
            extract_recursively(&path, zips, depth);
            continue;
        }
        if !meta.is_file() {
            continue;
        }
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let is_tar = [".tar", ".tar.gz", ".tar.zst"]
            .iter()
            .any(|e| name.ends_with(e));
        let is_zip = zips && (name.ends_with(".zip") || name.ends_with(".npz"));
        let is_sqfs = zips && name.ends_with(".sqfs");
        if !is_tar && !is_zip && !is_sqfs {
            continue;
        }
        let into = dir.join(format!("{name}.d"));
        // The directory has the archive's root entry's attributes when it has one (`./` in a
        // tar, a squashfs image's root), else the member's time.
        let has_root = is_sqfs
            || is_tar
                && run(Command::new("tar").arg("-tf").arg(&path))
                    .lines()
                    .any(|l| l == "./");
        if is_sqfs {
            run(Command::new("unsquashfs")
                .args(["-q", "-n", "-d"])
                .arg(&into)
                .arg(&path));
        } else {
            fs::create_dir_all(&into).unwrap();
            match is_tar {
                true => run(Command::new("tar")
                    .arg("-xf")
                    .arg(&path)
                    .arg("-C")
                    .arg(&into)),
                false => run(Command::new("unzip")
                    .arg("-q")
                    .arg(&path)
                    .arg("-d")
                    .arg(&into)),
            };
        }
        let root_time = fs::metadata(&into).unwrap().modified().unwrap();
        extract_recursively(&into, zips, depth - 1);
        match has_root {
            true => fs::File::open(&into)
                .unwrap()
                .set_modified(root_time)
                .unwrap(),
            false => {
                run(Command::new("touch").arg("-r").arg(&path).arg(&into));
            }
        }
        fs::remove_file(&path).unwrap();
        fs::rename(&into, &path).unwrap();
    }
}

/// Files of the mixed dataset under `dir/src`: text, a subdirectory, a symlink.
fn small_tree(dir: &Path, seed: u64) {
    write_file(&dir.join("x.txt"), &bytes(seed, 700), 0o644);
    write_file(&dir.join("sub/y.bin"), &bytes(seed + 1, 20_000), 0o600);
    std::os::unix::fs::symlink("../x.txt", dir.join("sub/to-x")).unwrap();
}

/// Tar in tar, zip in tar (one member stored, one deflated), `.tar.gz` and `.tar.zst` in tar, a
/// `.npz` (a zip) and a squashfs image in tar, a tar in a tar in a tar, and a tar stored in a
/// zip: by default the tars are directories and the zips and squashfs files; with
/// `--inner-archives all` those too; every tree as the real tools give it.
#[test]
fn tars_zips_and_compressed_tars_inside_a_tar_are_served_as_the_tools_extract_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let parts = d.join("parts");
    small_tree(&d.join("a"), 1);
    fs::create_dir_all(&parts).unwrap();
    run(Command::new("tar")
        .arg("-cf")
        .arg(parts.join("a.tar"))
        .arg("-C")
        .arg(d.join("a"))
        .args(["x.txt", "sub"]));
    small_tree(&d.join("b"), 10);
    write_file(&d.join("b/big.txt"), &vec![b'z'; 50_000], 0o644);
    sh(
        "cd b && zip -q -0 ../parts/b.zip x.txt && zip -q -r ../parts/b.zip sub big.txt",
        d,
    );
    fs::copy(parts.join("b.zip"), parts.join("weights.npz")).unwrap();
    small_tree(&d.join("c"), 20);
    sh("tar -czf parts/c.tar.gz -C c x.txt sub", d);
    sh("tar --zstd -cf parts/z.tar.zst -C c x.txt sub", d);
    // Three levels: d.tar holds e.tar, which holds f.tar.
    small_tree(&d.join("f"), 30);
    sh(
        "tar -cf e-in/f.tar -C f x.txt sub 2>/dev/null || (mkdir -p e-in && tar -cf e-in/f.tar -C f x.txt sub)",
        d,
    );
    write_file(&d.join("e-in/e.txt"), b"in e\n", 0o644);
    sh("mkdir -p d-in && tar -cf d-in/e.tar -C e-in f.tar e.txt", d);
    sh("tar -cf parts/d.tar -C d-in e.tar", d);
    write_file(&parts.join("notes.gz"), &bytes(40, 3000), 0o644);
    small_tree(&d.join("q"), 50);
    sh("mksquashfs q parts/s.sqfs -quiet -noappend -all-root", d);
    let outer = d.join("mixed.tar");
    sh(
        "tar -cf mixed.tar -C parts a.tar b.zip weights.npz c.tar.gz z.tar.zst d.tar notes.gz \
         s.sqfs",
        d,
    );
    let mnt = d.join("mnt");
    for (zips, extra) in [(false, &[][..]), (true, &["--inner-archives", "all"][..])] {
        let reference = d.join(format!("ref-{zips}"));
        fs::create_dir_all(&reference).unwrap();
        run(Command::new("tar")
            .arg("-xf")
            .arg(&outer)
            .arg("-C")
            .arg(&reference));
        extract_recursively(&reference, zips, 4);
        let m = Mount::new(&[&outer], &mnt, extra);
        assert_same_tree(&reference, &mnt, &[]);
        assert!(mnt.join("d.tar/e.tar/f.tar/sub/y.bin").is_file());
        assert_eq!(mnt.join("b.zip").is_dir(), zips);
        assert_eq!(mnt.join("s.sqfs").is_dir(), zips);
        drop(m);
    }

    // A tar stored in a zip (zip -0): the zip's member is opened as the tar it is.
    sh("cd parts && zip -q -0 ../outer.zip a.tar notes.gz", d);
    let reference = d.join("ref-zip");
    fs::create_dir_all(&reference).unwrap();
    run(Command::new("unzip")
        .arg("-q")
        .arg(d.join("outer.zip"))
        .arg("-d")
        .arg(&reference));
    extract_recursively(&reference, false, 4);
    let m = Mount::new(&[&d.join("outer.zip")], &mnt, &[]);
    assert_same_tree(&reference, &mnt, &[]);
    assert!(mnt.join("a.tar/sub/y.bin").is_file());
    drop(m);
}

/// Hostile nesting is bounded: a chain of tars six deep is opened only as deep as
/// --inner-depth says (the rest are files, byte for byte); an inner tar cut short is refused as
/// an archive, as it would be as an image, and served as the file it is, with a warning; a
/// member named `.tar` that is no archive stays a file, silently. (An archive
/// cannot hold its own stored bytes; a zip quine holds itself deflated, and only stored members
/// are opened.)
#[test]
fn hostile_nesting_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_file(&d.join("w/w0.txt"), b"the bottom\n", 0o644);
    for level in 1..=6 {
        let inner = match level {
            1 => "w0.txt".to_string(),
            _ => format!("w{}.tar", level - 1),
        };
        sh(&format!("tar -cf w/w{level}.tar -C w {inner}"), d);
    }
    let outer = d.join("w/w6.tar");
    let mnt = d.join("mnt");
    let m = Mount::new(&[&outer], &mnt, &["--inner-depth", "2"]);
    let deepest = mnt.join("w5.tar/w4.tar/w3.tar");
    assert!(mnt.join("w5.tar/w4.tar").is_dir());
    assert_eq!(
        fs::read(&deepest).unwrap(),
        fs::read(d.join("w/w3.tar")).unwrap()
    );
    drop(m);
    let m = Mount::new(&[&outer], &mnt, &[]);
    assert!(mnt.join("w5.tar/w4.tar/w3.tar/w2.tar").is_dir());
    assert!(mnt.join("w5.tar/w4.tar/w3.tar/w2.tar/w1.tar").is_file());
    drop(m);

    // A tar cut short inside a tar, and a `.tar` that is not one.
    write_file(&d.join("t/big.bin"), &bytes(5, 300_000), 0o644);
    write_file(&d.join("t/small.txt"), b"small\n", 0o644);
    sh("tar -cf cut.tar -C t small.txt big.bin", d);
    let cut = fs::read(d.join("cut.tar")).unwrap();
    fs::create_dir_all(d.join("o")).unwrap();
    fs::write(d.join("o/cut.tar"), &cut[..100_000]).unwrap();
    fs::write(d.join("o/fake.tar"), bytes(6, 4096)).unwrap();
    sh("tar -cf o.tar -C o cut.tar fake.tar", d);
    let log = d.join("mount.log");
    let m = Mount::new(
        &[&d.join("o.tar")],
        &mnt,
        &["--log-file", log.to_str().unwrap()],
    );
    assert_eq!(
        fs::read(mnt.join("fake.tar")).unwrap(),
        fs::read(d.join("o/fake.tar")).unwrap()
    );
    // The cut tar is refused as an archive, as it is as an image (GNU tar: "Unexpected EOF"),
    // and served as the member it is, with a warning that names it and why.
    assert_eq!(fs::read(mnt.join("cut.tar")).unwrap(), &cut[..100_000]);
    drop(m);
    let logged = fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("member \"cut.tar\" looks like an archive but is served as a file")
            && logged.contains("runs past the end"),
        "{logged}"
    );
    assert!(!logged.contains("fake.tar"), "{logged}");
}

/// A tar of 4 100 tiny `.tar.gz` (Python's tarfile writes them): each compressed inner archive
/// holds a temporary file and a mapping while mounted, so a dataset opens at most 4 096 of them;
/// the rest are served as the files they are, with one warning.
#[test]
fn a_tar_of_thousands_of_compressed_tars_opens_a_bounded_number() {
    let Some(interpreter) = python_with("tarfile", "python3") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let outer = dir.path().join("many.tar");
    python(
        &interpreter,
        "import io, sys, tarfile\n\
         with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as out:\n\
         \x20   for i in range(4100):\n\
         \x20       inner = io.BytesIO()\n\
         \x20       with tarfile.open(fileobj=inner, mode='w:gz') as t:\n\
         \x20           data = b'%d' % i\n\
         \x20           info = tarfile.TarInfo('x.txt'); info.size = len(data)\n\
         \x20           t.addfile(info, io.BytesIO(data))\n\
         \x20       info = tarfile.TarInfo('s%04d.tar.gz' % i); info.size = len(inner.getvalue())\n\
         \x20       out.addfile(info, io.BytesIO(inner.getvalue()))\n",
        &[outer.as_os_str()],
    );
    let out = packfs().arg("ls").arg(&outer).output().unwrap();
    assert_ok(&out);
    let listing = String::from_utf8_lossy(&out.stdout);
    let opened = listing.lines().filter(|l| l.ends_with("/x.txt")).count();
    let files = listing
        .lines()
        .filter(|l| l.ends_with(".tar.gz") && !listing.contains(&format!("{l}/x.txt")))
        .count();
    assert_eq!((opened, files), (4096, 4), "{listing}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("later archives inside images").count(),
        1,
        "{stderr}"
    );
}

/// An index whose inner archive names an outer image that does not come before it (crafted, its
/// checksums made whole again) is refused when opened, naming the image: a loop of images inside
/// images could otherwise never end.
#[test]
fn an_index_whose_inner_archive_lies_within_itself_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (outer, _) = imagenet_shaped(dir.path(), 2, 3);
    let index = dir.path().join("t.packfs-index");
    run(packfs().args(["index", "-q", "-o"]).arg(&index).arg(&outer));
    let mut bytes = fs::read(&index).unwrap();
    let images_off = u64::from_le_bytes(bytes[88..96].try_into().unwrap()) as usize;
    // The second record is the first class tar's: fixed 48 bytes (tag 3 at 20), then its outer
    // image's number. Make it itself.
    let first_len = (48
        + u32::from_le_bytes(bytes[images_off + 40..images_off + 44].try_into().unwrap()) as usize
        + u32::from_le_bytes(bytes[images_off + 44..images_off + 48].try_into().unwrap()) as usize)
        .next_multiple_of(8);
    let second = images_off + first_len;
    assert_eq!(
        u32::from_le_bytes(bytes[second + 20..second + 24].try_into().unwrap()),
        3,
        "an inner archive's record"
    );
    bytes[second + 48..second + 52].copy_from_slice(&1u32.to_le_bytes());
    assert!(packfs::catalog::index::reseal(&mut bytes));
    fs::write(&index, &bytes).unwrap();
    let out = packfs().arg("ls").arg(&index).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("image 1 lies within image 1, which does not come before it"),
        "{err}"
    );
}

/// A zip whose central directory lists one stored inner tar under many names (the 2 MB zip that
/// made 40 M catalog entries and took 8 GB): Info-ZIP unzip refuses it as a zip bomb; packfs
/// serves the first name, skips the others with a warning naming the image, the offset and the
/// fix, and its listing holds the inner tar's members once.
#[test]
fn a_zip_listing_one_inner_tar_under_many_names_opens_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for i in 0..200 {
        write_file(
            &d.join(format!("t/f{i:03}.txt")),
            format!("{i}\n").as_bytes(),
            0o644,
        );
    }
    sh("tar --format=gnu -cf inner.tar -C t .", d);
    let bomb = d.join("bomb.zip");
    run(Command::new("python3")
        .arg("-c")
        .arg(
            "import struct, sys, zlib\n\
             data = open(sys.argv[1], 'rb').read(); crc = zlib.crc32(data)\n\
             name = b'c00000.tar'\n\
             local = struct.pack('<IHHHHHIIIHH', 0x04034b50, 20, 0, 0, 0, 0x21, crc, len(data), len(data), len(name), 0) + name\n\
             out = bytearray(local + data); cd = bytearray()\n\
             for i in range(300):\n\
             \x20   n = b'c%05d.tar' % i\n\
             \x20   cd += struct.pack('<IHHHHHHIIIHHHHHII', 0x02014b50, 0x031e, 20, 0, 0, 0, 0x21, crc, len(data), len(data), len(n), 0, 0, 0, 0, 0o100644 << 16, 0) + n\n\
             end = struct.pack('<IHHHHIIH', 0x06054b50, 0, 0, 300, 300, len(cd), len(out), 0)\n\
             open(sys.argv[2], 'wb').write(out + cd + end)\n",
        )
        .arg(d.join("inner.tar"))
        .arg(&bomb));
    let unzip_test = Command::new("unzip")
        .arg("-tq")
        .arg(&bomb)
        .output()
        .unwrap();
    assert!(
        !unzip_test.status.success(),
        "unzip accepted the overlapping entries: {unzip_test:?}"
    );
    let out = packfs()
        .args(["ls", "--inner-archives", "all"])
        .arg(&bomb)
        .output()
        .unwrap();
    assert_ok(&out);
    let listing = String::from_utf8_lossy(&out.stdout);
    let members = listing.lines().filter(|l| l.ends_with(".txt")).count();
    assert_eq!(members, 200, "the inner tar's members, once: {listing}");
    assert!(listing.contains("c00000.tar/f000.txt"), "{listing}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("skipping member \"c00001.tar\"")
            && stderr.contains("overlap those of the member whose local header is at offset 0")
            && stderr.contains("bomb.zip")
            && stderr.contains("zip -r"),
        "{stderr}"
    );
}

/// `--inner-max N` opens N archives inside the images and serves the rest as the files they
/// are, with one warning that names the bound and how to raise it.
#[test]
fn inner_max_bounds_the_archives_opened() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for i in 0..8 {
        write_file(
            &d.join(format!("t{i}/x.txt")),
            format!("{i}\n").as_bytes(),
            0o644,
        );
        sh(&format!("tar -cf c{i}.tar -C t{i} x.txt"), d);
    }
    sh(
        "tar -cf outer.tar c0.tar c1.tar c2.tar c3.tar c4.tar c5.tar c6.tar c7.tar",
        d,
    );
    let out = packfs()
        .args(["ls", "--inner-max", "5"])
        .arg(d.join("outer.tar"))
        .output()
        .unwrap();
    assert_ok(&out);
    let listing = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        listing.lines().filter(|l| l.ends_with("/x.txt")).count(),
        5,
        "{listing}"
    );
    assert_eq!(
        listing.lines().filter(|l| !l.contains('/')).count(),
        8,
        "{listing}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr
            .matches("at most 5 archives inside its images")
            .count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("--inner-max N"), "{stderr}");
}

/// An index of a tar of class tars whose tar changed since: the message names the command that
/// rebuilds it from the tar given, not from the archives inside it (they were listed as images
/// of their own, which `packfs index` cannot open).
#[test]
fn a_stale_index_of_nested_archives_is_rebuilt_from_the_outer_image() {
    let dir = tempfile::tempdir().unwrap();
    let (outer, _) = imagenet_shaped(dir.path(), 2, 3);
    let index = dir.path().join("t.packfs-index");
    run(packfs().args(["index", "-o"]).arg(&index).arg(&outer));
    set_mtime(&outer, 1_000_000_000);
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let out = packfs()
        .arg("mount")
        .arg(&index)
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let command = format!("`packfs index -o {} {}`", index.display(), outer.display());
    assert!(err.contains(&command), "{err}");
}

/// `n01440764.tar` beside a directory `n01440764` keeps its extension under
/// --strip-inner-extension (else two classes would merge in one image), and says so; class tars
/// of the same name in two images merge into one directory, and that is said too (both were
/// silent: ImageFolder saw an extra class, or one class made of two images).
#[test]
fn stripped_names_that_clash_are_told() {
    let dir = tempfile::tempdir().unwrap();
    let (one, _) = imagenet_shaped(&dir.path().join("one"), 2, 3);
    let ls = |images: &[&Path]| {
        let out = packfs()
            .args(["ls", "--strip-inner-extension", "--duplicates", "last-wins"])
            .args(images)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (_, quiet) = ls(&[&one]);
    assert!(!quiet.contains("keep their extension"), "{quiet}");

    // A directory n01440764 beside n01440764.tar in the same image.
    let beside = dir.path().join("beside");
    fs::create_dir_all(beside.join("n01440764")).unwrap();
    write_file(&beside.join("n01440764/extra.JPEG"), b"x", 0o644);
    fs::copy(
        dir.path().join("one/tars/n01440764.tar"),
        beside.join("n01440764.tar"),
    )
    .unwrap();
    let image = dir.path().join("beside.tar");
    run(Command::new("tar")
        .arg("-cf")
        .arg(&image)
        .arg("-C")
        .arg(&beside)
        .args(["n01440764", "n01440764.tar"]));
    let (listing, told) = ls(&[&image]);
    assert!(
        listing
            .lines()
            .any(|l| l == "n01440764.tar/n01440764_0.JPEG"),
        "{listing}"
    );
    assert!(
        told.contains("keep their extension") && told.contains("\"n01440764.tar\""),
        "{told}"
    );

    // The same class tar in two images: one directory, told.
    let (two, _) = imagenet_shaped(&dir.path().join("two"), 1, 2);
    let (listing, told) = ls(&[&one, &two]);
    assert!(listing.lines().any(|l| l == "n01440764"), "{listing}");
    assert!(told.contains("merge there"), "{told}");
    assert!(
        told.contains(&one.display().to_string()) && told.contains(&two.display().to_string()),
        "{told}"
    );
}
