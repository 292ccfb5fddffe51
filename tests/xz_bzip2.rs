//! xz- and bzip2-compressed tars served by block: files written by GNU tar (`-J`, `-j`), xz with
//! threads and a block size, pixz, bzip2 at its smallest and largest block size, pbzip2 and
//! lbzip2, each compared with GNU tar's extraction and mounted; damage after indexing is an EIO for
//! the members of the damaged block only; an xz block larger than a read may decode is refused
//! with the commands that serve the data.

mod common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::process::Command;

use common::*;

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn tar_xz_and_tar_bz2_from_every_writer_mount_as_their_tree() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    build_tree(&src, 200);
    write_file(&src.join("text/tokens.txt"), &text(11, 3 << 20), 0o644);
    let s = src.display();
    sh(&format!("tar -cf plain.tar -C {s} ."), d);
    // (file, command, tool it needs beyond the ones CI always has, least blocks it must have)
    let writers = [
        ("gnu.tar.xz", format!("tar -Jcf gnu.tar.xz -C {s} ."), "", 1),
        (
            "blocks.tar.xz",
            "xz -q -T2 --block-size=256KiB -c plain.tar > blocks.tar.xz".into(),
            "",
            8,
        ),
        ("t0.tar.xz", "xz -q -T0 -c plain.tar > t0.tar.xz".into(), "", 1),
        (
            // Two streams, with stream padding between them.
            "two.tar.xz",
            "head -c 1000000 plain.tar | xz -q -c > two.tar.xz && head -c 8 /dev/zero >> two.tar.xz \
             && tail -c +1000001 plain.tar | xz -q -T2 --block-size=300KiB -c >> two.tar.xz"
                .into(),
            "",
            3,
        ),
        ("pixz.tar.xz", "pixz -p 2 < plain.tar > pixz.tar.xz".into(), "pixz", 1),
        ("gnu.tar.bz2", format!("tar -jcf gnu.tar.bz2 -C {s} ."), "", 3),
        ("one.tar.bz2", "bzip2 -1 -c plain.tar > one.tar.bz2".into(), "", 20),
        ("pb.tar.bz2", "pbzip2 -p2 -1 -c plain.tar > pb.tar.bz2".into(), "pbzip2", 20),
        ("lb.tar.bz2", "lbzip2 -n 2 -1 -c plain.tar > lb.tar.bz2".into(), "lbzip2", 20),
    ];
    let want_text = fs::read(src.join("text/tokens.txt")).unwrap();
    for (name, command, tool, least) in writers {
        if !tool.is_empty() && !have(tool) {
            skip("parallel-compressors", &format!("{tool} is not installed"));
            continue;
        }
        sh(&command, d);
        let img = d.join(name);
        // GNU tar reads each the same.
        let out = d.join(format!("x-{name}"));
        fs::create_dir(&out).unwrap();
        sh(&format!("tar -xf {name} -C x-{name}"), d);
        assert_same_tree(&src, &out, &[]);
        let mnt = Mount::new(&[&img], &d.join(format!("m-{name}")), &[]);
        assert_same_tree(&src, &mnt.dir, &[]);
        let f = fs::File::open(mnt.dir.join("text/tokens.txt")).unwrap();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..60 {
            let x = rng.next();
            let at = (x % want_text.len() as u64) as usize;
            let len = ((x >> 40) as usize % 300_000).min(want_text.len() - at);
            let mut got = vec![0u8; len];
            f.read_exact_at(&mut got, at as u64).unwrap();
            assert!(
                got == want_text[at..at + len],
                "{name}: bytes {at}..{}",
                at + len
            );
        }
        // Closed before the unmount, which waits for open files.
        drop(f);
        drop(mnt);
        // The listing says where the bytes come from, and in how many blocks.
        let ls = run(packfs().arg("ls").arg("--extents").arg(&img));
        let line = ls.lines().find(|l| l.contains("text/tokens.txt")).unwrap();
        let codec = if name.ends_with(".xz") {
            "xz,"
        } else {
            "bzip2,"
        };
        assert!(line.contains(codec), "{name}: {line}");
        assert!(count_before(line, "blocks") >= least, "{name}: {line}");
    }
}

#[test]
fn damage_after_indexing_is_eio_in_its_block_only() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let src = d.join("src");
    write_file(&src.join("train/a/img 001.jpg"), &bytes(1, 3000), 0o644);
    write_file(&src.join("text/tokens.txt"), &text(12, 4 << 20), 0o644);
    sh(
        "tar -cf plain.tar -C src train text && bzip2 -1 -c plain.tar > ds.tar.bz2 && \
         xz -q -T2 --block-size=500KiB -c plain.tar > ds.tar.xz",
        d,
    );
    for (name, check) in [("ds.tar.bz2", "bzip2"), ("ds.tar.xz", "xz")] {
        let img = d.join(name);
        let index = d.join(format!("{name}.packfs-index"));
        run(packfs().arg("index").arg(&img).arg("-o").arg(&index));
        let ok = run(&mut verify_data(&index));
        assert!(ok.contains("read and checked"), "{name}: {ok}");

        // One compressed byte flipped in a middle block (size, mtime and both ends unchanged).
        let len = fs::metadata(&img).unwrap().len();
        damage_in_place(&img, len / 2, 0x55);
        let t = Command::new(check).arg("-t").arg(&img).output().unwrap();
        assert!(!t.status.success(), "{check} -t accepts the damage");
        let out = packfs().arg("ls").arg(&img).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!("{name}: at byte offset"))
                && err.contains(&format!("{check} -t")),
            "{err}"
        );

        // Through the index made before: the small file reads, and so does the start of the
        // text; a read that needs the damaged block fails with EIO, named in the log.
        let log = d.join(format!("{name}.log"));
        let mnt = Mount::new(
            &[&index],
            &d.join(format!("m-{name}")),
            &["--log-file", log.to_str().unwrap()],
        );
        assert_eq!(
            fs::read(mnt.dir.join("train/a/img 001.jpg")).unwrap(),
            bytes(1, 3000)
        );
        let f = fs::File::open(mnt.dir.join("text/tokens.txt")).unwrap();
        let mut head = vec![0u8; 50_000];
        f.read_exact_at(&mut head, 0).unwrap();
        assert!(head == text(12, 4 << 20)[..50_000], "{name}");
        match fs::read(mnt.dir.join("text/tokens.txt")) {
            Ok(_) => panic!("{name}: a damaged block was served"),
            Err(err) => assert_eq!(err.raw_os_error(), Some(libc::EIO), "{name}: {err}"),
        }
        drop(f);
        drop(mnt);
        let log = fs::read_to_string(&log).unwrap();
        assert!(
            log.contains(name) && log.contains("text/tokens.txt"),
            "{log}"
        );
    }
}

#[test]
fn an_xz_block_larger_than_a_read_may_decode_is_refused_with_the_way_out() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    // 70 MiB of zeros in one member, sparse on disk, written by xz without threads: one block.
    sh(
        "truncate -s 70M big.bin && tar -cf - big.bin | xz -q -0 -T1 -c > one.tar.xz",
        d,
    );
    let out = packfs()
        .arg("ls")
        .arg(d.join("one.tar.xz"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("one.tar.xz: at byte offset 12: an xz block larger than 64 MiB")
            && err.contains("xz -dk")
            && err.contains("xz -T0 --block-size"),
        "{err}"
    );
}
