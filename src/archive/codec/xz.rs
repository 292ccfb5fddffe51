//! xz: whole streams (squashfs xz blocks are whole xz streams) and single blocks of a larger
//! stream (`archive::framed::xz`), both through liblzma's stream decoder with a memory limit.

use std::io;

/// The most memory one decoder may take. An xz header declares its dictionary size (up to
/// 1.5 GiB) and liblzma allocates it: without a limit a crafted block would make the daemon
/// allocate what the image asks. `xz -9` needs 65 MiB to decode; nothing packfs serves needs more.
const MEMLIMIT: u64 = 96 << 20;

pub fn decompress(input: &[u8], limit: usize, out: &mut Vec<u8>) -> io::Result<()> {
    decode_stream(input, limit, out)
}

/// `decompress`, its input read in turn.
pub fn decompress_from(input: impl io::BufRead, limit: usize, out: &mut Vec<u8>) -> io::Result<()> {
    decode_stream(input, limit, out)
}

fn decode_stream(input: impl io::BufRead, limit: usize, out: &mut Vec<u8>) -> io::Result<()> {
    let stream = liblzma::stream::Stream::new_stream_decoder(MEMLIMIT, 0)?;
    let mut reader = liblzma::bufread::XzDecoder::new_stream(input, stream);
    // One byte more than the limit, so an oversized block is seen.
    super::read_bounded(&mut reader, limit, out)?;
    Ok(())
}

/// Decodes one block of an xz stream (its header, data, padding and check: `block`, whose last
/// `pad` bytes before the check are padding) that must decode to exactly `size` bytes. liblzma
/// decodes streams, so the block is wrapped in the smallest stream that holds it: a stream header
/// with `check`, the block, an index of one record, a footer. liblzma then checks everything: the
/// block's header CRC, its check, and its sizes against the index.
pub fn decompress_block(
    block: &[u8],
    check: u8,
    pad: u8,
    size: usize,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    decompress_block_from(block, block.len() as u64, check, pad, size, out)
}

/// `decompress_block` of a block of `len` bytes that `block` gives in turn.
pub fn decompress_block_from(
    block: impl io::BufRead,
    len: u64,
    check: u8,
    pad: u8,
    size: usize,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    let check_len = check_size(check).ok_or_else(|| bad("unknown check type"))?;
    let unpadded = len
        .checked_sub(pad as u64)
        .filter(|&n| n > check_len && (n + pad as u64).is_multiple_of(4))
        .ok_or_else(|| bad("a block whose length does not fit its padding"))?;
    // The index and footer after the block; the three parts are read in turn, so the block
    // (up to a unit) is not copied.
    let mut tail = vec![0]; // index indicator
    put_vli(&mut tail, 1);
    put_vli(&mut tail, unpadded);
    put_vli(&mut tail, size as u64);
    while tail.len() % 4 != 0 {
        tail.push(0);
    }
    let crc = crc32fast::hash(&tail);
    tail.extend_from_slice(&crc.to_le_bytes());
    let backward = (tail.len() / 4 - 1) as u32;
    let mut footer = backward.to_le_bytes().to_vec();
    footer.extend_from_slice(&[0, check]);
    tail.extend_from_slice(&crc32fast::hash(&footer).to_le_bytes());
    tail.extend_from_slice(&footer);
    tail.extend_from_slice(b"YZ");
    let header = stream_header(check);
    let stream = io::Read::chain(io::Read::chain(&header[..], block), &tail[..]);
    decode_stream(stream, size, out)?;
    // A block that decodes to more than its index says stops one byte past, before liblzma
    // reaches the index that would refuse it.
    if out.len() != size {
        return Err(bad("the block decodes to more bytes than its index says"));
    }
    Ok(())
}

/// A stream header: magic, flags (the check type), CRC-32 of the flags.
fn stream_header(check: u8) -> [u8; 12] {
    let mut h = [0xFD, b'7', b'z', b'X', b'Z', 0, 0, check, 0, 0, 0, 0];
    let crc = crc32fast::hash(&h[6..8]);
    h[8..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The size of a check of type `check` (xz's file format, 2.1.1.2), if the type is valid.
pub fn check_size(check: u8) -> Option<u64> {
    Some(match check {
        0 => 0,
        1..=3 => 4,
        4..=6 => 8,
        7..=9 => 16,
        10..=12 => 32,
        13..=15 => 64,
        _ => return None,
    })
}

/// Appends `n` as an xz variable-length integer (7 bits per byte, low first).
fn put_vli(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push(n as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// xz blocks in a checkpoint table (`super::Framing`): the stream's check type and the block's
/// padding.
pub const FRAMING: super::Framing = super::Framing {
    kind: 2,
    names: ("xz", "blocks"),
    encode: |c| match c {
        super::Codec::XzBlock { check, pad } => Some([check, pad, 0, 0, 0, 0, 0, 0]),
        _ => None,
    },
    decode: |p| {
        (p[0] <= 15 && p[1] <= 3).then_some(super::Codec::XzBlock {
            check: p[0],
            pad: p[1],
        })
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dictionary_beyond_the_limit_is_refused_not_allocated() {
        let mut enc = liblzma::write::XzEncoder::new(Vec::new(), 1);
        io::Write::write_all(&mut enc, b"hello").unwrap();
        let mut packed = enc.finish().unwrap();
        let mut out = Vec::new();
        decompress(&packed, 5, &mut out).unwrap();
        // The block header (after the 12-byte stream header): size, flags (one filter, no
        // sizes), LZMA2's id and its one property byte, the dictionary size. 37 declares 1.5 GiB.
        let header_len = (packed[12] as usize + 1) * 4;
        assert_eq!(&packed[13..16], &[0, 0x21, 1]);
        packed[16] = 37;
        let crc = crc32fast::hash(&packed[12..12 + header_len - 4]);
        packed[12 + header_len - 4..12 + header_len].copy_from_slice(&crc.to_le_bytes());
        let err = decompress(&packed, 5, &mut out).unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
    }

    #[test]
    fn a_block_decodes_alone_and_its_damage_is_seen() {
        let plain: Vec<u8> = (0..200_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 9) as u8)
            .collect();
        let mut enc = liblzma::write::XzEncoder::new(Vec::new(), 1);
        io::Write::write_all(&mut enc, &plain).unwrap();
        let packed = enc.finish().unwrap();
        // The one block: from after the stream header to the index; CRC-64 is xz's default.
        let check = packed[7];
        assert_eq!(check, 4);
        let backward = (u32::from_le_bytes(
            packed[packed.len() - 8..packed.len() - 4]
                .try_into()
                .unwrap(),
        ) as usize
            + 1)
            * 4;
        let index = &packed[packed.len() - 12 - backward..];
        let block = &packed[12..packed.len() - 12 - backward];
        // The index: indicator 0, one record, its unpadded size (a variable-length integer).
        assert_eq!(&index[..2], &[0, 1]);
        let (mut unpadded, mut shift, mut i) = (0usize, 0, 2);
        loop {
            unpadded |= ((index[i] & 0x7f) as usize) << shift;
            shift += 7;
            i += 1;
            if index[i - 1] & 0x80 == 0 {
                break;
            }
        }
        let mut out = Vec::with_capacity(plain.len());
        let pad = (block.len() - unpadded) as u8;
        decompress_block(block, check, pad, plain.len(), &mut out).unwrap();
        assert!(out == plain);
        out.clear();
        assert!(decompress_block(block, check, pad, plain.len() - 1, &mut out).is_err());
        let mut bad = block.to_vec();
        let mid = bad.len() / 2;
        bad[mid] ^= 4;
        out.clear();
        assert!(decompress_block(&bad, check, pad, plain.len(), &mut out).is_err());
    }
}
