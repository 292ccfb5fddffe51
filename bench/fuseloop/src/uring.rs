//! FUSE over io_uring (Linux 6.14+, fs/fuse/dev_uring.c): one queue per possible CPU, each served
//! by a thread pinned to that CPU with its own ring. Each queue registers `depth` entries (a header
//! buffer and a payload buffer each) once; a request then arrives as the completion of its entry,
//! and its reply is committed together with the fetch of the next request in one SQE
//! (COMMIT_AND_FETCH): no system call per request beyond the ring's own enter.

use std::io;
use std::os::fd::RawFd;

use io_uring::{IoUring, cqueue, opcode, squeue, types};

use crate::floor::{Reply, handle};
use crate::proto::*;
use crate::session::MAX_WRITE;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `fuse_uring_req_header`: in_out (128), op_in (128), `fuse_uring_ent_in_out` (32).
const HEADER: usize = 288;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;

/// The queues the kernel expects: one per possible CPU (it picks the queue of the CPU a request
/// is issued on, and the ring is ready only once every queue has an entry).
pub fn queues() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            let last = s.trim().rsplit([',', '-']).next()?.parse::<usize>().ok()?;
            Some(last + 1)
        })
        .unwrap_or(1)
}

/// Whether the module parameter allows it (the kernel also has to offer it at INIT).
pub fn enabled() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|s| s.trim() == "Y")
}

/// Requests answered through the rings, for the log at exit.
pub static RING_REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

struct Entry {
    header: Box<[u8; HEADER]>,
    payload: Vec<u8>,
    iov: [libc::iovec; 2],
}

/// The 80-byte command area: `fuse_uring_cmd_req` {flags, commit_id, qid}.
fn command(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    put64(&mut c, 8, commit_id);
    put16(&mut c, 16, qid);
    c
}

/// A URING_CMD SQE on /dev/fuse. The kernel wants `len` = 2 (the iovec count), which the io-uring
/// crate's builder does not set: patched in the raw SQE (a `#[repr(C)]` 128-byte struct).
fn sqe(
    fd: RawFd,
    op: u32,
    cmd: [u8; 80],
    iov: *const libc::iovec,
    user_data: u64,
) -> squeue::Entry128 {
    let e = opcode::UringCmd80::new(types::Fd(fd), op)
        .cmd(cmd)
        .addr(Some(iov as u64))
        .build()
        .user_data(user_data);
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    put32(&mut raw, 24, 2);
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn pin_to_cpu(cpu: usize) {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Serves queue `qid` until the file system is unmounted.
pub fn queue_loop(fd: RawFd, qid: u16, depth: usize) -> io::Result<()> {
    pin_to_cpu(qid as usize);
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().build((depth as u32).next_power_of_two() * 2)?;
    let mut entries: Vec<Entry> = (0..depth)
        .map(|_| Entry {
            header: Box::new([0u8; HEADER]),
            payload: vec![0u8; MAX_WRITE],
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 2],
        })
        .collect();
    for (i, e) in entries.iter_mut().enumerate() {
        e.iov = [
            libc::iovec {
                iov_base: e.header.as_mut_ptr().cast(),
                iov_len: HEADER,
            },
            libc::iovec {
                iov_base: e.payload.as_mut_ptr().cast(),
                iov_len: e.payload.len(),
            },
        ];
        let s = sqe(fd, CMD_REGISTER, command(0, qid), e.iov.as_ptr(), i as u64);
        unsafe { ring.submission().push(&s) }.map_err(|_| io::Error::other("ring full"))?;
    }
    let mut live = depth;
    let mut done: Vec<(u64, i32)> = Vec::with_capacity(depth);
    let mut input = Vec::with_capacity(4096);
    while live > 0 {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
        done.clear();
        done.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        for &(i, res) in &done {
            if res < 0 {
                // The connection is gone (unmounted or aborted): this entry is finished.
                live -= 1;
                continue;
            }
            let e = &mut entries[i as usize];
            let Some(h) = InHeader::parse(&e.header[..IN_HEADER]) else {
                live -= 1;
                continue;
            };
            RING_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let commit_id = u64_at(&e.header[..], ENT_IN_OUT + 8);
            let in_len = (u32_at(&e.header[..], ENT_IN_OUT + 16) as usize).min(e.payload.len());
            let op_in = &e.header[OP_IN..OP_IN + op_in_size(h.opcode).min(OP_IN)];
            input.clear();
            if h.opcode != READ {
                input.extend_from_slice(&e.payload[..in_len]);
            }
            let (error, len) = match handle(&h, op_in, &input, &mut e.payload) {
                Reply::Data(len) => (0, len),
                Reply::Error(errno) => (-errno, 0),
                // Never sent through the ring (FORGET and INTERRUPT go through /dev/fuse).
                Reply::None => (0, 0),
            };
            out_header(&mut e.header[..], h.unique, error, len);
            put32(&mut e.header[..], ENT_IN_OUT + 16, len as u32);
            let s = sqe(
                fd,
                CMD_COMMIT_AND_FETCH,
                command(commit_id, qid),
                e.iov.as_ptr(),
                i,
            );
            unsafe { ring.submission().push(&s) }.map_err(|_| io::Error::other("ring full"))?;
        }
    }
    Ok(())
}
