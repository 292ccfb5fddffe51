//! Reading a staged chunk back with its check: the whole chunk in pieces, hashed as they pass,
//! against the xxh3 recorded when it was copied from the source; a chunk that fails is dropped
//! (and staged again), and the failure said once.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use tracing::error;
use xxhash_rust::xxh3::Xxh3;

use super::Stage;
use super::image::StagedImage;
use super::still_local;
use crate::source::read_at::Wait;

/// Bytes of a staged chunk read back at a time for its check.
const CHECK_PIECE: u64 = 128 << 10;

/// What reading a chunk back with its check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Checked {
    /// Its bytes match the record.
    Matched,
    /// It changed while it was read (dropped, copied again): nothing can be said.
    Changed,
    /// Its bytes do not match the record: dropped, staged again.
    Failed,
}

thread_local! {
    /// A piece of a chunk read back from local storage for its check.
    static CHECK_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Stage {
    /// Fills `dst` from `within` chunk `i` of `img` by reading the whole chunk back in pieces,
    /// hashed as they pass, `dst` filled from the same pieces, so what is served is what was
    /// checked. A whole chunk per reading thread (32 MiB under 32 readers) was memory outside the
    /// budget. A chunk that fails its check is dropped (and staged again).
    pub(super) fn read_checked(
        &self,
        img: &StagedImage,
        i: usize,
        before: u64,
        within: u64,
        dst: &mut [u8],
        wait: Wait,
    ) -> std::io::Result<Checked> {
        CHECK_BUF.with_borrow_mut(|piece| {
            let (len, from, to) = (img.chunk_len(i), within, within + dst.len() as u64);
            let mut hasher = Xxh3::new();
            let mut at = 0;
            while at < len {
                piece.resize((len - at).min(CHECK_PIECE) as usize, 0);
                if let Err(e) = img.read_local(i, at, piece, wait) {
                    // Dropped (or, would it block, kept and the error returned).
                    self.local_read_failed(img, i, before, e)?;
                    return Ok(Checked::Changed);
                }
                hasher.update(piece);
                let end = at + piece.len() as u64;
                let (lo, hi) = (at.max(from), end.min(to));
                if lo < hi {
                    dst[(lo - from) as usize..(hi - from) as usize]
                        .copy_from_slice(&piece[(lo - at) as usize..(hi - at) as usize]);
                }
                at = end;
            }
            let got = hasher.digest();
            let want = img.chunks[i].sum.load(Ordering::SeqCst);
            if !still_local(before, img.word(i)) {
                return Ok(Checked::Changed);
            }
            if got != want {
                self.failed_check(img, i, before, got, want);
                return Ok(Checked::Failed);
            }
            Ok(Checked::Matched)
        })
    }

    /// A staged chunk that could not be read back is dropped (and served from the source), but
    /// one that is only out of memory for a read that may not wait is kept: that read goes to
    /// the read pool. Dropped, every such chunk was logged as an error and fetched again.
    pub(super) fn local_read_failed(
        &self,
        img: &StagedImage,
        i: usize,
        word: u64,
        e: std::io::Error,
    ) -> std::io::Result<bool> {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Err(e);
        }
        error!(
            "cannot read staged chunk {i} of {} from {} at offset {}: {e}; reading it from the source",
            img.source_path.display(),
            img.data_path.display(),
            img.chunk_start(i)
        );
        self.drop_chunk(img, i, word);
        Ok(false)
    }

    pub(super) fn failed_check(&self, img: &StagedImage, i: usize, word: u64, got: u64, want: u64) {
        // Several readers may check the same chunk at once: the one that drops it reports.
        if !self.drop_chunk(img, i, word) {
            return;
        }
        self.failed_checks.fetch_add(1, Ordering::Relaxed);
        error!(
            "staged chunk {i} of {} (bytes {}..{} of {}) fails its checksum: xxh3 {got:016x}, \
             expected {want:016x}; dropped, served from the source and staged again",
            img.source_path.display(),
            img.chunk_start(i),
            img.chunk_start(i) + img.chunk_len(i),
            img.data_path.display()
        );
    }
}
