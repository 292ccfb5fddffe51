//! Worker threads that serve READ requests, so the FUSE request threads stay free for metadata.
//!
//! A FUSE thread turns a READ into a job (image, offset, length) and moves the reply here; a worker
//! does the `pread` and answers. An I/O error becomes EIO for that read only, logged with the image,
//! the offset and the file's path.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use fuser::{Errno, ReplyData};
use tracing::error;

use crate::catalog::{Catalog, EntryId};
use crate::tiers::Source;

pub struct ReadJob {
    pub id: EntryId,
    pub image: u32,
    /// Absolute offset in the image.
    pub offset: u64,
    pub len: usize,
    pub reply: ReplyData,
}

pub struct ReadPool {
    jobs: Option<Sender<ReadJob>>,
    workers: Vec<JoinHandle<()>>,
}

impl ReadPool {
    pub fn start(
        threads: usize,
        catalog: Arc<Catalog>,
        source: Arc<Source>,
    ) -> std::io::Result<Self> {
        let (tx, rx) = crossbeam_channel::unbounded::<ReadJob>();
        let workers = (0..threads.max(1))
            .map(|i| {
                let (rx, catalog, source) = (rx.clone(), catalog.clone(), source.clone());
                std::thread::Builder::new()
                    .name(format!("packfs-read-{i}"))
                    .spawn(move || serve(rx, &catalog, &source))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(ReadPool {
            jobs: Some(tx),
            workers,
        })
    }

    pub fn submit(&self, job: ReadJob) {
        if let Some(jobs) = &self.jobs
            && let Err(unsent) = jobs.send(job)
        {
            unsent.into_inner().reply.error(Errno::EIO);
        }
    }

    /// Lets the workers finish the queued reads and exit.
    pub fn shutdown(&mut self) {
        self.jobs.take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn serve(jobs: Receiver<ReadJob>, catalog: &Catalog, source: &Source) {
    let mut buf = Vec::new();
    for job in jobs {
        buf.resize(job.len, 0);
        match source.read_exact_at(job.image, job.offset, &mut buf[..job.len]) {
            Ok(()) => job.reply.data(&buf[..job.len]),
            Err(err) => {
                error!(
                    image = %source.image_path(job.image).display(),
                    offset = job.offset,
                    len = job.len,
                    path = %String::from_utf8_lossy(&catalog.path_of(job.id)),
                    "read failed, returning EIO: {err}"
                );
                job.reply.error(Errno::EIO);
            }
        }
        // Keep one request's worth of buffer, not the largest ever seen.
        buf.truncate(job.len);
        buf.shrink_to(2 << 20);
    }
}
