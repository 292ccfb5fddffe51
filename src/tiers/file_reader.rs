//! Executing a read plan: each piece of a file's byte range comes from where the format's planner
//! says (`archive::layout`), fetched through the image tiers. Stored bytes are read into the
//! caller's buffer; decoded units are decoded once into the RAM tier and copied out of it, or
//! shared without a copy when one unit covers the whole read.

use std::io;
use std::ops::Range;
use std::sync::Arc;

use super::images::{Fetch, Images};
use super::ram_cache::Decoded;
use crate::archive::layout::{Layout, Piece, Unit};
use crate::read_at::ReadAt;

/// A failed read: the image offset it failed at (for the log) and why.
#[derive(Debug)]
pub struct ReadError {
    pub image_offset: u64,
    pub error: io::Error,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at image offset {}: {}", self.image_offset, self.error)
    }
}

fn failed(image_offset: u64) -> impl FnOnce(io::Error) -> ReadError {
    move |error| ReadError {
        image_offset,
        error,
    }
}

/// The bytes of a read: a slice of a decoded unit, or the caller's buffer.
pub enum Served<'b> {
    Shared(Decoded, Range<usize>),
    Buffer(&'b [u8]),
}

impl Served<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Served::Shared(block, range) => &block[range.clone()],
            Served::Buffer(b) => b,
        }
    }
}

pub struct FileReader {
    images: Arc<Images>,
}

/// One image seen through the tiers, exactly as asked: what a unit decodes from.
struct ImageBytes<'a> {
    images: &'a Images,
    image: u32,
}

impl ReadAt for ImageBytes<'_> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let size = self.images.image_size(self.image);
        let n = (size.saturating_sub(offset)).min(buf.len() as u64) as usize;
        self.images
            .read_exact_at(self.image, offset, &mut buf[..n], Fetch::Exact)?;
        Ok(n)
    }
}

impl FileReader {
    pub fn new(images: Arc<Images>) -> FileReader {
        FileReader { images }
    }

    pub fn images(&self) -> &Images {
        &self.images
    }

    /// Reads `len` bytes at `offset` of a file of `size` bytes laid out as `layout` in `image`
    /// (the range lies inside the file).
    pub fn read<'b>(
        &self,
        image: u32,
        layout: Layout,
        size: u64,
        offset: u64,
        len: usize,
        buf: &'b mut Vec<u8>,
    ) -> Result<Served<'b>, ReadError> {
        buf.clear();
        for piece in layout.plan(size, offset, len) {
            let piece = piece.map_err(|e| ReadError {
                image_offset: e.at,
                error: io::Error::new(io::ErrorKind::InvalidData, e.why),
            })?;
            match piece {
                Piece::Decoded { unit, from, len: n } => {
                    let block = self.decode(image, unit)?;
                    if block.get(from..from + n).is_none() {
                        return Err(ReadError {
                            image_offset: unit.at,
                            error: io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!(
                                    "the plan wants bytes {from}..{} of a unit of {} bytes",
                                    from + n,
                                    block.len()
                                ),
                            ),
                        });
                    }
                    // The whole read inside one decoded unit: no copy.
                    if buf.is_empty() && n == len {
                        return Ok(Served::Shared(block, from..from + n));
                    }
                    buf.extend_from_slice(&block[from..from + n]);
                }
                Piece::Zeros(n) => buf.resize(buf.len() + n, 0),
                Piece::Stored { at, len: n } => {
                    let filled = buf.len();
                    buf.resize(filled + n, 0);
                    self.images
                        .read_exact_at(image, at, &mut buf[filled..], Fetch::Chunks)
                        .map_err(failed(at))?;
                }
            }
        }
        Ok(Served::Buffer(&buf[..]))
    }

    /// A unit's decoded bytes, decoded once per cache lifetime.
    fn decode(&self, image: u32, unit: Unit) -> Result<Decoded, ReadError> {
        let images = &*self.images;
        images
            .ram()
            .get_or_load(image, unit.key(), || {
                unit.decode(&ImageBytes { images, image })
            })
            .map_err(failed(unit.at))
    }
}
