//! One queue: a thread pinned to its CPU with its own ring. Each entry is a header buffer and a
//! payload buffer registered once; a request arrives as the completion of its entry and is
//! answered by a COMMIT_AND_FETCH of the same entry. Reads are answered later, from the read
//! pool, which writes the data into the entry's payload buffer and wakes the queue (an eventfd
//! read on the ring) to commit it.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use io_uring::{IoUring, cqueue, opcode, squeue, types};
use tracing::{debug, warn};

use super::answer::answer;
use super::wire::*;
use super::{MAX_PAYLOAD, Server};
use crate::fs::dispatch::{DataReply, ReadCall, Reply};
use crate::fs::error::Error;
use crate::fs::reads::ReadJob;
use crate::tiers::{Decoded, Served};
use crate::util::le::{put16, put32, put64, u32_at, u64_at};

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `fuse_uring_req_header`: in_out (128 bytes), op_in (128), `fuse_uring_ent_in_out` (32).
const HEADER: usize = 288;
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;

/// The user_data of the eventfd read that wakes the queue for finished reads.
const WAKE: u64 = u64::MAX;

struct Entry {
    header: Box<[u8; HEADER]>,
    /// Registered with the kernel by address: it is never resized (a read into it asks at most
    /// its length, so the core's buffer growth never happens here).
    payload: Vec<u8>,
    iov: Box<[libc::iovec; 2]>,
    /// The request's id, to commit it with.
    commit_id: u64,
}

impl Entry {
    /// Buffers that stay where they are when the entry moves (the kernel keeps their addresses).
    fn new() -> Entry {
        let mut header = Box::new([0u8; HEADER]);
        let mut payload = vec![0u8; MAX_PAYLOAD as usize];
        let iov = Box::new([
            libc::iovec {
                iov_base: header.as_mut_ptr().cast(),
                iov_len: HEADER,
            },
            libc::iovec {
                iov_base: payload.as_mut_ptr().cast(),
                iov_len: payload.len(),
            },
        ]);
        Entry {
            header,
            payload,
            iov,
            commit_id: 0,
        }
    }
}

/// A queue registers more entries when no more than this many are free: a read waiting on slow
/// storage holds its entry until it is answered, and requests that find no free entry wait in
/// the kernel behind them (tests/isolation.rs: 80 stalled reads held the 64 entries of the first
/// version, and reads elsewhere waited for the stall).
const FREE_AT_LEAST: usize = 8;
/// Entries added at a time, and at most per queue: as many as reads the pool can hold at once,
/// plus the first ones.
const GROW_BY: usize = 16;
const MAX_ENTRIES: usize = super::MAX_DEPTH + crate::fs::reads::MAX_IO_THREADS;

/// A finished read: the entry and its payload length, or an errno.
type Done = (u32, Result<usize, i32>);

/// A read's way back to its entry. The pool writes into the entry's payload buffer, which the
/// queue leaves alone until the answer comes back through `done`.
struct RingReply {
    payload: *mut u8,
    cap: usize,
    entry: u32,
    done: Sender<Done>,
    wake: Arc<OwnedFd>,
    answered: bool,
}

// SAFETY: the payload buffer is written by one thread at a time: the pool's until it answers,
// then the queue's (the channel orders the two), and the queue frees no buffer while reads are
// pending (`run` waits for them).
unsafe impl Send for RingReply {}

impl DataReply for RingReply {
    fn data(mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.cap);
        // SAFETY: `payload` points at `cap` bytes this reply alone writes until it answers, and
        // `n` <= `cap`; `bytes` is another buffer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.payload, n) };
        self.answer(Ok(n));
    }
}

impl Reply for RingReply {
    fn error(mut self, errno: i32) {
        self.answer(Err(errno));
    }
}

impl RingReply {
    fn answer(&mut self, result: Result<usize, i32>) {
        self.answered = true;
        let _ = self.done.send((self.entry, result));
        let one = 1u64.to_ne_bytes();
        // SAFETY: an 8-byte write from a local array to the queue's eventfd, which `wake` keeps
        // open.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

impl Drop for RingReply {
    /// A read dropped unanswered (the pool shut down) fails with EIO rather than leaving its
    /// entry waiting forever.
    fn drop(&mut self) {
        if !self.answered {
            self.answer(Err(Error::Stopping.errno()));
        }
    }
}

/// How a read tried on the queue thread was answered. The bytes are in the payload already when
/// the core assembled them there; a decoded unit's bytes are copied in after the read (the core
/// held the payload buffer until then).
enum InPayload {
    InPlace(usize),
    Shared(Decoded, Range<usize>),
    Copied(Vec<u8>),
    Failed(i32),
}

impl InPayload {
    /// The errno (negative, or 0) and length to commit, with the bytes put in `payload`.
    fn into_payload(self, payload: &mut [u8]) -> (i32, usize) {
        let mut put = |bytes: &[u8]| {
            let n = bytes.len().min(payload.len());
            payload[..n].copy_from_slice(&bytes[..n]);
            (0, n)
        };
        match self {
            InPayload::InPlace(n) => (0, n.min(payload.len())),
            InPayload::Shared(block, range) => put(&block[range]),
            InPayload::Copied(bytes) => put(&bytes),
            InPayload::Failed(errno) => (-errno, 0),
        }
    }
}

/// The reply of a read assembled in an entry's payload buffer (`Queue::read`).
struct PayloadReply<'a>(&'a mut InPayload);

impl Reply for PayloadReply<'_> {
    fn error(self, errno: i32) {
        *self.0 = InPayload::Failed(errno);
    }
}

impl DataReply for PayloadReply<'_> {
    /// Not the read path (`served` is): kept whole for any other caller.
    fn data(self, bytes: &[u8]) {
        *self.0 = InPayload::Copied(bytes.to_vec());
    }

    fn served(self, served: Served) -> u32 {
        *self.0 = match served {
            // Assembled in the buffer the read was given: the payload.
            Served::Buffer(bytes) => InPayload::InPlace(bytes.len()),
            Served::Shared(block, range) => InPayload::Shared(block, range),
        };
        match self.0 {
            InPayload::InPlace(n) => *n as u32,
            InPayload::Shared(_, range) => range.len() as u32,
            _ => 0,
        }
    }
}

/// The 80-byte command of an SQE128: `fuse_uring_cmd_req` {flags, commit_id, qid}.
fn command(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    put64(&mut c, 8, commit_id);
    put16(&mut c, 16, qid);
    c
}

/// A URING_CMD SQE on /dev/fuse. The kernel wants `len` = 2 (the iovec count), which the io-uring
/// crate's builder leaves 0: set in the raw SQE (`Entry128` is `#[repr(C)]`, 128 bytes, `len` at
/// byte 24 as in `struct io_uring_sqe`).
fn uring_cmd(
    fd: RawFd,
    op: u32,
    cmd: [u8; 80],
    iov: &[libc::iovec; 2],
    user_data: u64,
) -> squeue::Entry128 {
    let e = opcode::UringCmd80::new(types::Fd(fd), op)
        .cmd(cmd)
        .addr(Some(iov.as_ptr() as u64))
        .build()
        .user_data(user_data);
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `#[repr(C)]` over the 128 bytes of an SQE128, checked above; every
    // byte pattern is a valid array, and the patched one a valid SQE.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    put32(&mut raw, 24, 2);
    // SAFETY: as above, back into the same type.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

fn pin_to_cpu(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

struct Queue<'a> {
    fd: RawFd,
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    entries: Vec<Entry>,
    server: &'a Server,
    done_tx: Sender<Done>,
    done_rx: Receiver<Done>,
    wake: Arc<OwnedFd>,
    wake_buf: Box<[u8; 8]>,
    /// Reads handed to the pool and not yet answered.
    pending: usize,
    /// Entries the kernel has not ended (all of them until the connection ends).
    live: usize,
    /// Completions that came while entries were being registered.
    early: Vec<(u64, i32)>,
}

/// Serves queue `qid` until the connection ends; reports the registration to `registered`.
pub fn run(
    fd: Arc<OwnedFd>,
    qid: u16,
    depth: usize,
    server: &Arc<Server>,
    registered: Sender<io::Result<()>>,
) {
    pin_to_cpu(qid as usize);
    let mut queue = match Queue::new(fd.as_raw_fd(), qid, depth, server) {
        Ok(q) => q,
        Err(e) => {
            let _ = registered.send(Err(e));
            return;
        }
    };
    if let Err(e) = queue.register() {
        let _ = registered.send(Err(e));
        return;
    }
    let _ = registered.send(Ok(()));
    if let Err(e) = queue.serve() {
        warn!(qid, "ring queue ended: {e}");
    }
    // The pool may still write into payload buffers: wait for every read before freeing them.
    while queue.pending > 0 {
        match queue.done_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(_) => queue.pending -= 1,
            Err(_) => {
                // Leak the buffers rather than free them under a read that never answered.
                std::mem::forget(queue.entries);
                return;
            }
        }
    }
}

impl<'a> Queue<'a> {
    fn new(fd: RawFd, qid: u16, depth: usize, server: &'a Server) -> io::Result<Queue<'a>> {
        // Completions for every entry there may be, and the wake read.
        let ring = IoUring::builder()
            .setup_cqsize(((MAX_ENTRIES + 1) as u32).next_power_of_two())
            .build(((depth + 1) as u32).next_power_of_two())?;
        let entries = (0..depth).map(|_| Entry::new()).collect();
        // SAFETY: a plain system call; its result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        Ok(Queue {
            fd,
            qid,
            ring,
            entries,
            server,
            done_tx,
            done_rx,
            // SAFETY: `efd` is a new descriptor nothing else owns.
            wake: Arc::new(unsafe { OwnedFd::from_raw_fd(efd) }),
            wake_buf: Box::new([0u8; 8]),
            pending: 0,
            live: 0,
            early: Vec::new(),
        })
    }

    /// Queues an SQE, first submitting what is queued when the submission queue is full.
    fn push(&mut self, sqe: &squeue::Entry128) -> io::Result<()> {
        if self.ring.submission().is_full() {
            self.ring.submit()?;
        }
        // SAFETY: every buffer an SQE names (iovecs, headers, payloads, the wake buffer) lives in
        // `self.entries` or `self.wake_buf`, which outlive the ring's use of them: the ring is
        // dropped with the queue, after the connection has ended every entry.
        unsafe { self.ring.submission().push(sqe) }
            .map_err(|_| io::Error::other("submission queue full"))
    }

    /// Queues the registration of entry `i`: its buffers, to be handed the next request.
    fn push_register(&mut self, i: usize) -> io::Result<()> {
        let sqe = uring_cmd(
            self.fd,
            CMD_REGISTER,
            command(0, self.qid),
            &self.entries[i].iov,
            i as u64,
        );
        self.push(&sqe)
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let read = opcode::Read::new(
            types::Fd(self.wake.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            8,
        )
        .build()
        .user_data(WAKE);
        self.push(&read.into())
    }

    /// Registers every entry. Until INIT has been answered the kernel says EAGAIN: retried for
    /// up to 10 s. Any other refusal fails the queue (and the kernel then keeps the classic loop).
    fn register(&mut self) -> io::Result<()> {
        let started = Instant::now();
        let mut next = 0;
        while next < self.entries.len() {
            self.push_register(next)?;
            self.ring.submit()?;
            // A refused registration completes at once; an accepted one only with a request,
            // which may come already (once every queue has an entry): kept for `serve`.
            let arrived: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            let mut refused = None;
            for (user_data, result) in arrived {
                if user_data == next as u64 && result < 0 {
                    refused = Some(-result);
                } else {
                    self.early.push((user_data, result));
                }
            }
            match refused {
                None => next += 1,
                Some(libc::EAGAIN) if started.elapsed() < Duration::from_secs(10) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Some(errno) => {
                    return Err(io::Error::from_raw_os_error(errno));
                }
            }
        }
        self.arm_wake()?;
        self.ring.submit()?;
        Ok(())
    }

    fn serve(&mut self) -> io::Result<()> {
        self.live = self.entries.len();
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(self.entries.len() + 1);
        completions.append(&mut self.early);
        while self.live > 0 {
            if completions.is_empty() {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
                completions.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            }
            for &(user_data, result) in &completions {
                if user_data == WAKE {
                    self.commit_reads()?;
                    self.arm_wake()?;
                } else if result < 0 {
                    // The connection is gone (unmount, abort): this entry is done.
                    debug!(qid = self.qid, "ring entry ended: errno {}", -result);
                    self.live -= 1;
                } else {
                    self.request(user_data as usize)?;
                }
            }
            completions.clear();
        }
        Ok(())
    }

    /// Registers `GROW_BY` more entries when reads in the pool hold all but `FREE_AT_LEAST`.
    fn grow_if_short(&mut self) -> io::Result<()> {
        let have = self.entries.len();
        if have - self.pending > FREE_AT_LEAST || have >= MAX_ENTRIES {
            return Ok(());
        }
        let add = GROW_BY.min(MAX_ENTRIES - have);
        debug!(
            qid = self.qid,
            entries = have + add,
            "reads wait on storage: more ring entries"
        );
        for i in have..have + add {
            self.entries.push(Entry::new());
            self.push_register(i)?;
            self.live += 1;
        }
        Ok(())
    }

    /// Commits the reads the pool has answered.
    fn commit_reads(&mut self) -> io::Result<()> {
        while let Ok((entry, result)) = self.done_rx.try_recv() {
            self.pending -= 1;
            let (error, len) = match result {
                Ok(len) => (0, len),
                Err(errno) => (-errno, 0),
            };
            self.commit(entry as usize, error, len)?;
        }
        Ok(())
    }

    fn commit(&mut self, i: usize, error: i32, len: usize) -> io::Result<()> {
        let qid = self.qid;
        let e = &mut self.entries[i];
        let unique = e.commit_id;
        out_header(&mut e.header[..], unique, error, len);
        put32(&mut e.header[..], ENT_IN_OUT + 16, len as u32);
        let sqe = uring_cmd(
            self.fd,
            CMD_COMMIT_AND_FETCH,
            command(unique, qid),
            &e.iov,
            i as u64,
        );
        self.push(&sqe)
    }

    /// Answers a read here if its bytes are in memory (page cache, RAM cache, staged copy),
    /// assembled in the entry's payload buffer itself (no copy); otherwise hands it to the read
    /// pool, which answers through `RingReply`.
    fn read(&mut self, i: usize, call: ReadCall) -> io::Result<()> {
        let server = self.server;
        let e = &mut self.entries[i];
        let registered = e.payload.as_ptr();
        // The dispatcher answers every read it returns Ok for; were one left unanswered, it
        // fails as a read the pool dropped does.
        let mut answered = InPayload::Failed(Error::Stopping.errno());
        let tried =
            server
                .dispatch
                .read_without_waiting(call, &mut e.payload, PayloadReply(&mut answered));
        debug_assert_eq!(registered, e.payload.as_ptr(), "the payload moved");
        if tried.is_ok() {
            let (error, len) = answered.into_payload(&mut e.payload);
            return self.commit(i, error, len);
        }
        let e = &mut self.entries[i];
        let reply = RingReply {
            payload: e.payload.as_mut_ptr(),
            cap: e.payload.len(),
            entry: i as u32,
            done: self.done_tx.clone(),
            wake: self.wake.clone(),
            answered: false,
        };
        self.pending += 1;
        self.server.reads.hand_off(ReadJob { call, reply });
        self.grow_if_short()
    }

    /// Answers the request that arrived in entry `i` (or hands a read to the pool).
    fn request(&mut self, i: usize) -> io::Result<()> {
        let started = Instant::now();
        self.server.dispatch.observer().requests.through_ring();
        let e = &mut self.entries[i];
        let Some(h) = InHeader::parse(&e.header[..IN_HEADER]) else {
            return Ok(());
        };
        e.commit_id = u64_at(&e.header[..], ENT_IN_OUT + 8);
        let in_len = (u32_at(&e.header[..], ENT_IN_OUT + 16) as usize).min(e.payload.len());
        let op_in = &e.header[OP_IN..OP_IN + op_in_size(h.opcode).min(OP_IN)];
        if h.opcode == READ && op_in.len() >= 20 {
            let offset = u64_at(op_in, 8);
            let size = u32_at(op_in, 16).min(e.payload.len() as u32);
            let call = ReadCall {
                ino: h.nodeid,
                offset,
                size,
                started,
                reader: h.pid,
            };
            return self.read(i, call);
        }
        // The fixed arguments are at most 40 bytes (READDIR's): copied out of the header, which
        // the reply overwrites, without an allocation.
        let mut fixed = [0u8; 40];
        let fixed_len = op_in.len().min(fixed.len());
        fixed[..fixed_len].copy_from_slice(&op_in[..fixed_len]);
        let (error, len) = answer(
            self.server,
            &h,
            &fixed[..fixed_len],
            in_len,
            &mut e.payload,
            started,
        );
        self.commit(i, error, len)
    }
}
