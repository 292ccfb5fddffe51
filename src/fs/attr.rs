//! Catalog entry -> FUSE attributes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

use crate::catalog::{Entry, EntryId, Kind};

/// The archives never change while mounted, so the kernel may keep names and attributes for as
/// long as it likes.
pub const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Block size reported by stat: large enough that stdio and `cp` read in big requests.
const BLKSIZE: u32 = 128 * 1024;

/// Directory size reported by stat (the conventional value; the real size is the child count).
const DIR_SIZE: u64 = 4096;

pub fn ino_of(id: EntryId) -> INodeNo {
    INodeNo(id as u64 + 1)
}

/// `None` for inode numbers the catalog never handed out.
pub fn id_of(ino: INodeNo) -> Option<EntryId> {
    ino.0
        .checked_sub(1)
        .and_then(|id| EntryId::try_from(id).ok())
}

pub fn file_type(entry: &Entry) -> FileType {
    match entry.kind() {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

fn time_of(secs: i64, nsec: u32) -> SystemTime {
    let nanos = Duration::from_nanos(nsec as u64);
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + nanos
    }
}

/// Owner of every entry: the mounting user or `--uid/--gid` (archive uids mean nothing on the
/// cluster that reads them), so permission checks apply the archive's mode bits to that user.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

pub fn attr_of(id: EntryId, entry: &Entry, owner: Owner) -> FileAttr {
    let size = match entry.kind() {
        Kind::Dir => DIR_SIZE,
        _ => entry.size,
    };
    let time = time_of(entry.mtime, entry.mtime_nsec);
    FileAttr {
        ino: ino_of(id),
        size,
        blocks: size.div_ceil(512),
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind: file_type(entry),
        perm: entry.permissions(),
        // Like btrfs, 1 for directories: "subdirectory count unknown" to fts and find.
        nlink: 1,
        uid: owner.uid,
        gid: owner.gid,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}
