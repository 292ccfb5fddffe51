//! The core's attributes as fuser's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

use super::core::Attr;
use crate::catalog::Kind;

/// The archives never change while mounted, so the kernel may keep names and attributes for as
/// long as it likes.
pub const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Block size reported by stat: large enough that stdio and `cp` read in big requests.
pub const BLKSIZE: u32 = 128 * 1024;

pub fn file_type(kind: Kind) -> FileType {
    match kind {
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

pub fn file_attr(a: &Attr) -> FileAttr {
    let time = time_of(a.mtime, a.mtime_nsec);
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind: file_type(a.kind),
        perm: a.perm,
        // Like btrfs, 1 for directories: "subdirectory count unknown" to fts and find.
        nlink: 1,
        uid: a.owner.uid,
        gid: a.owner.gid,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}
