//! `packfs pack --compress zstd[:LEVEL]`: shards written in the zstd seekable format. The tar is
//! cut into frames at member boundaries: a frame holds whole members up to the frame size, and a
//! member larger than that gets frames of its own. Each frame carries its decoded size and
//! checksum, and a seek table (a skippable frame listing every frame's sizes) ends the file. So
//! `zstd -d`, `tar --zstd -x` and webdataset read the shards as ordinary `.tar.zst`, and packfs
//! serves any member by decoding the frames that hold it; the index it writes records every frame
//! (`archive::framed`) without reading the shard again.
//!
//! Frames are compressed in parallel on the pack's reader pool, a run of them at a time, and
//! written in order.

use std::fs::File;
use std::io::{self, Write};

use rayon::prelude::*;

use crate::archive::codec::Codec;
use crate::archive::framed::zstd as zstd_frames;
use crate::archive::inflate::table::FrameEntry;

/// The shard suffix of compressed packs.
pub const SUFFIX: &str = ".tar.zst";
/// Decoded bytes per frame unless `--frame-size` says otherwise: a random read of one member
/// decodes about this much (and reads its compressed bytes), so it is a few samples, not
/// megabytes; larger frames compress a little better (see docs/benchmarks/compressed.md).
pub const DEFAULT_FRAME: usize = 256 << 10;
/// What `--compress zstd` means without a level: zstd's own default.
pub const DEFAULT_LEVEL: i32 = 3;
/// Frames compressed at once per shard.
const RUN: usize = 16;

/// How a pack compresses its shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    pub level: i32,
    /// Decoded bytes a frame is cut after (at the next member boundary).
    pub frame: usize,
}

impl Compression {
    /// From `zstd` or `zstd:LEVEL` (1 to 19, or 20 to 22 as zstd's `--ultra` levels).
    pub fn parse(value: &str, frame: usize) -> Result<Compression, String> {
        let level = match value.split_once(':') {
            None if value == "zstd" => DEFAULT_LEVEL,
            Some(("zstd", level)) => level
                .parse::<i32>()
                .ok()
                .filter(|l| (1..=22).contains(l))
                .ok_or_else(|| format!("{value:?}: a zstd level is a number from 1 to 22"))?,
            _ => {
                return Err(format!(
                    "{value:?}: packfs packs with zstd (`--compress zstd` or `zstd:LEVEL`); the \
                     shards are then `.tar.zst` in the seekable format"
                ));
            }
        };
        if !(4096..=crate::archive::plan::MAX_UNIT / 2).contains(&frame) {
            return Err(format!(
                "a frame size of {frame} bytes: give 4K to {} MiB",
                crate::archive::plan::MAX_UNIT >> 21
            ));
        }
        Ok(Compression { level, frame })
    }

    /// As the manifest records it.
    pub fn describe(&self) -> String {
        format!("zstd:{}", self.level)
    }
}

/// A shard's tar written as frames into `file`.
pub struct FramedOut<'a> {
    file: &'a File,
    how: Compression,
    pool: &'a rayon::ThreadPool,
    /// Tar bytes not yet cut into a frame.
    pending: Vec<u8>,
    /// Frames cut, waiting to be compressed and written.
    queue: Vec<Vec<u8>>,
    /// Compressed bytes written so far, and decoded bytes they hold.
    in_at: u64,
    out_at: u64,
    frames: Vec<FrameEntry>,
}

impl<'a> FramedOut<'a> {
    pub fn new(file: &'a File, how: Compression, pool: &'a rayon::ThreadPool) -> FramedOut<'a> {
        FramedOut {
            file,
            how,
            pool,
            pending: Vec::with_capacity(how.frame),
            queue: Vec::new(),
            in_at: 0,
            out_at: 0,
            frames: Vec::new(),
        }
    }

    /// A member of `len` bytes (header, data, padding) follows: the frame is cut before it
    /// unless it all fits.
    pub fn begin_member(&mut self, len: u64) -> io::Result<()> {
        if !self.pending.is_empty() && self.pending.len() as u64 + len > self.how.frame as u64 {
            self.cut(self.pending.len())?;
        }
        Ok(())
    }

    /// Tar bytes; a member longer than a frame is cut into frames of its own.
    pub fn write(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let room = self.how.frame - self.pending.len();
            let n = room.min(bytes.len());
            self.pending.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            if self.pending.len() == self.how.frame {
                self.cut(self.how.frame)?;
            }
        }
        Ok(())
    }

    /// Moves the first `n` pending bytes into a frame of their own.
    fn cut(&mut self, n: usize) -> io::Result<()> {
        let rest = self.pending.split_off(n);
        let frame = std::mem::replace(&mut self.pending, rest);
        self.pending.reserve(self.how.frame);
        self.queue.push(frame);
        if self.queue.len() >= RUN {
            self.drain()?;
        }
        Ok(())
    }

    /// Compresses the queued frames in parallel and writes them in order.
    fn drain(&mut self) -> io::Result<()> {
        let level = self.how.level;
        let packed: Vec<io::Result<Vec<u8>>> = self.pool.install(|| {
            self.queue
                .par_iter()
                .map(|frame| compress_frame(frame, level))
                .collect()
        });
        for (frame, packed) in self.queue.drain(..).zip(packed) {
            let packed = packed?;
            self.file.write_all(&packed)?;
            self.frames.push(FrameEntry {
                in_at: self.in_at,
                in_len: packed.len() as u64,
                out_at: self.out_at,
                codec: Codec::Zstd,
            });
            self.in_at += packed.len() as u64;
            self.out_at += frame.len() as u64;
        }
        Ok(())
    }

    /// Writes what is left (`end`, the tar's end blocks, in the last frame) and the seek table;
    /// returns the frames and the decoded length.
    pub fn finish(mut self, end: &[u8]) -> io::Result<(Vec<FrameEntry>, u64)> {
        self.pending.extend_from_slice(end);
        let n = self.pending.len();
        self.cut(n)?;
        self.drain()?;
        self.file
            .write_all(&seek_table(&self.frames, self.out_at))?;
        Ok((self.frames, self.out_at))
    }
}

/// One frame, with its decoded size and checksum in it (so a reader checks what it decodes).
fn compress_frame(frame: &[u8], level: i32) -> io::Result<Vec<u8>> {
    let mut c = zstd::bulk::Compressor::new(level)?;
    c.include_checksum(true)?;
    c.include_contentsize(true)?;
    c.compress(frame)
}

/// The seek table of `frames`, which end where the next begins and the last at `total`.
fn seek_table(frames: &[FrameEntry], total: u64) -> Vec<u8> {
    let sizes: Vec<(u64, u64)> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let next = frames.get(i + 1).map_or(total, |n| n.out_at);
            (f.in_len, next - f.out_at)
        })
        .collect();
    zstd_frames::seek_table(&sizes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn levels_and_frame_sizes_are_checked() {
        assert_eq!(
            Compression::parse("zstd", DEFAULT_FRAME).unwrap().level,
            DEFAULT_LEVEL
        );
        assert_eq!(Compression::parse("zstd:19", 1 << 20).unwrap().level, 19);
        assert!(Compression::parse("zstd:0", DEFAULT_FRAME).is_err());
        assert!(
            Compression::parse("xz", DEFAULT_FRAME)
                .unwrap_err()
                .contains("zstd")
        );
        assert!(Compression::parse("zstd", 100).is_err());
    }

    #[test]
    fn frames_are_cut_at_members_and_the_file_reads_as_one_stream() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let file = tempfile::tempfile().unwrap();
        let how = Compression::parse("zstd:1", 4096).unwrap();
        let mut out = FramedOut::new(&file, how, &pool);
        let mut plain = Vec::new();
        // Members of 1000 bytes (four fit a frame), then one of 10 000 (frames of its own).
        for (i, len) in [1000usize, 1000, 1000, 1000, 1000, 10_000, 1000]
            .iter()
            .enumerate()
        {
            let bytes = vec![b'a' + i as u8; *len];
            out.begin_member(*len as u64).unwrap();
            out.write(&bytes[..len / 2]).unwrap();
            out.write(&bytes[len / 2..]).unwrap();
            plain.extend_from_slice(&bytes);
        }
        let (frames, total) = out.finish(&[0; 1024]).unwrap();
        plain.extend_from_slice(&[0; 1024]);
        assert_eq!(total, plain.len() as u64);
        let starts: Vec<u64> = frames.iter().map(|f| f.out_at).collect();
        // The fifth member does not fit the first frame; the large one fills two frames and
        // leaves a rest that the last member and the end blocks join.
        assert_eq!(starts, [0, 4000, 5000, 9096, 13192]);
        use std::io::Seek;
        (&file).seek(io::SeekFrom::Start(0)).unwrap();
        let mut packed = Vec::new();
        (&file).read_to_end(&mut packed).unwrap();
        // zstd's own decoder reads it all, the seek table passed over.
        let decoded = zstd::stream::decode_all(&packed[..]).unwrap();
        assert!(decoded == plain);
        // The seek table's footer names the frame count.
        let n = packed.len();
        assert_eq!(&packed[n - 4..], &0x8F92_EAB1u32.to_le_bytes());
        assert_eq!(
            u32::from_le_bytes(packed[n - 9..n - 5].try_into().unwrap()),
            5
        );
    }
}
