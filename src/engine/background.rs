//! What an engine does besides answering reads, each on a thread of its own: the stager copies
//! the images a stage keeps, the watcher checks images for being rewritten in place, and the
//! index is verified (and its files with checksums counted) at low priority.

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::{info, warn};

use crate::catalog::Catalog;
use crate::tiers::{self, FileReader};

/// How often the watcher checks one image for being rewritten under the mount: at most 60
/// metadata requests a minute per mount, whatever the number of images (each a stat of the
/// image, which on Lustre is an MDS getattr and OST glimpses; the old check of every image every
/// 2 s was 512 000 requests a second for 1 024 shards on 1 000 nodes).
const WATCH_PERIOD: Duration = Duration::from_secs(1);

/// The threads started, to stop and wait for.
pub struct Work {
    stager: Option<JoinHandle<()>>,
    /// Dropped to stop the watcher.
    watcher: Option<crossbeam_channel::Sender<()>>,
}

impl Work {
    pub fn start(
        files: &Arc<FileReader>,
        catalog: &Arc<Catalog>,
        checksummed: &Arc<OnceLock<u64>>,
    ) -> Work {
        verify(catalog.clone(), checksummed.clone());
        let watcher = watch_images(files.clone());
        // A stager that cannot start leaves the engine serving from the source.
        let stager = files.images().stage().cloned().and_then(start_stager);
        Work { stager, watcher }
    }

    /// Stops the watcher and waits for the stager (its stage told to shut down already).
    pub fn stop(self) {
        drop(self.watcher);
        if let Some(stager) = self.stager {
            let _ = stager.join();
        }
    }
}

fn start_stager(stage: Arc<tiers::stage::Stage>) -> Option<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("packfs-stage".into())
        .spawn(move || tiers::stage::run_copier(&stage, false, None))
        .map_err(|e| warn!("cannot start the stager, serving from the source only: {e}"))
        .ok()
}

/// Checks, one image a `WATCH_PERIOD` in turn, that no image read from since its last check was
/// rewritten in place (a shard overwritten while mounted served thousands of wrong files,
/// silently): from the first change on, that image's reads fail with EIO and the log says what
/// changed. Images nobody reads from are not checked (a failed read checks its image at once),
/// so an idle or fully staged engine sends the file system nothing. Stops when the returned
/// sender is dropped.
fn watch_images(files: Arc<FileReader>) -> Option<crossbeam_channel::Sender<()>> {
    let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
    std::thread::Builder::new()
        .name("packfs-watch".into())
        .spawn(move || {
            let mut cursor = usize::MAX;
            while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                stopped.recv_timeout(WATCH_PERIOD)
            {
                files.images().source().check_next_read(&mut cursor);
            }
        })
        .map_err(|e| warn!("cannot start the image watcher: {e}"))
        .ok()?;
    Some(stop)
}

/// Checks every chunk of a mapped index at low priority: damage shows in the log at once instead
/// of at the first request that meets it, and the index pages get warm; then counts the files
/// with checksums, for status (a walk of every entry nobody waited for).
fn verify(catalog: Arc<Catalog>, checksummed: Arc<OnceLock<u64>>) {
    let spawned = std::thread::Builder::new()
        .name("packfs-verify".into())
        .spawn(move || {
            // SAFETY: plain syscall; on Linux, `who = 0` is the calling thread only.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
            if let Some(index) = catalog.index_path().map(Path::to_path_buf) {
                let started = std::time::Instant::now();
                let damaged = catalog.verify_all();
                let secs = started.elapsed().as_secs_f64();
                if damaged == 0 {
                    info!("index {} verified in {secs:.3} s", index.display());
                } else {
                    tracing::error!(
                        "index {}: {damaged} damaged chunk(s); the entries in them answer EIO",
                        index.display()
                    );
                }
            }
            // After the verification, whose word on damage comes first: the same walk.
            let _ = checksummed.set(catalog.checksummed_files());
        });
    if let Err(e) = spawned {
        warn!("cannot start the index verification: {e}");
    }
}
