//! Where a sparse file's data segments are: a record the catalog keeps in its arena (and so in
//! the index), from which reads are planned in O(log segments). Holes read as zeros.
//!
//! ```text
//! 0  u32  segment count n
//! 4  u32  0
//! 8  n x (u64 file offset, u64 length, u64 image offset), by file offset, not overlapping
//! ```

use super::plan::{Piece, PlanError};
use crate::util::le;

const HEAD: usize = 8;
const SEGMENT: usize = 24;

/// Segments (file offset, length) of a file of `size` bytes whose data is stored, segment after
/// segment, from `data_offset`: checks them and appends the record to `out`. Zero-length
/// segments (GNU tar ends maps with one) are dropped.
pub fn encode(
    segments: &[(u64, u64)],
    size: u64,
    data_offset: u64,
    stored: u64,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let kept: Vec<(u64, u64)> = segments.iter().copied().filter(|s| s.1 > 0).collect();
    let mut end = 0u64;
    let mut total = 0u64;
    for &(off, len) in &kept {
        let seg_end = off
            .checked_add(len)
            .ok_or("a sparse segment overflows 64 bits")?;
        if off < end {
            return Err(format!(
                "sparse segments overlap or are out of order at {off}"
            ));
        }
        if seg_end > size {
            return Err(format!(
                "a sparse segment ends at {seg_end}, past the file's size {size}"
            ));
        }
        end = seg_end;
        total += len;
    }
    if total != stored {
        return Err(format!(
            "the sparse map covers {total} bytes of data, the archive stores {stored}"
        ));
    }
    let count = u32::try_from(kept.len()).map_err(|_| "too many sparse segments")?;
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    let mut at = data_offset;
    for (off, len) in kept {
        for v in [off, len, at] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        at += len;
    }
    Ok(())
}

/// The length of the record whose first 8 bytes are `head`.
pub fn encoded_len(head: &[u8]) -> usize {
    let count = le::u32_at(head, 0) as usize;
    HEAD + count * SEGMENT
}

pub const RECORD_HEAD: usize = HEAD;

/// A decoded view of one record.
#[derive(Clone, Copy, Debug)]
pub struct SparseMap<'a> {
    segments: &'a [u8],
}

impl<'a> SparseMap<'a> {
    pub fn decode(b: &'a [u8]) -> Result<SparseMap<'a>, String> {
        if b.len() < HEAD || b.len() != encoded_len(b) {
            return Err("truncated sparse map".into());
        }
        Ok(SparseMap {
            segments: &b[HEAD..],
        })
    }

    pub fn count(&self) -> usize {
        self.segments.len() / SEGMENT
    }

    /// Segment `i`: (file offset, length, image offset).
    pub fn segment(&self, i: usize) -> (u64, u64, u64) {
        let s = &self.segments[i * SEGMENT..(i + 1) * SEGMENT];
        let v = |k: usize| le::u64_at(s, k * 8);
        (v(0), v(1), v(2))
    }

    /// The piece of a file of `size` bytes at `pos`, at most `want` bytes: data of the segment
    /// holding `pos`, or zeros up to the next segment.
    pub fn piece(&self, size: u64, pos: u64, want: usize) -> Result<Piece<'static>, PlanError> {
        // The first segment that ends after `pos`.
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (off, len, _) = self.segment(mid);
            if off + len <= pos {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo < self.count() {
            let (off, len, at) = self.segment(lo);
            if off <= pos {
                let n = ((off + len - pos) as usize).min(want);
                return Ok(Piece::Stored {
                    at: at + (pos - off),
                    len: n,
                    crc: None,
                });
            }
            return Ok(Piece::Zeros(((off - pos) as usize).min(want)));
        }
        Ok(Piece::Zeros((size.saturating_sub(pos) as usize).min(want)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_and_data() {
        let mut rec = Vec::new();
        let segs = [(100, 50), (1000, 10), (2000, 0)];
        encode(&segs, 2000, 512, 60, &mut rec).unwrap();
        let map = SparseMap::decode(&rec).unwrap();
        assert_eq!(map.count(), 2);
        let piece = |pos, want| map.piece(2000, pos, want).unwrap();
        assert_eq!(piece(0, 500), Piece::Zeros(100));
        assert_eq!(
            piece(120, 500),
            Piece::Stored {
                at: 532,
                len: 30,
                crc: None
            }
        );
        assert_eq!(piece(150, 2000), Piece::Zeros(850));
        assert_eq!(
            piece(1005, 3),
            Piece::Stored {
                at: 567,
                len: 3,
                crc: None
            }
        );
        assert_eq!(piece(1010, 5000), Piece::Zeros(990));
        let err = |segs: &[(u64, u64)], stored| encode(segs, 2000, 0, stored, &mut Vec::new());
        assert!(
            err(&[(100, 50), (120, 10)], 60)
                .unwrap_err()
                .contains("overlap")
        );
        assert!(err(&[(1990, 50)], 50).unwrap_err().contains("past"));
        assert!(err(&[(0, 50)], 49).unwrap_err().contains("stores 49"));
    }
}
