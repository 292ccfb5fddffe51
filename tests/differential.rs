//! Differential fuzzing against the reference extractors: random trees (odd names, sizes around
//! block edges, sparse files, hard links, symlinks, odd modes and mtimes), written by a random
//! writer with random options, are mounted and compared with what the format's reference tool
//! extracts from the same archive (GNU tar for tars, Info-ZIP unzip for zips).
//!
//! `PACKFS_FUZZ_CASES` (default 24) sets how many cases run and `PACKFS_FUZZ_SEED` the first
//! seed; a failure prints its seed, writer and tree, so `PACKFS_FUZZ_SEED=N PACKFS_FUZZ_CASES=1`
//! replays it.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A writer: how it makes an archive of `src` at `out`, whether names may hold bytes its format
/// family's reference tool rewrites on extraction, and how the reference extracts it.
struct Writer {
    name: &'static str,
    zip: bool,
    command: &'static str,
}

/// `{src}` and `{out}` are substituted; tars are extracted with GNU tar, zips with unzip.
const WRITERS: &[Writer] = &[
    Writer {
        name: "gnu tar, gnu",
        zip: false,
        command: "tar --format=gnu -cf {out} -C {src} .",
    },
    Writer {
        name: "gnu tar, gnu, sparse",
        zip: false,
        command: "tar --format=gnu --sparse -cf {out} -C {src} .",
    },
    Writer {
        name: "gnu tar, posix, sparse",
        zip: false,
        command: "tar --format=posix --sparse -cf {out} -C {src} .",
    },
    Writer {
        name: "gnu tar, oldgnu",
        zip: false,
        command: "tar --format=oldgnu -cf {out} -C {src} .",
    },
    Writer {
        name: "gnu tar, ustar",
        zip: false,
        command: "tar --format=ustar -cf {out} -C {src} . 2>/dev/null || true",
    },
    Writer {
        name: "gnu tar, v7",
        zip: false,
        command: "tar --format=v7 -cf {out} -C {src} . 2>/dev/null || true",
    },
    Writer {
        name: "gnu tar, gzip",
        zip: false,
        command: "tar --format=posix -czf {out} -C {src} .",
    },
    Writer {
        // Frames of 100 kB of tar each (pzstd's output opens with a skippable frame, which GNU
        // tar's detection does not know).
        name: "gnu tar, zstd frames",
        zip: false,
        command: "tar --format=posix -cf - -C {src} . | split -b 100000 --filter='zstd -q -c' > {out}",
    },
    Writer {
        name: "gnu tar, xz blocks of 64 KiB",
        zip: false,
        command: "tar --format=gnu -cf - -C {src} . | xz -q -T2 --block-size=64KiB -c > {out}",
    },
    Writer {
        name: "gnu tar, bzip2 -1",
        zip: false,
        command: "tar --format=posix -cf - -C {src} . | bzip2 -1 -c > {out}",
    },
    Writer {
        name: "bsdtar, pax",
        zip: false,
        command: "bsdtar --format pax -cf {out} -C {src} .",
    },
    Writer {
        name: "bsdtar, gnutar",
        zip: false,
        command: "bsdtar --format gnutar -cf {out} -C {src} .",
    },
    Writer {
        name: "busybox tar",
        zip: false,
        command: "cd {src} && busybox tar -cf {out} .",
    },
    Writer {
        name: "python tarfile, pax",
        zip: false,
        command: "python3 -c 'import tarfile,sys; t=tarfile.open(sys.argv[1],\"w\",format=tarfile.PAX_FORMAT); t.add(sys.argv[2],arcname=\".\"); t.close()' {out} {src}",
    },
    Writer {
        name: "python tarfile, gnu",
        zip: false,
        command: "python3 -c 'import tarfile,sys; t=tarfile.open(sys.argv[1],\"w\",format=tarfile.GNU_FORMAT); t.add(sys.argv[2],arcname=\".\"); t.close()' {out} {src}",
    },
    Writer {
        name: "zip -9 -y",
        zip: true,
        command: "cd {src} && zip -q -9 -r -y {out} .",
    },
    Writer {
        name: "zip -0 -y",
        zip: true,
        command: "cd {src} && zip -q -0 -r -y {out} .",
    },
    Writer {
        name: "7-Zip",
        zip: true,
        command: "cd {src} && 7zz a -tzip -bd -bso0 {out} . -snl",
    },
];

/// A name component: plain, spaced, UTF-8, long, or (for tars) with control characters and bytes
/// that are not UTF-8.
fn name(rng: &mut Rng, i: usize, odd_bytes: bool) -> Vec<u8> {
    let mut n = match rng.below(8) {
        0 => format!("f {i}").into_bytes(),
        1 => format!("ñame_日本_{i}").into_bytes(),
        2 => format!("{}_{i}", "x".repeat(90 + rng.below(80) as usize)).into_bytes(),
        3 => format!("-dash{i}").into_bytes(),
        4 if odd_bytes => format!("nl\nand\ttab{i}").into_bytes(),
        5 if odd_bytes => {
            let mut v = b"raw\xff\xfe".to_vec();
            v.extend(i.to_string().bytes());
            v
        }
        _ => format!("n{i}.bin").into_bytes(),
    };
    n.truncate(200);
    n
}

/// Sizes around the 512-byte block and the 2 MiB checkpoint interval, and random ones.
fn size(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0 => 0,
        1 => *rng.pick(&[1, 511, 512, 513, 1023, 1024, 1025]),
        2 => (2 << 20) + rng.below(3) as usize * 4096 - 4096,
        3 => rng.below(300_000) as usize,
        _ => rng.below(20_000) as usize,
    }
}

/// Writes a random tree at `root`; returns a description for failure messages.
fn tree(rng: &mut Rng, root: &Path, odd_bytes: bool) -> String {
    let mut dirs = vec![root.to_path_buf()];
    let mut files: Vec<PathBuf> = Vec::new();
    let mut about = Vec::new();
    let count = 5 + rng.below(30) as usize;
    for i in 0..count {
        let parent = rng.pick(&dirs).clone();
        let path = parent.join(OsStr::from_bytes(&name(rng, i, odd_bytes)));
        match rng.below(12) {
            0 | 1 if dirs.len() < 8 => {
                fs::create_dir(&path).unwrap();
                dirs.push(path.clone());
                about.push(format!("dir {}", path.display()));
            }
            2 if !files.is_empty() => {
                let target = rng.pick(&files).clone();
                fs::hard_link(&target, &path).unwrap();
                about.push(format!(
                    "hard link {} -> {}",
                    path.display(),
                    target.display()
                ));
            }
            3 => {
                let target = *rng.pick(&["n0.bin", "../up", "/etc/hostname", "nowhere/x"]);
                symlink(target, &path).unwrap();
                about.push(format!("symlink {} -> {target}", path.display()));
            }
            4 => {
                // A sparse file: data segments in a hole-y file of up to 3 MiB.
                let f = fs::File::create(&path).unwrap();
                let len = 4096 + rng.below(3 << 20);
                f.set_len(len).unwrap();
                let segments = 1 + rng.below(6);
                for s in 0..segments {
                    let at = rng.below(len) & !4095;
                    let n = (4096 * (1 + rng.below(3))).min(len - at);
                    f.write_all_at(&bytes(rng.next() ^ s, n as usize), at)
                        .unwrap();
                }
                files.push(path.clone());
                about.push(format!(
                    "sparse {} ({len} bytes, {segments} segments)",
                    path.display()
                ));
            }
            _ => {
                let n = size(rng);
                let data = match rng.below(2) {
                    0 => bytes(rng.next(), n),
                    _ => b"text line of a sample\n"
                        .iter()
                        .cycle()
                        .take(n)
                        .copied()
                        .collect(),
                };
                fs::write(&path, &data).unwrap();
                files.push(path.clone());
                about.push(format!("file {} ({n} bytes)", path.display()));
            }
        }
    }
    // Odd modes and mtimes, files before directories (a directory's mtime changes as it fills).
    for f in &files {
        let mode = *rng.pick(&[0o644, 0o600, 0o755, 0o444, 0o4755, 0o2750, 0o640]);
        fs::set_permissions(f, fs::Permissions::from_mode(mode)).unwrap();
        set_mtime(f, rng.below(1 << 31));
    }
    for d in dirs.iter().rev() {
        let mode = *rng.pick(&[0o755, 0o750, 0o1777, 0o700]);
        fs::set_permissions(d, fs::Permissions::from_mode(mode)).unwrap();
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(rng.below(1 << 31));
        fs::File::open(d).unwrap().set_modified(at).unwrap();
    }
    about.join("\n")
}

fn extract(writer: &Writer, archive: &Path, into: &Path) {
    fs::create_dir(into).unwrap();
    let mut cmd = if writer.zip {
        let mut c = Command::new("unzip");
        c.args(["-q", "-K"]).arg(archive).arg("-d").arg(into);
        c
    } else {
        // Members may come back into a directory after others (bsdtar orders so): GNU tar then
        // needs to set directory times at the end, as the archive's are what it holds.
        let mut c = Command::new("tar");
        c.args(["--delay-directory-restore", "-xf"])
            .arg(archive)
            .arg("-C")
            .arg(into);
        c
    };
    let out = cmd.output().unwrap();
    // unzip's 1 is a warning (some member not as asked); tar's 2 is a fatal error.
    let ok = out.status.success() || (writer.zip && out.status.code() == Some(1));
    assert!(ok, "{} extraction: {out:?}", writer.name);
}

#[test]
fn mounts_match_the_reference_extraction() {
    let cases: u64 = std::env::var("PACKFS_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let first: u64 = std::env::var("PACKFS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_261_122);
    for seed in first..first + cases {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let writer = rng.pick(WRITERS);
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let src = d.join("src");
        fs::create_dir(&src).unwrap();
        let about = tree(&mut rng, &src, !writer.zip);
        let context = format!("seed {seed}, writer {}:\n{about}", writer.name);
        let archive = d.join("archive.img");
        let command = writer
            .command
            .replace("{out}", &archive.display().to_string())
            .replace("{src}", &src.display().to_string());
        run(Command::new("sh").arg("-c").arg(&command));
        let reference = d.join("reference");
        extract(writer, &archive, &reference);
        let mnt = Mount::new(&[&archive], &d.join("mnt"), &[]);
        let compared = std::panic::catch_unwind(|| assert_same_tree(&reference, &mnt.dir, &[]));
        drop(mnt);
        if let Err(e) = compared {
            eprintln!("differential case failed: {context}");
            std::panic::resume_unwind(e);
        }
    }
    eprintln!("{cases} differential cases from seed {first} matched");
}
