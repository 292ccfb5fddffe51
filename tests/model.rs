//! The file-system core against a reference model, without the kernel: proptest generates member
//! lists (duplicates, implied parents, file/directory clashes, symlinks, hard links, non-UTF-8
//! names, sparse and compressible data), a real writer turns them into a tar (the tar crate), a
//! zip (the zip crate, stored and deflated) or a squashfs image (mksquashfs, every compressor),
//! packfs scans it, builds the catalog, writes and reopens the index, and every answer of the core
//! (lookup, getattr, list, readlink, read at random ranges) is compared with a BTreeMap of paths.
//! The same model then runs through a fault-injecting source: every injected fault becomes the
//! error of the read that met it, never wrong bytes.

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use packfs::catalog::{self, Catalog, DuplicatePolicy, Kind};
use packfs::fs::{Attr, Core, DirEntry, Error, Ino, Listing, Owner, ROOT_INO};
use packfs::source::read_at::ReadAt;
use packfs::tiers::faults::{Fault, Faulty};
use packfs::tiers::{self, OpenedImages, TierOptions};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};

const OWNER: Owner = Owner {
    uid: 1234,
    gid: 5678,
};
/// What zip members' DOS time (2024-02-29 13:14:16, read as UTC) means.
const ZIP_MTIME: i64 = 1_709_212_456;

/// Figures for the closing summary of each test.
#[derive(Default)]
struct Tally {
    cases: AtomicU64,
    reads: AtomicU64,
    faults: AtomicU64,
    failed_reads: AtomicU64,
}

impl Tally {
    fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn report(&self, what: &str) {
        println!(
            "model {what}: {} cases, {} reads compared, {} faults injected, {} reads failed with EIO",
            self.cases.load(Ordering::Relaxed),
            self.reads.load(Ordering::Relaxed),
            self.faults.load(Ordering::Relaxed),
            self.failed_reads.load(Ordering::Relaxed)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The generated archives and the model of what they serve.

#[derive(Clone, Debug)]
enum Node {
    File {
        data: Vec<u8>,
        mode: u32,
    },
    Dir {
        mode: u32,
    },
    Symlink(Vec<u8>),
    /// A hard link to the member at this index (a file whose path appears once).
    HardLink(usize),
}

#[derive(Clone, Debug)]
struct Member {
    path: Vec<Vec<u8>>,
    node: Node,
    mtime: i64,
}

impl Member {
    fn joined(&self) -> Vec<u8> {
        self.path.join(&b'/')
    }
}

/// What the tree holds at one path.
#[derive(Clone, Debug, PartialEq)]
enum Want {
    File {
        data: Vec<u8>,
        mode: u32,
        mtime: i64,
    },
    /// `mode` is `None` for a directory no member names (synthesized, 0755).
    Dir {
        mode: Option<u32>,
    },
    Symlink {
        target: Vec<u8>,
        mtime: i64,
    },
}

type Tree = BTreeMap<Vec<u8>, Want>;

/// What GNU tar extraction makes of a member list, member by member: hard links take their
/// target's data; a later member replaces an earlier one of the same name (a directory keeps the
/// last directory's attributes); missing parents appear. A member whose parent is a file, or a
/// file that would replace a directory already holding members, cannot be extracted and is left
/// out. Returns the tree and how many members were left out.
fn model(members: &[Member]) -> (Tree, u64) {
    let mut tree = Tree::new();
    let mut holds_members = std::collections::HashSet::new();
    let mut left_out = 0;
    for m in members {
        let want = match &m.node {
            Node::File { data, mode } => Want::File {
                data: data.clone(),
                mode: *mode,
                mtime: m.mtime,
            },
            Node::HardLink(t) => match &members[*t].node {
                Node::File { data, mode } => Want::File {
                    data: data.clone(),
                    mode: *mode,
                    mtime: members[*t].mtime,
                },
                _ => unreachable!("links are fixed up to name files"),
            },
            Node::Dir { mode } => Want::Dir { mode: Some(*mode) },
            Node::Symlink(target) => Want::Symlink {
                target: target.clone(),
                mtime: m.mtime,
            },
        };
        let path = m.joined();
        let parents: Vec<Vec<u8>> = (1..m.path.len()).map(|n| m.path[..n].join(&b'/')).collect();
        let blocked = parents
            .iter()
            .any(|p| tree.get(p).is_some_and(|w| !matches!(w, Want::Dir { .. })));
        let replaces_full_dir = !matches!(want, Want::Dir { .. }) && holds_members.contains(&path);
        if blocked || replaces_full_dir {
            left_out += 1;
            continue;
        }
        for p in parents {
            tree.entry(p.clone()).or_insert(Want::Dir { mode: None });
            holds_members.insert(p);
        }
        tree.insert(path, want);
    }
    (tree, left_out)
}

/// The members of a list that fit one tree (for writers that take a tree, not a list): those
/// that would need a file as a directory, or make one of a directory, are left out.
fn without_clashes(members: Vec<Member>) -> Vec<Member> {
    let mut kept: Vec<Member> = Vec::new();
    for m in members {
        let is_dir = matches!(m.node, Node::Dir { .. });
        let clashes = kept.iter().any(|k| {
            let k_dir = matches!(k.node, Node::Dir { .. });
            (k.path.len() < m.path.len() && m.path.starts_with(&k.path) && !k_dir)
                || (m.path.len() < k.path.len() && k.path.starts_with(&m.path) && !is_dir)
                || (k.path == m.path && k_dir != is_dir)
        });
        let links_away = matches!(m.node, Node::HardLink(_));
        if !clashes && !links_away {
            kept.push(m);
        }
    }
    kept
}

fn component(non_utf8: bool) -> BoxedStrategy<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = [
        "a",
        "b",
        "c d",
        "é",
        "x.jpg",
        "long_component_name_0123456789",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    if non_utf8 {
        names.push(b"caf\xe9".to_vec());
        names.push(b"\xff\xfe".to_vec());
    }
    prop::sample::select(names).boxed()
}

/// File contents: random bytes, compressible text, or zeros with a few islands (sparse blocks).
fn data() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..3000),
        (0usize..30_000, any::<u8>()).prop_map(|(n, seed)| {
            (0..n)
                .map(|i| b"0123456789 sample text\n"[(i + seed as usize) % 23])
                .collect()
        }),
        (
            0usize..40_000,
            prop::collection::vec((any::<u16>(), any::<u8>()), 0..4)
        )
            .prop_map(|(n, islands)| {
                let mut v = vec![0u8; n];
                for (at, b) in islands {
                    if n > 0 {
                        v[(at as usize * 7) % n] = b | 1;
                    }
                }
                v
            }),
    ]
    .boxed()
}

fn node(non_utf8: bool) -> BoxedStrategy<Node> {
    let target_bytes = if non_utf8 { 1u8..=255 } else { 32u8..=126 };
    let mode = prop::sample::select(vec![0o644u32, 0o600, 0o755, 0o444, 0o4755, 0o1777 & 0o7755]);
    prop_oneof![
        6 => (data(), mode.clone()).prop_map(|(data, mode)| Node::File { data, mode }),
        2 => mode.clone().prop_map(|m| Node::Dir { mode: m | 0o700 }),
        1 => prop::collection::vec(target_bytes, 1..40).prop_map(Node::Symlink),
        1 => any::<usize>().prop_map(Node::HardLink),
    ]
    .boxed()
}

/// Member lists; hard links that would not name a single earlier file become plain files.
fn members(non_utf8: bool, max: usize) -> BoxedStrategy<Vec<Member>> {
    let member = (
        prop::collection::vec(component(non_utf8), 1..=3),
        node(non_utf8),
        0i64..2_000_000_000,
    )
        .prop_map(|(path, node, mtime)| Member { path, node, mtime });
    prop::collection::vec(member, 1..max)
        .prop_map(|mut ms| {
            for i in 0..ms.len() {
                let Node::HardLink(pick) = ms[i].node else {
                    continue;
                };
                let path = ms[i].joined();
                // A target that extraction surely places: a top-level file named once, never
                // used as a directory.
                let targets: Vec<usize> = (0..i)
                    .filter(|&t| matches!(ms[t].node, Node::File { .. }))
                    .filter(|&t| ms[t].path.len() == 1 && ms[t].joined() != path)
                    .filter(|&t| ms.iter().filter(|o| o.path[0] == ms[t].path[0]).count() == 1)
                    .collect();
                ms[i].node = match targets.get(pick % targets.len().max(1)) {
                    Some(&t) => Node::HardLink(t),
                    None => Node::File {
                        data: b"was a link".to_vec(),
                        mode: 0o644,
                    },
                };
            }
            ms
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Writers.

fn os(bytes: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(bytes))
}

/// The member list as GNU tar members, in order (duplicates, links and clashes as they are).
fn write_tar(members: &[Member], out: &Path) {
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    for m in members {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(m.mtime as u64);
        let path = m.joined();
        match &m.node {
            Node::File { data, mode } => {
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                h.set_entry_type(tar::EntryType::Regular);
                b.append_data(&mut h, os(&path), data.as_slice()).unwrap();
            }
            Node::Dir { mode } => {
                h.set_mode(*mode);
                h.set_size(0);
                h.set_entry_type(tar::EntryType::Directory);
                b.append_data(&mut h, os(&path), std::io::empty()).unwrap();
            }
            Node::Symlink(target) => {
                h.set_mode(0o777);
                h.set_size(0);
                h.set_entry_type(tar::EntryType::Symlink);
                // Literally: `append_link` normalizes the target as a path ("//x" became "/x"),
                // so the archive would not hold the target the model expects.
                h.set_link_name_literal(target).unwrap();
                b.append_data(&mut h, os(&path), std::io::empty()).unwrap();
            }
            Node::HardLink(t) => {
                h.set_mode(0o644);
                h.set_size(0);
                h.set_entry_type(tar::EntryType::Link);
                b.append_link(&mut h, os(&path), os(&members[*t].joined()))
                    .unwrap();
            }
        }
    }
    b.into_inner().unwrap();
}

/// The tree as a zip: directories as entries, files stored or deflated, symlinks as `zip -y`
/// writes them. Names and targets are UTF-8 here (the zip crate's writer takes strings).
fn write_zip(tree: &Tree, out: &Path, deflate: bool) {
    use zip::write::SimpleFileOptions;
    let mut z = zip::ZipWriter::new(std::fs::File::create(out).unwrap());
    let time = zip::DateTime::from_date_and_time(2024, 2, 29, 13, 14, 16).unwrap();
    let method = if deflate {
        zip::CompressionMethod::Deflated
    } else {
        zip::CompressionMethod::Stored
    };
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).unwrap();
    for (path, want) in tree {
        let opts = SimpleFileOptions::default()
            .last_modified_time(time)
            .compression_method(method);
        match want {
            Want::File { data, mode, .. } => {
                z.start_file(text(path), opts.unix_permissions(*mode))
                    .unwrap();
                z.write_all(data).unwrap();
            }
            Want::Dir { mode } => {
                let opts = opts.unix_permissions(mode.unwrap_or(0o755));
                z.add_directory(format!("{}/", text(path)), opts).unwrap();
            }
            Want::Symlink { target, .. } => {
                z.add_symlink(text(path), text(target), opts).unwrap();
            }
        }
    }
    z.finish().unwrap();
}

/// The tree as files on disk, then mksquashfs with `options`. Without duplicate detection: under
/// load, mksquashfs 4.5.1's writes corrupt images with it now and then (13 of 60 builds of one
/// tree with `-comp zstd -b 4K -tailends`, 0 of 45 with `-no-duplicates`; packfs, unsquashfs and
/// the kernel agree on every such image), and duplicates are not what this test is about.
fn write_squashfs(tree: &Tree, work: &Path, out: &Path, options: &[&str]) {
    use std::os::unix::fs::PermissionsExt;
    let root = work.join("root");
    std::fs::create_dir(&root).unwrap();
    let mut dirs = Vec::new();
    for (path, want) in tree {
        let at = root.join(os(path));
        match want {
            Want::Dir { mode } => {
                std::fs::create_dir_all(&at).unwrap();
                dirs.push((at, mode.unwrap_or(0o755)));
            }
            Want::File { data, mode, mtime } => {
                std::fs::write(&at, data).unwrap();
                let f = std::fs::File::options().write(true).open(&at).unwrap();
                f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(*mtime as u64))
                    .unwrap();
                std::fs::set_permissions(&at, std::fs::Permissions::from_mode(*mode)).unwrap();
            }
            Want::Symlink { target, .. } => std::os::unix::fs::symlink(os(target), &at).unwrap(),
        }
    }
    // Modes last, so that read-only directories were writable while filled.
    for (dir, mode) in dirs.into_iter().rev() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let done = Command::new("mksquashfs")
        .arg(&root)
        .arg(out)
        .args([
            "-quiet",
            "-no-progress",
            "-noappend",
            "-processors",
            "1",
            "-no-duplicates",
        ])
        .args(options)
        .output()
        .expect("mksquashfs (squashfs-tools) runs");
    assert!(done.status.success(), "{done:?}");
}

// ---------------------------------------------------------------------------------------------
// Checking the core against the model.

/// One listed entry.
struct Listed {
    name: Vec<u8>,
    ino: Ino,
    kind: Kind,
    attr: Option<Attr>,
    next: u64,
}

/// A listing into a Vec that holds `room` entries per call, so that listings resume.
struct Page {
    room: usize,
    got: Vec<Listed>,
}

impl Listing for Page {
    fn add(&mut self, e: DirEntry) -> bool {
        if self.got.len() == self.room {
            return true;
        }
        self.got.push(Listed {
            name: e.name.to_vec(),
            ino: e.ino,
            kind: e.kind,
            attr: e.attr,
            next: e.next,
        });
        false
    }
}

/// Everything in a directory, listed `room` entries at a time.
fn list_all(core: &Core, ino: Ino, room: usize, with_attrs: bool) -> Result<Vec<Listed>, Error> {
    let mut all = Vec::new();
    let mut offset = 0;
    loop {
        let mut page = Page {
            room,
            got: Vec::new(),
        };
        core.list(ino, offset, with_attrs, &mut page)?;
        let Some(last) = page.got.last() else { break };
        offset = last.next;
        all.extend(page.got);
    }
    Ok(all)
}

fn resolve(core: &Core, path: &[u8]) -> Result<Attr, Error> {
    let mut attr = core.getattr(ROOT_INO)?;
    for comp in path.split(|&b| b == b'/') {
        attr = core.lookup(attr.ino, comp)?;
    }
    Ok(attr)
}

/// Reads `len` bytes at `offset` the way the kernel does: requests of at most 128 KiB.
fn read(core: &Core, ino: Ino, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    while out.len() < len {
        let ask = (len - out.len()).min(128 * 1024) as u32;
        let served = core.read(
            &packfs::tiers::ReadRequest::waiting(),
            ino,
            offset + out.len() as u64,
            ask,
            &mut buf,
        )?;
        if served.bytes().is_empty() {
            break;
        }
        out.extend_from_slice(served.bytes());
    }
    Ok(out)
}

/// How a format shows what the model says.
#[derive(Clone, Copy)]
struct Shows {
    /// Zip keeps a DOS time for every member.
    mtime: Option<i64>,
    /// Symlinks keep their mtime (tar); directories their explicit mode (all formats here).
    symlink_mtime: bool,
    /// Permission bits the archive holds: the zip crate's writer keeps only the low nine (packfs
    /// serves setuid, setgid and sticky from zips that have them: tests/zip.rs).
    perm_mask: u32,
}

fn fail(what: String) -> TestCaseError {
    TestCaseError::fail(what)
}

/// Every answer of the core for every path of the model, and reads at `ranges` (fractions of
/// each file's size).
fn compare(
    core: &Core,
    tree: &Tree,
    shows: Shows,
    ranges: &[(u16, u16)],
    tally: &Tally,
) -> Result<(), TestCaseError> {
    let shown = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
    for (path, want) in tree {
        let attr = resolve(core, path).map_err(|e| fail(format!("{}: {e}", shown(path))))?;
        prop_assert_eq!(attr.owner, OWNER);
        match want {
            Want::File { data, mode, mtime } => {
                prop_assert_eq!(attr.kind, Kind::File, "{}", shown(path));
                prop_assert_eq!(attr.size, data.len() as u64, "{}", shown(path));
                prop_assert_eq!(attr.perm as u32, *mode & shows.perm_mask, "{}", shown(path));
                prop_assert_eq!(attr.mtime, shows.mtime.unwrap_or(*mtime), "{}", shown(path));
                let whole = read(core, attr.ino, 0, data.len() + 10)
                    .map_err(|e| fail(format!("{}: {e}", shown(path))))?;
                prop_assert!(whole == *data, "{} reads wrong bytes", shown(path));
                for &(a, b) in ranges {
                    let n = data.len() as u64 + 1;
                    let offset = a as u64 * n / 65536;
                    let len = (b as u64 * n / 65536) as usize;
                    let got = read(core, attr.ino, offset, len)
                        .map_err(|e| fail(format!("{}: {e}", shown(path))))?;
                    let from = (offset as usize).min(data.len());
                    let to = (offset as usize + len).min(data.len());
                    prop_assert!(got == data[from..to], "{} at {offset}+{len}", shown(path));
                }
                tally.add(&tally.reads, 1 + ranges.len() as u64);
                prop_assert!(matches!(core.readlink(attr.ino), Err(Error::NotSymlink)));
                prop_assert!(matches!(core.lookup(attr.ino, b"x"), Err(Error::NotDir)));
            }
            Want::Dir { mode } => {
                prop_assert_eq!(attr.kind, Kind::Dir, "{}", shown(path));
                prop_assert_eq!(
                    attr.perm as u32,
                    mode.unwrap_or(0o755) & shows.perm_mask,
                    "{}",
                    shown(path)
                );
                prop_assert!(matches!(
                    core.read(
                        &packfs::tiers::ReadRequest::waiting(),
                        attr.ino,
                        0,
                        10,
                        &mut Vec::new()
                    ),
                    Err(Error::IsDir)
                ));
            }
            Want::Symlink { target, mtime } => {
                prop_assert_eq!(attr.kind, Kind::Symlink, "{}", shown(path));
                prop_assert_eq!(core.readlink(attr.ino).ok(), Some(target.as_slice()));
                if shows.symlink_mtime {
                    prop_assert_eq!(attr.mtime, *mtime, "{}", shown(path));
                }
                prop_assert!(matches!(
                    core.read(
                        &packfs::tiers::ReadRequest::waiting(),
                        attr.ino,
                        0,
                        10,
                        &mut Vec::new()
                    ),
                    Err(Error::NotFile)
                ));
            }
        }
    }
    // Every directory lists exactly its children, in name order, across resumed calls.
    let mut dirs: Vec<&[u8]> = vec![b""];
    dirs.extend(
        tree.iter()
            .filter(|(_, w)| matches!(w, Want::Dir { .. }))
            .map(|(p, _)| p.as_slice()),
    );
    for (n, dir) in dirs.into_iter().enumerate() {
        let ino = if dir.is_empty() {
            ROOT_INO
        } else {
            resolve(core, dir).map_err(|e| fail(e.to_string()))?.ino
        };
        let with_attrs = n % 2 == 1;
        let listed = list_all(core, ino, 1 + n % 4, with_attrs).map_err(|e| fail(e.to_string()))?;
        prop_assert_eq!(&listed[0].name, b".");
        prop_assert_eq!(&listed[1].name, b"..");
        let names: Vec<&[u8]> = listed[2..].iter().map(|l| l.name.as_slice()).collect();
        let prefix = if dir.is_empty() {
            Vec::new()
        } else {
            [dir, b"/"].concat()
        };
        let want: Vec<&[u8]> = tree
            .keys()
            .filter_map(|p| p.strip_prefix(prefix.as_slice()))
            .filter(|rest| !rest.is_empty() && !rest.contains(&b'/'))
            .collect();
        prop_assert_eq!(&names, &want, "listing of {}", shown(dir));
        for l in &listed[2..] {
            let child = core
                .lookup(listed[0].ino, &l.name)
                .map_err(|e| fail(e.to_string()))?;
            prop_assert_eq!((child.ino, child.kind), (l.ino, l.kind));
            if with_attrs {
                prop_assert_eq!(l.attr.as_ref(), Some(&child));
            }
        }
    }
    prop_assert!(matches!(
        core.lookup(ROOT_INO, b"no such name"),
        Err(Error::NotFound)
    ));
    prop_assert!(matches!(core.getattr(0), Err(Error::NotFound)));
    prop_assert!(matches!(core.getattr(u64::MAX), Err(Error::NotFound)));
    Ok(())
}

/// A core over `catalog` whose image 0 is read through `wrap`.
fn core_over(
    catalog: Arc<Catalog>,
    opts: &TierOptions,
    wrap: impl Fn(Arc<dyn ReadAt>) -> Arc<dyn ReadAt>,
) -> Core {
    let source = OpenedImages::open(catalog.images(), &packfs::source::Stores::default())
        .unwrap()
        .wrapped(|_, data| wrap(data));
    let files = tiers::assemble(Arc::new(source), &catalog, opts).unwrap();
    Core::new(catalog, Arc::new(files), OWNER)
}

/// Tier settings a case picks: no cache, a tiny one, RAM chunks.
fn tier_options(pick: u8) -> TierOptions {
    let mut opts = TierOptions::direct([0, 8 << 10, 1 << 20, 64 << 20][pick as usize % 4]);
    opts.chunk_size = 64 << 10;
    opts.ram_chunks = pick.is_multiple_of(3);
    opts
}

/// Faults at random spots of an image of `len` bytes.
fn faults(len: u64, picks: &[(u16, u8)]) -> Vec<(Range<u64>, Fault)> {
    picks
        .iter()
        .map(|&(at, kind)| {
            let start = at as u64 * len / 65536;
            let fault = match kind % 4 {
                0 | 1 => Fault::Eio,
                2 => Fault::Short(1 + kind as usize % 37),
                _ => Fault::Latency(Duration::from_micros(50)),
            };
            (start..start + 1 + kind as u64 * 17, fault)
        })
        .collect()
}

/// Runs the model through a faulty source: each read either returns the model's bytes or fails
/// with EIO; without EIO faults every read succeeds.
fn compare_under_faults(
    catalog: &Arc<Catalog>,
    tree: &Tree,
    opts: &TierOptions,
    picks: &[(u16, u8)],
    tally: &Tally,
) -> Result<(), TestCaseError> {
    let len = catalog.images()[0].fingerprint.size;
    let plan = faults(len, picks);
    let any_eio = plan.iter().any(|(_, f)| matches!(f, Fault::Eio));
    let faulty: std::sync::Mutex<Option<Arc<Faulty>>> = Default::default();
    let core = core_over(catalog.clone(), opts, |data| {
        let f = Arc::new(Faulty::new(data, plan.clone()));
        *faulty.lock().unwrap() = Some(f.clone());
        f
    });
    for (path, want) in tree {
        let Want::File { data, .. } = want else {
            continue;
        };
        let attr = resolve(&core, path).map_err(|e| fail(e.to_string()))?;
        match read(&core, attr.ino, 0, data.len()) {
            Ok(got) => prop_assert!(
                got == *data,
                "{}: wrong bytes under faults",
                String::from_utf8_lossy(path)
            ),
            Err(Error::Io { error, .. }) => {
                prop_assert!(any_eio, "a read failed without an EIO fault: {error}");
                tally.add(&tally.failed_reads, 1);
            }
            Err(other) => return Err(fail(format!("unexpected error under faults: {other}"))),
        }
        tally.add(&tally.reads, 1);
    }
    let injected = faulty.lock().unwrap().as_ref().map_or(0, |f| f.injected());
    tally.add(&tally.faults, injected);
    Ok(())
}

/// Scans `image`, builds the catalog, checks it; writes the index, reopens it, checks that too;
/// then the faulty run over the reopened index.
/// What a case varies besides the archive: the tier settings, the read ranges, the faults.
#[derive(Clone, Debug)]
struct Variation {
    pick: u8,
    ranges: Vec<(u16, u16)>,
    faults: Vec<(u16, u8)>,
}

fn check_image(
    image: &Path,
    work: &Path,
    (tree, left_out): &(Tree, u64),
    shows: Shows,
    v: &Variation,
    tally: &Tally,
) -> Result<(), TestCaseError> {
    let (pick, ranges, fault_picks) = (v.pick, &v.ranges, &v.faults);
    let mut scanned = packfs::dataset::scan_all(
        &[packfs::source::ImageLocation::File(image.to_path_buf())],
        &packfs::dataset::nested::Nesting::default(),
        &packfs::source::Stores::default(),
        &packfs::dataset::quiet,
    )
    .map_err(|e| fail(e.to_string()))?;
    let built = packfs::dataset::build_settling_clashes(&mut scanned, DuplicatePolicy::Error)
        .map_err(|e| fail(e.to_string()))?;
    prop_assert_eq!(scanned[0].skipped, *left_out, "members left out");
    let built = Arc::new(built);
    let opts = tier_options(pick);
    compare(
        &core_over(built.clone(), &opts, |d| d),
        tree,
        shows,
        ranges,
        tally,
    )?;
    let index = work.join("model.packfs-index");
    catalog::index::write(&built, &index).map_err(|e| fail(e.to_string()))?;
    let reopened = Arc::new(
        catalog::index::open(&index, &packfs::source::Stores::default())
            .map_err(|e| fail(e.to_string()))?,
    );
    prop_assert_eq!(reopened.len(), built.len());
    compare(
        &core_over(reopened.clone(), &opts, |d| d),
        tree,
        shows,
        ranges,
        tally,
    )?;
    compare_under_faults(&reopened, tree, &opts, fault_picks, tally)?;
    tally.add(&tally.cases, 1);
    Ok(())
}

/// A runner whose cases come from one seed: `PACKFS_PROPTEST_SEED`, or a fresh one each run.
/// The seed is printed (libtest shows it with a failure), and setting it replays the same cases,
/// so a failure seen once in CI can be run again.
fn runner(cases: u32) -> TestRunner {
    use std::hash::{BuildHasher, Hasher};
    let seed = std::env::var("PACKFS_PROPTEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        });
    eprintln!("cases from seed {seed}: PACKFS_PROPTEST_SEED={seed} replays them");
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

/// Tier settings, read ranges and faults for one case.
fn variation() -> impl Strategy<Value = Variation> {
    (
        any::<u8>(),
        prop::collection::vec((any::<u16>(), any::<u16>()), 1..4),
        prop::collection::vec((any::<u16>(), any::<u8>()), 1..5),
    )
        .prop_map(|(pick, ranges, faults)| Variation {
            pick,
            ranges,
            faults,
        })
}

#[test]
fn tar_images_serve_what_extraction_makes() {
    let tally = Tally::default();
    let strategy = (members(true, 24), variation());
    runner(256)
        .run(&strategy, |(members, v)| {
            let work = tempfile::tempdir().unwrap();
            let image = work.path().join("model.tar");
            write_tar(&members, &image);
            let shows = Shows {
                mtime: None,
                symlink_mtime: true,
                perm_mask: 0o7777,
            };
            check_image(&image, work.path(), &model(&members), shows, &v, &tally)
        })
        .unwrap();
    tally.report("tar");
}

/// Cases for the formats written from a tree: `write` makes the image from the tree and the
/// case's `extra` choice (compression, options).
fn tree_cases<X: Clone + std::fmt::Debug>(
    what: &str,
    cases: u32,
    non_utf8: bool,
    extra: impl Strategy<Value = X>,
    shows: Shows,
    write: impl Fn(&Tree, &Path, &X) -> std::path::PathBuf,
) {
    let tally = Tally::default();
    runner(cases)
        .run(
            &(members(non_utf8, 16), extra, variation()),
            |(members, x, v)| {
                let (tree, left_out) = model(&without_clashes(members));
                assert_eq!(left_out, 0, "a tree has no clashes");
                let work = tempfile::tempdir().unwrap();
                let image = write(&tree, work.path(), &x);
                check_image(&image, work.path(), &(tree, 0), shows, &v, &tally)
            },
        )
        .unwrap();
    tally.report(what);
}

#[test]
fn zip_images_serve_what_extraction_makes() {
    let shows = Shows {
        mtime: Some(ZIP_MTIME),
        symlink_mtime: false,
        perm_mask: 0o777,
    };
    tree_cases(
        "zip",
        192,
        false,
        any::<bool>(),
        shows,
        |tree, work, &deflate| {
            let image = work.join("model.zip");
            write_zip(tree, &image, deflate);
            image
        },
    );
}

#[test]
fn squashfs_images_serve_what_extraction_makes() {
    let compressors = prop::sample::select(vec![
        vec!["-comp", "gzip", "-b", "4K"],
        vec!["-comp", "zstd", "-b", "4K", "-tailends"],
        vec!["-comp", "lz4"],
        vec!["-comp", "xz", "-b", "8K", "-no-fragments"],
        vec!["-comp", "zstd", "-b", "4K", "-noI", "-noD", "-noF", "-noX"],
    ]);
    let shows = Shows {
        mtime: None,
        symlink_mtime: false,
        perm_mask: 0o7777,
    };
    tree_cases(
        "squashfs",
        96,
        true,
        compressors,
        shows,
        |tree, work, options| {
            let image = work.join("model.sqfs");
            write_squashfs(tree, work, &image, options);
            image
        },
    );
}
