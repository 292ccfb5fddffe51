//! Where a byte range of an image is now, and how to get it: the one answer that the reads
//! (`Images::read_exact_at`), the splice path (`Images::file_range`) and the lookahead
//! (`Images::ahead_class`) act on. The tier order is written here once: the lookahead's window,
//! then the stage and the RAM tier chunk by chunk, then the source (exactly, or spliced from a
//! plain file).

use super::chunks::Fetch;
use super::images::Images;
pub use super::located::{At, Located};
use super::ram_cache::CHUNK_TAG;
use super::request::Asker;

impl Images {
    /// Where `len` bytes at `offset` of `image` are now, for `asker`, whose read wants `fetch`.
    /// The window is asked for a reader only: the lookahead never fetches what it holds or
    /// fetches (`Window::begin` refuses an overlap), and a read asks it by serving from it
    /// (`read_exact_at`: one lock, not two).
    pub fn locate(
        &self,
        asker: Asker<'_>,
        image: u32,
        offset: u64,
        len: u64,
        fetch: Fetch,
    ) -> Located {
        let (image, offset) = self.source().resolve(image, offset);
        let reader = matches!(asker, Asker::Reader(_));
        if reader && self.window().holds(image, offset, len) {
            return Located {
                image,
                offset,
                len,
                at: At::Window,
            };
        }
        self.locate_stored(asker, image, offset, len, fetch)
    }

    /// `locate` past the window, for the outermost `image`: the stage, the RAM tier or the
    /// source. A reader's plan notes its read (a walk in order is found from them): asked once
    /// per read.
    pub(super) fn locate_stored(
        &self,
        asker: Asker<'_>,
        image: u32,
        offset: u64,
        len: u64,
        fetch: Fetch,
    ) -> Located {
        let req = match asker {
            Asker::Reader(req) => Some(req),
            Asker::Lookahead => None,
        };
        let located = |at| Located {
            image,
            offset,
            len,
            at,
        };
        if req.is_none() && self.resident(image, offset, len) {
            return located(At::Resident);
        }
        let plan = self.chunks().plan(req, image, (offset, len), fetch);
        match plan.straight_to_source() {
            true => located(At::Source {
                file: self.source().file_descriptor(image).is_some(),
            }),
            false => located(At::Chunks(plan)),
        }
    }

    /// Whether every chunk of `len` bytes at `offset` of the outermost `image` is staged or in
    /// the RAM tier.
    fn resident(&self, image: u32, offset: u64, len: u64) -> bool {
        let size = self.chunks().chunk_size();
        let (first, last) = (offset / size, (offset + len.max(1) - 1) / size);
        (first..=last).all(|i| {
            self.stage().is_some_and(|s| s.holds(image, i as usize))
                || self.ram().contains(image, CHUNK_TAG | (i * size))
        })
    }

    /// Whether reads of `image` may ever be spliced from its file: it lies in a plain file on a
    /// local disk (itself or the image around it), and no stage keeps it (staged chunks are read
    /// from the stage). The one place that decides; a read is spliced when it is located at
    /// `At::Source` with a file.
    pub fn may_splice(&self, image: u32) -> bool {
        let (image, _) = self.source().resolve(image, 0);
        self.source().file_descriptor(image).is_some()
            && !self.stage().is_some_and(|s| s.keeps(image))
    }
}
