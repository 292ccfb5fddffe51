//! Chunks that reads fetch whole while the stage copies their image: who fetches each chunk
//! (`claim_for_read`: each is read from the source once, by a read or by the stager), how other
//! reads of it share the fetch, and how it reaches local storage: handed to the stager through its
//! queue, or, when that queue is full, stored by the read itself (`ForRead::Store`), so a stager
//! that lags (one thread among the readers' many on a busy node) costs no second source read.
//! `store_chunk` is also the stager's own way of writing a chunk and recording it.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use xxhash_rust::xxh3::xxh3_64;

use super::image::{self, ABSENT, BUSY, PRESENT, StagedImage, state, with_state};
use super::{Decoded, ForRead, Shared, Stage, StopReason};
use crate::source::read_at::Wait;

impl Stage {
    /// Decides how a read gets chunk `i` of `image` (kept by this stage, staging not stopped) when
    /// it wants the chunk whole: each chunk is read from the source once, by a read or by the
    /// stager, never by both. A read that may not wait never stores a chunk itself.
    pub fn claim_for_read(&self, image: u32, i: usize, wait: Wait) -> ForRead {
        let Some(Some(img)) = self.images.get(image as usize) else {
            return ForRead::Exact;
        };
        let word = img.word(i);
        if state(word) == image::ABSENT && !self.stopped() {
            // Through the stager's queue if it has room, else stored by this read; but not by a
            // read that must not wait (a ring's queue thread): a write to local storage may.
            let may_store = wait == Wait::May;
            let (how, next) = match self.admit() {
                true => (ForRead::Fetch, image::QUEUED),
                false if may_store && self.has_room_for(img.chunk_len(i)) => (ForRead::Store, BUSY),
                false => {
                    self.lagged_reads.fetch_add(1, Ordering::Relaxed);
                    return ForRead::Exact;
                }
            };
            // Other reads of it share this fetch (`shared`) until it is handed over or stored.
            // The entry goes in under the same lock as the claim: a read that sees the chunk
            // claimed and asks `shared` must find it (found missing, the read fetched its sample
            // from the source too: tests/staging.rs's 32 lazy readers, 3 runs in 9).
            let mut handed = self.handed_bytes();
            if img.swap(i, word, with_state(word, next)) {
                handed.insert((image, i), None);
                return how;
            }
            drop(handed);
            // Another read or the stager took it first: whatever it is now, it is not ours.
            if how == ForRead::Fetch {
                self.pending.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let fetched_by_read = || self.handed_bytes().contains_key(&(image, i));
        match state(img.word(i)) {
            image::QUEUED => ForRead::Shared,
            // Being stored by a read (the walk's chunks are busy too, and not shared).
            BUSY if fetched_by_read() => ForRead::Shared,
            _ => ForRead::Exact,
        }
    }

    /// Ends the claim `claim_for_read` gave a read (`how`: `Fetch` or `Store`; the others hold
    /// none) once its fetch is done: the bytes handed to the stager or stored, or, with `None`
    /// (the fetch failed), the chunk given back for another to fetch.
    pub fn settle(&self, image: u32, i: usize, how: ForRead, fetched: Option<&Decoded>) {
        match (how, fetched) {
            (ForRead::Fetch, Some(bytes)) => self.hand_over(image, i, bytes.clone()),
            (ForRead::Store, Some(bytes)) => self.store_fetched(image, i, bytes),
            (ForRead::Fetch | ForRead::Store, None) => self.release(image, i),
            _ => {}
        }
    }

    /// The bytes of chunk `i` of `image`, fetched whole after `claim_for_read` said `Fetch`.
    fn hand_over(&self, image: u32, i: usize, bytes: Decoded) {
        self.handed_bytes().insert((image, i), Some(bytes.clone()));
        self.send(image, i, Some(bytes));
    }

    /// Where the bytes of chunk `i` of `image` are, for a read told `ForRead::Shared`. (A chunk
    /// queued by an exact read is not here: the stager reads it, and so is `Gone` for reads.)
    pub fn shared(&self, image: u32, i: usize) -> Shared {
        match self.handed_bytes().get(&(image, i)) {
            Some(Some(bytes)) => Shared::Bytes(bytes.clone()),
            Some(None) => Shared::Fetching,
            None => Shared::Gone,
        }
    }

    pub(super) fn handed_bytes(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(u32, usize), Option<Decoded>>> {
        self.handed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives back a chunk `claim_for_read` gave to a read whose fetch failed.
    fn release(&self, image: u32, i: usize) {
        self.handed_bytes().remove(&(image, i));
        let Some(Some(img)) = self.images.get(image as usize) else {
            return;
        };
        let word = img.word(i);
        match state(word) {
            image::QUEUED => {
                img.swap(i, word, with_state(word, image::ABSENT));
                self.pending.fetch_sub(1, Ordering::Relaxed);
            }
            // A read told `Store`: it took no place in the queue.
            BUSY => {
                img.swap(i, word, with_state(word, image::ABSENT));
            }
            _ => {}
        }
    }

    /// Whether `len` more local bytes fit the budget without evicting (only the stager evicts).
    pub(super) fn has_room_for(&self, len: u64) -> bool {
        self.opts
            .budget
            .is_none_or(|budget| self.present_bytes.load(Ordering::Relaxed) + len <= budget)
    }

    /// Writes chunk `i` (claimed: state word `busy`) and records it; false when it was not stored
    /// (staging stopped), leaving the chunk claimed for the caller to release.
    pub(super) fn store_chunk(
        &self,
        img: &StagedImage,
        i: usize,
        busy: u64,
        bytes: &[u8],
        sum: u64,
    ) -> bool {
        let len = bytes.len() as u64;
        let written = img
            .data
            .write_all_at(bytes, img.chunk_start(i))
            .and_then(|()| img.state.mark(i, sum));
        if let Err(e) = written {
            let _ = img.punch(i);
            let _ = img.state.clear(i);
            self.local_write_failed(e);
            return false;
        }
        img.chunks[i].sum.store(sum, Ordering::SeqCst);
        img.swap(i, busy, with_state(busy, PRESENT));
        self.present_chunks.fetch_add(1, Ordering::Relaxed);
        self.present_bytes.fetch_add(len, Ordering::Relaxed);
        self.copied_bytes.fetch_add(len, Ordering::Relaxed);
        true
    }

    /// Stores chunk `i` of `image`, fetched whole by a read told `ForRead::Store`.
    fn store_fetched(&self, image: u32, i: usize, bytes: &Decoded) {
        let Some(Some(img)) = self.images.get(image as usize) else {
            return;
        };
        let busy = img.word(i);
        if state(busy) == BUSY && !self.stopped() {
            if self.store_chunk(img, i, busy, bytes, xxh3_64(bytes)) {
                self.copied_from_reads
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            } else {
                img.swap(i, busy, with_state(busy, ABSENT));
            }
        } else if state(busy) == BUSY {
            img.swap(i, busy, with_state(busy, ABSENT));
        }
        self.handed_bytes().remove(&(image, i));
    }

    fn local_write_failed(&self, e: io::Error) {
        let dir = self.dir().display();
        let (reason, why) = match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => (
                StopReason::DirectoryFull,
                format!(
                    "stage directory {dir} is full ({e}); staging stopped, unstaged chunks are read from the source"
                ),
            ),
            _ => (
                StopReason::WriteFailed,
                format!(
                    "cannot write to stage directory {dir} ({e}); staging stopped, unstaged chunks are read from the source"
                ),
            ),
        };
        self.stop(reason, why);
    }
}
