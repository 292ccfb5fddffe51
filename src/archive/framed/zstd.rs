//! A zstd stream indexed by frame: each frame of a zstd stream decodes on its own, so a stream of
//! many frames (pzstd's, the seekable format's, `packfs pack --compress zstd`'s, or frames
//! concatenated by hand) serves any byte by decoding the one frame that holds it. The frames are
//! listed first: from the seek table when the file is in the seekable format (no read but its
//! end), else by walking the frame and block headers (a read of the file, no decoding). They are
//! then decoded for the tar walk several at a time (`BlockIndexer`), each checked against its
//! checksum when it has one and its declared size.
//!
//! A frame must decode to at most `plan::MAX_UNIT` bytes. A stream written as one big frame (the
//! zstd command's default for a large input) is refused with the commands that serve it:
//! decompress it once, or write it again in frames. Skippable frames (pzstd's, the seek table) are
//! passed over; a frame that needs a dictionary is refused.

use std::io;

use super::{Block, Chunked};
use crate::archive::codec::Codec;
use crate::archive::inflate::InflateError;
use crate::archive::plan::MAX_UNIT;
use crate::source::read_at::ReadAt;
use crate::util::le;

const MAGIC: u32 = 0xFD2F_B528;
/// Skippable frames: magic 0x184D2A50 to 0x184D2A5F, a 4-byte length, then that many bytes.
const SKIPPABLE: std::ops::RangeInclusive<u32> = 0x184D_2A50..=0x184D_2A5F;
/// The seekable format: its seek table is the skippable frame 0x184D2A5E, whose last 9 bytes are
/// the frame count, a descriptor and this magic.
const SEEK_TABLE: u32 = 0x184D_2A5E;
const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;

fn too_big(frame: u64) -> InflateError {
    InflateError::bad(
        frame,
        format!(
            "a zstd frame larger than {} MiB: packfs serves zstd streams written in frames \
             (pzstd, the seekable format, `packfs pack --compress zstd`), one frame decoded per \
             read; decompress this one once (`zstd -d`) and give the .tar, or write it again in \
             frames (`zstd -dc FILE | pzstd -p 8 -o FILE.zst`)",
            MAX_UNIT >> 20
        ),
    )
}

/// Every frame of the zstd file in `image` (`len` bytes), in order.
pub fn frames(image: &dyn ReadAt, len: u64) -> Result<Vec<Block>, InflateError> {
    if let Some(frames) = from_seek_table(image, len)? {
        return Ok(frames);
    }
    let mut file = Chunked::new(image, len);
    let mut found = Vec::new();
    let mut at = 0;
    while at < len {
        if len - at < 4 {
            return Err(InflateError::bad(
                at,
                "bytes after the last zstd frame are not a frame",
            ));
        }
        let word = le::u32_at(file.bytes(at, 4)?, 0);
        if SKIPPABLE.contains(&word) {
            if len - at < 8 {
                return Err(InflateError::bad(at, "a skippable frame is cut short"));
            }
            let skip = le::u32_at(file.bytes(at + 4, 4)?, 0) as u64;
            at += 8 + skip;
            if at > len {
                return Err(InflateError::bad(
                    at - 8 - skip,
                    "a skippable frame runs past the end of the file",
                ));
            }
            continue;
        }
        if word != MAGIC {
            return Err(InflateError::bad(at, "not a zstd frame (bad magic number)"));
        }
        let (frame_len, size) = walk_frame(&mut file, at)?;
        found.push(Block {
            in_at: at,
            in_len: frame_len,
            size,
            codec: Codec::Zstd,
        });
        at += frame_len;
    }
    Ok(found)
}

/// The frames the seek table lists, when the file ends with one whose sizes add up to the file;
/// `None` when there is none (the headers are walked then).
fn from_seek_table(image: &dyn ReadAt, len: u64) -> Result<Option<Vec<Block>>, InflateError> {
    let mut footer = [0u8; 9];
    if len < 17 {
        return Ok(None);
    }
    image.read_exact_at(&mut footer, len - 9)?;
    if le::u32_at(&footer, 5) != SEEKABLE_MAGIC {
        return Ok(None);
    }
    let count = le::u32_at(&footer, 0) as u64;
    let entry = if footer[4] & 0x80 != 0 { 12 } else { 8 };
    let table_len = count * entry + 9;
    let Some(table_at) = len.checked_sub(table_len + 8) else {
        return Ok(None);
    };
    let mut head = [0u8; 8];
    image.read_exact_at(&mut head, table_at)?;
    if le::u32_at(&head, 0) != SEEK_TABLE || le::u32_at(&head, 4) as u64 != table_len {
        return Ok(None);
    }
    let mut table = vec![0u8; (count * entry) as usize];
    image.read_exact_at(&mut table, table_at + 8)?;
    let mut found = Vec::with_capacity(count as usize);
    let mut at = 0u64;
    for e in table.chunks_exact(entry as usize) {
        let (packed, size) = (le::u32_at(e, 0) as u64, le::u32_at(e, 4) as u64);
        if size > MAX_UNIT as u64 {
            return Err(too_big(at));
        }
        found.push(Block {
            in_at: at,
            in_len: packed,
            size: Some(size),
            codec: Codec::Zstd,
        });
        at += packed;
    }
    // A table that does not describe the file exactly is not trusted: the headers are walked.
    Ok((at == table_at).then_some(found))
}

/// The seek table (a skippable frame) for frames of these (compressed, decoded) sizes, without
/// checksums: what `packfs pack --compress` ends a shard with, and `from_seek_table` reads.
/// Sizes must fit in 32 bits (pack's frames are far smaller).
pub fn seek_table(sizes: &[(u64, u64)]) -> Vec<u8> {
    let len = sizes.len() * 8 + 9;
    let mut t = Vec::with_capacity(8 + len);
    t.extend_from_slice(&SEEK_TABLE.to_le_bytes());
    t.extend_from_slice(&(len as u32).to_le_bytes());
    for &(packed, size) in sizes {
        t.extend_from_slice(&(packed as u32).to_le_bytes());
        t.extend_from_slice(&(size as u32).to_le_bytes());
    }
    t.extend_from_slice(&(sizes.len() as u32).to_le_bytes());
    t.push(0);
    t.extend_from_slice(&SEEKABLE_MAGIC.to_le_bytes());
    t
}

/// Walks the header, blocks and checksum of the frame at `at`: its length, and its decoded size
/// if the header declares it.
fn walk_frame(file: &mut Chunked, at: u64) -> Result<(u64, Option<u64>), InflateError> {
    let h = file.bytes(at, 5).map_err(|e| cut_short(e, at))?;
    let descriptor = h[4];
    let fcs_flag = descriptor >> 6;
    let single_segment = descriptor & 0x20 != 0;
    if descriptor & 0x08 != 0 {
        return Err(InflateError::bad(
            at,
            "a zstd frame header with its reserved bit set",
        ));
    }
    let checksum = descriptor & 0x04 != 0;
    let dict_len = [0, 1, 2, 4][(descriptor & 3) as usize];
    let fcs_len = match fcs_flag {
        0 => usize::from(single_segment),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let rest = usize::from(!single_segment) + dict_len + fcs_len;
    let fields = file.bytes(at + 5, rest).map_err(|e| cut_short(e, at))?;
    let dict_at = usize::from(!single_segment);
    if fields[dict_at..dict_at + dict_len].iter().any(|&b| b != 0) {
        return Err(InflateError::bad(
            at,
            "a zstd frame that needs a dictionary: decompress the file once with its dictionary \
             (`zstd -d -D DICT`) and give the .tar",
        ));
    }
    let f = dict_at + dict_len;
    let declared = match fcs_len {
        0 => None,
        1 => Some(fields[f] as u64),
        2 => Some(le::u16_at(fields, f) as u64 + 256),
        4 => Some(le::u32_at(fields, f) as u64),
        _ => Some(le::u64_at(fields, f)),
    };
    if declared.is_some_and(|d| d > MAX_UNIT as u64) {
        return Err(too_big(at));
    }
    // The blocks: a 3-byte header each (last flag, type, size), then the block's bytes.
    let mut pos = at + 5 + rest as u64;
    loop {
        let b = file.bytes(pos, 3).map_err(|e| cut_short(e, at))?;
        let h = b[0] as u32 | (b[1] as u32) << 8 | (b[2] as u32) << 16;
        let (last, kind, size) = (h & 1 != 0, (h >> 1) & 3, (h >> 3) as u64);
        let content = match kind {
            0 | 2 => size,
            1 => 1,
            _ => return Err(InflateError::bad(pos, "a zstd block of the reserved type")),
        };
        pos += 3 + content;
        if pos - at > MAX_UNIT as u64 {
            return Err(too_big(at));
        }
        if last {
            break;
        }
    }
    if checksum {
        pos += 4;
    }
    if pos > file.len {
        return Err(InflateError::bad(
            at,
            "the zstd frame is cut short (the file ends inside it)",
        ));
    }
    Ok((pos - at, declared))
}

/// Decodes the frame `packed` (at `at`) that does not declare its decoded size, up to a unit.
/// Decodes a frame that does not declare its size, to at most `limit` bytes (a unit at most).
pub(super) fn decode_undeclared(
    packed: &[u8],
    at: u64,
    limit: usize,
) -> Result<Vec<u8>, InflateError> {
    let mut out = Vec::new();
    let decoder = zstd::stream::read::Decoder::with_buffer(packed)
        .map_err(InflateError::Io)?
        .single_frame();
    if let Err(e) = crate::archive::codec::read_bounded(decoder, limit, &mut out) {
        return Err(InflateError::bad(
            at,
            format!("the zstd frame is corrupt: {e}"),
        ));
    }
    if out.len() > limit {
        return Err(match limit >= MAX_UNIT {
            true => too_big(at),
            false => InflateError::bad(at, format!("the zstd frame decodes to more than {limit}")),
        });
    }
    Ok(out)
}

fn cut_short(e: io::Error, at: u64) -> InflateError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            InflateError::bad(at, "the zstd frame is cut short (the file ends inside it)")
        }
        _ => InflateError::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::framed::BlockIndexer;
    use crate::archive::inflate::Checkpoints;
    use crate::archive::plan::Piece;
    use crate::archive::spill::TableFile;

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
    fn the_seek_table_written_is_the_one_read() {
        let parts = [sample(9_000, 3), sample(20_000, 4)];
        let mut file = Vec::new();
        let mut sizes = Vec::new();
        for p in &parts {
            let frame = zstd::bulk::compress(p, 3).unwrap();
            sizes.push((frame.len() as u64, p.len() as u64));
            file.extend(frame);
        }
        file.extend(seek_table(&sizes));
        let found = from_seek_table(&file, file.len() as u64).unwrap().unwrap();
        let listed: Vec<_> = found.iter().map(|b| (b.in_len, b.size.unwrap())).collect();
        assert_eq!(listed, sizes);
        assert_eq!(found[1].in_at, sizes[0].0);
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
        let found = frames(&stream, stream.len() as u64).unwrap();
        let decoded = BlockIndexer::new(&stream, found.clone()).decode_all();
        assert_eq!(decoded.len(), 75_000);
        assert!(decoded == parts.concat(), "the decoded stream differs");
        let mut tables = TableFile::new().unwrap();
        let done = BlockIndexer::new(&stream, found)
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
        let found = frames(&stream, stream.len() as u64).unwrap();
        let mut indexer = BlockIndexer::new(&stream, found);
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
        let err = frames(&big, big.len() as u64).unwrap_err();
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
