//! The checkpoint table of one compressed stream, as the catalog keeps it (in its arena, so an
//! index maps it without decoding). Of kind `RESTARTS`, a deflate stream: where each interval of
//! the decoded stream starts in the image, the bits and 32 KiB window needed to restart there, and
//! the interval's CRC-32. Of the frame kinds (zstd frames, xz blocks, bzip2 blocks): where each
//! piece that decodes on its own (`archive::framed`) starts in the image and in the decoded stream,
//! its compressed length, and what its decoder needs besides its bytes (the piece checks itself).
//!
//! ```text
//! head      16 bytes: decoded length u64, checkpoint count u32, kind u32 (0 restarts, 1 zstd
//!           frames, 2 xz blocks, 3 bzip2 blocks)
//! entries   count x 32 bytes: image offset u64, decoded offset u64, then for restarts: window
//!           offset u64 (from the record's start), CRC-32 of the interval u32, window length u16,
//!           bit count u8, bits u8; for frames: compressed length u64, 8 bytes of parameters
//!           (zstd: 0; xz: check type, padding; bzip2: first bit, unused bits of the last byte,
//!           level)
//! windows   the windows, back to back (restarts only)
//! ```
//!
//! Every value is checked when it is used: a damaged or hostile index yields an error for the
//! read, never a panic or an allocation beyond `MAX_INTERVAL`.

use super::{Located, MAX_INTERVAL, Restart, WINDOW};
use crate::archive::codec::{Codec, FRAMINGS, framing_of};
use crate::archive::plan::{Piece, PlanError, Unit};
use crate::util::le::{self, u64_at};

pub const HEAD: usize = 16;
const ENTRY: usize = 32;

/// The table kind of deflate restarts; the frame kinds are the codecs' (`codec::FRAMINGS`).
const RESTARTS: u32 = 0;

/// One piece of a framed stream, as the scan finds it: its compressed bytes `in_at..in_at +
/// in_len`, the decoded offset it starts at, and the codec that decodes it (with its parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameEntry {
    pub in_at: u64,
    pub in_len: u64,
    pub out_at: u64,
    pub codec: Codec,
}

/// The table kind and an entry's parameters for a framed piece's codec.
fn frame_code(codec: Codec) -> (u32, [u8; 8]) {
    let (framing, params) = codec.framing();
    (framing.kind, params)
}

/// The codec of a framed piece from its table's kind and its parameters, if they are valid.
fn frame_codec(kind: u32, p: &[u8]) -> Option<Codec> {
    let params: &[u8; 8] = p.get(..8)?.try_into().ok()?;
    (framing_of(kind)?.decode)(params)
}

/// Encodes a whole table of frames (all of one codec) for a stream of `total` decoded bytes.
pub fn encode_frames(total: u64, frames: &[FrameEntry], out: &mut Vec<u8>) {
    let kind = frames
        .first()
        .map_or(FRAMINGS[0].kind, |f| frame_code(f.codec).0);
    out.extend_from_slice(&total.to_le_bytes());
    out.extend_from_slice(&(frames.len() as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    for f in frames {
        out.extend_from_slice(&f.in_at.to_le_bytes());
        out.extend_from_slice(&f.out_at.to_le_bytes());
        out.extend_from_slice(&f.in_len.to_le_bytes());
        out.extend_from_slice(&frame_code(f.codec).1);
    }
}

/// One restart point, as the indexer finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Image offset of the first whole compressed byte after the restart point.
    pub in_at: u64,
    /// Decoded offset the interval starts at.
    pub out_at: u64,
    /// Bits (0 to 7) of the byte before `in_at` that belong to the next block, and their value.
    pub bit_count: u8,
    pub bits: u8,
    /// Range of the stream's windows (`spill::Windows`): the decoded bytes before `out_at` (up
    /// to 32 KiB, none at the start of a stream). Windows follow each other in checkpoint order.
    pub window: std::ops::Range<u64>,
    /// CRC-32 of the interval's decoded bytes.
    pub crc: u32,
}

/// Encodes the head and entries of a table of `checkpoints` (in decoded order, the first at
/// decoded offset 0) for a stream of `total` decoded bytes. The windows, back to back in
/// checkpoint order, follow them in the record.
pub fn encode_head(total: u64, checkpoints: &[Checkpoint], out: &mut Vec<u8>) {
    out.extend_from_slice(&total.to_le_bytes());
    out.extend_from_slice(&(checkpoints.len() as u32).to_le_bytes());
    out.extend_from_slice(&RESTARTS.to_le_bytes());
    let windows_at = (HEAD + ENTRY * checkpoints.len()) as u64;
    for c in checkpoints {
        out.extend_from_slice(&c.in_at.to_le_bytes());
        out.extend_from_slice(&c.out_at.to_le_bytes());
        out.extend_from_slice(&(windows_at + c.window.start).to_le_bytes());
        out.extend_from_slice(&c.crc.to_le_bytes());
        out.extend_from_slice(&((c.window.end - c.window.start) as u16).to_le_bytes());
        out.push(c.bit_count);
        out.push(c.bits);
    }
}

/// A whole record, windows included (`windows` holds the bytes the ranges refer to).
#[cfg(test)]
pub fn encode(total: u64, checkpoints: &[Checkpoint], windows: &[u8], out: &mut Vec<u8>) {
    encode_head(total, checkpoints, out);
    out.extend_from_slice(windows);
}

/// The bytes of a table's head and entries, from its head (`HEAD` bytes). The windows follow; their
/// total is known from the last entry, so a reader takes the head, then the entries
/// (`Checkpoints::record_len`), then the whole record.
pub fn entries_len(head: &[u8]) -> Option<u64> {
    let count = u32::from_le_bytes(head.get(8..12)?.try_into().ok()?) as u64;
    Some(HEAD as u64 + count * ENTRY as u64)
}

/// A table read from the catalog's arena: the head and entries (checked), and where the whole
/// record is, for the windows (`Checkpoints::record_len` gives its length).
#[derive(Clone, Copy, Debug)]
pub struct Checkpoints<'a> {
    bytes: &'a [u8],
    /// The whole record, for the windows.
    record: Located<'a>,
    total: u64,
    count: usize,
    /// The table's kind (restarts or one of the frame kinds).
    kind: u32,
}

impl<'a> Checkpoints<'a> {
    /// The length of the whole record whose head and entries are `entries` (as `encoded_len`
    /// sized them): up to the end of the last window.
    pub fn record_len(entries: &[u8]) -> Result<u64, String> {
        let count = entries_count(entries)?;
        if count == 0 || kind(entries)? != RESTARTS {
            return Ok((HEAD + count * ENTRY) as u64);
        }
        let last = HEAD + (count - 1) * ENTRY;
        let window_at = u64_at(entries, last + 16);
        let window_len = le::u16_at(entries, last + 28) as u64;
        window_at
            .checked_add(window_len)
            .ok_or_else(|| "a window offset overflows".to_string())
    }

    /// A view of a record whose head and entries are `bytes` and which is all of `record`;
    /// checks its shape (entries are checked when used).
    pub fn decode(bytes: &'a [u8], record: Located<'a>) -> Result<Checkpoints<'a>, String> {
        let count = entries_count(bytes)?;
        if count == 0 {
            return Err("a checkpoint table without checkpoints".into());
        }
        Ok(Checkpoints {
            bytes,
            record,
            total: u64_at(bytes, 0),
            count,
            kind: kind(bytes)?,
        })
    }

    /// A view of a whole record held in memory.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<Checkpoints<'a>, String> {
        Checkpoints::decode(bytes, Located::Bytes(bytes))
    }

    /// Decoded bytes in the stream.
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Whether the table lists frames (zstd frames, xz or bzip2 blocks), not deflate restarts.
    pub fn is_frames(&self) -> bool {
        self.kind != RESTARTS
    }

    /// For a table of frames, the compression and what its pieces are called, for listings.
    pub fn framing(&self) -> Option<(&'static str, &'static str)> {
        framing_of(self.kind).map(|f| f.names)
    }

    fn field64(&self, i: usize, at: usize) -> u64 {
        u64_at(self.bytes, HEAD + i * ENTRY + at)
    }

    /// The decoded offset checkpoint `i` starts at.
    pub fn out_at(&self, i: usize) -> u64 {
        self.field64(i, 8)
    }

    /// Image offset of checkpoint `i`'s first whole byte.
    pub fn in_at(&self, i: usize) -> u64 {
        self.field64(i, 0)
    }

    /// Image offset of the compressed bytes that decode the interval holding decoded offset
    /// `pos` (from its checkpoint).
    pub fn image_offset_of(&self, pos: u64) -> u64 {
        self.in_at(self.find(pos))
    }

    /// The checkpoint whose interval holds decoded offset `pos` (binary search; an unordered,
    /// damaged table yields some checkpoint, which `unit` then rejects).
    fn find(&self, pos: u64) -> usize {
        let (mut lo, mut hi) = (0, self.count);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.out_at(mid) <= pos {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The unit that decodes checkpoint `i`'s interval, and the decoded offset it starts at.
    fn unit(&self, i: usize) -> Result<(Unit<'a>, u64), String> {
        let e = HEAD + i * ENTRY;
        let b = &self.bytes[e..e + ENTRY];
        let (in_at, out_at, window_at) = (u64_at(b, 0), u64_at(b, 8), u64_at(b, 16));
        let crc = le::u32_at(b, 24);
        let window_len = le::u16_at(b, 28) as usize;
        let (bit_count, bits) = (b[30], b[31]);
        let next_out = match i + 1 < self.count {
            true => self.out_at(i + 1),
            false => self.total,
        };
        if self.kind != RESTARTS {
            // The window offset's place holds the frame's compressed length, the rest its
            // codec's parameters.
            let codec = frame_codec(self.kind, &b[24..32])
                .ok_or_else(|| format!("frame {i} has bad codec parameters"))?;
            let len = next_out
                .checked_sub(out_at)
                .filter(|&n| n > 0 && n <= MAX_INTERVAL as u64)
                .ok_or_else(|| format!("frame {i} spans a bad interval {out_at}..{next_out}"))?;
            let in_len = u32::try_from(window_at)
                .ok()
                .filter(|&n| n as usize <= MAX_INTERVAL)
                .ok_or_else(|| format!("frame {i} has a bad compressed length {window_at}"))?;
            let unit = Unit::block(codec, in_at, in_len, len as usize);
            return Ok((unit, out_at));
        }
        let next_in = (i + 1 < self.count).then(|| self.in_at(i + 1));
        let len = next_out
            .checked_sub(out_at)
            .filter(|&n| n > 0 && n <= MAX_INTERVAL as u64)
            .ok_or_else(|| format!("checkpoint {i} spans a bad interval {out_at}..{next_out}"))?;
        let window = self
            .record
            .part(window_at, window_len as u64)
            .filter(|_| window_len <= WINDOW && bit_count <= 7)
            .ok_or_else(|| format!("checkpoint {i} has a bad window or bit count"))?;
        // The compressed bytes of the interval: up to and including the byte the next
        // checkpoint's bits come from, when there is a next one.
        let in_len = next_in.and_then(|n| n.checked_sub(in_at)).map(|n| n + 1);
        let restart = Restart {
            in_len,
            bit_count,
            bits,
            window,
            len: len as usize,
            crc,
        };
        let unit = Unit::restart(in_at, restart);
        Ok((unit, out_at))
    }

    /// The piece of decoded bytes `pos..pos + want` (of this stream) that starts at `pos`: a slice
    /// of the interval that holds it, cut at the interval's end.
    pub fn piece(&self, pos: u64, want: usize) -> Result<Piece<'a>, PlanError> {
        let i = self.find(pos);
        let (unit, start) = self.unit(i).map_err(|why| PlanError {
            at: 0,
            why: format!("the catalog's checkpoint table is invalid: {why}"),
        })?;
        let from = pos
            .checked_sub(start)
            .filter(|&f| f < unit.decoded_len() as u64);
        let Some(from) = from else {
            return Err(PlanError {
                at: 0,
                why: format!("no checkpoint interval holds decoded offset {pos}"),
            });
        };
        let from = from as usize;
        Ok(Piece::Decoded {
            unit,
            from,
            len: want.min(unit.decoded_len() - from),
        })
    }
}

/// The table's kind, from its head.
fn kind(bytes: &[u8]) -> Result<u32, String> {
    match bytes.get(..HEAD).map(|h| le::u32_at(h, 12)) {
        Some(k) if k == RESTARTS || framing_of(k).is_some() => Ok(k),
        Some(k) => Err(format!("a checkpoint table of unknown kind {k}")),
        None => Err("the checkpoint table is cut short".into()),
    }
}

fn entries_count(bytes: &[u8]) -> Result<usize, String> {
    let head = bytes
        .get(..HEAD)
        .ok_or("the checkpoint table is cut short")?;
    let count = le::u32_at(head, 8) as usize;
    if bytes.len() < HEAD + count * ENTRY {
        return Err("the checkpoint table is cut short".into());
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let windows = vec![7u8; 10];
        let cps = [
            Checkpoint {
                in_at: 100,
                out_at: 0,
                bit_count: 0,
                bits: 0,
                window: 0..0,
                crc: 1,
            },
            Checkpoint {
                in_at: 180,
                out_at: 1000,
                bit_count: 3,
                bits: 5,
                window: 0..10,
                crc: 2,
            },
        ];
        let mut out = Vec::new();
        encode(1500, &cps, &windows, &mut out);
        out
    }

    #[test]
    fn pieces_are_cut_at_intervals() {
        let rec = sample();
        assert_eq!(
            Checkpoints::record_len(&rec[..entries_len(&rec).unwrap() as usize]),
            Ok(rec.len() as u64)
        );
        let t = Checkpoints::from_bytes(&rec).unwrap();
        let Piece::Decoded { unit, from, len } = t.piece(900, 300).unwrap() else {
            panic!()
        };
        assert_eq!(
            (unit.at, unit.decoded_len(), from, len),
            (100, 1000, 900, 100)
        );
        let Piece::Decoded { unit, from, len } = t.piece(1000, 300).unwrap() else {
            panic!()
        };
        assert_eq!((unit.at, unit.decoded_len(), from, len), (180, 500, 0, 300));
        assert!(t.piece(1500, 1).is_err());
    }

    #[test]
    fn damaged_tables_are_errors() {
        let rec = sample();
        assert!(Checkpoints::from_bytes(&rec[..20]).is_err());
        // The second interval made to run backwards, and a window pointing outside the record.
        let mut bad = rec.clone();
        bad[HEAD + ENTRY + 8..HEAD + ENTRY + 16].copy_from_slice(&5000u64.to_le_bytes());
        let t = Checkpoints::from_bytes(&bad).unwrap();
        assert!(t.piece(5000, 1).is_err());
        let mut bad = rec.clone();
        bad[HEAD + ENTRY + 16..HEAD + ENTRY + 24].copy_from_slice(&u64::MAX.to_le_bytes());
        let t = Checkpoints::from_bytes(&bad).unwrap();
        assert!(t.piece(1200, 1).is_err());
        assert!(Checkpoints::record_len(&bad).is_err());
    }
}
