//! Serving READ requests without ever starving lookups.
//!
//! A FUSE request thread reads inline (the fastest path: no hand-off, one wakeup less per request)
//! as long as fewer than `threads - 1` request threads are inside a read. Otherwise it moves the
//! reply to a pool of I/O workers and returns at once. So at least one request thread is always free
//! for lookups and listings, however slow the parallel filesystem is. An I/O error becomes EIO for
//! that read only, logged with the image, the offset and the file's path.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::Sender;
use fuser::{Errno, ReplyData};
use tracing::error;

use crate::archive::Encoding;
use crate::catalog::{Catalog, EntryId};
use crate::tiers::{Inflated, Source};

pub struct ReadJob {
    pub id: EntryId,
    pub image: u32,
    /// Where the file's (stored or compressed) bytes start in the image, and how they are stored.
    pub data_offset: u64,
    pub encoding: Encoding,
    pub file_size: u64,
    /// Offset of the request in the file; the request lies inside the file.
    pub offset: u64,
    pub len: usize,
    pub reply: ReplyData,
}

/// What serving a read needs.
struct Tiers {
    catalog: Arc<Catalog>,
    source: Arc<Source>,
    inflated: Arc<Inflated>,
}

pub struct Reads {
    tiers: Arc<Tiers>,
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
        catalog: Arc<Catalog>,
        source: Arc<Source>,
        inflated: Arc<Inflated>,
    ) -> std::io::Result<Self> {
        let tiers = Arc::new(Tiers {
            catalog,
            source,
            inflated,
        });
        let (tx, rx) = crossbeam_channel::unbounded::<ReadJob>();
        let workers = (0..io_threads.max(1))
            .map(|i| {
                let (rx, tiers) = (rx.clone(), tiers.clone());
                std::thread::Builder::new()
                    .name(format!("packfs-read-{i}"))
                    .spawn(move || {
                        for job in rx {
                            serve(job, &tiers);
                        }
                    })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Reads {
            tiers,
            inline_limit: request_threads.saturating_sub(1),
            inline_now: AtomicUsize::new(0),
            pool: Some(tx),
            workers,
        })
    }

    /// Serves the read here or in the pool (see the module comment).
    pub fn submit(&self, job: ReadJob) {
        if self.inline_now.fetch_add(1, Ordering::AcqRel) < self.inline_limit {
            serve(job, &self.tiers);
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

fn serve(job: ReadJob, tiers: &Tiers) {
    let source = &tiers.source;
    let fail = |job: ReadJob, err: std::io::Error| {
        error!(
            image = %source.image_path(job.image).display(),
            offset = job.data_offset,
            len = job.len,
            path = %String::from_utf8_lossy(&tiers.catalog.path_of(job.id)),
            "read failed, returning EIO: {err}"
        );
        job.reply.error(Errno::EIO);
    };
    if job.encoding == Encoding::Deflate {
        match tiers
            .inflated
            .member(source, job.image, job.data_offset, job.file_size)
        {
            Ok(bytes) => {
                let start = job.offset as usize;
                job.reply.data(&bytes[start..start + job.len]);
            }
            Err(err) => fail(job, err),
        }
        return;
    }
    let len = job.len;
    BUFFER.with_borrow_mut(|buf| {
        buf.resize(len, 0);
        let at = job.data_offset + job.offset;
        match source.read_exact_at(job.image, at, &mut buf[..job.len]) {
            Ok(()) => job.reply.data(&buf[..job.len]),
            Err(err) => fail(job, err),
        }
        // Keep at most one large request's worth of buffer per thread.
        buf.truncate(len);
        buf.shrink_to(2 << 20);
    });
}
