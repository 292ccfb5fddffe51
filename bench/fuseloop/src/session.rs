//! Mounting, the INIT handshake and the classic loop: each thread reads a request from /dev/fuse
//! and writes its reply (two system calls and a wake-up per request).

use std::ffi::CString;
use std::io;
use std::os::fd::RawFd;
use std::path::Path;

use crate::floor::{Reply, handle};
use crate::proto::*;

/// Requests answered by the classic loop, for the log at exit.
pub static CLASSIC_REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Largest read or write: 128 KiB (32 pages), the kernel's default `max_pages`.
pub const MAX_WRITE: usize = 128 * 1024;
/// A classic read buffer: the largest request plus headers (the kernel wants at least 8 KiB).
pub const READ_BUFFER: usize = MAX_WRITE + 4096;

/// Opens /dev/fuse and mounts it at `mnt` (as root, with mount(2)).
pub fn mount(mnt: &Path) -> io::Result<RawFd> {
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let target = CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
    let opts = CString::new(format!(
        "fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"
    ))
    .unwrap();
    let rc = unsafe {
        libc::mount(
            c"fuseloop".as_ptr(),
            target.as_ptr(),
            c"fuse.fuseloop".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// What INIT agreed on.
pub struct Agreed {
    pub uring: bool,
}

/// Reads INIT and answers it, offering FUSE over io_uring when `want_uring` and the kernel
/// offers it.
pub fn init(fd: RawFd, want_uring: bool) -> io::Result<Agreed> {
    let mut buf = vec![0u8; READ_BUFFER];
    let n = read_request(fd, &mut buf)?;
    let h = InHeader::parse(&buf[..n]).ok_or_else(|| io::Error::other("short INIT"))?;
    if h.opcode != INIT {
        return Err(io::Error::other(format!("first request is {}", h.opcode)));
    }
    let a = &buf[IN_HEADER..n];
    let major = u32_at(a, 0);
    let minor = u32_at(a, 4);
    let mut offered = u32_at(a, 12) as u64;
    if offered & INIT_EXT != 0 && a.len() >= 20 {
        offered |= (u32_at(a, 16) as u64) << 32;
    }
    let uring = want_uring && offered & OVER_IO_URING != 0;
    let mut flags = ASYNC_READ | PARALLEL_DIROPS | MAX_PAGES | INIT_EXT;
    if uring {
        flags |= OVER_IO_URING;
    }
    flags &= offered | INIT_EXT;
    let mut out = [0u8; OUT_HEADER + 64];
    let o = &mut out[OUT_HEADER..];
    put32(o, 0, major.min(7));
    put32(o, 4, minor.min(45));
    put32(o, 8, u32_at(a, 8));
    put32(o, 12, flags as u32);
    put16(o, 16, 256);
    put16(o, 18, 192);
    put32(o, 20, MAX_WRITE as u32);
    put32(o, 24, 1);
    put16(o, 28, (MAX_WRITE / 4096) as u16);
    put32(o, 32, (flags >> 32) as u32);
    out_header(&mut out, h.unique, 0, 64);
    write_reply(fd, &out)?;
    Ok(Agreed { uring })
}

fn read_request(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // Interrupted, or a request that was interrupted before it was read: try again.
            Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
            _ => return Err(e),
        }
    }
}

fn write_reply(fd: RawFd, b: &[u8]) -> io::Result<()> {
    let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        // The request was interrupted and is gone: not an error of ours.
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// The classic loop, until the file system is unmounted (ENODEV).
pub fn classic_loop(fd: RawFd) {
    let mut buf = vec![0u8; READ_BUFFER];
    let mut out = vec![0u8; READ_BUFFER];
    loop {
        let n = match read_request(fd, &mut buf) {
            Ok(n) => n,
            Err(_) => return,
        };
        let Some(h) = InHeader::parse(&buf[..n]) else {
            continue;
        };
        CLASSIC_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let args = &buf[IN_HEADER..n];
        let split = op_in_size(h.opcode).min(args.len());
        let (op_in, rest) = args.split_at(split);
        let (head, body) = out.split_at_mut(OUT_HEADER);
        let len = match handle(&h, op_in, rest, body) {
            Reply::None => continue,
            Reply::Data(len) => {
                out_header(head, h.unique, 0, len);
                len
            }
            Reply::Error(errno) => {
                out_header(head, h.unique, -errno, 0);
                0
            }
        };
        if write_reply(fd, &out[..OUT_HEADER + len]).is_err() {
            return;
        }
        if h.opcode == DESTROY {
            return;
        }
    }
}
