//! A zstd stream indexed by frame: each frame of a zstd stream decodes on its own, so a stream of
//! many frames (pzstd's, the seekable format's, `packfs pack --compress zstd`'s, or frames
//! concatenated by hand) serves any byte by decoding the one frame that holds it. The scan walks
//! the frames once, in order, decoding each (its checksum checked when the frame has one) to give
//! the tar walk its bytes, and records where each frame starts in the image and in the decoded
//! stream. The table goes into the catalog as a checkpoint table of kind `FRAMES`
//! (`inflate::table`), and a read decodes one frame as a `plan::Unit` block.
//!
//! A frame must decode to at most `plan::MAX_UNIT` bytes: one read may make the daemon decode and
//! hold a whole frame. A stream written as one big frame (the zstd command's default for a large
//! input) is refused with the commands that serve it: decompress it once, or write it in frames.
//! Skippable frames (the seekable format's seek table among them) are passed over.

use std::io::Read;

use super::Finished;
use crate::archive::codec::Codec;
use crate::archive::inflate::InflateError;
use crate::archive::inflate::table::FrameEntry;
use crate::archive::plan::MAX_UNIT;
use crate::archive::spill::TableFile;
use crate::source::read_at::ReadAt;
use crate::util::le;

const MAGIC: u32 = 0xFD2F_B528;
/// Skippable frames: magic 0x184D2A50 to 0x184D2A5F, a 4-byte length, then that many bytes.
const SKIPPABLE: std::ops::RangeInclusive<u32> = 0x184D_2A50..=0x184D_2A5F;

/// Whether `head` starts a zstd frame (format detection).
pub fn is_zstd(head: &[u8]) -> bool {
    head.len() >= 4 && le::u32_at(head, 0) == MAGIC
}

/// Walks the frames of the stream in `image` (`len` bytes), decoding each in turn.
pub struct FrameIndexer<'r> {
    image: &'r dyn ReadAt,
    len: u64,
    /// Image offset of the next frame.
    in_pos: u64,
    total: u64,
    frames: Vec<FrameEntry>,
    /// The frame being read, then its decoded bytes.
    packed: Vec<u8>,
    decoded: Vec<u8>,
    done: bool,
}

impl<'r> FrameIndexer<'r> {
    pub fn new(image: &'r dyn ReadAt, len: u64) -> FrameIndexer<'r> {
        FrameIndexer {
            image,
            len,
            in_pos: 0,
            total: 0,
            frames: Vec::new(),
            packed: Vec::new(),
            decoded: Vec::new(),
            done: false,
        }
    }

    fn bad(&self, at: u64, why: impl Into<String>) -> InflateError {
        InflateError::Bad {
            at,
            why: why.into(),
        }
    }

    /// `n` bytes at `at` of the image, appended to `packed`; a frame that runs past the end of the
    /// image is cut short.
    fn take(&mut self, at: u64, n: usize, frame: u64) -> Result<(), InflateError> {
        if at.checked_add(n as u64).is_none_or(|end| end > self.len) {
            return Err(self.bad(
                frame,
                "the zstd frame is cut short (the file ends inside it)",
            ));
        }
        let from = self.packed.len();
        if from + n > MAX_UNIT {
            return Err(self.too_big(frame));
        }
        self.packed.resize(from + n, 0);
        self.image.read_exact_at(&mut self.packed[from..], at)?;
        Ok(())
    }

    fn too_big(&self, frame: u64) -> InflateError {
        self.bad(
            frame,
            format!(
                "a zstd frame larger than {} MiB: packfs serves zstd streams written in frames \
                 (pzstd, the seekable format, `packfs pack --compress zstd`), one frame decoded \
                 per read; decompress this one once (`zstd -d`) and give the .tar, or write it \
                 again in frames (`zstd -dc FILE | pzstd -p 8 -o FILE.zst`)",
                MAX_UNIT >> 20
            ),
        )
    }

    /// The next frame's decoded bytes; empty at the end of the stream.
    pub fn next_chunk(&mut self) -> Result<&[u8], InflateError> {
        loop {
            if self.done || self.in_pos >= self.len {
                self.done = true;
                return Ok(&[]);
            }
            let at = self.in_pos;
            let mut magic = [0u8; 8];
            let n = (self.len - at).min(8) as usize;
            self.image.read_exact_at(&mut magic[..n], at)?;
            if n < 4 {
                return Err(self.bad(at, "bytes after the last zstd frame are not a frame"));
            }
            let word = le::u32_at(&magic, 0);
            if SKIPPABLE.contains(&word) {
                if n < 8 {
                    return Err(self.bad(at, "a skippable frame is cut short"));
                }
                let skip = le::u32_at(&magic, 4) as u64;
                self.in_pos = at + 8 + skip;
                if self.in_pos > self.len {
                    return Err(self.bad(at, "a skippable frame runs past the end of the file"));
                }
                continue;
            }
            if word != MAGIC {
                return Err(self.bad(at, "not a zstd frame (bad magic number)"));
            }
            self.read_frame(at)?;
            // An empty chunk means the end: an empty frame is passed over.
            if !self.decoded.is_empty() {
                return Ok(&self.decoded);
            }
        }
    }

    /// Reads the frame at `at` (header, blocks, checksum) and decodes it into `decoded`.
    fn read_frame(&mut self, at: u64) -> Result<(), InflateError> {
        self.packed.clear();
        self.take(at, 5, at)?;
        let descriptor = self.packed[4];
        let fcs_flag = descriptor >> 6;
        let single_segment = descriptor & 0x20 != 0;
        if descriptor & 0x08 != 0 {
            return Err(self.bad(at, "a zstd frame header with its reserved bit set"));
        }
        let checksum = descriptor & 0x04 != 0;
        let dict_len = [0, 1, 2, 4][(descriptor & 3) as usize];
        let fcs_len = match fcs_flag {
            0 => usize::from(single_segment),
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let header_rest = usize::from(!single_segment) + dict_len + fcs_len;
        self.take(at + 5, header_rest, at)?;
        let dict_at = 5 + usize::from(!single_segment);
        if dict_len > 0
            && self.packed[dict_at..dict_at + dict_len]
                .iter()
                .any(|&b| b != 0)
        {
            return Err(self.bad(
                at,
                "a zstd frame that needs a dictionary: decompress the file once with its \
                 dictionary (`zstd -d -D DICT`) and give the .tar",
            ));
        }
        let fcs_at = dict_at + dict_len;
        let declared = match fcs_len {
            0 => None,
            1 => Some(self.packed[fcs_at] as u64),
            2 => Some(le::u16_at(&self.packed, fcs_at) as u64 + 256),
            4 => Some(le::u32_at(&self.packed, fcs_at) as u64),
            _ => Some(le::u64_at(&self.packed, fcs_at)),
        };
        if declared.is_some_and(|d| d > MAX_UNIT as u64) {
            return Err(self.too_big(at));
        }
        // The blocks: a 3-byte header each (last flag, type, size), then the block's bytes.
        let mut pos = at + 5 + header_rest as u64;
        loop {
            let header_at = self.packed.len();
            self.take(pos, 3, at)?;
            let h = self.packed[header_at] as u32
                | (self.packed[header_at + 1] as u32) << 8
                | (self.packed[header_at + 2] as u32) << 16;
            let (last, kind, size) = (h & 1 != 0, (h >> 1) & 3, (h >> 3) as usize);
            let content = match kind {
                0 | 2 => size,
                1 => 1,
                _ => return Err(self.bad(pos, "a zstd block of the reserved type")),
            };
            self.take(pos + 3, content, at)?;
            pos += 3 + content as u64;
            if last {
                break;
            }
        }
        if checksum {
            self.take(pos, 4, at)?;
            pos += 4;
        }
        // Decoded with a limit, so a frame that declares nothing cannot make the scan hold more.
        self.decoded.clear();
        let decoder = zstd::stream::read::Decoder::with_buffer(&self.packed[..])
            .map_err(InflateError::Io)?
            .single_frame();
        let read = decoder
            .take(MAX_UNIT as u64 + 1)
            .read_to_end(&mut self.decoded);
        if let Err(e) = read {
            return Err(self.bad(at, format!("the zstd frame is corrupt: {e}")));
        }
        if self.decoded.len() > MAX_UNIT {
            return Err(self.too_big(at));
        }
        if declared.is_some_and(|d| d != self.decoded.len() as u64) {
            return Err(self.bad(
                at,
                format!(
                    "the zstd frame decodes to {} bytes, its header says {}",
                    self.decoded.len(),
                    declared.unwrap_or(0)
                ),
            ));
        }
        if !self.decoded.is_empty() {
            self.frames.push(FrameEntry {
                in_at: at,
                in_len: pos - at,
                out_at: self.total,
                codec: Codec::Zstd,
            });
        }
        self.total += self.decoded.len() as u64;
        self.in_pos = pos;
        Ok(())
    }

    /// Walks the rest of the stream and appends its frame table to `tables`.
    pub fn finish(mut self, tables: &mut TableFile) -> Result<Finished, InflateError> {
        while !self.next_chunk()?.is_empty() {}
        super::finish(tables, self.total, &self.frames)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::inflate::Checkpoints;
    use crate::archive::plan::Piece;

    fn sample(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        (0..len)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if i % 7 == 0 {
                    (x >> 33) as u8
                } else {
                    b'a' + (i % 5) as u8
                }
            })
            .collect()
    }

    #[test]
    fn frames_are_found_decoded_and_planned_one_unit_each() {
        // Three frames (the middle one with a checksum, one empty) and a skippable frame.
        let parts = [sample(70_000, 1), Vec::new(), sample(5_000, 2)];
        let mut stream = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            enc.include_checksum(i == 2).unwrap();
            enc.write_all_and_finish(p, &mut stream);
        }
        stream.extend_from_slice(&0x184D_2A5Eu32.to_le_bytes());
        stream.extend_from_slice(&3u32.to_le_bytes());
        stream.extend_from_slice(b"abc");
        let mut indexer = FrameIndexer::new(&stream, stream.len() as u64);
        let mut decoded = Vec::new();
        loop {
            let chunk = indexer.next_chunk().unwrap();
            if chunk.is_empty() {
                break;
            }
            decoded.extend_from_slice(chunk);
        }
        assert_eq!(decoded.len(), 75_000);
        assert!(decoded == parts.concat(), "the decoded stream differs");
        let mut tables = TableFile::new().unwrap();
        let done = FrameIndexer::new(&stream, stream.len() as u64)
            .finish(&mut tables)
            .unwrap();
        assert_eq!(
            (done.total, done.frames),
            (75_000, 2),
            "the empty frame holds nothing"
        );
        let bytes = tables.read(done.table).unwrap();
        let table = Checkpoints::from_bytes(&bytes).unwrap();
        match table.piece(70_100, 10).unwrap() {
            Piece::Decoded { unit, from, len } => {
                assert_eq!((from, len, unit.decoded_len()), (100, 10, 5_000));
                let out = unit.decode(&stream).unwrap();
                assert_eq!(out, parts[2]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn damage_and_oversize_are_refused_with_the_offset() {
        let mut stream = Vec::new();
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.include_checksum(true).unwrap();
        enc.write_all_and_finish(&sample(50_000, 3), &mut stream);
        let first = stream.len() as u64;
        stream.extend_from_slice(&stream.clone());
        // A flipped byte in the second frame's checksum.
        let last = stream.len() - 1;
        stream[last] ^= 1;
        let mut indexer = FrameIndexer::new(&stream, stream.len() as u64);
        assert_eq!(indexer.next_chunk().unwrap().len(), 50_000);
        match indexer.next_chunk() {
            Err(InflateError::Bad { at, why }) => {
                assert_eq!(at, first);
                assert!(why.contains("corrupt"), "{why}");
            }
            other => panic!("{:?}", other.map(|c| c.len())),
        }
        // A header that declares more than a unit may hold.
        let mut big = MAGIC.to_le_bytes().to_vec();
        big.push(0xC0); // 8-byte content size, not single-segment
        big.push(0x50); // window descriptor
        big.extend_from_slice(&(1u64 << 40).to_le_bytes());
        big.extend_from_slice(&[1, 0, 0]); // a last raw block of 0 bytes
        let err = FrameIndexer::new(&big, big.len() as u64)
            .next_chunk()
            .map(|c| c.len())
            .unwrap_err();
        assert!(err.to_string().contains("pzstd"), "{err}");
    }

    trait Finish {
        fn write_all_and_finish(self, data: &[u8], out: &mut Vec<u8>);
    }

    impl Finish for zstd::stream::write::Encoder<'_, Vec<u8>> {
        fn write_all_and_finish(mut self, data: &[u8], out: &mut Vec<u8>) {
            use std::io::Write;
            self.write_all(data).unwrap();
            out.extend_from_slice(&self.finish().unwrap());
        }
    }
}
