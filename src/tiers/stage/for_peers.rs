//! What a node's stage gives other nodes of its job (`peers`): whole chunks, checked here as a
//! local read checks them, with the xxh3 the stager recorded when it copied them from the
//! source, for the asking node to check again on arrival.

use std::sync::atomic::Ordering;

use super::Stage;
use crate::source::read_at::Wait;

impl Stage {
    /// Chunks of `image` in its staged copy; None when this stage does not keep the image.
    pub fn chunk_count(&self, image: u32) -> Option<usize> {
        match self.images.get(image as usize) {
            Some(Some(img)) => Some(img.chunks.len()),
            _ => None,
        }
    }

    /// Chunk `i` of `image` into `buf` (resized to it), and its recorded xxh3; None when it is
    /// not staged here (another node's share, not copied yet, dropped after a failed check).
    pub fn chunk_for_peer(
        &self,
        image: u32,
        i: usize,
        buf: &mut Vec<u8>,
    ) -> std::io::Result<Option<u64>> {
        let Some(Some(img)) = self.images.get(image as usize) else {
            return Ok(None);
        };
        if i >= img.chunks.len() {
            return Ok(None);
        }
        buf.resize(img.chunk_len(i) as usize, 0);
        if !self.read(image, i, 0, buf, Wait::May)? {
            return Ok(None);
        }
        // Recopied between the read and here, the record is of the same source bytes.
        Ok(Some(img.chunks[i].sum.load(Ordering::SeqCst)))
    }
}
