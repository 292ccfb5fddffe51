//! The attribute policy of both transports (one time for all, link count, block sizes, statfs
//! figures), and the core's attributes as fuser's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo};

use super::core::{Attr, Usage};
use crate::catalog::Kind;

/// The archives never change while mounted, so the kernel may keep names and attributes for as
/// long as it likes.
pub const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Block size reported by stat: large enough that stdio and `cp` read in big requests.
pub const BLKSIZE: u32 = 128 * 1024;

/// Like btrfs, 1 for directories: "subdirectory count unknown" to fts and find.
pub const NLINK: u32 = 1;

/// stat's 512-byte blocks of a file of `size` bytes.
pub fn blocks_of(size: u64) -> u64 {
    size.div_ceil(512)
}

/// statfs's block size, and the longest name.
pub const STATFS_BSIZE: u32 = 4096;
pub const NAME_MAX: u32 = 255;

/// What statfs reports, for both transports: the images' bytes in `STATFS_BSIZE` blocks (all
/// used), and the entries as files.
pub fn statfs_figures(usage: Usage) -> (u64, u64) {
    (usage.bytes.div_ceil(STATFS_BSIZE as u64), usage.entries)
}

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
        blocks: blocks_of(a.size),
        atime: time,
        mtime: time,
        ctime: time,
        crtime: time,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: NLINK,
        uid: a.owner.uid,
        gid: a.owner.gid,
        rdev: 0,
        blksize: BLKSIZE,
        flags: 0,
    }
}
