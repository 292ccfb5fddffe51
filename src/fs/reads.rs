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

use crate::catalog::{Catalog, EntryId};
use crate::tiers::FileReader;

pub struct ReadJob {
    pub id: EntryId,
    /// Offset of the request in the file; the request lies inside the file.
    pub offset: u64,
    pub len: usize,
    pub reply: ReplyData,
}

/// What serving a read needs.
struct Tiers {
    catalog: Arc<Catalog>,
    files: Arc<FileReader>,
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
        files: Arc<FileReader>,
    ) -> std::io::Result<Self> {
        let tiers = Arc::new(Tiers { catalog, files });
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
    let catalog = &tiers.catalog;
    let entry = match catalog.entry(job.id) {
        Ok(entry) => entry,
        Err(_) => return job.reply.error(Errno::EIO),
    };
    BUFFER.with_borrow_mut(|buf| {
        match tiers.files.read(catalog, entry, job.offset, job.len, buf) {
            Ok(served) => job.reply.data(served.bytes()),
            Err(err) => {
                error!(
                    image = %tiers.files.source().image_path(entry.image).display(),
                    offset = err.image_offset,
                    file_offset = job.offset,
                    len = job.len,
                    path = %String::from_utf8_lossy(&catalog.path_of(job.id)),
                    "read failed, returning EIO: {}",
                    err.error
                );
                job.reply.error(Errno::EIO);
            }
        }
        // Keep at most one large request's worth of buffer per thread.
        buf.truncate(job.len);
        buf.shrink_to(2 << 20);
    });
}
