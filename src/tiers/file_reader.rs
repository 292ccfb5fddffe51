//! Serving a byte range of a catalog file, whatever its encoding: stored bytes come from the image
//! tiers (staged copy, RAM chunks, source), deflated zip members and compressed squashfs blocks
//! are decoded once into the RAM tier and copied out of it.

use std::cell::RefCell;
use std::io;
use std::ops::Range;
use std::sync::Arc;

use super::images::{Fetch, Images};
use super::ram_cache::Decoded;
use super::{DEFAULT_CHUNK, Source, inflate};
use crate::archive::Encoding;
use crate::archive::squashfs::block_map::{BlockMap, Extent};
use crate::catalog::{Catalog, Entry};

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

fn invalid(image_offset: u64, why: String) -> ReadError {
    ReadError {
        image_offset,
        error: io::Error::new(io::ErrorKind::InvalidData, why),
    }
}

/// The bytes of a read: a slice of a decoded block, or the caller's buffer.
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

/// Where the bytes at one position of a squashfs file come from, up to the end of its block.
enum Piece {
    Zeros(usize),
    Stored {
        at: u64,
        len: usize,
    },
    Decoded {
        block: Decoded,
        from: usize,
        len: usize,
    },
}

pub struct FileReader {
    images: Arc<Images>,
}

thread_local! {
    /// Compressed bytes of the block being decoded on this thread.
    static PACKED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl FileReader {
    pub fn new(images: Arc<Images>) -> FileReader {
        FileReader { images }
    }

    /// A reader straight from the source, with `cache_budget` bytes of RAM (for commands that read
    /// a few files once).
    pub fn direct(source: Arc<Source>, cache_budget: u64) -> FileReader {
        FileReader::new(Arc::new(Images::new(
            source,
            cache_budget,
            DEFAULT_CHUNK,
            false,
            None,
        )))
    }

    pub fn source(&self) -> &Source {
        self.images.source()
    }

    /// Reads `len` bytes at `offset` of the file `entry` (the range lies inside the file).
    pub fn read<'b>(
        &self,
        catalog: &Catalog,
        entry: &Entry,
        offset: u64,
        len: usize,
        buf: &'b mut Vec<u8>,
    ) -> Result<Served<'b>, ReadError> {
        match entry.encoding() {
            Encoding::Stored => {
                buf.resize(len, 0);
                let at = entry.offset + offset;
                self.images
                    .read_exact_at(entry.image, at, &mut buf[..len], Fetch::Chunks)
                    .map_err(failed(at))?;
                Ok(Served::Buffer(&buf[..len]))
            }
            Encoding::Deflate => {
                let (image, at, size) = (entry.image, entry.offset, entry.size);
                let member = self
                    .images
                    .ram()
                    .get_or_load(image, at, || inflate(&self.images, image, at, size))
                    .map_err(failed(at))?;
                let start = offset as usize;
                Ok(Served::Shared(member, start..start + len))
            }
            Encoding::Squashfs => {
                let record = catalog.block_map(entry).map_err(|e| {
                    invalid(0, format!("the catalog's block map is unreadable: {e}"))
                })?;
                let map = BlockMap::decode(record)
                    .map_err(|e| invalid(0, format!("the catalog's block map is invalid: {e}")))?;
                self.read_squashfs(entry.image, &map, entry.size, offset, len, buf)
            }
        }
    }

    fn read_squashfs<'b>(
        &self,
        image: u32,
        map: &BlockMap,
        file_size: u64,
        offset: u64,
        len: usize,
        buf: &'b mut Vec<u8>,
    ) -> Result<Served<'b>, ReadError> {
        let end = offset + len as u64;
        buf.clear();
        let mut pos = offset;
        while pos < end {
            let want = (end - pos) as usize;
            let n = match self.piece(image, map, file_size, pos)? {
                // The whole read inside one decoded block: no copy.
                Piece::Decoded { block, from, len } if buf.is_empty() && len >= want => {
                    return Ok(Served::Shared(block, from..from + want));
                }
                Piece::Decoded { block, from, len } => {
                    let n = len.min(want);
                    buf.extend_from_slice(&block[from..from + n]);
                    n
                }
                Piece::Zeros(len) => {
                    let n = len.min(want);
                    buf.resize(buf.len() + n, 0);
                    n
                }
                Piece::Stored { at, len } => {
                    let (n, filled) = (len.min(want), buf.len());
                    buf.resize(filled + n, 0);
                    self.images
                        .read_exact_at(image, at, &mut buf[filled..], Fetch::Chunks)
                        .map_err(failed(at))?;
                    n
                }
            };
            pos += n as u64;
        }
        Ok(Served::Buffer(&buf[..]))
    }

    /// The bytes of the file from `pos` to the end of the block holding `pos`.
    fn piece(
        &self,
        image: u32,
        map: &BlockMap,
        file_size: u64,
        pos: u64,
    ) -> Result<Piece, ReadError> {
        let bs = map.block_size();
        let i = (pos / bs) as usize;
        let within = pos % bs;
        if i < map.count {
            let block_len = map.decoded_len(file_size, i);
            let rest = (block_len - within) as usize;
            let extent = map.block(i);
            if extent.is_sparse() {
                return Ok(Piece::Zeros(rest));
            }
            if extent.is_stored() {
                if extent.disk_len() as u64 != block_len {
                    return Err(invalid(
                        extent.start,
                        format!(
                            "stored block of {} bytes, expected {block_len}",
                            extent.disk_len()
                        ),
                    ));
                }
                return Ok(Piece::Stored {
                    at: extent.start + within,
                    len: rest,
                });
            }
            let block = self.decode(image, map, extent, block_len as usize)?;
            if block.len() as u64 != block_len {
                return Err(invalid(
                    extent.start,
                    format!(
                        "{} block decodes to {} bytes, expected {block_len}",
                        map.codec.name(),
                        block.len()
                    ),
                ));
            }
            return Ok(Piece::Decoded {
                block,
                from: within as usize,
                len: rest,
            });
        }
        let tail = map
            .tail
            .ok_or_else(|| invalid(0, format!("offset {pos} is past the file's blocks")))?;
        let tail_len = file_size - map.count as u64 * bs;
        let rest = (tail_len - within) as usize;
        let from = tail.offset as u64 + within;
        if tail.block.is_stored() {
            return Ok(Piece::Stored {
                at: tail.block.start + from,
                len: rest,
            });
        }
        let block = self.decode(image, map, tail.block, bs as usize)?;
        if (block.len() as u64) < tail.offset as u64 + tail_len {
            return Err(invalid(
                tail.block.start,
                format!(
                    "{} fragment block decodes to {} bytes, too short for a tail of {tail_len} \
                     bytes at {}",
                    map.codec.name(),
                    block.len(),
                    tail.offset
                ),
            ));
        }
        Ok(Piece::Decoded {
            block,
            from: from as usize,
            len: rest,
        })
    }

    /// A compressed block, decoded (once per cache lifetime) into at most `limit` bytes.
    fn decode(
        &self,
        image: u32,
        map: &BlockMap,
        extent: Extent,
        limit: usize,
    ) -> Result<Decoded, ReadError> {
        let images = &self.images;
        images
            .ram()
            .get_or_load(image, extent.start, || {
                PACKED.with_borrow_mut(|packed| {
                    packed.resize(extent.disk_len() as usize, 0);
                    images.read_exact_at(image, extent.start, packed, Fetch::Exact)?;
                    let mut out = Vec::new();
                    map.codec
                        .decompress(packed, limit, &mut out)
                        .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
                    Ok(out)
                })
            })
            .map_err(failed(extent.start))
    }
}
