//! Where a file's bytes are, and how to read a byte range of it: the format's read planner.
//!
//! The catalog records a file's `Placement` (an encoding, an image offset and, for squashfs, a block
//! map). For a range of the file, `Placement::plan` yields the pieces that make it up, in order:
//! zeros, stored image bytes, or a slice of a `Unit` (an encoded run of the image that decodes as
//! one: a squashfs block, a whole deflated zip member). The tiers execute plans (staged copy, RAM
//! cache, source) without knowing any format; new placements (sparse members, deflate from restart
//! checkpoints) are new pieces and units here.

use std::fmt;
use std::io;

use super::codec;
use super::codec::Codec;
use super::inflate::{self, Checkpoints};
use super::plan::{Encoding, Located, MAX_UNIT, Piece, PlanError, Unit, UnitKind, WholeCrc};
use super::sparse_map::{self, SparseMap};
use super::squashfs::block_map::{self, BlockMap};
use crate::source::read_at::ReadAt;
use crate::util::le;

/// Bytes of a placement record with a CRC-32 (zip members, tar members packfs wrote): the data offset
/// (u64) and the CRC-32 (u32), little-endian.
pub const CRC_RECORD: usize = 12;

/// A placement record with a CRC-32.
pub fn crc_record(data_offset: u64, crc: u32) -> [u8; CRC_RECORD] {
    let mut r = [0u8; CRC_RECORD];
    r[..8].copy_from_slice(&data_offset.to_le_bytes());
    r[8..].copy_from_slice(&crc.to_le_bytes());
    r
}

/// A file's placement (where and how its bytes lie in its image) as the catalog holds it.
#[derive(Clone, Copy, Debug)]
pub enum Placement<'a> {
    /// Bytes as they are at `at`; `crc` is the CRC-32 of the whole file, when the format keeps one.
    Stored {
        at: u64,
        crc: Option<u32>,
    },
    /// A raw deflate stream at `at`; `crc` as for `Stored`.
    Deflate {
        at: u64,
        crc: Option<u32>,
    },
    Squashfs(BlockMap<'a>),
    Sparse(SparseMap<'a>),
    /// Bytes at `at` of a deflate stream read through its checkpoints: a big zip member (`at` 0)
    /// or a member of a `.tar.gz` (`at` in the decoded tar).
    Inflated {
        at: u64,
        table: Checkpoints<'a>,
    },
    /// A sparse member of a `.tar.gz`: its data segments lie in the decoded tar.
    SparseInflated {
        map: SparseMap<'a>,
        table: Checkpoints<'a>,
    },
}

/// Reads an `inflate::table` record at `offset` of the catalog's arena: its head and entries
/// through `record` (checked against the index's checksums), the whole record through `whole`
/// (not checked: a table is 1.6% of its stream's decoded size, gigabytes for a big `.tar.gz`,
/// and checking it all on a file's first read would read it all). A damaged window cannot make
/// a read wrong: each interval's bytes are checked against the CRC-32 in its checked entry.
pub fn read_checkpoints<'a, E: From<PlanError>>(
    offset: u64,
    record: impl Fn(u64, usize) -> Result<&'a [u8], E>,
    whole: impl Fn(u64, u64) -> Result<Located<'a>, E>,
) -> Result<Checkpoints<'a>, E> {
    let invalid = |why: String| PlanError {
        at: 0,
        why: format!("the catalog's checkpoint table is invalid: {why}"),
    };
    let head = record(offset, inflate::table::HEAD)?;
    let entries = inflate::table::entries_len(head)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| invalid("bad head".into()))?;
    let entries = record(offset, entries)?;
    let len = Checkpoints::record_len(entries).map_err(invalid)?;
    Ok(Checkpoints::decode(entries, whole(offset, len)?).map_err(invalid)?)
}

impl Unit<'_> {
    /// The most memory `decode` takes: the result, the encoded bytes (a block's are read whole,
    /// a stream's a piece at a time) and the decoder's own state. The memory budget reserves it
    /// before decoding. xz's dictionary is allocated as declared but touched only as far as the
    /// output goes, so it counts as much as the output; bzip2 sorts in 4 bytes per block byte.
    pub fn memory(&self) -> u64 {
        const DECODER: u64 = 256 << 10;
        let bytes = match self.kind {
            UnitKind::Block {
                codec, len, limit, ..
            } => {
                let working = match codec {
                    Codec::Xz | Codec::XzBlock { .. } => limit as u64,
                    Codec::Bzip2Block { .. } => 4 * 900_000,
                    _ => 0,
                };
                limit as u64 + 1 + len as u64 + working
            }
            UnitKind::DeflateStream { size, .. } => size + codec::READ_CHUNK as u64,
            UnitKind::Restart(ref r) => r.window.len() + r.len as u64 + inflate::RESTART_READ,
        };
        bytes + DECODER
    }

    /// Reads the encoded bytes from `image` (through whatever tiers it stands for) and decodes
    /// them. A result of the wrong length is `InvalidData`, like a corrupt stream.
    pub fn decode(&self, image: &dyn ReadAt) -> io::Result<Vec<u8>> {
        let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        // The sizes come from the catalog, which a crafted index controls: never allocate for
        // more than any image packfs writes an index for can need.
        let encoded = match self.kind {
            UnitKind::Block { len, limit, .. } => (len as usize).max(limit),
            _ => 0,
        };
        if self.decoded_len().max(encoded) > MAX_UNIT {
            return Err(invalid(format!(
                "the catalog says the data at {} decodes as one unit of more than {} MiB, which \
                 no image needs (the index is damaged or crafted)",
                self.at,
                MAX_UNIT >> 20
            )));
        }
        match self.kind {
            UnitKind::Restart(ref r) => inflate::inflate_interval(image, self.at, r),
            UnitKind::DeflateStream { size, crc } => {
                let out = codec::inflate_stream(image, self.at, size)?;
                check_crc(&out, crc).map_err(invalid)?;
                Ok(out)
            }
            UnitKind::Block {
                codec,
                len,
                need,
                limit,
                what,
            } => {
                let mut out = Vec::new();
                let decode = |packed: &mut [u8], out: &mut Vec<u8>| {
                    image
                        .read_exact_at(packed, self.at)
                        .and_then(|()| codec.decompress(packed, limit, out).map_err(invalid))
                };
                if len as usize > KEEP_ENCODED && codec.streams() {
                    // A large xz piece is decoded as its bytes are read, a piece at a time:
                    // never held whole beside what it decodes to (16 threads over 64 MiB blocks
                    // of 25 MB held 89 MB a decode, more than an 80 MiB budget).
                    let mut failure = None;
                    let encoded = Pieces {
                        image,
                        at: self.at,
                        end: self.at + len as u64,
                        failure: &mut failure,
                    };
                    let decoded = codec.decompress_streamed(encoded, len as u64, limit, &mut out);
                    // A read that failed is the image's error, not corrupt data.
                    if let Some(error) = failure {
                        return Err(error);
                    }
                    decoded.map_err(invalid)?;
                } else if len as usize > KEEP_ENCODED {
                    // A large piece's encoded bytes in a mapping of their own, given back to the
                    // kernel when decoded (malloc kept them in the reading thread's arena: 16
                    // threads over 64 MiB xz blocks held 620 MB against an 80 MiB budget).
                    let mut packed = memmap2::MmapMut::map_anon(len as usize)?;
                    decode(&mut packed, &mut out)?;
                } else {
                    ENCODED.with_borrow_mut(|packed| {
                        packed.resize(len as usize, 0);
                        decode(packed, &mut out)
                    })?;
                }
                if out.len() < need {
                    let expected = if need == limit {
                        format!("expected {need}")
                    } else {
                        format!("too short for the {need} bytes used")
                    };
                    return Err(invalid(format!(
                        "{} {what} decodes to {} bytes, {expected}",
                        codec.name(),
                        out.len()
                    )));
                }
                Ok(out)
            }
        }
    }
}

/// Checks `bytes` against the CRC-32 the archive recorded for them, if any.
pub fn check_crc(bytes: &[u8], crc: Option<u32>) -> Result<(), String> {
    match crc {
        Some(want) => {
            let got = crc32fast::hash(bytes);
            if got == want {
                Ok(())
            } else {
                Err(format!(
                    "bad CRC-32: the archive records {want:08x}, the bytes have {got:08x} (the \
                     member is damaged)"
                ))
            }
        }
        None => Ok(()),
    }
}

/// Encoded bytes kept per thread between blocks, at most: every squashfs block fits.
const KEEP_ENCODED: usize = 1 << 20;

/// The encoded bytes `at..end` of an image, read a piece at a time as a decoder asks for them;
/// a read that fails is kept in `failure` (the decoder only says it could not go on).
struct Pieces<'i> {
    image: &'i dyn ReadAt,
    at: u64,
    end: u64,
    failure: &'i mut Option<io::Error>,
}

impl io::Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.end - self.at) as usize;
        if let Err(e) = self.image.read_exact_at(&mut buf[..n], self.at) {
            let said = io::Error::new(e.kind(), e.to_string());
            *self.failure = Some(e);
            return Err(said);
        }
        self.at += n as u64;
        Ok(n)
    }
}

thread_local! {
    /// Encoded bytes of the block being decoded on this thread.
    static ENCODED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<'a> Placement<'a> {
    /// The placement of a file whose catalog record says `encoding` and `offset`; `record(offset,
    /// len)` gives bytes of the catalog's arena (where squashfs block maps are kept), checked;
    /// `whole` the same bytes unchecked, for checkpoint tables (`read_checkpoints`).
    pub fn read<E: From<PlanError>>(
        encoding: Encoding,
        offset: u64,
        record: impl Fn(u64, usize) -> Result<&'a [u8], E>,
        whole: impl Fn(u64, u64) -> Result<Located<'a>, E>,
    ) -> Result<Placement<'a>, E> {
        let zip = |offset| -> Result<(u64, Option<u32>), E> {
            let r = record(offset, CRC_RECORD)?;
            let at = le::u64_at(r, 0);
            let crc = le::u32_at(r, 8);
            Ok((at, Some(crc)))
        };
        Ok(match encoding {
            Encoding::Stored => Placement::Stored {
                at: offset,
                crc: None,
            },
            Encoding::Deflate => Placement::Deflate {
                at: offset,
                crc: None,
            },
            Encoding::StoredCrc => {
                let (at, crc) = zip(offset)?;
                Placement::Stored { at, crc }
            }
            Encoding::ZipDeflated => {
                let (at, crc) = zip(offset)?;
                Placement::Deflate { at, crc }
            }
            Encoding::Sparse => {
                let head = record(offset, sparse_map::RECORD_HEAD)?;
                let len = sparse_map::encoded_len(head);
                let invalid = |why| PlanError {
                    at: 0,
                    why: format!("the catalog's sparse map is invalid: {why}"),
                };
                Placement::Sparse(SparseMap::decode(record(offset, len)?).map_err(invalid)?)
            }
            Encoding::Checkpointed => Placement::Inflated {
                at: 0,
                table: read_checkpoints(offset, &record, whole)?,
            },
            Encoding::Squashfs => {
                let head = record(offset, block_map::HEAD)?;
                let len = BlockMap::encoded_len(head.try_into().expect("HEAD bytes"));
                let invalid = |why| PlanError {
                    at: 0,
                    why: format!("the catalog's block map is invalid: {why}"),
                };
                Placement::Squashfs(BlockMap::decode(record(offset, len)?).map_err(invalid)?)
            }
        })
    }

    /// The placement of a member of a compressed image (a `.tar.gz`) whose offsets are in the
    /// decoded stream that `table` describes.
    pub fn in_stream(self, table: Checkpoints<'a>) -> Result<Placement<'a>, PlanError> {
        match self {
            Placement::Stored { at, crc: None } => Ok(Placement::Inflated { at, table }),
            Placement::Sparse(map) => Ok(Placement::SparseInflated { map, table }),
            other => Err(PlanError {
                at: 0,
                why: format!("the catalog places a {other} member in a compressed image"),
            }),
        }
    }

    /// Checks that a file of `size` bytes with this placement lies inside its image of `image_size`
    /// bytes (or inside the decoded stream, for a compressed image), and that its sparse map or
    /// block map is consistent: for `packfs verify` on an index that may have been crafted.
    pub fn check_extent(&self, size: u64, image_size: u64) -> Result<(), String> {
        let within = |at: u64, len: u64, limit: u64, what: &str| match at.checked_add(len) {
            Some(end) if end <= limit => Ok(()),
            _ => Err(format!(
                "{len} bytes at {at} run past the end of the {what} ({limit} bytes)"
            )),
        };
        let segments = |map: &SparseMap, limit: u64, what: &str| {
            let mut end = 0u64;
            for i in 0..map.count() {
                let (off, len, at) = map.segment(i);
                let seg_end = off.checked_add(len).filter(|&e| off >= end && e <= size);
                end = seg_end.ok_or_else(|| {
                    format!("sparse segment {i} ({len} bytes at {off}) is out of order or past the file's end")
                })?;
                within(at, len, limit, what)?;
            }
            Ok(())
        };
        match self {
            Placement::Stored { at, .. } => within(*at, size, image_size, "image"),
            Placement::Deflate { at, .. } => {
                if size > MAX_UNIT as u64 {
                    return Err(format!(
                        "a deflated member of {size} bytes is more than packfs inflates at once"
                    ));
                }
                within(*at, 1, image_size, "image")
            }
            Placement::Squashfs(map) => {
                map.check_size(size)?;
                within(0, map.blocks_end(), image_size, "image")?;
                match map.tail {
                    Some(t) => within(
                        t.block.start,
                        t.block.disk_len() as u64,
                        image_size,
                        "image",
                    ),
                    None => Ok(()),
                }
            }
            Placement::Sparse(map) => segments(map, image_size, "image"),
            Placement::Inflated { at, table } => within(*at, size, table.total(), "decoded stream"),
            Placement::SparseInflated { map, table } => {
                segments(map, table.total(), "decoded stream")
            }
        }
    }

    /// The pieces of bytes `offset..offset + len` of a file of `size` bytes (the range lies
    /// inside the file).
    pub fn plan(self, size: u64, offset: u64, len: usize) -> Plan<'a> {
        Plan {
            placement: self,
            size,
            pos: offset,
            end: offset + len as u64,
        }
    }

    /// The piece that starts at `pos`, at most `want` bytes long.
    fn piece(&self, size: u64, pos: u64, want: usize) -> Result<Piece<'a>, PlanError> {
        match *self {
            Placement::Stored { at, crc } => Ok(Piece::Stored {
                at: at + pos,
                len: want,
                crc: crc.map(|crc| WholeCrc { at, len: size, crc }),
            }),
            Placement::Deflate { at, crc } => Ok(Piece::Decoded {
                unit: Unit::deflate_stream(at, size, crc),
                from: pos as usize,
                len: want,
            }),
            Placement::Squashfs(ref map) => map.piece(size, pos, want),
            Placement::Sparse(ref map) => map.piece(size, pos, want),
            Placement::Inflated { at, ref table } => table.piece(at + pos, want),
            Placement::SparseInflated { ref map, ref table } => match map.piece(size, pos, want)? {
                Piece::Stored { at, len, .. } => table.piece(at, len),
                other => Ok(other),
            },
        }
    }
}

impl Placement<'_> {
    /// The CRC-32 of the whole file that the catalog records, if any.
    pub fn crc(&self) -> Option<u32> {
        match self {
            Placement::Stored { crc, .. } | Placement::Deflate { crc, .. } => *crc,
            _ => None,
        }
    }

    /// Where the file's bytes begin in its image: the offset of the first encoded byte a read of
    /// its start uses (for a member of a `.tar.gz`, of the compressed interval that holds it).
    /// Files of one image sorted by it are read in the image's order.
    pub fn image_offset(&self) -> u64 {
        match self {
            Placement::Stored { at, .. } | Placement::Deflate { at, .. } => *at,
            Placement::Inflated { at, table } => table.image_offset_of(*at),
            Placement::SparseInflated { map, table } => match map.count() {
                0 => table.image_offset_of(0),
                _ => table.image_offset_of(map.segment(0).2),
            },
            Placement::Sparse(map) => match map.count() {
                0 => 0,
                _ => map.segment(0).2,
            },
            Placement::Squashfs(map) => match (map.count, map.tail) {
                (0, Some(t)) => t.block.start,
                (0, None) => 0,
                _ => map.block(0).start,
            },
        }
    }
}

impl fmt::Display for Placement<'_> {
    /// Where the bytes lie, for `packfs ls --extents`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Stored { at, .. } => write!(f, "stored at {at}"),
            Placement::Deflate { at, .. } => write!(f, "deflate at {at}"),
            Placement::Inflated { at, table } if let Some((codec, pieces)) = table.framing() => {
                write!(
                    f,
                    "{codec}, at offset {at} of a stream of {} bytes in {} {pieces} from {}",
                    table.total(),
                    table.count(),
                    table.in_at(0)
                )
            }
            Placement::Inflated { at, table } => write!(
                f,
                "inflated from offset {at} of a stream of {} bytes, {} checkpoints from {}",
                table.total(),
                table.count(),
                table.in_at(0)
            ),
            Placement::SparseInflated { map, table } => write!(
                f,
                "sparse, {} data segments, inflated through {} checkpoints",
                map.count(),
                table.count()
            ),
            Placement::Sparse(map) => {
                write!(f, "sparse, {} data segments", map.count())?;
                if map.count() > 0 {
                    write!(f, " from {}", map.segment(0).2)?;
                }
                Ok(())
            }
            Placement::Squashfs(map) => {
                f.write_str(map.codec.name())?;
                if map.count > 0 {
                    let first = map.block(0).start;
                    write!(f, " blocks {} at {first}..{}", map.count, map.blocks_end())?;
                }
                if let Some(t) = map.tail {
                    write!(f, " tail at {}+{}", t.block.start, t.offset)?;
                }
                Ok(())
            }
        }
    }
}

/// The pieces of one read, in order (an iterator, so a read allocates no list).
pub struct Plan<'a> {
    placement: Placement<'a>,
    size: u64,
    pos: u64,
    end: u64,
}

impl<'a> Iterator for Plan<'a> {
    type Item = Result<Piece<'a>, PlanError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.end {
            return None;
        }
        let want = (self.end - self.pos) as usize;
        let piece = self.placement.piece(self.size, self.pos, want);
        match &piece {
            Ok(p) if !p.is_empty() => self.pos += p.len() as u64,
            // An empty piece would never advance: a record that covers nothing here is damage.
            Ok(_) => {
                self.pos = self.end;
                return Some(Err(PlanError {
                    at: 0,
                    why: format!("the placement covers nothing at file offset {}", self.pos),
                }));
            }
            Err(_) => self.pos = self.end,
        }
        Some(piece)
    }
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
