//! The bytes the tar walk reads: a plain tar through a window of positioned reads whose size
//! follows the gaps between headers (`Window`), or the decoded stream of a `.tar.gz`, inflated
//! forward as the walk asks and dropped behind it (`Decoded`).

use std::io;

use crate::archive::framed::BlockIndexer;
use crate::archive::inflate::{Indexer, InflateError};
use crate::source::read_at::ReadAt;

/// While members are small, headers are read through windows this large, so a run of small
/// members costs one read (and the data read along with them is cheaper than more system calls).
const WIDE_WINDOW: usize = 256 * 1024;
/// While members are large, each header is read alone, with room for extension records; the data
/// between headers is skipped.
const NARROW_WINDOW: usize = 4 * 1024;
/// Headers closer together than this on average count as small members.
const SMALL_GAP: u64 = 16 * 1024;
/// The bytes the scanner walks: an uncompressed tar file, or the decoded stream of a `.tar.gz`.
pub(super) trait Stream {
    /// `len` bytes at `offset`; the caller has checked with `len_upto` that they exist.
    fn read(&mut self, offset: u64, len: usize) -> io::Result<&[u8]>;
    /// The stream's length if it is less than `limit`, else `limit` (a compressed stream is
    /// decoded that far).
    fn len_upto(&mut self, limit: u64) -> io::Result<u64>;
    /// Bytes before `offset` will not be read again.
    fn forget_before(&mut self, _offset: u64) {}
    /// Records the distance from one header to the next.
    fn note_gap(&mut self, _gap: u64) {}
    /// What the offsets count, for messages.
    fn what(&self) -> &'static str {
        "the file"
    }
}

/// Positioned reads through a buffer whose size follows the gaps between headers.
pub(super) struct Window<'a> {
    file: &'a dyn ReadAt,
    len: u64,
    buf: Vec<u8>,
    start: u64,
    /// Running mean of the distance between consecutive headers.
    mean_gap: u64,
}

impl<'a> Window<'a> {
    pub(super) fn new(file: &'a dyn ReadAt, len: u64) -> Self {
        Window {
            file,
            len,
            buf: Vec::with_capacity(WIDE_WINDOW),
            start: 0,
            mean_gap: 0,
        }
    }
}

impl Stream for Window<'_> {
    fn note_gap(&mut self, gap: u64) {
        self.mean_gap = (self.mean_gap * 7 + gap) / 8;
    }

    fn len_upto(&mut self, limit: u64) -> io::Result<u64> {
        Ok(self.len.min(limit))
    }

    fn read(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
        let end = offset + len as u64;
        let cached_end = self.start + self.buf.len() as u64;
        if offset < self.start || end > cached_end {
            let window = if self.mean_gap <= SMALL_GAP {
                WIDE_WINDOW
            } else {
                NARROW_WINDOW
            };
            let want = len.max(window).min((self.len - offset) as usize);
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, offset)?;
            self.start = offset;
        }
        let at = (offset - self.start) as usize;
        Ok(&self.buf[at..at + len])
    }
}

/// The decoded stream of a `.tar.gz`, inflated forward as the walk asks; bytes behind the
/// walk's mark are dropped, so a scan holds about one member's headers, never the tar.
pub(super) struct Decoded<C> {
    pub(super) indexer: C,
    /// Decoded bytes `start..start + buf.len()`; the end is always what has been decoded.
    buf: Vec<u8>,
    start: u64,
    mark: u64,
    ended: bool,
    /// The stream's own failure (the walk sees it as an I/O error and stops).
    pub(super) failed: Option<InflateError>,
}

/// A decoder that gives a compressed stream's decoded bytes in chunks, in order, then an empty
/// chunk at its end.
pub(super) trait Chunks {
    fn next_chunk(&mut self) -> Result<&[u8], InflateError>;
}

impl Chunks for Indexer<'_> {
    fn next_chunk(&mut self) -> Result<&[u8], InflateError> {
        Indexer::next_chunk(self)
    }
}

impl Chunks for BlockIndexer<'_> {
    fn next_chunk(&mut self) -> Result<&[u8], InflateError> {
        BlockIndexer::next_chunk(self)
    }
}

/// Room the decoded-stream buffer keeps between pieces.
const KEEP: usize = 4 << 20;

impl<C: Chunks> Decoded<C> {
    pub(super) fn new(indexer: C) -> Decoded<C> {
        Decoded {
            indexer,
            buf: Vec::new(),
            start: 0,
            mark: 0,
            ended: false,
            failed: None,
        }
    }

    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    fn ensure(&mut self, limit: u64) -> io::Result<()> {
        while self.end() < limit && !self.ended {
            let behind = (self.mark.saturating_sub(self.start) as usize).min(self.buf.len());
            if behind > 0 {
                self.buf.drain(..behind);
                self.start += behind as u64;
                // A whole decoded piece (up to a unit) was copied for one header: its room goes
                // back before the next piece is decoded, not kept for the rest of the scan.
                if self.buf.capacity() > KEEP && self.buf.len() < KEEP / 2 {
                    self.buf.shrink_to(KEEP / 2);
                }
            }
            let end = self.end();
            let chunk = match self.indexer.next_chunk() {
                Ok(chunk) => chunk,
                Err(e) => {
                    let error = io::Error::new(io::ErrorKind::InvalidData, e.to_string());
                    self.failed = Some(e);
                    return Err(error);
                }
            };
            if chunk.is_empty() {
                self.ended = true;
            } else if self.mark <= end {
                self.buf.extend_from_slice(chunk);
            } else {
                // All of the buffer is behind the mark, and maybe some of the chunk.
                let skip = ((self.mark - end) as usize).min(chunk.len());
                self.buf.clear();
                self.buf.extend_from_slice(&chunk[skip..]);
                self.start = end + skip as u64;
            }
        }
        Ok(())
    }
}

impl<C: Chunks> Stream for Decoded<C> {
    fn read(&mut self, offset: u64, len: usize) -> io::Result<&[u8]> {
        let end = offset + len as u64;
        self.ensure(end)?;
        if offset < self.start || end > self.end() {
            return Err(io::Error::other(format!(
                "decoded bytes {offset}..{end} are no longer (or not) held"
            )));
        }
        let at = (offset - self.start) as usize;
        Ok(&self.buf[at..at + len])
    }

    fn len_upto(&mut self, limit: u64) -> io::Result<u64> {
        self.ensure(limit)?;
        Ok(self.end().min(limit))
    }

    fn forget_before(&mut self, offset: u64) {
        self.mark = self.mark.max(offset);
    }

    fn what(&self) -> &'static str {
        "the decompressed tar"
    }
}
