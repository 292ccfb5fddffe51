//! Serving READ requests without ever starving lookups.
//!
//! A FUSE request thread reads inline (the fastest path: no hand-off, one wakeup less per request)
//! as long as fewer than `threads - 1` request threads are inside a read. Otherwise it moves the
//! reply to a pool of I/O workers and returns at once. So at least one request thread is always free
//! for lookups and listings, however slow the parallel filesystem is. The pool grows while all its
//! workers are inside reads and none finishes, so reads stuck in one slow region (a slow OST, a failing disk) hold
//! only their own threads: measured with 40 reads stalled, a read elsewhere took 28 s with a
//! fixed pool of 16 and normal time with this one (docs/semantics.md). What a read answers is the
//! core's business; an I/O error becomes EIO for that read only.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tracing::warn;

use super::dispatch::{DataReply, Dispatch, ReadCall, Reply, SentData};
use super::error::Error;
use crate::tiers::budget::MemoryBudget;

/// A read to answer through `reply`, whichever transport it came by.
pub struct ReadJob<R> {
    pub call: ReadCall,
    pub reply: R,
}

pub struct Reads {
    server: Arc<Dispatch>,
    pace: Arc<Pace>,
    /// Request threads allowed to read inline at once.
    inline_limit: usize,
    inline_now: AtomicUsize,
    /// None once shut down. One pool for both transports: the rings hand every read that
    /// must wait here, as the classic loop does when its request threads are busy.
    pool: RwLock<Option<Sender<ReadJob<SentData>>>>,
    workers: Arc<Workers>,
}

/// The read workers: `base` of them always, more while every one is busy (a stuck region of
/// one image holds its readers, the rest of the mount must not wait behind them), up to `max`;
/// the extra ones leave after `IDLE_EXIT` without work.
struct Workers {
    base: usize,
    max: usize,
    alive: AtomicUsize,
    idle: AtomicUsize,
    jobs: Receiver<ReadJob<SentData>>,
    handles: Mutex<Vec<JoinHandle<()>>>,
    pace: Arc<Pace>,
    /// When a worker of the pool last finished a read (`Clock`): busy workers that finish reads
    /// are CPU-bound or I/O-bound, not stuck, and more threads would only cost memory. The
    /// pool's own, not the mount's: reads served inline that finish say nothing of workers stuck
    /// in the source (with one clock for both, clairvoyant reads from a store at 5 ms measured
    /// 0.83-0.92x in three sets of rounds, 1.00x with the pool's own: bench/remote.py).
    pool_done: Clock,
}

/// When something last happened, in ms since the clock was made.
struct Clock {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Clock {
    fn new() -> Clock {
        Clock {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn tick(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// Nothing happened for `STALLED`.
    fn stalled(&self) -> bool {
        let now = self.epoch.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_ms.load(Ordering::Relaxed)) >= STALLED.as_millis() as u64
    }
}

/// The mount's reads as a whole: the room their replies are assembled in, and the clock of the
/// last read finished (inline or in the pool), which tells reads stuck in the source from reads
/// that are only busy. One per mount (two mounts in a process do not wait on each other's room
/// or clock).
struct Pace {
    /// Bytes of replies being assembled at once (`REPLY_ROOM`).
    room: Arc<MemoryBudget>,
    /// The engine's budget: reads waiting for its memory are not stuck.
    memory: Arc<MemoryBudget>,
    /// When some read of the mount last finished.
    read_done: Clock,
    /// Threads that keep a large reply buffer, at most `KEEPERS`.
    keeping: Arc<AtomicUsize>,
}

impl Pace {
    /// A read waiting for reply room goes ahead without it when no read finished for `STALLED`
    /// (the reads holding the room are stuck in a slow region of the source, and the rest of the
    /// mount must not wait behind them: docs/semantics.md, slow or stuck regions); reads that only
    /// wait their turn do not (under 32 readers staging, a fixed 20 ms let the replies of 42
    /// threads through). Reads waiting for memory are not stuck either: going ahead then let the
    /// replies of 32 readers through while the stager's runs held the budget (87 MiB against 65).
    fn reads_stalled(&self) -> bool {
        self.read_done.stalled() && !self.memory.anyone_waits()
    }
}

/// Most read workers at once: how many reads may be stuck in slow regions of the source while
/// the rest of the mount still reads at normal speed (each waiting thread costs a stack).
pub const MAX_IO_THREADS: usize = 256;
const IDLE_EXIT: Duration = Duration::from_secs(30);
/// No read finished for this long while reads wait: the workers are stuck, add one.
const STALLED: Duration = Duration::from_millis(20);

/// A thread's reply buffer. Its bytes stay between reads (the next read overwrites them instead
/// of clearing them first), but only `KEEPERS` threads keep a large one: the read pool grows to
/// hundreds of threads while a region of the source stalls, and a large buffer each (1 MiB
/// reads) was memory beyond the daemon's budget (33 MiB under 32 readers staging).
struct ReplyBuffer {
    bytes: Vec<u8>,
    /// The count of keepers this thread is one of, if it is.
    keeper: Option<Arc<AtomicUsize>>,
}

/// Bytes of replies being assembled at once, at most: a read waits for room before it fills its
/// buffer. Without it, 55 threads assembling 1 MiB replies for 32 readers held 33 MiB beyond the
/// daemon's budget (`tiers::budget`, whose `OUTSIDE` counts this room).
pub const REPLY_ROOM: u64 = 4 << 20;

/// Threads of a mount that keep a large reply buffer, at most.
const KEEPERS: usize = 4;
/// What a keeper keeps: a read of the most FUSE asks (1 MiB) and its header.
const KEPT: usize = (1 << 20) + 4096;
/// What every other thread keeps.
const SMALL: usize = 128 << 10;

impl ReplyBuffer {
    /// After a read: a large buffer stays only with a keeper (this thread, if there is room).
    fn settle(&mut self, keeping: &Arc<AtomicUsize>) {
        if self.bytes.capacity() <= SMALL {
            return;
        }
        if self.keeper.is_none()
            && keeping
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < KEEPERS).then_some(n + 1)
                })
                .is_ok()
        {
            self.keeper = Some(keeping.clone());
        }
        let keep = if self.keeper.is_some() { KEPT } else { SMALL };
        self.bytes.truncate(keep);
        self.bytes.shrink_to(keep);
    }
}

impl Drop for ReplyBuffer {
    fn drop(&mut self) {
        if let Some(keeping) = &self.keeper {
            keeping.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

thread_local! {
    static BUFFER: RefCell<ReplyBuffer> = const {
        RefCell::new(ReplyBuffer { bytes: Vec::new(), keeper: None })
    };
}

impl Reads {
    /// `request_threads` is the number of FUSE request threads; `io_threads` the pool size kept
    /// at all times.
    pub fn start(
        request_threads: usize,
        io_threads: usize,
        server: Arc<Dispatch>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded::<ReadJob<SentData>>();
        let base = io_threads.max(1);
        let pace = Arc::new(Pace {
            room: MemoryBudget::new(REPLY_ROOM),
            memory: server.memory().clone(),
            read_done: Clock::new(),
            keeping: Arc::default(),
        });
        let workers = Arc::new(Workers {
            base,
            max: MAX_IO_THREADS.max(base),
            alive: AtomicUsize::new(0),
            idle: AtomicUsize::new(0),
            jobs: rx,
            handles: Mutex::new(Vec::new()),
            pace: pace.clone(),
            pool_done: Clock::new(),
        });
        for _ in 0..base {
            spawn_worker(&workers, &server)?;
        }
        Ok(Reads {
            server,
            pace,
            inline_limit: request_threads.saturating_sub(1),
            inline_now: AtomicUsize::new(0),
            pool: RwLock::new(Some(tx)),
            workers,
        })
    }

    /// Serves the read here or in the pool (see the module comment).
    pub fn submit<R: DataReply + Send + 'static>(&self, job: ReadJob<R>) {
        if self.inline_now.fetch_add(1, Ordering::AcqRel) < self.inline_limit {
            serve(job, &self.server, &self.pace);
            self.inline_now.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        self.inline_now.fetch_sub(1, Ordering::AcqRel);
        self.hand_off(job);
    }

    /// Serves the read in the pool, never on the calling thread (a ring's queue thread must not
    /// wait on storage: every request issued on its CPU would wait behind it).
    pub fn hand_off<R: DataReply + Send + 'static>(&self, job: ReadJob<R>) {
        let pool = self.pool.read().expect("not poisoned");
        let Some(pool) = pool.as_ref() else {
            return job.reply.error(Error::Stopping.errno());
        };
        let job = ReadJob {
            call: job.call,
            reply: SentData::new(job.reply),
        };
        if let Err(unsent) = pool.send(job) {
            return unsent.into_inner().reply.error(Error::Stopping.errno());
        }
        grow_if_behind(&self.workers, &self.server);
    }

    /// Lets the workers finish the queued reads and exit.
    pub fn shutdown(&self) {
        self.pool.write().expect("not poisoned").take();
        let handles = std::mem::take(&mut *self.workers.handles.lock().expect("not poisoned"));
        for worker in handles {
            let _ = worker.join();
        }
    }
}

/// Adds a worker when more reads are queued than workers wait for work and no read has finished
/// for `STALLED`: the others are stuck inside reads. Called on every hand-off and by every worker
/// that takes a read, so no read stays queued behind stuck ones. (Growing whenever all were busy
/// doubled the daemon's threads and RSS under 64 readers of compressed data, for nothing.)
fn grow_if_behind(w: &Arc<Workers>, server: &Arc<Dispatch>) {
    if w.pool_done.stalled()
        && w.jobs.len() > w.idle.load(Ordering::Acquire)
        && w.alive.load(Ordering::Acquire) < w.max
        && let Err(e) = spawn_worker(w, server)
    {
        warn!("cannot start another read worker: {e}");
    }
}

fn spawn_worker(workers: &Arc<Workers>, server: &Arc<Dispatch>) -> std::io::Result<()> {
    let n = workers.alive.fetch_add(1, Ordering::AcqRel);
    let (w, server) = (workers.clone(), server.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("packfs-read-{n}"))
        .spawn(move || {
            loop {
                w.idle.fetch_add(1, Ordering::AcqRel);
                let job = w.jobs.recv_timeout(IDLE_EXIT);
                w.idle.fetch_sub(1, Ordering::AcqRel);
                match job {
                    Ok(job) => {
                        grow_if_behind(&w, &server);
                        serve(job, &server, &w.pace);
                        w.pool_done.tick();
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        // Extra workers leave when the stall is over; the base stays.
                        let alive = w.alive.load(Ordering::Acquire);
                        if alive > w.base
                            && w.alive
                                .compare_exchange(
                                    alive,
                                    alive - 1,
                                    Ordering::AcqRel,
                                    Ordering::Acquire,
                                )
                                .is_ok()
                        {
                            return;
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            w.alive.fetch_sub(1, Ordering::AcqRel);
        });
    match spawned {
        Ok(handle) => {
            let mut handles = workers.handles.lock().expect("not poisoned");
            handles.retain(|h| !h.is_finished());
            handles.push(handle);
            Ok(())
        }
        Err(e) => {
            workers.alive.fetch_sub(1, Ordering::AcqRel);
            Err(e)
        }
    }
}

fn serve(job: ReadJob<impl DataReply>, server: &Dispatch, pace: &Pace) {
    BUFFER.with_borrow_mut(|reply_buffer| {
        let buf = &mut reply_buffer.bytes;
        let ReadJob { call, reply } = job;
        let size = call.size;
        // Held until the reply is sent: its buffer (or the unit it shares) is in use until then.
        let _room = pace
            .room
            .acquire_unless_stuck(size as u64, STALLED, || pace.reads_stalled());
        // The whole reply at once: grown by doubling, the smaller steps were freed into the
        // allocator's per-thread arenas, which kept them.
        buf.reserve_exact((size as usize).saturating_sub(buf.len()));
        server.read(call, buf, reply);
        pace.read_done.tick();
        reply_buffer.settle(&pace.keeping);
    });
}
