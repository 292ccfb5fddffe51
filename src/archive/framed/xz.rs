//! An xz file indexed by block. xz keeps its own index at the end of each stream: the compressed
//! ("unpadded") and decoded size of every block. Reading it from the end, stream by stream
//! (concatenated streams and the zero padding between them included), gives every block's place
//! without decoding anything; the blocks are then decoded once for the tar walk (several at a time,
//! `BlockIndexer`), and a read decodes the one block that holds its bytes. `xz -T0` (xz 5.4 and
//! later by default with threads) and pixz write many blocks; a single-threaded `xz` writes one,
//! which is refused when it is larger than a unit.

use super::Block;
use crate::archive::codec::{Codec, xz_check_size};
use crate::archive::inflate::InflateError;
use crate::archive::plan::MAX_UNIT;
use crate::source::read_at::ReadAt;
use crate::util::le;

const HEADER_MAGIC: [u8; 6] = [0xFD, b'7', b'z', b'X', b'Z', 0];
const FOOTER_MAGIC: [u8; 2] = *b"YZ";
/// The largest index packfs reads: 8 MiB list a million blocks and more (6 bytes per record for
/// blocks of 16 MiB), 20 TB of data. The records it holds are bounded by the stream's size too
/// (`MIN_BLOCK`), so a small file cannot make packfs hold millions.
const MAX_INDEX: u64 = 8 << 20;
/// The fewest bytes an xz block takes: an 8-byte header, a byte of data, padding to four.
const MIN_BLOCK: u64 = 12;

/// The refusal of a block larger than one read may decode: the single-block policy.
fn too_big(at: u64) -> InflateError {
    InflateError::bad(
        at,
        format!(
            "an xz block larger than {} MiB: packfs serves xz files written in blocks (`xz -T0`, \
             pixz), one block decoded per read, and this one was written as one block (xz \
             without threads); decompress it once (`xz -dk FILE`) and give the .tar, or write it \
             again in blocks (`xz -dc FILE | xz -T0 --block-size=16MiB > NEW.tar.xz`)",
            MAX_UNIT >> 20
        ),
    )
}

/// Every block of the xz file in `image` (`len` bytes), in stream order.
pub fn blocks(image: &dyn ReadAt, len: u64) -> Result<Vec<Block>, InflateError> {
    let mut streams = Vec::new();
    let mut end = len;
    if !len.is_multiple_of(4) {
        return Err(InflateError::bad(
            len,
            "the file's size is not a multiple of four bytes, as xz files are (it is cut short \
             or has bytes after its end)",
        ));
    }
    while end > 0 {
        // Stream padding: groups of four zero bytes after a stream.
        let mut word = [0u8; 4];
        image.read_exact_at(&mut word, end - 4)?;
        if word == [0; 4] {
            end -= 4;
            continue;
        }
        let (start, blocks) = stream(image, end)?;
        streams.push(blocks);
        end = start;
    }
    if streams.is_empty() {
        return Err(InflateError::bad(0, "an xz file with no stream"));
    }
    Ok(streams.into_iter().rev().flatten().collect())
}

/// The stream that ends at `end`: where it starts, and its blocks.
fn stream(image: &dyn ReadAt, end: u64) -> Result<(u64, Vec<Block>), InflateError> {
    if end < 24 {
        return Err(InflateError::bad(
            0,
            "an xz stream shorter than its header and footer",
        ));
    }
    let footer_at = end - 12;
    let mut footer = [0u8; 12];
    image.read_exact_at(&mut footer, footer_at)?;
    if footer[10..12] != FOOTER_MAGIC {
        return Err(InflateError::bad(
            footer_at,
            "no xz stream footer where the file (or the stream before padding) ends: the file \
             is cut short or has bytes after its end",
        ));
    }
    if crc32fast::hash(&footer[4..10]) != le::u32_at(&footer, 0) {
        return Err(InflateError::bad(
            footer_at,
            "the xz stream footer's CRC does not match",
        ));
    }
    let flags = [footer[8], footer[9]];
    let check = flags[1];
    let check_len = xz_check_size(check)
        .filter(|_| flags[0] == 0 && check <= 15)
        .ok_or_else(|| InflateError::bad(footer_at, "xz stream flags this xz does not know"))?;
    let index_len = (le::u32_at(&footer, 4) as u64 + 1) * 4;
    let index_at = footer_at
        .checked_sub(index_len)
        .filter(|_| index_len <= MAX_INDEX)
        .ok_or_else(|| InflateError::bad(footer_at, "the xz index is larger than the stream"))?;
    let mut index = vec![0u8; index_len as usize];
    image.read_exact_at(&mut index, index_at)?;
    // A block takes 12 bytes at least (an 8-byte header, data, padding to four): an index cannot
    // list more than fit between the stream header and itself. (A crafted 8 MiB index in a file
    // of its own size listed 4 million and took 334 MB.)
    let room = index_at.saturating_sub(12) / MIN_BLOCK;
    let records = parse_index(&index, room).map_err(|why| InflateError::bad(index_at, why))?;
    let blocks_len = records
        .iter()
        .try_fold(0u64, |sum, r| sum.checked_add(r.0.div_ceil(4) * 4));
    let header_at = blocks_len
        .and_then(|n| index_at.checked_sub(n))
        .and_then(|n| n.checked_sub(12))
        .ok_or_else(|| {
            InflateError::bad(
                index_at,
                "the xz index lists more blocks than the stream holds",
            )
        })?;
    let mut header = [0u8; 12];
    image.read_exact_at(&mut header, header_at)?;
    if header[..6] != HEADER_MAGIC || header[6..8] != flags {
        return Err(InflateError::bad(
            header_at,
            "no xz stream header where the stream's index says it starts",
        ));
    }
    if crc32fast::hash(&header[6..8]) != le::u32_at(&header, 8) {
        return Err(InflateError::bad(
            header_at,
            "the xz stream header's CRC does not match",
        ));
    }
    let mut at = header_at + 12;
    let mut blocks = Vec::with_capacity(records.len());
    for (unpadded, size) in records {
        let padded = unpadded.div_ceil(4) * 4;
        if unpadded <= check_len {
            return Err(InflateError::bad(at, "an xz block smaller than its check"));
        }
        if size > MAX_UNIT as u64 || padded > MAX_UNIT as u64 {
            return Err(too_big(at));
        }
        blocks.push(Block {
            in_at: at,
            in_len: padded,
            size: Some(size),
            codec: Codec::XzBlock {
                check,
                pad: (padded - unpadded) as u8,
            },
        });
        at += padded;
    }
    Ok((header_at, blocks))
}

/// The records of an xz index (indicator, count, then unpadded and decoded size per block,
/// padding, CRC-32): (unpadded size, decoded size) per block.
fn parse_index(index: &[u8], room: u64) -> Result<Vec<(u64, u64)>, String> {
    let body = index
        .len()
        .checked_sub(4)
        .ok_or("the xz index is cut short")?;
    if crc32fast::hash(&index[..body]) != le::u32_at(index, body) {
        return Err("the xz index's CRC does not match".into());
    }
    if index[0] != 0 {
        return Err("the xz index does not start with its indicator".into());
    }
    let mut pos = 1;
    let count = vli(&index[..body], &mut pos)?;
    // Each record takes two bytes at least: a count beyond that is a lie, not an allocation.
    if count > (body as u64) / 2 {
        return Err(format!(
            "the xz index claims {count} blocks in {body} bytes"
        ));
    }
    if count > room {
        return Err(format!(
            "the xz index claims {count} blocks, more than the {room} the stream has room for"
        ));
    }
    let mut records = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let unpadded = vli(&index[..body], &mut pos)?;
        let size = vli(&index[..body], &mut pos)?;
        if unpadded == 0 {
            return Err("the xz index lists a block of size 0".into());
        }
        records.push((unpadded, size));
    }
    if index[pos..body].iter().any(|&b| b != 0) || (body - pos) >= 4 || body % 4 != 0 {
        return Err("the xz index has bytes after its records".into());
    }
    Ok(records)
}

/// An xz variable-length integer (at most 9 bytes, 63 bits) at `pos` of `bytes`.
fn vli(bytes: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut n = 0u64;
    for i in 0..9 {
        let b = *bytes.get(*pos).ok_or("the xz index is cut short")?;
        *pos += 1;
        n |= ((b & 0x7F) as u64) << (7 * i);
        if b & 0x80 == 0 {
            if b == 0 && i > 0 {
                return Err("the xz index holds a badly encoded number".into());
            }
            return Ok(n);
        }
    }
    Err("the xz index holds a number longer than 9 bytes".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::framed::BlockIndexer;

    fn sample(len: usize) -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i % 251) as u8 ^ (i >> 11) as u8)
            .collect()
    }

    /// An xz stream of `parts` as separate blocks (liblzma's full flush ends a block).
    pub fn blocks_of(parts: &[&[u8]]) -> Vec<u8> {
        use liblzma::stream::{Action, Check, Status, Stream};
        fn flush(enc: &mut Stream, out: &mut Vec<u8>, action: Action) {
            loop {
                out.reserve(1 << 16);
                if enc.process_vec(&[], out, action).unwrap() == Status::StreamEnd {
                    break;
                }
            }
        }
        let mut enc = Stream::new_easy_encoder(1, Check::Crc64).unwrap();
        let mut out = Vec::new();
        for p in parts {
            let mut input = *p;
            while !input.is_empty() {
                out.reserve(1 << 16);
                let before = enc.total_in();
                enc.process_vec(input, &mut out, Action::Run).unwrap();
                input = &input[(enc.total_in() - before) as usize..];
            }
            flush(&mut enc, &mut out, Action::FullFlush);
        }
        flush(&mut enc, &mut out, Action::Finish);
        out
    }

    #[test]
    fn blocks_of_concatenated_padded_streams_are_found_and_decode_alone() {
        let a = sample(100_000);
        let b = sample(30_000);
        let mut file = blocks_of(&[&a, &b]);
        file.extend_from_slice(&[0; 8]);
        file.extend(blocks_of(&[&b]));
        let found = blocks(&file, file.len() as u64).unwrap();
        let sizes: Vec<_> = found.iter().map(|b| b.size).collect();
        assert_eq!(sizes, [Some(100_000), Some(30_000), Some(30_000)]);
        let decoded = BlockIndexer::new(&file, found).decode_all();
        assert!(decoded == [&a[..], &b, &b].concat());
    }

    #[test]
    fn damage_is_named_with_its_offset() {
        let file = blocks_of(&[&sample(50_000)]);
        let cut = &file[..file.len() - 4];
        assert!(blocks(&cut.to_vec(), cut.len() as u64).is_err());
        let mut bad = file.clone();
        let n = bad.len();
        bad[n - 20] ^= 1; // in the index
        match blocks(&bad, n as u64) {
            Err(InflateError::Bad { why, .. }) => assert!(why.contains("index"), "{why}"),
            other => panic!("{other:?}"),
        }
        let mut bad = file.clone();
        bad[40] ^= 0x40; // in the block's data
        let found = blocks(&bad, n as u64).unwrap();
        let mut indexer = BlockIndexer::new(&bad, found);
        match indexer.next_chunk() {
            Err(InflateError::Bad { at, why }) => {
                assert_eq!(at, 12);
                assert!(why.contains("corrupt"), "{why}");
            }
            other => panic!("{:?}", other.map(|c| c.len())),
        }
    }
}
