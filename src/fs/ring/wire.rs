//! The FUSE protocol as the ring carries it (include/uapi/linux/fuse.h, ABI 7.42+): the request
//! header and the fixed argument of each opcode the ring serves, and the replies, written as
//! little-endian bytes at fixed offsets. fuser encodes the same replies on the classic loop; it has
//! no io_uring transport (0.18), so the few structures served here are written by hand. Every
//! length read from the kernel is checked against the buffer before use.

use crate::catalog::Kind;
use crate::fs::attr::{self, TTL};
use crate::fs::core::{Attr, DirEntry, Listing};
use crate::util::le::{put32, put64, u32_at, u64_at};

pub const IN_HEADER: usize = 40;
pub const OUT_HEADER: usize = 16;

pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const READLINK: u32 = 5;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FLUSH: u32 = 25;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const INTERRUPT: u32 = 36;
pub const DESTROY: u32 = 38;
pub const IOCTL: u32 = 39;
pub const BATCH_FORGET: u32 = 42;
pub const READDIRPLUS: u32 = 44;

/// Size of the fixed argument each opcode starts with (`in_args[0]`, the ring's `op_in`).
pub fn op_in_size(opcode: u32) -> usize {
    match opcode {
        GETATTR => 16,
        OPEN | OPENDIR => 8,
        READ | READDIR | READDIRPLUS => 40,
        RELEASE | RELEASEDIR | FLUSH => 24,
        IOCTL => 32,
        FORGET | INTERRUPT | BATCH_FORGET => 8,
        _ => 0,
    }
}

#[derive(Clone, Copy, Debug)]
pub struct InHeader {
    pub opcode: u32,
    pub nodeid: u64,
    /// The process that asked.
    pub pid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        (b.len() >= IN_HEADER).then(|| InHeader {
            opcode: u32_at(b, 4),
            nodeid: u64_at(b, 16),
            pid: u32_at(b, 32),
        })
    }
}

/// `fuse_out_header` of a reply carrying `payload` bytes, or failing with `error` (negative).
pub fn out_header(b: &mut [u8], unique: u64, error: i32, payload: usize) {
    put32(b, 0, (OUT_HEADER + payload) as u32);
    put32(b, 4, error as u32);
    put64(b, 8, unique);
}

fn mode_of(kind: Kind) -> u32 {
    match kind {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
    }
}

pub const ATTR: usize = 88;
pub const ENTRY_OUT: usize = 128;
pub const ATTR_OUT: usize = 104;
pub const STATFS_OUT: usize = 80;

/// `fuse_attr`, as `attr::file_attr` gives it to fuser: one time for all three, nlink 1.
pub fn put_attr(b: &mut [u8], a: &Attr) {
    let b = &mut b[..ATTR];
    b.fill(0);
    let (secs, nsec) = (a.mtime as u64, a.mtime_nsec);
    put64(b, 0, a.ino);
    put64(b, 8, a.size);
    put64(b, 16, attr::blocks_of(a.size));
    for at in [24, 32, 40] {
        put64(b, at, secs);
    }
    for at in [48, 52, 56] {
        put32(b, at, nsec);
    }
    put32(b, 60, mode_of(a.kind) | a.perm as u32);
    put32(b, 64, attr::NLINK);
    put32(b, 68, a.owner.uid);
    put32(b, 72, a.owner.gid);
    put32(b, 80, attr::BLKSIZE);
}

/// `fuse_entry_out`: the node, no generation, the mount's timeouts, the attributes.
pub fn put_entry(b: &mut [u8], a: &Attr) -> usize {
    let b = &mut b[..ENTRY_OUT];
    b[..40].fill(0);
    put64(b, 0, a.ino);
    put64(b, 16, TTL.as_secs());
    put64(b, 24, TTL.as_secs());
    put_attr(&mut b[40..], a);
    ENTRY_OUT
}

/// `fuse_attr_out`.
pub fn put_attr_out(b: &mut [u8], a: &Attr) -> usize {
    let b = &mut b[..ATTR_OUT];
    b[..16].fill(0);
    put64(b, 0, TTL.as_secs());
    put_attr(&mut b[16..], a);
    ATTR_OUT
}

/// `fuse_kstatfs`, as the classic loop answers it.
pub fn put_statfs(b: &mut [u8], blocks: u64, files: u64) -> usize {
    let b = &mut b[..STATFS_OUT];
    b.fill(0);
    put64(b, 0, blocks);
    put64(b, 24, files);
    put32(b, 40, attr::STATFS_BSIZE);
    put32(b, 44, attr::NAME_MAX);
    put32(b, 48, attr::STATFS_BSIZE);
    STATFS_OUT
}

/// A READDIR or READDIRPLUS reply filled into a buffer of the size the kernel asked for.
pub struct DirBuffer<'a> {
    pub buf: &'a mut [u8],
    pub len: usize,
    pub plus: bool,
}

impl Listing for DirBuffer<'_> {
    fn add(&mut self, e: DirEntry) -> bool {
        // fuse_dirent: ino, off, namelen, type, name, padded to 8 bytes.
        let dirent = (24 + e.name.len()).next_multiple_of(8);
        let size = dirent + if self.plus { ENTRY_OUT } else { 0 };
        if self.len + size > self.buf.len() {
            return true;
        }
        let b = &mut self.buf[self.len..self.len + size];
        let d = if self.plus {
            let attr = e.attr.expect("a listing with attributes");
            put_entry(b, &attr);
            &mut b[ENTRY_OUT..]
        } else {
            b
        };
        put64(d, 0, e.ino);
        put64(d, 8, e.next);
        put32(d, 16, e.name.len() as u32);
        put32(d, 20, mode_of(e.kind) >> 12);
        d[24..24 + e.name.len()].copy_from_slice(e.name);
        d[24 + e.name.len()..].fill(0);
        self.len += size;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::Owner;

    fn attr(kind: Kind) -> Attr {
        Attr {
            ino: 7,
            kind,
            size: 1000,
            perm: 0o644,
            mtime: 1_700_000_000,
            mtime_nsec: 5,
            owner: Owner { uid: 10, gid: 20 },
        }
    }

    #[test]
    fn attributes_sit_where_the_kernel_reads_them() {
        let mut b = [0xffu8; ENTRY_OUT];
        assert_eq!(put_entry(&mut b, &attr(Kind::File)), 128);
        assert_eq!(u64_at(&b, 0), 7);
        assert_eq!(u64_at(&b, 8), 0, "generation");
        assert_eq!(u64_at(&b, 16), TTL.as_secs());
        let a = &b[40..];
        assert_eq!(u64_at(a, 8), 1000);
        assert_eq!(u64_at(a, 16), 2, "512-byte blocks");
        assert_eq!(u64_at(a, 32), 1_700_000_000, "mtime");
        assert_eq!(u32_at(a, 52), 5, "mtime nsec");
        assert_eq!(u32_at(a, 60), libc::S_IFREG | 0o644);
        assert_eq!((u32_at(a, 68), u32_at(a, 72)), (10, 20));
    }

    #[test]
    fn listings_stop_before_the_buffer_overflows() {
        let mut buf = [0u8; 64];
        let mut out = DirBuffer {
            buf: &mut buf,
            len: 0,
            plus: false,
        };
        let entry = |name: &'static [u8], next| DirEntry {
            ino: 3,
            next,
            kind: Kind::Dir,
            name,
            attr: None,
        };
        assert!(!out.add(entry(b"abc", 1)), "32 bytes fit");
        assert!(!out.add(entry(b"defghij", 2)), "32 more fit");
        assert!(out.add(entry(b"x", 3)), "the buffer is full");
        assert_eq!(out.len, 64);
        assert_eq!(u32_at(&buf, 16), 3);
        assert_eq!(u32_at(&buf, 20), libc::DT_DIR as u32);
        assert_eq!(&buf[24..27], b"abc");
        assert_eq!(u64_at(&buf, 32 + 8), 2, "offset of the second entry");
    }
}
