//! What programs read of a catalog: `packfs ls --json`, read by Python as the `packfs` Python
//! package reads it. Names that are not UTF-8 come back byte for byte (their `_b64` field);
//! every file's size, image and offset are right (its bytes are at that offset of a plain tar or
//! a stored zip); shares follow the `--stage-share` rule.

mod common;

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

use common::*;

/// Reads the export from stdin and checks it against the tree `argv[1]` and the images, in
/// order, `argv[2..]` (plain tar, stored zip, `.tar.gz`). Prints a summary line.
const CHECK: &str = r#"
import base64, json, os, sys
src, images = sys.argv[1], sys.argv[2:]
def raw(row, key):
    # A name's exact bytes: the text, or the base64 beside it when the name is not UTF-8.
    exact = row.get(key + "_b64")
    return base64.b64decode(exact) if exact is not None else row[key].encode()
lines = sys.stdin.buffer.read().splitlines()
# One array, one parse: how a million-entry export loads in a second or two.
rows = json.loads(b"[" + b",".join(lines) + b"]")
head, rows = rows[0], rows[1:]
assert head["packfs_ls"] == 1, head
imgs = [r for r in rows if r["kind"] == "image"]
entries = [r for r in rows if r["kind"] != "image"]
assert len(imgs) == head["images"] == len(images), (head, imgs)
assert len(entries) == head["entries"], (head, len(entries))
assert [i["image"] for i in imgs] == list(range(len(images)))
assert [i["share"] for i in imgs] == [i % 2 for i in range(len(images))], imgs
for i, path in zip(imgs, images):
    assert raw(i, "path") == os.fsencode(os.path.abspath(path)), i
    assert i["size"] == os.path.getsize(path), i
files = {raw(r, "path"): r for r in entries if r["kind"] == "file"}
links = {raw(r, "path"): r for r in entries if r["kind"] == "symlink"}
checked = 0
for top, dirs, names in os.walk(os.fsencode(src)):
    for name in names:
        full = os.path.join(top, name)
        rel = os.path.relpath(full, os.fsencode(src))
        if os.path.islink(full):
            assert raw(links[rel], "target") == os.readlink(full), rel
            continue
        r = files[rel]
        data = open(full, "rb").read()
        assert r["size"] == len(data), (rel, r)
        assert r["mode"] == os.stat(full).st_mode & 0o7777, (rel, r)
        image = images[r["image"]]
        if not image.endswith(".gz"):
            with open(image, "rb") as f:
                f.seek(r["offset"])
                assert f.read(len(data)) == data, (rel, r)
        checked += 1
print("checked", checked, "files, non-UTF-8:", sum(1 for k in files if b"\xff" in k))
"#;

#[test]
fn the_json_export_is_read_back_by_python_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = d.join("src");
    for (i, name) in ["a/one.bin", "a/two.txt", "b/three.bin"].iter().enumerate() {
        write_file(&src.join(name), &bytes(i as u64, 3000 + i * 5000), 0o640);
    }
    // A name that is not UTF-8, one with a quote, a backslash and a newline, and a symlink.
    let odd = std::ffi::OsStr::from_bytes(b"b/caf\xff\xe9.bin");
    write_file(&src.join(odd), b"latin-1 name", 0o644);
    write_file(&src.join("b/q\"u\\o\nte.txt"), b"quoted", 0o644);
    std::os::unix::fs::symlink("../a/one.bin", src.join("b/link")).unwrap();

    let tar = d.join("plain.tar");
    tar_members(&src, &tar, &["a"]);
    let zip = d.join("stored.zip");
    run(Command::new("zip")
        .args(["-q", "-r", "-0", "-y"])
        .arg(&zip)
        .arg("b")
        .current_dir(&src));
    // The .tar.gz holds a copy of the tree under another top directory.
    let copy = d.join("copy");
    std::fs::create_dir(&copy).unwrap();
    run(Command::new("cp")
        .arg("-a")
        .arg(src.join("a"))
        .arg(copy.join("c")));
    let tgz = d.join("more.tar.gz");
    run(Command::new("tar")
        .arg("-czf")
        .arg(&tgz)
        .arg("-C")
        .arg(&copy)
        .arg("c"));
    run(Command::new("cp")
        .arg("-a")
        .arg(copy.join("c"))
        .arg(src.join("c")));

    let export = |images: &[&Path]| {
        let out = packfs()
            .args(["ls", "--json", "--shares", "2"])
            .args(images)
            .output()
            .unwrap();
        assert_ok(&out);
        out.stdout
    };
    let images: [&Path; 3] = [&tar, &zip, &tgz];
    let check = |json: Vec<u8>| {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(CHECK)
            .arg(&src)
            .args(images)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), &json).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_ok(&out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = check(export(&images));
    assert!(said.contains("checked 7 files, non-UTF-8: 1"), "{said}");
    // From the index, the same lines.
    let index = d.join("all.packfs-index");
    run(packfs().arg("index").arg("-o").arg(&index).args(images));
    let from_index = export(&[&index]);
    assert_eq!(from_index, export(&images));
    // --shares needs --json, and N > 0.
    for bad in [
        &["ls", "--shares", "2"][..],
        &["ls", "--json", "--shares", "0"],
    ] {
        let out = packfs().args(bad).arg(&tar).output().unwrap();
        assert!(!out.status.success(), "{bad:?}");
    }
}
