//! Compressed streams made of pieces that decode on their own: zstd frames, xz blocks and bzip2
//! blocks. A stream of many pieces serves any byte by decoding the one piece that holds it. The
//! scan decodes every piece once, in order, to give the tar walk its bytes (each piece checked as
//! its format checks it), and records where each starts in the image and in the decoded stream.
//! The table goes into the catalog as a checkpoint table of a frame kind (`inflate::table`), and a
//! read decodes one piece as a `plan::Unit` block through `codec`.
//!
//! A piece must decode to at most `plan::MAX_UNIT` bytes: one read may make the daemon decode and
//! hold a whole piece. A stream written as one piece larger than that (`zstd`'s and single-threaded
//! `xz`'s default for a large input) is refused with the commands that serve it: decompress it
//! once, or write it again in pieces. bzip2 blocks are never that large (900 kB before its first
//! run-length stage, at most 46 MB after).

pub mod bzip2;
pub mod xz;
pub mod zstd;

use std::collections::VecDeque;
use std::io;

use rayon::prelude::*;

use crate::archive::codec::Codec;
use crate::archive::inflate::InflateError;
use crate::archive::inflate::table::{self, FrameEntry};
use crate::archive::plan::MAX_UNIT;
use crate::archive::spill::{TableFile, TableRef, Windows};
use crate::source::read_at::ReadAt;

/// A stream walked to its end.
#[derive(Debug)]
pub struct Finished {
    pub table: TableRef,
    pub total: u64,
    pub frames: usize,
}

/// Appends the frame table of a stream of `total` decoded bytes to `tables`.
fn finish(
    tables: &mut TableFile,
    total: u64,
    frames: &[FrameEntry],
) -> Result<Finished, InflateError> {
    let mut head = Vec::new();
    table::encode_frames(total, frames, &mut head);
    let table = tables.append(&head, Windows::new())?;
    Ok(Finished {
        table,
        total,
        frames: frames.len(),
    })
}

/// Makes the frames of a stream of `total` decoded bytes, written by packfs itself (`packfs pack
/// --compress`), the table `image`'s members are read through, as a scan would have.
pub fn attach(
    image: &mut crate::archive::ScannedImage,
    total: u64,
    frames: &[FrameEntry],
) -> std::io::Result<()> {
    let done = finish(image.tables()?, total, frames).map_err(|e| match e {
        InflateError::Io(e) => e,
        InflateError::Bad { why, .. } => std::io::Error::other(why),
    })?;
    image.stream = Some(done.table);
    Ok(())
}

/// Decoded bytes handed to the walk per `next_chunk` at most.
const SLICE: usize = 1 << 20;

/// The file is read in pieces this large while walking it for pieces.
const CHUNK: usize = 4 << 20;

/// A file through a window of large reads, for the pre-scans that walk it in order (zstd frame
/// headers, bzip2 magics).
pub(super) struct Chunked<'r> {
    image: &'r dyn ReadAt,
    pub(super) len: u64,
    buf: Vec<u8>,
    buf_at: u64,
}

impl<'r> Chunked<'r> {
    pub(super) fn new(image: &'r dyn ReadAt, len: u64) -> Chunked<'r> {
        Chunked {
            image,
            len,
            buf: Vec::new(),
            buf_at: 0,
        }
    }

    /// `n` bytes at `at` (`UnexpectedEof` past the end of the file).
    pub(super) fn bytes(&mut self, at: u64, n: usize) -> io::Result<&[u8]> {
        let end = at + n as u64;
        if end > self.len {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if at < self.buf_at || end > self.buf_at + self.buf.len() as u64 {
            let want = (self.len - at).min(CHUNK.max(n) as u64) as usize;
            self.buf.resize(want, 0);
            self.image.read_exact_at(&mut self.buf, at)?;
            self.buf_at = at;
        }
        let from = (at - self.buf_at) as usize;
        Ok(&self.buf[from..from + n])
    }

    /// The byte at `i` (0 past the end of the file, where a bit scan may look).
    pub(super) fn byte(&mut self, i: u64) -> io::Result<u8> {
        match i < self.len {
            true => Ok(self.bytes(i, 1)?[0]),
            false => Ok(0),
        }
    }
}

/// Decoded bytes a batch of pieces may hold at most (one piece is always taken, up to a unit),
/// and the most pieces in a batch. A piece that does not declare its size (a bzip2 block) counts
/// as its limit, `undeclared_limit`: a 2.5 KB `bzip2 -9` of zeros holds blocks of 46 MB each,
/// and 64 of them decoded at once took the scan to 4.25 GB.
const BATCH_BYTES: u64 = 32 << 20;
const BATCH_PIECES: usize = 64;

/// What a piece of undeclared size may decode to in a batch of several: the batch's bytes
/// shared by the threads (at least 4 MiB, more than a bzip2 block of ordinary data decodes to).
/// One that decodes to more is decoded again alone, up to a unit.
fn undeclared_limit(threads: usize) -> usize {
    (BATCH_BYTES as usize / threads.max(1)).clamp(4 << 20, MAX_UNIT)
}

/// One piece, found before it is decoded: its compressed bytes, its codec, and its decoded size
/// when the format declares it (xz's index does; bzip2 says nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub in_at: u64,
    pub in_len: u64,
    pub size: Option<u64>,
    pub codec: Codec,
}

/// Decodes a stream's pieces, found beforehand, in order for the tar walk, several at a time on
/// rayon's threads: the scan of a `.tar.bz2` or `.tar.xz` runs at the decoders' speed times the
/// cores, not one decoder's.
pub struct BlockIndexer<'r> {
    image: &'r dyn ReadAt,
    blocks: Vec<Block>,
    /// The first block not yet decoded, and the first not yet handed to the walk.
    next: usize,
    handed: usize,
    /// Decoded pieces waiting for the walk, in order (blocks `handed..next`).
    ready: VecDeque<Vec<u8>>,
    /// The failure of the block at `next`, given once the pieces before it are handed out.
    failed: Option<InflateError>,
    /// Set when the block at `next` decoded to more than its share of a batch: the next batch is
    /// that block alone.
    alone: bool,
    current: Vec<u8>,
    /// Bytes of `current` handed out so far.
    served: usize,
    frames: Vec<FrameEntry>,
    total: u64,
    threads: usize,
}

#[cfg(test)]
impl BlockIndexer<'_> {
    /// Every decoded byte, in order (the pieces' tests).
    pub(crate) fn decode_all(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let chunk = self.next_chunk().unwrap();
            if chunk.is_empty() {
                return out;
            }
            out.extend_from_slice(chunk);
        }
    }
}

impl<'r> BlockIndexer<'r> {
    pub fn new(image: &'r dyn ReadAt, blocks: Vec<Block>) -> BlockIndexer<'r> {
        let threads = rayon::current_num_threads();
        BlockIndexer {
            image,
            blocks,
            next: 0,
            handed: 0,
            ready: VecDeque::new(),
            failed: None,
            alone: false,
            current: Vec::new(),
            served: 0,
            frames: Vec::new(),
            total: 0,
            threads,
        }
    }

    /// The next piece's decoded bytes; empty at the end of the stream.
    pub fn next_chunk(&mut self) -> Result<&[u8], InflateError> {
        // A piece is handed out a slice at a time: the walk copies what it is given, and a
        // whole piece copied held a unit twice (128 MiB for 64 MiB frames).
        if self.served < self.current.len() {
            let from = self.served;
            self.served = (from + SLICE).min(self.current.len());
            return Ok(&self.current[from..self.served]);
        }
        // The walk is done with the last piece: its room goes before the next is decoded.
        self.current = Vec::new();
        self.served = 0;
        loop {
            let Some(decoded) = self.ready.pop_front() else {
                if let Some(e) = self.failed.take() {
                    return Err(e);
                }
                if self.next >= self.blocks.len() {
                    return Ok(&[]);
                }
                self.decode_batch();
                continue;
            };
            let block = self.blocks[self.handed];
            self.handed += 1;
            if !decoded.is_empty() {
                self.frames.push(FrameEntry {
                    in_at: block.in_at,
                    in_len: block.in_len,
                    out_at: self.total,
                    codec: block.codec,
                });
                self.total += decoded.len() as u64;
                self.current = decoded;
                self.served = self.current.len().min(SLICE);
                return Ok(&self.current[..self.served]);
            }
        }
    }

    /// Decodes the next pieces on rayon's threads into `ready`: at least one per thread, and
    /// small ones by the dozen (`BATCH_BYTES`), so that 256 KiB frames cost no hand-off each. The
    /// first failure (in stream order) is the stream's, unless it is a bzip2 block cut short by a
    /// chance magic, which is then joined with the next piece and tried again.
    fn decode_batch(&mut self) {
        let shared = undeclared_limit(self.threads);
        let mut end = self.next;
        let mut bytes = 0u64;
        while end < self.blocks.len() && end - self.next < BATCH_PIECES {
            let b = &self.blocks[end];
            let counted = b.size.unwrap_or(shared as u64);
            if end > self.next && (self.alone || bytes + counted > BATCH_BYTES) {
                break;
            }
            bytes += counted;
            end += 1;
        }
        self.alone = false;
        let batch = &self.blocks[self.next..end];
        // A piece alone may decode to a whole unit; in company, to its share.
        let limit = if batch.len() == 1 { MAX_UNIT } else { shared };
        let image = self.image;
        let results: Vec<Result<Vec<u8>, InflateError>> =
            batch.par_iter().map(|b| decode(image, b, limit)).collect();
        let several = batch.len() > 1;
        for (j, r) in results.into_iter().enumerate() {
            let undeclared = self.blocks[self.next + j].size.is_none();
            match r {
                Ok(out) => self.ready.push_back(out),
                Err(_) if several && undeclared => {
                    // Over its share (or corrupt, which it will say alone).
                    self.next += j;
                    self.alone = true;
                    return;
                }
                Err(_) if self.join_with_next(self.next + j) => {
                    self.next += j;
                    return;
                }
                Err(e) => {
                    self.failed = Some(e);
                    self.next = self.blocks.len();
                    return;
                }
            }
        }
        self.next = end;
    }

    /// Joins bzip2 block `i` with the block after it, when they are adjacent and the two are no
    /// longer than one block can be; whether it did.
    fn join_with_next(&mut self, i: usize) -> bool {
        let (Some(a), Some(b)) = (self.blocks.get(i), self.blocks.get(i + 1)) else {
            return false;
        };
        let (
            Codec::Bzip2Block {
                shift,
                unused: a_unused,
                level,
            },
            Codec::Bzip2Block {
                shift: b_shift,
                unused,
                ..
            },
        ) = (a.codec, b.codec)
        else {
            return false;
        };
        let a_end = (a.in_at + a.in_len) * 8 - a_unused as u64;
        let in_len = b.in_at + b.in_len - a.in_at;
        if a_end != b.in_at * 8 + b_shift as u64 || in_len > bzip2::MAX_PACKED {
            return false;
        }
        self.blocks[i] = Block {
            in_at: a.in_at,
            in_len,
            size: None,
            codec: Codec::Bzip2Block {
                shift,
                unused,
                level,
            },
        };
        self.blocks.remove(i + 1);
        true
    }

    /// Walks the rest of the stream and appends its frame table to `tables`.
    pub fn finish(mut self, tables: &mut TableFile) -> Result<Finished, InflateError> {
        while !self.next_chunk()?.is_empty() {}
        finish(tables, self.total, &self.frames)
    }
}

/// Reads and decodes one piece, as a read will; one that does not declare its size, to at most
/// `undeclared` bytes.
fn decode(image: &dyn ReadAt, b: &Block, undeclared: usize) -> Result<Vec<u8>, InflateError> {
    let bad = |why: String| InflateError::Bad { at: b.in_at, why };
    let what = b.codec.name();
    let piece = match b.codec {
        Codec::Zstd => "frame",
        _ => "block",
    };
    let in_len = usize::try_from(b.in_len)
        .ok()
        .filter(|&n| n <= MAX_UNIT)
        .ok_or_else(|| {
            bad(format!(
                "an {what} block of more than {} MiB",
                MAX_UNIT >> 20
            ))
        })?;
    let mut packed = vec![0u8; in_len];
    image.read_exact_at(&mut packed, b.in_at)?;
    let limit = b.size.map_or(undeclared.min(MAX_UNIT), |n| n as usize);
    let mut out = Vec::new();
    if b.codec == Codec::Zstd && b.size.is_none() {
        // A frame that does not declare its size: decoded as a stream, so one that decodes
        // to more than a unit is told from a corrupt one.
        return zstd::decode_undeclared(&packed, b.in_at, limit);
    }
    b.codec
        .decompress(&packed, limit, &mut out)
        .map_err(|e| bad(format!("the {what} {piece} is corrupt: {e}")))?;
    if b.size.is_some_and(|n| n != out.len() as u64) {
        return Err(bad(format!(
            "the {what} {piece} decodes to {} bytes, its header or index says {limit}",
            out.len()
        )));
    }
    Ok(out)
}
