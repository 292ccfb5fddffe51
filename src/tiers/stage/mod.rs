//! Node-local staging: copies of the images on NVMe or /dev/shm, filled chunk by chunk in the
//! background while the mount serves, and read in place of the source once a chunk is complete
//! and has passed its checksum.
//!
//! Readers never wait for the stager: a chunk that is not ready is read from the source (through
//! the RAM tier), and in lazy mode that read asks the stager to keep the chunk. The stager is the
//! only writer of local bytes; readers may only drop a chunk that fails its check.

mod checked;
mod copier;
pub mod for_peers;
mod image;
mod lock;
pub mod per_node;
mod state;
mod state_file;
mod store;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};
use tracing::{info, warn};

use checked::Checked;
pub use copier::run as run_copier;
pub use image::chunk_len;
use image::{BUSY, PRESENT, StagedImage, VERIFIED, dropped, is_local, state, with_state};
pub use lock::{DirLock, LockError};
use state::Status;
pub use state::{StageState, StageStats, StopReason};

use super::OpenedImages;
use super::budget::MemoryBudget;
use super::ram_cache::Decoded;
use crate::catalog::ImageInfo;
use crate::source::read_at::Wait;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageMode {
    /// Copy every assigned image, front to back, as fast as allowed.
    Eager,
    /// Copy only the chunks that reads touch (for datasets larger than local storage).
    Lazy,
}

/// This node's part of the images in a data-parallel job: image i when i mod `world` == `rank`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    pub rank: u32,
    pub world: u32,
}

impl std::str::FromStr for Share {
    type Err = String;
    fn from_str(s: &str) -> Result<Share, String> {
        let bad = || format!("{s:?} is not RANK/WORLD with 0 <= RANK < WORLD, e.g. 3/8");
        let (r, w) = s.split_once('/').ok_or_else(bad)?;
        let (rank, world) = (
            r.trim().parse().map_err(|_| bad())?,
            w.trim().parse().map_err(|_| bad())?,
        );
        if world == 0 || rank >= world {
            return Err(bad());
        }
        Ok(Share { rank, world })
    }
}

impl Share {
    pub fn assigned(&self, image: usize) -> bool {
        share_of(image, self.world) == self.rank
    }
}

/// The share (0..world) image number `image` belongs to: images are dealt to shares in turn, so
/// shares differ by one image at most. The one rule `--stage-share` stages by and `packfs ls
/// --json --shares` exports (the Python samplers read it from there).
pub fn share_of(image: usize, world: u32) -> u32 {
    (image as u64 % world.max(1) as u64) as u32
}

#[derive(Clone, Debug)]
pub struct StageOptions {
    pub dir: PathBuf,
    pub mode: StageMode,
    /// Local bytes at most.
    pub budget: Option<u64>,
    /// Source bytes per second read by the stager at most.
    pub rate: Option<u64>,
    pub share: Option<Share>,
    pub chunk_size: u64,
}

/// Why a stage directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("stage directory: {0}")]
    Dir(#[from] crate::util::safe_file::DirError),
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(
        "cannot prepare the local copy of {} in stage directory {}: {error}",
        image.display(),
        dir.display()
    )]
    Prepare {
        image: PathBuf,
        dir: PathBuf,
        error: std::io::Error,
    },
}

/// A chunk that a read touched, for the stager; with its bytes when the read fetched them whole.
struct Offer {
    image: u32,
    chunk: usize,
    bytes: Option<Decoded>,
}

/// Whether a chunk whose state word was `before` when a read began still had its local bytes
/// throughout: same generation (no eviction or drop in between), still complete.
fn still_local(before: u64, now: u64) -> bool {
    now >> 8 == before >> 8 && is_local(now)
}

/// Bytes of offers waiting at most (each may hold a chunk's bytes, mostly shared with the RAM
/// tier), and at least this many offers. Beyond, the stager lags: a read that fetched a chunk
/// whole stores it itself (`ForRead::Store`). A burst of 16 readers from mount time offered 40
/// chunks faster than a stager on a busy CPU took them: with room for 32, a third of a lazy
/// epoch's chunks were not kept.
const QUEUE_BYTES: u64 = 64 << 20;
const QUEUE_MIN: u64 = 32;

/// Where a chunk another read claimed is (`Stage::shared`).
pub enum Shared {
    /// That read is fetching it: the RAM tier's fetch of it is joined.
    Fetching,
    /// Handed over, waiting for the stager.
    Bytes(Decoded),
    /// The stager took it (it is being written, or is local now).
    Gone,
}

/// What a read that wants chunk `i` whole does, while the stage copies its image
/// (`Stage::claim_for_read`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForRead {
    /// The chunk is this read's to fetch whole, for the stager: then `settle` the claim.
    Fetch,
    /// Another read is fetching it, or fetched it and it waits for the stager (`Stage::shared`).
    Shared,
    /// The stager's queue is full: the chunk is this read's to fetch whole and store itself;
    /// then `settle` the claim.
    Store,
    /// Not to be fetched whole: the stager is copying it (its bytes in memory only if a read
    /// fetched them), or the stage has no room, or the chunk became local meanwhile.
    Exact,
}

pub struct Stage {
    opts: StageOptions,
    _lock: DirLock,
    /// (device, inode) of the stage directory when opened: a different answer means it vanished.
    dir_id: (u64, u64),
    images: Vec<Option<StagedImage>>,
    source: Arc<OpenedImages>,
    offers: (Sender<Offer>, Receiver<Offer>),
    /// Offers sent and not yet taken by the stager (at most `queue`, by admission).
    pending: AtomicU64,
    /// The bytes of chunks handed over and not yet taken, for other reads of them: a QUEUED
    /// chunk's bytes may have left the RAM tier (a 64 MiB cache under 16 readers evicts a chunk
    /// before the next sample in it is read), and fetching it again is what this avoids.
    /// `None` while the read that claimed the chunk fetches it.
    handed: Mutex<HashMap<(u32, usize), Option<Decoded>>>,
    queue: u64,
    tick: AtomicU64,
    total_chunks: u64,
    total_bytes: u64,
    present_chunks: AtomicU64,
    present_bytes: AtomicU64,
    copied_bytes: AtomicU64,
    copied_from_reads: AtomicU64,
    lagged_reads: AtomicU64,
    verified_chunks: AtomicU64,
    failed_checks: AtomicU64,
    evicted_bytes: AtomicU64,
    /// Set once staging gave up (disk full, directory gone); reads keep going.
    stopped: AtomicBool,
    shutdown: AtomicBool,
    status: Mutex<Status>,
    /// The mount's memory budget, which the stager's runs draw from (none for `packfs stage`,
    /// whose runs are its only memory).
    memory: Option<Arc<MemoryBudget>>,
}

impl Stage {
    /// Opens the stage directory (created if missing) for `images`, locks it for `holder`, and
    /// loads what earlier runs staged there.
    pub fn open(
        opts: StageOptions,
        source: Arc<OpenedImages>,
        images: &[ImageInfo],
        holder: &str,
        memory: Option<Arc<MemoryBudget>>,
    ) -> Result<Stage, StageError> {
        let dir = &opts.dir;
        // Its files are read back as staged bytes and their checksums: only a directory of this
        // user's, on a path nobody else can redirect (util::safe_file).
        crate::util::safe_file::private_dir_all(dir, 0o700)?;
        let lock = DirLock::take(dir, holder)?;
        let meta = std::fs::symlink_metadata(dir).map_err(|error| {
            crate::util::safe_file::DirError::Create {
                dir: dir.clone(),
                error,
            }
        })?;
        let mut staged = Vec::with_capacity(images.len());
        let (mut total_chunks, mut total_bytes, mut present_bytes, mut present_chunks) =
            (0, 0, 0, 0);
        for (i, info) in images.iter().enumerate() {
            // An inner archive's bytes are staged as its outer image's.
            if info.within.is_some() || opts.share.is_some_and(|s| !s.assigned(i)) {
                staged.push(None);
                continue;
            }
            let opened = StagedImage::open(
                dir,
                i as u32,
                info.path(),
                &info.fingerprint,
                opts.chunk_size,
            )
            .map_err(|error| StageError::Prepare {
                image: info.path().to_path_buf(),
                dir: dir.clone(),
                error,
            })?;
            if let Some(why) = &opened.reset {
                info!(
                    "discarding the staged copy of {}: {why}",
                    info.path().display()
                );
            }
            let img = opened.image;
            let (chunks, bytes) = img.local_extent();
            total_chunks += img.chunks.len() as u64;
            total_bytes += img.size;
            present_chunks += chunks;
            present_bytes += bytes;
            staged.push(Some(img));
        }
        let assigned = staged.iter().flatten().count();
        info!(
            images = assigned,
            total_bytes,
            present_bytes,
            mode = ?opts.mode,
            "stage directory {}: {present_bytes} of {total_bytes} bytes already staged",
            dir.display()
        );
        Ok(Stage {
            dir_id: (meta.dev(), meta.ino()),
            _lock: lock,
            images: staged,
            source,
            offers: crossbeam_channel::unbounded(),
            pending: AtomicU64::new(0),
            handed: Mutex::default(),
            queue: (QUEUE_BYTES / opts.chunk_size.max(1)).max(QUEUE_MIN),
            tick: AtomicU64::new(1),
            total_chunks,
            total_bytes,
            present_chunks: AtomicU64::new(present_chunks),
            present_bytes: AtomicU64::new(present_bytes),
            copied_bytes: AtomicU64::new(0),
            copied_from_reads: AtomicU64::new(0),
            lagged_reads: AtomicU64::new(0),
            verified_chunks: AtomicU64::new(0),
            failed_checks: AtomicU64::new(0),
            evicted_bytes: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            status: Mutex::new(Status {
                state: StageState::Starting,
                stopped: None,
                text: "starting".into(),
            }),
            memory,
            opts,
        })
    }

    pub fn memory(&self) -> Option<&Arc<MemoryBudget>> {
        self.memory.as_ref()
    }

    pub fn chunk_size(&self) -> u64 {
        self.opts.chunk_size
    }

    pub fn dir(&self) -> &Path {
        &self.opts.dir
    }

    pub fn mode(&self) -> StageMode {
        self.opts.mode
    }

    /// Fills `dst` from the local copy of chunk `i` of `image`, starting `within` the chunk;
    /// false when the chunk is not staged, or fails its check (then it is dropped and refetched).
    /// A read that may not wait (`Wait::Never`) and finds the chunk out of the page cache fails
    /// with `WouldBlock`, the chunk kept: it is not damaged, only not in memory.
    pub fn read(
        &self,
        image: u32,
        i: usize,
        within: u64,
        dst: &mut [u8],
        wait: Wait,
    ) -> std::io::Result<bool> {
        let Some(Some(img)) = self.images.get(image as usize) else {
            return Ok(false);
        };
        let before = img.word(i);
        match state(before) {
            VERIFIED => {
                if let Err(e) = img.read_local(i, within, dst, wait) {
                    return self.local_read_failed(img, i, before, e);
                }
                if !still_local(before, img.word(i)) {
                    return Ok(false);
                }
            }
            PRESENT => {
                if self.read_checked(img, i, before, within, dst, wait)? != Checked::Matched {
                    return Ok(false);
                }
                if img.swap(i, before, with_state(before, VERIFIED)) {
                    self.verified_chunks.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => return Ok(false),
        }
        // Recency only matters where chunks get evicted; elsewhere spare the shared counter.
        if self.opts.mode == StageMode::Lazy && self.opts.budget.is_some() {
            let now = self.tick.fetch_add(1, Ordering::Relaxed);
            img.chunks[i].last_use.store(now, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Tells the stager that a read touched chunk `i` of `image`, which is not staged, and read
    /// exactly its own bytes (lazy mode copies the chunk; eager mode reaches it anyway). Whole
    /// chunks go through `claim_for_read` and `hand_over` instead.
    pub fn offer(&self, image: u32, i: usize) {
        if self.stopped.load(Ordering::Relaxed) || self.opts.mode == StageMode::Eager {
            return;
        }
        let Some(Some(img)) = self.images.get(image as usize) else {
            return;
        };
        let word = img.word(i);
        if state(word) != image::ABSENT || !self.admit() {
            return;
        }
        if !img.swap(i, word, with_state(word, image::QUEUED)) {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        self.send(image, i, None);
    }

    /// Takes a place in the stager's queue, if it has one.
    fn admit(&self) -> bool {
        let pending = self.pending.fetch_add(1, Ordering::Relaxed);
        if pending >= self.queue {
            self.pending.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn send(&self, image: u32, chunk: usize, bytes: Option<Decoded>) {
        // Unbounded, but never more than `queue` waiting: every offer was admitted first.
        let _ = self.offers.0.send(Offer {
            image,
            chunk,
            bytes,
        });
    }

    /// An offer left the queue (taken by the stager, whatever becomes of it).
    fn offer_taken(&self, image: u32, i: usize) {
        self.handed_bytes().remove(&(image, i));
        self.pending.fetch_sub(1, Ordering::Relaxed);
    }
    /// Drops the local bytes of a complete chunk (unless another thread changed it first).
    fn drop_chunk(&self, img: &StagedImage, i: usize, word: u64) -> bool {
        let busy = with_state(dropped(word), BUSY);
        if !img.swap(i, word, busy) {
            return false;
        }
        if let Err(e) = img.state.clear(i) {
            warn!(
                "cannot update staging progress {}: {e}",
                img.state.path().display()
            );
        }
        let _ = img.punch(i);
        self.present_chunks.fetch_sub(1, Ordering::Relaxed);
        self.present_bytes
            .fetch_sub(img.chunk_len(i), Ordering::Relaxed);
        img.swap(i, busy, dropped(word));
        true
    }

    /// Stops staging for good (reads of staged chunks go on).
    fn stop(&self, reason: StopReason, why: String) {
        if !self.stopped.swap(true, Ordering::SeqCst) {
            warn!("{why}");
            *self.status.lock().expect("status lock") = Status {
                state: StageState::Stopped,
                stopped: Some(reason),
                text: format!("stopped: {why}"),
            };
        }
    }

    /// A new state, unless staging stopped (that is for good).
    fn set_status(&self, state: StageState, text: &str) {
        let mut s = self.status.lock().expect("status lock");
        if s.state != StageState::Stopped && s.text != text {
            s.state = state;
            s.text = text.to_string();
        }
    }

    /// Whether the stage directory is still the one opened.
    fn dir_present(&self) -> bool {
        std::fs::metadata(&self.opts.dir).is_ok_and(|m| (m.dev(), m.ino()) == self.dir_id)
    }

    /// Whether this stage copies `image` (false for images of other nodes' shares).
    /// Whether chunk `i` of `image` is complete locally.
    pub fn holds(&self, image: u32, i: usize) -> bool {
        match self.images.get(image as usize) {
            Some(Some(img)) => i < img.chunks.len() && is_local(img.word(i)),
            _ => false,
        }
    }

    pub fn keeps(&self, image: u32) -> bool {
        matches!(self.images.get(image as usize), Some(Some(_)))
    }

    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Asks the stager to finish.
    /// Whether the stage copies `image` now (keeps it, and has not stopped): the one answer to
    /// "staging now", for the chunk plan, the chunk room and read-ahead.
    pub fn copying(&self, image: u32) -> bool {
        self.keeps(image) && !self.stopped()
    }

    pub fn shut_down(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
    }

    pub fn stats(&self) -> StageStats {
        let status = self.status.lock().expect("status lock");
        StageStats {
            dir: self.opts.dir.to_string_lossy().into_owned(),
            mode: Some(self.opts.mode),
            images: self.images.iter().flatten().count() as u64,
            total_bytes: self.total_bytes,
            present_bytes: self.present_bytes.load(Ordering::Relaxed),
            copied_bytes: self.copied_bytes.load(Ordering::Relaxed),
            copied_from_reads: self.copied_from_reads.load(Ordering::Relaxed),
            lagged_reads: self.lagged_reads.load(Ordering::Relaxed),
            verified_chunks: self.verified_chunks.load(Ordering::Relaxed),
            failed_checks: self.failed_checks.load(Ordering::Relaxed),
            evicted_bytes: self.evicted_bytes.load(Ordering::Relaxed),
            state: status.state,
            stopped: status.stopped,
            status: status.text.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_parse_and_assign() {
        // Images dealt in turn: share sizes differ by one image at most.
        let shares: Vec<u32> = (0..10).map(|i| share_of(i, 4)).collect();
        assert_eq!(shares, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]);
        let s: Share = "1/4".parse().unwrap();
        assert!((0..10).all(|i| s.assigned(i) == (share_of(i, 4) == 1)));
        let mine: Vec<usize> = (0..10).filter(|&i| s.assigned(i)).collect();
        assert_eq!(mine, vec![1, 5, 9]);
        for bad in ["4/4", "1", "a/4", "0/0", "-1/4"] {
            assert!(bad.parse::<Share>().is_err(), "{bad}");
        }
    }
}
