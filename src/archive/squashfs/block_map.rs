//! Where a squashfs file's bytes are: its data blocks and its tail in a fragment block, encoded as
//! a compact byte record that the catalog keeps in its string arena (and so in the index file).
//!
//! ```text
//! 0   u8   codec id (squashfs compressor id)
//! 1   u8   block_log (block size = 1 << block_log)
//! 2   u8   flags: bit 0 = the file ends in a fragment
//! 3   u8   0
//! 4   u32  block count n
//! [fragment] u64 fragment block start, u32 its size word, u32 the tail's offset in the block
//! ceil(n / 64) x u64   checkpoints: the image offset of blocks 0, 64, 128, ...
//! n x u32              size words as on disk: length in bits 0..24, bit 24 = stored uncompressed,
//!                      length 0 = a sparse (all-zero) block
//! ```
//!
//! Checkpoints bound the work to find block i to 63 additions, for any file size.

use super::{codec_from_id, codec_id};
use crate::archive::codec::Codec;
use crate::archive::plan::{Piece, PlanError, Unit};
use crate::util::le;

const FRAGMENT: usize = 16;
const CHECKPOINT_EVERY: usize = 64;
/// Bit of a size word that marks a block stored without compression.
pub const STORED: u32 = 1 << 24;
const HAS_FRAGMENT: u8 = 1;

/// A compressed or stored run of bytes in the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub start: u64,
    /// The size word: length and the stored flag.
    pub word: u32,
}

impl Extent {
    /// Bytes on disk (0 for a sparse block).
    pub fn disk_len(self) -> u32 {
        self.word & (STORED - 1)
    }

    pub fn is_stored(self) -> bool {
        self.word & STORED != 0
    }

    pub fn is_sparse(self) -> bool {
        self.disk_len() == 0
    }
}

/// The fragment block holding a file's tail, and where in it the tail starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    pub block: Extent,
    pub offset: u32,
}

/// Appends the record for a file to `out`.
pub fn encode(
    codec: Codec,
    block_log: u8,
    blocks_start: u64,
    words: &[u32],
    tail: Option<Tail>,
    out: &mut Vec<u8>,
) {
    out.push(codec_id(codec));
    out.push(block_log);
    out.push(if tail.is_some() { HAS_FRAGMENT } else { 0 });
    out.push(0);
    out.extend_from_slice(&(words.len() as u32).to_le_bytes());
    if let Some(t) = tail {
        out.extend_from_slice(&t.block.start.to_le_bytes());
        out.extend_from_slice(&t.block.word.to_le_bytes());
        out.extend_from_slice(&t.offset.to_le_bytes());
    }
    let mut at = blocks_start;
    for (i, w) in words.iter().enumerate() {
        if i % CHECKPOINT_EVERY == 0 {
            out.extend_from_slice(&at.to_le_bytes());
        }
        at += (w & (STORED - 1)) as u64;
    }
    for w in words {
        out.extend_from_slice(&w.to_le_bytes());
    }
}

/// A decoded view of one record.
#[derive(Clone, Copy, Debug)]
pub struct BlockMap<'a> {
    pub codec: Codec,
    pub block_log: u8,
    pub count: usize,
    pub tail: Option<Tail>,
    checkpoints: &'a [u8],
    words: &'a [u8],
}

/// Bytes of a record's fixed head, from which its whole length follows.
pub const HEAD: usize = 8;

impl<'a> BlockMap<'a> {
    /// The length of the record that starts with `head` (its first 8 bytes).
    pub fn encoded_len(head: &[u8; HEAD]) -> usize {
        let count = le::u32_at(head, 4) as usize;
        let fragment = if head[2] & HAS_FRAGMENT != 0 {
            FRAGMENT
        } else {
            0
        };
        HEAD + fragment + count.div_ceil(CHECKPOINT_EVERY) * 8 + count * 4
    }

    pub fn decode(b: &'a [u8]) -> Result<BlockMap<'a>, String> {
        let head: &[u8; HEAD] = b
            .get(..HEAD)
            .and_then(|h| h.try_into().ok())
            .ok_or("truncated block map")?;
        if b.len() != Self::encoded_len(head) {
            return Err(format!("block map has {} bytes, expected more", b.len()));
        }
        let codec = codec_from_id(head[0] as u16)?;
        let block_log = head[1];
        if !(12..=20).contains(&block_log) {
            return Err(format!("block size 2^{block_log} is out of range"));
        }
        let count = le::u32_at(head, 4) as usize;
        let mut at = HEAD;
        let tail = (head[2] & HAS_FRAGMENT != 0).then(|| {
            let f = &b[at..at + FRAGMENT];
            at += FRAGMENT;
            Tail {
                block: Extent {
                    start: le::u64_at(f, 0),
                    word: le::u32_at(f, 8),
                },
                offset: le::u32_at(f, 12),
            }
        });
        let checkpoints_len = count.div_ceil(CHECKPOINT_EVERY) * 8;
        Ok(BlockMap {
            codec,
            block_log,
            count,
            tail,
            checkpoints: &b[at..at + checkpoints_len],
            words: &b[at + checkpoints_len..],
        })
    }

    pub fn block_size(&self) -> u64 {
        1 << self.block_log
    }

    fn word(&self, i: usize) -> u32 {
        le::u32_at(self.words, i * 4)
    }

    /// Data block `i` (`i < count`).
    pub fn block(&self, i: usize) -> Extent {
        let c = i / CHECKPOINT_EVERY;
        let base = le::u64_at(self.checkpoints, c * 8);
        let skipped: u64 = (c * CHECKPOINT_EVERY..i)
            .map(|j| (self.word(j) & (STORED - 1)) as u64)
            .sum();
        Extent {
            // Saturating: a crafted record could overflow; the read past the image then fails.
            start: base.saturating_add(skipped),
            word: self.word(i),
        }
    }

    /// One past the last image byte of the data blocks.
    pub fn blocks_end(&self) -> u64 {
        match self.count {
            0 => 0,
            n => {
                let last = self.block(n - 1);
                last.start.saturating_add(last.disk_len() as u64)
            }
        }
    }

    /// The bytes of the file's block `i` once decoded: a full block, or less for the last one.
    pub fn decoded_len(&self, file_size: u64, i: usize) -> u64 {
        (file_size - i as u64 * self.block_size()).min(self.block_size())
    }

    /// The piece of a file of `file_size` bytes that starts at `pos`: the rest of the block (or
    /// tail) holding `pos`, at most `want` bytes.
    pub fn piece(
        &self,
        file_size: u64,
        pos: u64,
        want: usize,
    ) -> Result<Piece<'static>, PlanError> {
        let bs = self.block_size();
        let i = (pos / bs) as usize;
        let within = pos % bs;
        if i < self.count {
            let block_len = self.decoded_len(file_size, i);
            let len = ((block_len - within) as usize).min(want);
            let extent = self.block(i);
            if extent.is_sparse() {
                return Ok(Piece::Zeros(len));
            }
            if extent.is_stored() {
                if extent.disk_len() as u64 != block_len {
                    return Err(PlanError {
                        at: extent.start,
                        why: format!(
                            "stored block of {} bytes, expected {block_len}",
                            extent.disk_len()
                        ),
                    });
                }
                return Ok(Piece::Stored {
                    at: extent.start.saturating_add(within),
                    len,
                    crc: None,
                });
            }
            let unit = Unit::block(
                self.codec,
                extent.start,
                extent.disk_len(),
                block_len as usize,
            );
            return Ok(Piece::Decoded {
                unit,
                from: within as usize,
                len,
            });
        }
        let Some(tail) = self.tail else {
            return Err(PlanError {
                at: 0,
                why: format!("offset {pos} is past the file's blocks"),
            });
        };
        let tail_len = file_size - self.count as u64 * bs;
        let len = ((tail_len - within) as usize).min(want);
        let from = tail.offset as u64 + within;
        if tail.block.is_stored() {
            return Ok(Piece::Stored {
                at: tail.block.start.saturating_add(from),
                len,
                crc: None,
            });
        }
        let need = (tail.offset as u64 + tail_len) as usize;
        let unit = Unit::fragment_block(
            self.codec,
            tail.block.start,
            tail.block.disk_len(),
            need,
            bs as usize,
        );
        Ok(Piece::Decoded {
            unit,
            from: from as usize,
            len,
        })
    }

    /// Checks that the blocks and the tail account for exactly `file_size` bytes.
    pub fn check_size(&self, file_size: u64) -> Result<(), String> {
        let bs = self.block_size();
        let in_blocks = (self.count as u64).saturating_mul(bs);
        let ok = match self.tail {
            Some(_) => file_size >= in_blocks && file_size - in_blocks < bs,
            None => file_size <= in_blocks && in_blocks - file_size < bs.max(1),
        };
        if ok || (file_size == 0 && self.count == 0 && self.tail.is_none()) {
            Ok(())
        } else {
            Err(format!(
                "{} blocks of {bs} bytes{} cannot hold {file_size} bytes",
                self.count,
                if self.tail.is_some() {
                    " and a tail"
                } else {
                    ""
                }
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_checkpoints() {
        let words: Vec<u32> = (0..200u32)
            .map(|i| match i % 7 {
                0 => 0,             // sparse
                1 => 4096 | STORED, // stored
                _ => 1000 + i * 3,  // compressed
            })
            .collect();
        let tail = Tail {
            block: Extent {
                start: 9_000_000_000,
                word: 777,
            },
            offset: 123,
        };
        let mut rec = vec![0xee; 3]; // records start anywhere in the arena
        encode(Codec::Zstd, 12, 5_000_000_000, &words, Some(tail), &mut rec);
        let b = &rec[3..];
        assert_eq!(BlockMap::encoded_len(b[..8].try_into().unwrap()), b.len());
        let map = BlockMap::decode(b).unwrap();
        assert_eq!(
            (map.codec, map.count, map.tail),
            (Codec::Zstd, 200, Some(tail))
        );
        let mut at = 5_000_000_000u64;
        for (i, &w) in words.iter().enumerate() {
            assert_eq!(map.block(i), Extent { start: at, word: w }, "block {i}");
            at += (w & (STORED - 1)) as u64;
        }
        assert_eq!(map.blocks_end(), at);
        assert!(map.block(0).is_sparse() && map.block(1).is_stored());
        let size = 200 * 4096 + 50;
        map.check_size(size).unwrap();
        assert!(map.check_size(size + 4096).is_err());
        assert_eq!(map.decoded_len(size, 199), 4096);
        assert!(BlockMap::decode(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn without_tail() {
        let mut rec = Vec::new();
        encode(Codec::Zlib, 17, 96, &[5000, 6000], None, &mut rec);
        let map = BlockMap::decode(&rec).unwrap();
        assert_eq!(map.block(1).start, 5096);
        map.check_size(131072 + 10).unwrap();
        map.check_size(2 * 131072).unwrap();
        assert!(map.check_size(131072).is_err());
        assert_eq!(map.decoded_len(131072 + 10, 1), 10);
    }
}
