//! Serving READ requests without ever starving lookups.
//!
//! A FUSE request thread reads inline (the fastest path: no hand-off, one wakeup less per request)
//! as long as fewer than `threads - 1` request threads are inside a read. Otherwise it moves the
//! reply to a pool of I/O workers and returns at once. So at least one request thread is always free
//! for lookups and listings, however slow the parallel filesystem is. What a read answers is the
//! core's business; an I/O error becomes EIO for that read only.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use fuser::{Errno, ReplyData};

use super::adapter::failed;
use super::core::{Core, Ino};
use super::error::guarded;

pub struct ReadJob {
    pub ino: Ino,
    pub offset: u64,
    pub size: u32,
    pub reply: ReplyData,
}

pub struct Reads {
    core: Arc<Core>,
    /// Request threads allowed to read inline at once.
    inline_limit: usize,
    inline_now: AtomicUsize,
    pool: Option<Sender<ReadJob>>,
    workers: Vec<JoinHandle<()>>,
}

thread_local! {
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Reads {
    /// `request_threads` is the number of FUSE request threads; `io_threads` the pool size.
    pub fn start(
        request_threads: usize,
        io_threads: usize,
        core: Arc<Core>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded::<ReadJob>();
        let workers = (0..io_threads.max(1))
            .map(|i| {
                let (rx, core) = (rx.clone(), core.clone());
                std::thread::Builder::new()
                    .name(format!("packfs-read-{i}"))
                    .spawn(move || {
                        for job in rx {
                            serve(job, &core);
                        }
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Reads {
            core,
            inline_limit: request_threads.saturating_sub(1),
            inline_now: AtomicUsize::new(0),
            pool: Some(tx),
            workers,
        })
    }

    /// Serves the read here or in the pool (see the module comment).
    pub fn submit(&self, job: ReadJob) {
        if self.inline_now.fetch_add(1, Ordering::AcqRel) < self.inline_limit {
            serve(job, &self.core);
            self.inline_now.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        self.inline_now.fetch_sub(1, Ordering::AcqRel);
        match &self.pool {
            Some(pool) => {
                if let Err(unsent) = pool.send(job) {
                    unsent.into_inner().reply.error(Errno::EIO);
                }
            }
            None => job.reply.error(Errno::EIO),
        }
    }

    /// Lets the workers finish the queued reads and exit.
    pub fn shutdown(&mut self) {
        self.pool.take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn serve(job: ReadJob, core: &Core) {
    BUFFER.with_borrow_mut(|buf| {
        let read = guarded(
            || {
                format!(
                    "read of {} bytes at {} of inode {}",
                    job.size, job.offset, job.ino
                )
            },
            || core.read(job.ino, job.offset, job.size, buf),
        );
        match read {
            Ok(served) => job.reply.data(served.bytes()),
            Err(e) => job.reply.error(failed(e)),
        }
        // Keep at most one large request's worth of buffer per thread.
        buf.truncate(job.size as usize);
        buf.shrink_to(2 << 20);
    });
}
