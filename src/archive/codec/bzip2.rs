//! bzip2 blocks, one at a time (`archive::framed::bzip2`). A bzip2 block starts at any bit offset
//! and decodes on its own; libbzip2 decodes streams, so the block is moved to a byte boundary and
//! wrapped in the smallest stream that holds it: the stream header with the block's level, the
//! block, the end-of-stream marker and the stream CRC, which for one block is the block's own. The
//! decoder then checks the block's CRC and the stream's.

use std::io;

/// The 48-bit magic that ends a stream.
pub const END_MAGIC: u64 = 0x1772_4538_5090;

/// Decodes the bzip2 block in `input`, from bit `shift` of its first byte to `unused` bits before
/// the end of its last; at most `limit` bytes. Its stream's block size was `level` x 100 kB.
pub fn decompress_block(
    input: &[u8],
    shift: u8,
    unused: u8,
    level: u8,
    limit: usize,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
    let bits = (input.len() as u64 * 8)
        .checked_sub(shift as u64 + unused as u64)
        .filter(|&b| b >= 80 && shift <= 7 && unused <= 7 && (1..=9).contains(&level))
        .ok_or_else(|| bad("a block shorter than its header"))?;
    let mut stream = BitWriter::with_capacity(input.len() + 16);
    for &b in b"BZh" {
        stream.put(b as u64, 8);
    }
    stream.put((b'0' + level) as u64, 8);
    stream.copy_bits(input, shift as u64, bits);
    // The block's CRC: the 32 bits after its 48-bit magic.
    let crc = read_bits(input, shift as u64 + 48, 32);
    stream.put(END_MAGIC, 48);
    stream.put(crc, 32);
    let stream = stream.finish();
    let mut decoder = bzip2::bufread::BzDecoder::new(&stream[..]);
    // One byte more than the limit, so an oversized block is seen.
    super::read_bounded(&mut decoder, limit, out)?;
    if out.len() > limit {
        return Err(bad("the block decodes to more than its limit"));
    }
    Ok(())
}

/// `n` (at most 57) bits of `input` from bit `at` (most significant first), as a number.
pub fn read_bits(input: &[u8], at: u64, n: u32) -> u64 {
    let mut v = 0u64;
    for i in 0..n as u64 {
        let bit = at + i;
        let byte = input.get((bit / 8) as usize).copied().unwrap_or(0);
        v = v << 1 | ((byte >> (7 - bit % 8)) & 1) as u64;
    }
    v
}

/// Bits appended most significant first, as bzip2 writes them.
struct BitWriter {
    bytes: Vec<u8>,
    /// Bits used in the last byte (0 when it is full or there is none).
    used: u32,
}

impl BitWriter {
    fn with_capacity(n: usize) -> BitWriter {
        BitWriter {
            bytes: Vec::with_capacity(n),
            used: 0,
        }
    }

    /// Appends the low `n` bits of `v`.
    fn put(&mut self, v: u64, n: u32) {
        for i in (0..n).rev() {
            let bit = (v >> i) & 1;
            if self.used == 0 {
                self.bytes.push(0);
            }
            let last = self.bytes.len() - 1;
            self.bytes[last] |= (bit as u8) << (7 - self.used);
            self.used = (self.used + 1) % 8;
        }
    }

    /// Appends `n` bits of `input` from bit `at`. The writer is byte-aligned here (after the
    /// 4-byte header), so whole bytes are shifted into place, not copied bit by bit.
    fn copy_bits(&mut self, input: &[u8], at: u64, n: u64) {
        debug_assert_eq!(self.used, 0);
        let (first, shift) = ((at / 8) as usize, (at % 8) as u32);
        let whole = (n / 8) as usize;
        for i in 0..whole {
            let hi = input[first + i] << shift;
            let lo = match shift {
                0 => 0,
                s => input.get(first + i + 1).map_or(0, |&b| b >> (8 - s)),
            };
            self.bytes.push(hi | lo);
        }
        let rest = (n % 8) as u32;
        self.put(read_bits(input, at + whole as u64 * 8, rest), rest);
    }

    fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// bzip2 blocks in a checkpoint table (`super::Framing`): the block's bit shift, its unused
/// bits and its stream's level.
pub const FRAMING: super::Framing = super::Framing {
    kind: 3,
    names: ("bzip2", "blocks"),
    encode: |c| match c {
        super::Codec::Bzip2Block {
            shift,
            unused,
            level,
        } => Some([shift, unused, level, 0, 0, 0, 0, 0]),
        _ => None,
    },
    decode: |p| {
        (p[0] <= 7 && p[1] <= 7 && (1..=9).contains(&p[2])).then_some(super::Codec::Bzip2Block {
            shift: p[0],
            unused: p[1],
            level: p[2],
        })
    },
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_block_at_any_bit_offset_decodes_alone() {
        let plain: Vec<u8> = (0..50_000u32)
            .map(|i| (i % 97) as u8 ^ (i >> 7) as u8)
            .collect();
        let mut enc = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::new(1));
        enc.write_all(&plain).unwrap();
        let packed = enc.finish().unwrap();
        // One block: after the 4-byte header, up to the end-of-stream magic, which ends 80 bits
        // (magic and stream CRC) plus padding before the end.
        let total_bits = packed.len() as u64 * 8;
        let end = (32..=total_bits - 80)
            .rev()
            .find(|&b| read_bits(&packed, b, 48) == END_MAGIC)
            .unwrap();
        let block_bits = end - 32;
        for shift in 0..8u64 {
            // The block moved to start at bit `shift`, with junk bits around it.
            let mut w = BitWriter::with_capacity(packed.len() + 2);
            w.put(0b1010_1010 >> (8 - shift), shift as u32);
            for i in 0..block_bits {
                w.put(read_bits(&packed, 32 + i, 1), 1);
            }
            let unused = (8 - (shift + block_bits) % 8) % 8;
            w.put(0x5a, unused as u32);
            let input = w.finish();
            let mut out = Vec::new();
            decompress_block(&input, shift as u8, unused as u8, 1, plain.len(), &mut out).unwrap();
            assert!(out == plain, "shift {shift}");
            let mut bad = input.clone();
            bad[input.len() / 2] ^= 0x10;
            out.clear();
            let err = decompress_block(&bad, shift as u8, unused as u8, 1, plain.len(), &mut out);
            assert!(err.is_err(), "damage at shift {shift} went unseen");
        }
    }
}
