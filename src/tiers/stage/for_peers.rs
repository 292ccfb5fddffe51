//! What a node's stage gives other nodes of its job (`peers`): bytes of chunks it holds, under
//! the trust its own reads give them. A chunk not yet read back since it was copied is checked
//! whole against the xxh3 the stager recorded from the source first (and dropped, and staged
//! again, if it fails); one checked already is read as a local read reads it. A whole chunk goes
//! out with its record, so the asking node checks it end to end; a range goes out with the xxh3
//! of its bytes (docs/semantics.md, "Peers").

use std::sync::atomic::Ordering;

use super::image::{PRESENT, VERIFIED, state, with_state};
use super::{Checked, Stage};
use crate::source::read_at::Wait;

/// What the stage has of a chunk a peer asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum ForPeer {
    /// The bytes asked for are in the buffer, from a chunk that matched the source's record
    /// (given) when it was first read back.
    Checked { record: u64 },
    /// Not staged here (another node's share, not copied yet, dropped meanwhile).
    NotStaged,
    /// Staged, but its bytes do not match the record: dropped now, staged again.
    Damaged,
}

impl Stage {
    /// `range` of chunk `i` of `image` (the whole chunk when None) into `buf` (resized to it);
    /// `NotStaged` for a range beyond the chunk.
    pub fn chunk_for_peer(
        &self,
        image: u32,
        i: usize,
        range: Option<std::ops::Range<u64>>,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<ForPeer> {
        let Some(Some(img)) = self.images.get(image as usize) else {
            return Ok(ForPeer::NotStaged);
        };
        if i >= img.chunks.len() {
            return Ok(ForPeer::NotStaged);
        }
        let len = img.chunk_len(i);
        let range = range.unwrap_or(0..len);
        if range.end > len || range.start >= range.end {
            return Ok(ForPeer::NotStaged);
        }
        buf.resize((range.end - range.start) as usize, 0);
        let before = img.word(i);
        let record = img.chunks[i].sum.load(Ordering::SeqCst);
        match state(before) {
            VERIFIED => Ok(match self.read(image, i, range.start, buf, Wait::May)? {
                true => ForPeer::Checked { record },
                false => ForPeer::NotStaged,
            }),
            PRESENT => Ok(
                match self.read_checked(img, i, before, range.start, buf, Wait::May)? {
                    Checked::Matched => {
                        if img.swap(i, before, with_state(before, VERIFIED)) {
                            self.verified_chunks.fetch_add(1, Ordering::Relaxed);
                        }
                        ForPeer::Checked { record }
                    }
                    Checked::Changed => ForPeer::NotStaged,
                    Checked::Failed => ForPeer::Damaged,
                },
            ),
            _ => Ok(ForPeer::NotStaged),
        }
    }
}
