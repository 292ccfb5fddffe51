//! The file system's answers, from the catalog and the tiers, without FUSE: lookup, attributes,
//! symlink targets, listings (one implementation, with or without attributes) and reads. Every
//! answer is a value or one `Error`; the transports only decode requests and encode replies (the
//! dispatcher records them), so all of this runs in tests without a kernel.

use std::io;
use std::sync::Arc;

use super::error::Error;
use crate::catalog::{Catalog, Entry, EntryId, Kind};
use crate::source::read_at::Wait;
use crate::tiers::{FileRange, FileReader, Member, ReadRequest, Served};

/// Inode numbers are entry ids + 1 (FUSE's root is 1, the catalog's root is entry 0).
pub type Ino = u64;
pub const ROOT_INO: Ino = 1;

/// Directory size reported by stat (the conventional value; the real size is the child count).
const DIR_SIZE: u64 = 4096;

/// Owner of every entry: the mounting user or `--uid/--gid` (archive uids mean nothing on the
/// cluster that reads them), so permission checks apply the archive's mode bits to that user.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// What stat shows of an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    pub size: u64,
    pub perm: u16,
    pub mtime: i64,
    pub mtime_nsec: u32,
    pub owner: Owner,
}

/// One line of a listing; `next` is the offset at which a listing resumes after it.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry<'a> {
    pub ino: Ino,
    pub next: u64,
    pub kind: Kind,
    pub name: &'a [u8],
    /// Only when the listing asked for attributes.
    pub attr: Option<Attr>,
}

/// Where a listing goes (a FUSE reply, a Vec in tests); `add` answers true once it is full.
pub trait Listing {
    fn add(&mut self, entry: DirEntry) -> bool;
}

/// One line of a listing as the catalog has it: id, entry and name.
type Slot<'a> = (EntryId, &'a Entry, &'a [u8]);

/// Sizes for statfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub bytes: u64,
    pub entries: u64,
}

pub struct Core {
    catalog: Arc<Catalog>,
    files: Arc<FileReader>,
    owner: Owner,
}

pub fn ino_of(id: EntryId) -> Ino {
    id as Ino + 1
}

/// `None` for inode numbers the catalog never handed out.
pub(crate) fn id_of(ino: Ino) -> Option<EntryId> {
    ino.checked_sub(1).and_then(|id| EntryId::try_from(id).ok())
}

impl Core {
    pub fn new(catalog: Arc<Catalog>, files: Arc<FileReader>, owner: Owner) -> Core {
        Core {
            catalog,
            files,
            owner,
        }
    }

    /// The file system over `engine`'s dataset.
    pub fn over(engine: &crate::engine::Engine, owner: Owner) -> Core {
        Core::new(engine.catalog().clone(), engine.files().clone(), owner)
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn files(&self) -> &FileReader {
        &self.files
    }

    fn entry(&self, ino: Ino) -> Result<(EntryId, &Entry), Error> {
        let id = id_of(ino).ok_or(Error::NotFound)?;
        Ok((id, self.catalog.entry(id)?))
    }

    fn attr(&self, id: EntryId, e: &Entry) -> Attr {
        Attr {
            ino: ino_of(id),
            kind: e.kind(),
            size: if e.is_dir() { DIR_SIZE } else { e.size },
            perm: e.permissions(),
            mtime: e.mtime,
            mtime_nsec: e.mtime_nsec,
            owner: self.owner,
        }
    }

    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr, Error> {
        let (parent_id, dir) = self.entry(parent)?;
        if !dir.is_dir() {
            return Err(Error::NotDir);
        }
        let id = self.catalog.lookup(parent_id, name)?;
        Ok(self.attr(id, self.catalog.entry(id)?))
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr, Error> {
        let (id, e) = self.entry(ino)?;
        Ok(self.attr(id, e))
    }

    pub fn readlink(&self, ino: Ino) -> Result<&[u8], Error> {
        let (_, e) = self.entry(ino)?;
        if e.kind() != Kind::Symlink {
            return Err(Error::NotSymlink);
        }
        Ok(self.catalog.symlink_target(e)?)
    }

    /// Lists directory `ino` from `offset` into `out` until it is full: "." at offset 0, ".." at
    /// 1, child `i` at `2 + i`. An entry that cannot be read ends the listing there (the next call
    /// starts at it and fails), unless it is the first, which fails this call.
    pub fn list(
        &self,
        ino: Ino,
        offset: u64,
        with_attrs: bool,
        out: &mut impl Listing,
    ) -> Result<(), Error> {
        let (dir_id, dir) = self.entry(ino)?;
        if !dir.is_dir() {
            return Err(Error::NotDir);
        }
        for slot in offset.. {
            let line = match self.dir_slot(dir_id, dir, slot) {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(e) if slot == offset => return Err(e),
                Err(_) => break,
            };
            let (id, e, name) = line;
            let entry = DirEntry {
                ino: ino_of(id),
                next: slot + 1,
                kind: e.kind(),
                name,
                attr: with_attrs.then(|| self.attr(id, e)),
            };
            if out.add(entry) {
                break;
            }
        }
        Ok(())
    }

    /// The id, entry and name at `slot` of a listing, `None` past its end.
    fn dir_slot<'a>(
        &'a self,
        dir_id: EntryId,
        dir: &'a Entry,
        slot: u64,
    ) -> Result<Option<Slot<'a>>, Error> {
        let (id, name) = match slot {
            0 => (dir_id, b".".as_slice()),
            1 => (dir.parent, b"..".as_slice()),
            _ => {
                let Some(child) = self.catalog.children(dir).nth((slot - 2) as usize) else {
                    return Ok(None);
                };
                (
                    child,
                    self.catalog.name(self.catalog.child(dir_id, child)?)?,
                )
            }
        };
        Ok(Some((id, self.catalog.entry(id)?, name)))
    }

    /// Reads up to `size` bytes at `offset` of file `ino` (fewer at its end, none past it).
    pub fn read<'b>(
        &self,
        req: &ReadRequest,
        ino: Ino,
        offset: u64,
        size: u32,
        buf: &'b mut Vec<u8>,
    ) -> Result<Served<'b>, Error> {
        let Some((member, len)) = self.member_at(ino, offset, size)? else {
            return Ok(Served::Buffer(&[]));
        };
        self.files
            .read(req, member, offset, len, buf)
            .map_err(|err| match err.error.kind() {
                io::ErrorKind::WouldBlock if req.wait() == Wait::Never => Error::WouldWait,
                _ => Error::Io {
                    image: self.files.images().source().image_path(member.image),
                    offset: err.image_offset,
                    path: self.catalog.path_of(member.entry),
                    file_offset: offset,
                    len,
                    error: err.error,
                },
            })
    }

    /// The read of up to `size` bytes at `offset` of file `ino` as a range of an image file, for
    /// a transport that can splice it (`tiers::FileRange`); `None` when `read` must serve it
    /// (any error included: `read` meets it again and reports it).
    pub fn file_range(
        &self,
        req: &ReadRequest,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> Option<FileRange<'_>> {
        let (member, len) = self.member_at(ino, offset, size).ok()??;
        self.files.file_range(req, member, offset, len)
    }

    /// File `ino` and how many of its bytes a read of `size` at `offset` covers; `None` when it
    /// covers none (at or past its end).
    fn member_at(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> Result<Option<(Member<'_>, usize)>, Error> {
        let (id, e) = self.entry(ino)?;
        match e.kind() {
            Kind::File => {}
            Kind::Dir => return Err(Error::IsDir),
            Kind::Symlink => return Err(Error::NotFile),
        }
        if offset >= e.size || size == 0 {
            return Ok(None);
        }
        let len = (e.size - offset).min(size as u64) as usize;
        let member = Member {
            entry: id,
            image: e.image,
            placement: self.catalog.placement(e)?,
            size: e.size,
        };
        Ok(Some((member, len)))
    }

    /// Whether some read of this mount may be spliced (`tiers::Images::may_splice`): some image
    /// holds its members' bytes as they are, not in a compressed stream (theirs or the image's
    /// around them). Only then are READs made small enough for a pipe (`fs::splice`): the extra
    /// READ that splits each 1 MiB sample otherwise only costs memory and requests.
    pub fn may_splice(&self) -> bool {
        let images = self.catalog.images();
        let stored = |i: usize| images.get(i).is_some_and(|info| info.stream.is_none());
        (0..images.len()).any(|i| {
            let (outer, _) = crate::catalog::outermost(images, i as u32, 0);
            stored(i) && stored(outer as usize) && self.files.images().may_splice(i as u32)
        })
    }

    pub fn usage(&self) -> Usage {
        Usage {
            bytes: self.catalog.file_bytes(),
            entries: self.catalog.len() as u64,
        }
    }
}
