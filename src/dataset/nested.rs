//! Archives inside an archive, served as directories of their members: ImageNet's training set
//! comes as one tar of 1 000 class tars, and `ImageFolder` wants the classes as directories.
//!
//! An archive stored as a member of an image (its bytes as they are: a plain tar's member, a zip
//! member stored) is scanned as an image of its own, a window of the outer image
//! (`ImageLocation::Within`), and its members take the outer member's place in the tree, under
//! its path. Its bytes stay where they are: a read of an inner member is one read of the outer
//! image, cached and staged as the outer image's. Nothing is extracted.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tracing::warn;

use std::os::unix::ffi::OsStrExt;

use crate::archive::registry::Registry;
use crate::archive::{self, Encoding, Member, MemberKind, ScannedImage, Span, format::Probe};
use crate::source::ImageLocation;
use crate::source::read_at::{ReadAt, Window};

/// Which archives inside an archive are served as directories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum InnerKinds {
    /// None: every member is the file it is.
    None,
    /// Tar archives, plain or compressed (a class's tar, a split's `.tar.gz`). A zip or a
    /// squashfs image stays a file: a `.npz` sample or a `.docx` is a zip.
    #[default]
    Tar,
    /// Every format packfs reads (tar, compressed tar, zip, squashfs), as ratarmount's
    /// `--recursive`.
    All,
}

/// How archives inside archives are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nesting {
    pub kinds: InnerKinds,
    /// Levels of archives inside archives served as directories (1: those in the images given).
    pub depth: u32,
    /// `n01440764.tar` served as the directory `n01440764` (its archive extension dropped),
    /// unless that name is taken.
    pub strip_extension: bool,
    /// The memory budget of the scan (a mount's `--cache-size` + 64 MiB; `ls` and `index`
    /// take the default cache's): archives inside images are opened while their cost, about
    /// `COST_PER_INNER` each, fits in it. Not part of the tree an index records.
    pub budget: u64,
    /// At most this many archives inside images opened, whatever the budget (`--inner-max`).
    pub most: Option<usize>,
}

/// What an archive inside an image costs a scan, and then a daemon, besides its entries: its
/// image record, location and window (measured: 1.1 KB in `ls`, 1.4 KB in a daemon, with
/// 100 000 inner tars).
pub const COST_PER_INNER: u64 = 1536;

/// The scan budget of `ls` and `index` (the default cache of 64 MiB + 64 MiB).
pub const DEFAULT_BUDGET: u64 = 128 << 20;

/// The default depth: deep enough for any dataset seen (a tar of class tars is 1), shallow
/// enough that an archive that holds itself stops soon.
pub const DEFAULT_DEPTH: u32 = 4;

impl Default for Nesting {
    fn default() -> Nesting {
        Nesting {
            kinds: InnerKinds::Tar,
            depth: DEFAULT_DEPTH,
            strip_extension: false,
            budget: DEFAULT_BUDGET,
            most: None,
        }
    }
}

impl Nesting {
    /// Members served as they are, never opened as archives.
    pub fn none() -> Nesting {
        Nesting {
            kinds: InnerKinds::None,
            ..Nesting::default()
        }
    }

    /// Whether it makes the tree the images make without options (the budget aside).
    pub fn is_default_tree(&self) -> bool {
        Nesting {
            budget: DEFAULT_BUDGET,
            most: None,
            ..*self
        } == Nesting::default()
    }

    fn expands(&self) -> bool {
        self.kinds != InnerKinds::None && self.depth > 0
    }
}

/// Inner archives opened at most, in all the images of a dataset; and of those, archives whose
/// scan keeps checkpoint tables (compressed tars, zips with large deflated members), each held
/// open as a temporary file and mapped while mounted. Beyond them, archives are files (with a
/// warning): a hostile tar of a million tiny `.tar.gz` must not take a million descriptors.
const MAX_INNER: usize = 1 << 20;
const MAX_INNER_WITH_TABLES: usize = 4096;

/// An archive inside an image adds at most one member per this many of its bytes (and 1 024
/// members to any): a tar's member takes 512 bytes at least, a zip's 76, and real samples far
/// more. Nesting then never adds more entries than the bytes that hold them could describe.
const BYTES_PER_ENTRY: u64 = 32;

fn entries_in(size: u64) -> u64 {
    (size / BYTES_PER_ENTRY).max(1024)
}

/// What is left of those bounds while a dataset's images are expanded (by several scan threads).
pub struct Room {
    /// Inner archives opened at most in this scan.
    most: usize,
    inner: AtomicUsize,
    with_tables: AtomicUsize,
    warned: AtomicBool,
}

impl Room {
    /// The room of a scan under `nesting`'s budget: the inner archives' own cost takes at most
    /// half of it (their entries are the catalog's, as a flat image's are).
    pub fn for_nesting(nesting: &Nesting) -> Room {
        let by_budget = (nesting.budget / 2 / COST_PER_INNER) as usize;
        let most = nesting.most.unwrap_or(by_budget).min(MAX_INNER);
        Room {
            most,
            inner: AtomicUsize::new(most),
            with_tables: AtomicUsize::new(MAX_INNER_WITH_TABLES),
            warned: AtomicBool::new(false),
        }
    }
}

impl Room {
    /// Takes room for one inner archive (with checkpoint tables or not); false when none is left.
    fn take(&self, tables: bool) -> bool {
        let take = |n: &AtomicUsize| {
            n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(1)
            })
            .is_ok()
        };
        if !take(&self.inner) {
            return false;
        }
        if tables && !take(&self.with_tables) {
            self.inner.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// `outer` (scanned from `data`) and the archives inside it, as far as `nesting` says: `outer`
/// first (its archive members taken out), then each inner archive after the image that holds
/// it, whose position in the returned list its `within` gives. Reads go through `data`, the
/// scan's own reader: no second open of the image (a metadata request on a parallel FS).
pub fn expand(
    outer: ScannedImage,
    data: Arc<dyn ReadAt>,
    nesting: &Nesting,
    room: &Room,
) -> Vec<ScannedImage> {
    let mut group = vec![outer];
    if !nesting.expands() || group[0].stream.is_some() {
        // A compressed image's members lie in its decoded stream, not as stored bytes.
        return group;
    }
    let mut readers = vec![data];
    let mut depth_of = vec![0u32];
    let mut next = 0;
    while next < group.len() {
        if depth_of[next] < nesting.depth && group[next].stream.is_none() {
            let data = readers[next].clone();
            // Taken out while its archives join the group (a placeholder that allocates nothing
            // holds its place), so they go straight in: collected apart first, 100 000 inner
            // archives were held twice at the peak.
            let placeholder =
                ScannedImage::new(ImageLocation::File(PathBuf::new()), Default::default());
            let mut image = std::mem::replace(&mut group[next], placeholder);
            expand_one(
                &mut image,
                data,
                next,
                nesting,
                room,
                &mut group,
                &mut readers,
            );
            group[next] = image;
            depth_of.resize(group.len(), depth_of[next] + 1);
        }
        next += 1;
    }
    group
}

/// The archives among `image`'s members (read through `data`), scanned, their members' paths
/// under the member's, pushed onto `group` with their windows of `data` onto `readers`; the
/// members that held them are taken out of `image`.
fn expand_one(
    image: &mut ScannedImage,
    data: Arc<dyn ReadAt>,
    at: usize,
    nesting: &Nesting,
    room: &Room,
    group: &mut Vec<ScannedImage>,
    readers: &mut Vec<Arc<dyn ReadAt>>,
) {
    // Candidates by name first: reading the head of every sample of a million-file shard would
    // cost a read each (an RPC each on a cold parallel FS). Their bytes then decide.
    let candidates: Vec<usize> = (0..image.members.len())
        .filter(|&i| {
            let m = &image.members[i];
            m.kind == MemberKind::File
                && m.size > 0
                && matches!(m.encoding, Encoding::Stored | Encoding::StoredCrc)
                && archive_name(image.path_of(m), nesting.kinds)
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    let mut taken = taken_names(image);
    let mut expanded = Vec::new();
    // At most one each: reserved exactly, not by doubling.
    group.reserve(candidates.len());
    readers.reserve(candidates.len());
    // The byte ranges of the archives opened so far: one stored twice under two names (a
    // squashfs image shares the blocks of equal files; a crafted image points many members at
    // one) is opened once, so nesting never multiplies what the bytes hold.
    let mut opened: BTreeMap<u64, u64> = BTreeMap::new();
    // Archives whose stripped name the image serves already: they keep their extension.
    let mut kept_suffix: Vec<Vec<u8>> = Vec::new();
    for i in candidates {
        let m = image.members[i];
        let name = image.path_of(&m).to_vec();
        let end = m.data_offset.saturating_add(m.size);
        // The ranges are disjoint: only the last to start before this one's end can overlap it.
        if let Some((&at, _)) = opened
            .range(..end)
            .next_back()
            .filter(|&(_, &stop)| m.data_offset < stop)
        {
            warn!(
                image = %image.path.display(),
                offset = m.header_offset,
                "member {:?} is served as a file, not opened as an archive: its bytes overlap \
                 those of the archive at offset {at}, opened already (archives inside an image \
                 are opened once)",
                String::from_utf8_lossy(&name)
            );
            continue;
        }
        let window: Arc<dyn ReadAt> = Arc::new(Window::new(data.clone(), m.data_offset, m.size));
        if !is_archive(&*window, m.size, &name, nesting.kinds) {
            continue;
        }
        let location = ImageLocation::within(
            image.location.clone(),
            PathBuf::from(std::ffi::OsStr::from_bytes(&name)),
            m.data_offset,
            m.size,
        );
        // Scanned as an image of the member's size; its fingerprint is then the outer image's
        // (one changes when the other does).
        let sized = crate::source::Fingerprint {
            size: m.size,
            ..image.fingerprint
        };
        let mut inner = match archive::scan(&location, &*window, sized) {
            Ok(mut inner) => {
                inner.fingerprint = image.fingerprint;
                inner
            }
            Err(e) => {
                warn!(
                    image = %image.path.display(),
                    offset = m.header_offset,
                    "member {:?} looks like an archive but is served as a file: {e}",
                    String::from_utf8_lossy(&name)
                );
                continue;
            }
        };
        let most = entries_in(m.size);
        if inner.members.len() as u64 > most {
            warn!(
                image = %image.path.display(),
                offset = m.header_offset,
                "member {:?} is served as a file, not opened as an archive: its {} bytes \
                 declare {} members, more than the one per {BYTES_PER_ENTRY} bytes an archive \
                 inside an image may add ({most})",
                String::from_utf8_lossy(&name),
                m.size,
                inner.members.len()
            );
            continue;
        }
        if !room.take(inner.tables.is_some()) {
            if !room.warned.swap(true, Ordering::Relaxed) {
                warn!(
                    image = %image.path.display(),
                    offset = m.header_offset,
                    "member {:?} and later archives inside images are served as files: a \
                     dataset opens at most {} archives inside its images here (each costs \
                     about {COST_PER_INNER} bytes of the memory budget, which a mount's \
                     --cache-size raises, or give --inner-max N; never more than {MAX_INNER}), \
                     {MAX_INNER_WITH_TABLES} of them compressed",
                    String::from_utf8_lossy(&name),
                    room.most
                );
            }
            continue;
        }
        let dir = match (nesting.strip_extension, stripped(&name)) {
            (true, Some(short)) if !taken.contains(short) => short.to_vec(),
            (true, Some(_)) => {
                kept_suffix.push(name.clone());
                name.clone()
            }
            _ => name.clone(),
        };
        taken.insert(dir.clone());
        place_under(&mut inner, &dir, &m);
        inner.shrink_to_fit();
        opened.insert(m.data_offset, end);
        inner.within = Some(at);
        group.push(inner);
        readers.push(window);
        expanded.push(i);
    }
    if let Some(first) = kept_suffix.first() {
        let short = stripped(first).unwrap_or(first);
        warn!(
            image = %image.path.display(),
            "{} archive(s) inside the image keep their extension although \
             --strip-inner-extension was given, because the image already serves the name \
             without it: {:?} is the directory {:?}, beside the image's own {:?} (ImageFolder \
             would see both as classes); rename one, or leave out --strip-inner-extension",
            kept_suffix.len(),
            String::from_utf8_lossy(first),
            String::from_utf8_lossy(first),
            String::from_utf8_lossy(short)
        );
    }
    // The members that are now directories: each accounted for as merged into what it holds.
    let mut k = 0;
    image.members.retain(|_| {
        let keep = expanded.binary_search(&k).is_err();
        k += 1;
        keep
    });
    image.merged += expanded.len() as u64;
    group.shrink_to_fit();
    readers.shrink_to_fit();
}

/// Which names and contents make an archive is the registry's to say (`archive::registry`,
/// each format's `Inside`): here, only which kinds `--inner-archives` opens.
fn all_kinds(kinds: InnerKinds) -> bool {
    kinds == InnerKinds::All
}

/// Whether a member's name is one an archive of `kinds` has.
fn archive_name(name: &[u8], kinds: InnerKinds) -> bool {
    Registry::standard().inner_name(name, all_kinds(kinds))
}

/// Whether the `len` bytes of `window` (a member named `name`) are an archive of `kinds`.
fn is_archive(window: &dyn ReadAt, len: u64, name: &[u8], kinds: InnerKinds) -> bool {
    let mut head = [0u8; 512];
    let Ok(n) = window.read_up_to(&mut head, 0) else {
        return false;
    };
    let probe = Probe {
        head: &head[..n],
        file: window,
        len,
    };
    Registry::standard().inner_archive(&probe, name, all_kinds(kinds))
}

/// The directory an archive inside an image is served as: its entries all lie under it, so it
/// is the shortest path among them.
pub fn served_dir(inner: &ScannedImage) -> Option<&[u8]> {
    inner
        .members
        .iter()
        .map(|m| inner.bytes(m.path))
        .min_by_key(|p| p.len())
}

/// `name` without its archive extension, if it has one and something is left.
fn stripped(name: &[u8]) -> Option<&[u8]> {
    Registry::standard().strip_extension(name)
}

/// Every path `image` serves and every directory above one: a stripped name must not be one.
fn taken_names(image: &ScannedImage) -> HashSet<Vec<u8>> {
    let mut taken = HashSet::new();
    for m in &image.members {
        let mut path = image.path_of(m);
        while taken.insert(path.to_vec()) {
            match path.iter().rposition(|&b| b == b'/') {
                Some(slash) => path = &path[..slash],
                None => break,
            }
        }
    }
    taken
}

/// Puts `inner`'s members under the directory `dir`, which takes the attributes of the member
/// `holder` that held the archive (as a directory: searchable where readable) unless the
/// archive has a root entry of its own.
fn place_under(inner: &mut ScannedImage, dir: &[u8], holder: &Member) {
    let mut has_root = false;
    for i in 0..inner.members.len() {
        let m = inner.members[i];
        let path = inner.bytes(m.path).to_vec();
        let mut full = dir.to_vec();
        if !path.is_empty() {
            full.push(b'/');
            full.extend_from_slice(&path);
        } else {
            has_root = true;
        }
        inner.members[i].path = inner.push_string(&full);
    }
    if !has_root {
        let path = inner.push_string(dir);
        let readable = holder.mode & 0o444;
        inner.members.push(Member {
            path,
            link: Span::default(),
            kind: MemberKind::Dir,
            mode: holder.mode | readable >> 2,
            mtime: holder.mtime,
            mtime_nsec: holder.mtime_nsec,
            size: 0,
            data_offset: 0,
            encoding: Encoding::Stored,
            header_offset: holder.header_offset,
        });
        // Served, and no header of the archive's: counted so the accounting stays whole.
        inner.headers += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_extensions_are_stripped_longest_first() {
        let s = |n: &str| stripped(n.as_bytes()).map(|b| String::from_utf8_lossy(b).into_owned());
        assert_eq!(s("n01440764.tar").as_deref(), Some("n01440764"));
        assert_eq!(s("train/split.TAR.GZ").as_deref(), Some("train/split"));
        assert_eq!(s("a.tgz").as_deref(), Some("a"));
        assert_eq!(s("weights.npz"), None);
        assert_eq!(s(".tar"), None, "nothing would be left");
    }

    /// A stripped name is never one the image already serves, as a file or as a directory
    /// above one: `a.tar` beside a directory `a/` stays `a.tar`.
    #[test]
    fn names_taken_include_every_directory_above_a_member() {
        let location = ImageLocation::File("t.tar".into());
        let mut image = ScannedImage::new(location, Default::default());
        for path in ["a/b/c.jpg", "x.tar"] {
            let span = image.push_string(path.as_bytes());
            image.members.push(Member {
                path: span,
                link: Span::default(),
                kind: MemberKind::File,
                mode: 0o644,
                mtime: 0,
                mtime_nsec: 0,
                size: 1,
                data_offset: 0,
                encoding: Encoding::Stored,
                header_offset: 0,
            });
        }
        let taken = taken_names(&image);
        for name in ["a", "a/b", "a/b/c.jpg", "x.tar"] {
            assert!(taken.contains(name.as_bytes()), "{name}");
        }
        assert!(!taken.contains(&b"x"[..]));
    }

    /// Archives inside images cost about 1.5 KB each besides their entries: a scan opens as
    /// many as fit in half its budget (43 690 with the default cache), a mount's --cache-size
    /// raises that, and --inner-max sets it.
    #[test]
    fn the_budget_bounds_how_many_inner_archives_are_opened() {
        assert_eq!(Room::for_nesting(&Nesting::default()).most, 43_690);
        let big = Nesting {
            budget: (1 << 30) + (64 << 20),
            ..Nesting::default()
        };
        assert_eq!(Room::for_nesting(&big).most, 371_370);
        let set = Nesting {
            most: Some(5),
            ..Nesting::default()
        };
        assert_eq!(Room::for_nesting(&set).most, 5);
        assert!(set.is_default_tree() && big.is_default_tree());
    }

    /// Zeros are no tar here (an empty sample), nor a name without a tar's magic.
    #[test]
    fn only_real_archives_are_opened() {
        let zeros = vec![0u8; 4096];
        assert!(!is_archive(&zeros, 4096, b"empty.tar", InnerKinds::All));
        let gzip_sample = [&b"\x1f\x8b\x08\x00"[..], &[0u8; 600]].concat();
        assert!(!is_archive(
            &gzip_sample,
            604,
            b"x.json.gz",
            InnerKinds::All
        ));
        let zip = [&b"PK\x03\x04"[..], &[0u8; 600]].concat();
        assert!(!is_archive(&zip, 604, b"w.npz", InnerKinds::Tar));
        assert!(is_archive(&zip, 604, b"w.npz", InnerKinds::All));
    }
}
