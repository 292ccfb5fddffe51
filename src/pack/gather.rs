//! The members to pack, gathered from the sources: directory trees walked in parallel (a parallel
//! file system answers each directory listing and stat with a round trip, so one walker would
//! spend hours on ImageNet), and images or an index read through the catalog and the tiers, so
//! every format packfs mounts can be resharded or converted.

use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::warn;

use super::PackError;
use crate::catalog::{Catalog, EntryId, Kind, ROOT};
use crate::tiers::{self, FileReader};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKind {
    File,
    Dir,
    Symlink,
}

/// Where a member's bytes come from.
#[derive(Clone, Copy, Debug)]
pub enum Origin {
    /// A file under the directory source with this number: at its base joined with the path.
    Disk(u32),
    /// An entry of the images' catalog.
    Catalog(EntryId),
    /// A label member made by `pack --labels` (`labels`): the class number.
    Label(u32),
}

/// One member to pack.
#[derive(Debug)]
pub struct Item {
    /// The member name: relative, `/`-separated, sanitized.
    pub path: Box<[u8]>,
    /// A symlink's target (empty otherwise).
    pub link: Box<[u8]>,
    pub kind: ItemKind,
    pub mode: u32,
    pub mtime: i64,
    pub size: u64,
    pub origin: Origin,
    /// Length of the sample key at the start of `path` (set by `Item::set_key`).
    pub key_len: u32,
}

impl Item {
    /// The sample key (`archive::name::key_of` of the path), cached for sorting.
    pub fn key(&self) -> &[u8] {
        &self.path[..self.key_len as usize]
    }

    /// What the member's tar header says it is.
    pub fn header_kind(&self) -> super::tar_writer::HeaderKind<'_> {
        use super::tar_writer::HeaderKind;
        match self.kind {
            ItemKind::File => HeaderKind::File { size: self.size },
            ItemKind::Dir => HeaderKind::Dir,
            ItemKind::Symlink => HeaderKind::Symlink { target: &self.link },
        }
    }

    pub fn set_key(&mut self) {
        self.key_len = crate::archive::name::key_of(&self.path).len() as u32;
    }
}

/// A directory given as a source: its members are named from its own name down (as `tar -C
/// PARENT -c NAME` names them), so `pack /data/train` makes `train/...`.
#[derive(Debug)]
pub struct DirSource {
    /// The directory's parent: a member's file is `base/path`.
    pub base: PathBuf,
    pub root: PathBuf,
}

/// Every source of one pack, and how to read their members.
pub struct Sources {
    pub dirs: Vec<DirSource>,
    /// Images and index sources, merged into one tree as a mount would merge them.
    pub images: Option<(std::sync::Arc<Catalog>, FileReader)>,
    /// How the image sources were named, for the manifest.
    pub image_patterns: Vec<String>,
}

/// Counts for the progress display while sources are walked.
#[derive(Default)]
pub struct Found {
    pub members: AtomicU64,
    pub bytes: AtomicU64,
}

impl Sources {
    /// Every member of every source, with what was left out (special files).
    pub fn gather(
        &self,
        pool: &rayon::ThreadPool,
        found: &Found,
    ) -> Result<(Vec<Item>, u64), PackError> {
        let mut items = Vec::new();
        let mut skipped = 0;
        for (i, dir) in self.dirs.iter().enumerate() {
            let (found_items, n) = walk(pool, dir, i as u32, found)?;
            items.extend(found_items);
            skipped += n;
        }
        if let Some((catalog, _)) = &self.images {
            for id in catalog.walk(ROOT) {
                let e = catalog
                    .entry(id)
                    .map_err(|e| PackError::Source(e.to_string()))?;
                let (kind, link) = match e.kind() {
                    Kind::File => (ItemKind::File, Box::default()),
                    Kind::Dir => (ItemKind::Dir, Box::default()),
                    Kind::Symlink => (
                        ItemKind::Symlink,
                        catalog
                            .symlink_target(e)
                            .map_err(|e| PackError::Source(e.to_string()))?
                            .into(),
                    ),
                };
                let size = if kind == ItemKind::File { e.size } else { 0 };
                found.members.fetch_add(1, Ordering::Relaxed);
                found.bytes.fetch_add(size, Ordering::Relaxed);
                items.push(Item {
                    path: catalog.path_of(id).into(),
                    link,
                    kind,
                    mode: e.permissions() as u32,
                    mtime: e.mtime,
                    size,
                    origin: Origin::Catalog(id),
                    key_len: 0,
                });
            }
        }
        Ok((items, skipped))
    }

    /// Opens a member for reading.
    pub fn open(&self, item: &Item) -> Result<MemberFile<'_>, PackError> {
        match item.origin {
            Origin::Disk(src) => {
                let path = self.dirs[src as usize]
                    .base
                    .join(std::ffi::OsStr::from_bytes(&item.path));
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&path)
                    .map_err(|error| PackError::Read {
                        path: path.clone(),
                        error,
                    })?;
                Ok(MemberFile::Disk { file, path })
            }
            Origin::Catalog(id) => {
                let (catalog, files) = self.images.as_ref().expect("catalog items have a catalog");
                Ok(MemberFile::Catalog { catalog, files, id })
            }
            Origin::Label(label) => Ok(MemberFile::Label(label_text(label))),
        }
    }
}

/// A label member's bytes (`pack --labels`): the class number in decimal, as WebDataset's
/// decoder reads `.cls`.
pub fn label_text(label: u32) -> Vec<u8> {
    label.to_string().into_bytes()
}

/// An opened member.
pub enum MemberFile<'a> {
    Disk {
        file: File,
        path: PathBuf,
    },
    Catalog {
        catalog: &'a Catalog,
        files: &'a FileReader,
        id: EntryId,
    },
    Label(Vec<u8>),
}

/// Bytes asked of the read path at once, as the kernel would ask.
const CATALOG_PIECE: usize = 1 << 20;

impl MemberFile<'_> {
    /// Appends `len` bytes at `offset` of the member to `out`.
    pub fn read(
        &self,
        item: &Item,
        offset: u64,
        len: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), PackError> {
        let start = out.len();
        out.resize(start + len, 0);
        self.read_into(item, offset, &mut out[start..])
    }

    /// Fills `buf` with the member's bytes at `offset`; a file that has shrunk since it was
    /// listed is an error (its header already promised the size).
    pub fn read_into(&self, item: &Item, offset: u64, buf: &mut [u8]) -> Result<(), PackError> {
        let len = buf.len();
        match self {
            MemberFile::Disk { file, path } => {
                let mut done = 0;
                while done < len {
                    match file.read_at(&mut buf[done..], offset + done as u64) {
                        Ok(0) => {
                            return Err(PackError::Read {
                                path: path.clone(),
                                error: io::Error::other(format!(
                                    "it changed while packing: {} bytes when listed, now {}",
                                    item.size,
                                    offset + done as u64
                                )),
                            });
                        }
                        Ok(n) => done += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(error) => {
                            return Err(PackError::Read {
                                path: path.clone(),
                                error,
                            });
                        }
                    }
                }
            }
            MemberFile::Label(text) => {
                let at = offset as usize;
                buf.copy_from_slice(&text[at..at + len]);
            }
            MemberFile::Catalog { catalog, files, id } => {
                let member = tiers::Member::of(catalog, *id)
                    .map_err(|e| PackError::Source(e.to_string()))?;
                let req = tiers::ReadRequest::waiting();
                let mut scratch = Vec::new();
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(CATALOG_PIECE);
                    let at = offset + done as u64;
                    let served = files
                        .read(&req, member, at, n, &mut scratch)
                        .map_err(|err| PackError::Read {
                            path: PathBuf::from(std::ffi::OsStr::from_bytes(&item.path)),
                            error: io::Error::other(err.to_string()),
                        })?;
                    let bytes = served.bytes();
                    if bytes.len() != n {
                        return Err(PackError::Source(format!(
                            "{}: the images gave {} bytes at {at}, expected {n}",
                            String::from_utf8_lossy(&item.path),
                            bytes.len()
                        )));
                    }
                    buf[done..done + n].copy_from_slice(bytes);
                    done += n;
                }
            }
        }
        Ok(())
    }
}

/// Walks one directory source in parallel on `pool`.
fn walk(
    pool: &rayon::ThreadPool,
    source: &DirSource,
    number: u32,
    found: &Found,
) -> Result<(Vec<Item>, u64), PackError> {
    let items = Mutex::new(Vec::new());
    let first_error: Mutex<Option<PackError>> = Mutex::new(None);
    let skipped = AtomicU64::new(0);
    let name = source
        .root
        .file_name()
        .expect("a source directory has a name")
        .as_bytes()
        .to_vec();
    let root_meta = std::fs::symlink_metadata(&source.root).map_err(|error| PackError::Read {
        path: source.root.clone(),
        error,
    })?;
    items.lock().expect("not poisoned").push(Item {
        path: name.clone().into(),
        link: Box::default(),
        kind: ItemKind::Dir,
        mode: root_meta.mode() & 0o7777,
        mtime: root_meta.mtime(),
        size: 0,
        origin: Origin::Disk(number),
        key_len: 0,
    });
    let ctx = WalkContext {
        number,
        items: &items,
        first_error: &first_error,
        skipped: &skipped,
        found,
    };
    pool.scope(|scope| visit(scope, &ctx, source.root.clone(), name));
    if let Some(e) = first_error.into_inner().expect("not poisoned") {
        return Err(e);
    }
    Ok((
        items.into_inner().expect("not poisoned"),
        skipped.into_inner(),
    ))
}

struct WalkContext<'a> {
    number: u32,
    items: &'a Mutex<Vec<Item>>,
    first_error: &'a Mutex<Option<PackError>>,
    skipped: &'a AtomicU64,
    found: &'a Found,
}

/// Lists one directory (its entries' attributes without following symlinks) and spawns a visit
/// of each subdirectory.
fn visit<'s>(scope: &rayon::Scope<'s>, ctx: &'s WalkContext<'s>, dir: PathBuf, rel: Vec<u8>) {
    let fail = |path: &Path, error: io::Error| {
        let mut slot = ctx.first_error.lock().expect("not poisoned");
        slot.get_or_insert(PackError::Read {
            path: path.to_path_buf(),
            error,
        });
    };
    let listing = match std::fs::read_dir(&dir) {
        Ok(l) => l,
        Err(e) => return fail(&dir, e),
    };
    let mut local = Vec::new();
    for entry in listing {
        let entry = match entry {
            Ok(e) => e,
            Err(e) => return fail(&dir, e),
        };
        let path = entry.path();
        // `DirEntry::metadata` is an lstat relative to the open directory.
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) => return fail(&path, e),
        };
        let mut member = rel.clone();
        member.push(b'/');
        member.extend_from_slice(entry.file_name().as_bytes());
        let ft = meta.file_type();
        let (kind, link, size) = if ft.is_file() {
            (ItemKind::File, Box::default(), meta.len())
        } else if ft.is_dir() {
            (ItemKind::Dir, Box::default(), 0)
        } else if ft.is_symlink() {
            match std::fs::read_link(&path) {
                Ok(t) => (ItemKind::Symlink, t.as_os_str().as_bytes().into(), 0),
                Err(e) => return fail(&path, e),
            }
        } else {
            let what = if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_socket() {
                "a socket"
            } else {
                "a device node"
            };
            warn!(
                "skipping {}: {what}; packfs packs files, directories and symlinks",
                path.display()
            );
            ctx.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if kind == ItemKind::Dir {
            let (sub, sub_rel) = (path.clone(), member.clone());
            scope.spawn(move |s| visit(s, ctx, sub, sub_rel));
        }
        ctx.found.members.fetch_add(1, Ordering::Relaxed);
        ctx.found.bytes.fetch_add(size, Ordering::Relaxed);
        local.push(Item {
            path: member.into(),
            link,
            kind,
            mode: meta.mode() & 0o7777,
            mtime: meta.mtime(),
            size,
            origin: Origin::Disk(ctx.number),
            key_len: 0,
        });
    }
    ctx.items.lock().expect("not poisoned").extend(local);
}
