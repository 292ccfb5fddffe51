//! The few FUSE protocol structures this benchmark needs (include/uapi/linux/fuse.h, ABI 7.42+),
//! read and written as little-endian bytes at fixed offsets: no layout is trusted to the compiler.

pub const IN_HEADER: usize = 40;
pub const OUT_HEADER: usize = 16;

pub const LOOKUP: u32 = 1;
pub const FORGET: u32 = 2;
pub const GETATTR: u32 = 3;
pub const OPEN: u32 = 14;
pub const READ: u32 = 15;
pub const STATFS: u32 = 17;
pub const RELEASE: u32 = 18;
pub const FLUSH: u32 = 25;
pub const INIT: u32 = 26;
pub const OPENDIR: u32 = 27;
pub const READDIR: u32 = 28;
pub const RELEASEDIR: u32 = 29;
pub const INTERRUPT: u32 = 36;
pub const DESTROY: u32 = 38;
pub const IOCTL: u32 = 39;
pub const BATCH_FORGET: u32 = 42;

// INIT flags (the high 32 bits go in flags2, read by the kernel only with FUSE_INIT_EXT).
pub const ASYNC_READ: u64 = 1 << 0;
pub const PARALLEL_DIROPS: u64 = 1 << 18;
pub const MAX_PAGES: u64 = 1 << 22;
pub const INIT_EXT: u64 = 1 << 30;
pub const OVER_IO_URING: u64 = 1 << 41;

pub const FOPEN_DIRECT_IO: u32 = 1 << 0;

/// The fixed argument ("op_in") each opcode starts with; what follows it is the payload.
pub fn op_in_size(opcode: u32) -> usize {
    match opcode {
        GETATTR => 16,
        OPEN | OPENDIR => 8,
        READ | READDIR => 40,
        RELEASE | RELEASEDIR | FLUSH => 24,
        IOCTL => 32,
        INIT => 64,
        FORGET => 8,
        INTERRUPT => 8,
        BATCH_FORGET => 8,
        _ => 0,
    }
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

#[derive(Clone, Copy, Debug)]
pub struct InHeader {
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        (b.len() >= IN_HEADER).then(|| InHeader {
            opcode: u32_at(b, 4),
            unique: u64_at(b, 8),
            nodeid: u64_at(b, 16),
        })
    }
}

/// Writes `fuse_out_header` for a reply of `payload` bytes or an errno.
pub fn out_header(b: &mut [u8], unique: u64, error: i32, payload: usize) {
    put32(b, 0, (OUT_HEADER + payload) as u32);
    put32(b, 4, error as u32);
    put64(b, 8, unique);
}

/// What stat shows: `fuse_attr` (88 bytes).
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub mode: u32,
    pub nlink: u32,
}

pub const ATTR_SIZE: usize = 88;

pub fn put_attr(b: &mut [u8], a: &Attr) {
    b[..ATTR_SIZE].fill(0);
    put64(b, 0, a.ino);
    put64(b, 8, a.size);
    put64(b, 16, a.size.div_ceil(512));
    put32(b, 60, a.mode);
    put32(b, 64, a.nlink);
    put32(b, 80, 4096);
}

/// `fuse_entry_out` (128 bytes) with zero timeouts: every lookup comes back to the daemon.
pub fn put_entry(b: &mut [u8], a: &Attr) -> usize {
    b[..40].fill(0);
    put64(b, 0, a.ino);
    put_attr(&mut b[40..], a);
    128
}

/// `fuse_attr_out` (104 bytes), zero timeout.
pub fn put_attr_out(b: &mut [u8], a: &Attr) -> usize {
    b[..16].fill(0);
    put_attr(&mut b[16..], a);
    104
}
