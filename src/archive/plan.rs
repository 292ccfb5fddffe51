//! The vocabulary of read plans, below every format's planner: how a member is encoded
//! (`Encoding`, with the codes an index records), the `Piece`s a read is made of (zeros, stored
//! image bytes, a slice of a decoded `Unit`), the units themselves (a compressed block, a whole
//! deflate stream, one interval of a stream restarted at a checkpoint) and `PlanError`. Formats
//! (`squashfs::block_map`, `sparse_map`, `inflate::table`) produce these; `placement` chooses among
//! them and decodes units; the tiers execute them knowing no format.

use std::fmt;
use std::io;

use super::codec::Codec;

/// How a member's bytes are stored at its data offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encoding {
    /// `size` bytes as they are (tar, zip stored): served with one pread.
    #[default]
    Stored,
    /// A raw deflate stream that inflates to `size` bytes (zip deflated); self-terminating, so
    /// its compressed length is not needed to read it.
    Deflate,
    /// Squashfs data blocks and tail fragment, described by a `squashfs::block_map` record.
    Squashfs,
    /// Bytes as they are, with their CRC-32 (a zip member stored, or a tar member `packfs pack`
    /// wrote): a `CRC_RECORD` in the catalog's arena.
    StoredCrc,
    /// A zip member deflated, with its CRC-32: a `CRC_RECORD` in the catalog's arena.
    ZipDeflated,
    /// A sparse file: data segments and holes, a `sparse_map` record in the catalog's arena.
    Sparse,
    /// A deflate stream served through restart checkpoints (a zip member larger than
    /// `inflate::SPACING`): an `inflate::table` record in the catalog's arena.
    Checkpointed,
}

impl Encoding {
    /// Every encoding, by its code.
    const BY_CODE: [Encoding; 7] = [
        Encoding::Stored,
        Encoding::Deflate,
        Encoding::Squashfs,
        Encoding::StoredCrc,
        Encoding::ZipDeflated,
        Encoding::Sparse,
        Encoding::Checkpointed,
    ];

    /// The number an index records for this encoding (never reused: indexes outlive builds).
    pub fn code(self) -> u32 {
        match self {
            Encoding::Stored => 0,
            Encoding::Deflate => 1,
            Encoding::Squashfs => 2,
            Encoding::StoredCrc => 3,
            Encoding::ZipDeflated => 4,
            Encoding::Sparse => 5,
            Encoding::Checkpointed => 6,
        }
    }

    /// The encoding an index's `code` names; none for a code no encoding has (a damaged or
    /// crafted index, or one a newer packfs wrote), which must never be read as stored bytes.
    pub fn from_code(code: u32) -> Option<Encoding> {
        let found = Encoding::BY_CODE.get(code as usize).copied()?;
        (found.code() == code).then_some(found)
    }

    /// Whether the catalog keeps a record for this encoding in its arena (the entry's offset
    /// then points to the record).
    pub fn has_record(self) -> bool {
        matches!(
            self,
            Encoding::Squashfs
                | Encoding::StoredCrc
                | Encoding::ZipDeflated
                | Encoding::Sparse
                | Encoding::Checkpointed
        )
    }
}

/// The most bytes one unit may decode to, or occupy encoded: a checkpoint interval's bound,
/// above every squashfs block (1 MiB) and every whole deflated member packfs indexes (32 MiB).
pub const MAX_UNIT: usize = 64 << 20;

/// A piece of a read, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Zeros(usize),
    /// `len` image bytes at `at`; `crc` is the whole file's checksum when the format keeps one
    /// (the executor checks the whole file once before serving any part of it).
    Stored {
        at: u64,
        len: usize,
        crc: Option<WholeCrc>,
    },
    /// `len` bytes from `from` of what `unit` decodes to.
    Decoded {
        unit: Unit<'a>,
        from: usize,
        len: usize,
    },
}

impl Piece<'_> {
    pub fn len(&self) -> usize {
        match self {
            Piece::Zeros(len) | Piece::Stored { len, .. } | Piece::Decoded { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The extent of a whole stored file and the CRC-32 its bytes must have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WholeCrc {
    pub at: u64,
    pub len: u64,
    pub crc: u32,
}

/// A run of image bytes that decodes as one. Decoded units are what the RAM cache keeps, keyed by
/// (image, `key()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit<'a> {
    /// Image offset of the encoded bytes.
    pub at: u64,
    pub(super) kind: UnitKind<'a>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum UnitKind<'a> {
    /// `len` encoded bytes that decode to at least `need` and at most `limit` bytes; `what` names
    /// it in errors.
    Block {
        codec: Codec,
        len: u32,
        need: usize,
        limit: usize,
        what: &'static str,
    },
    /// A raw deflate stream that inflates to exactly `size` bytes, with that CRC-32 if known.
    DeflateStream { size: u64, crc: Option<u32> },
    /// One interval of a deflate stream, inflated from its checkpoint (`inflate::table`).
    Restart(Restart<'a>),
}

impl<'a> Unit<'a> {
    /// A block of `len` encoded bytes at `at` that must decode to exactly `size` bytes.
    pub fn block(codec: Codec, at: u64, len: u32, size: usize) -> Unit<'a> {
        Unit {
            at,
            kind: UnitKind::Block {
                codec,
                len,
                need: size,
                limit: size,
                what: "block",
            },
        }
    }

    /// A squashfs fragment block: at most `limit` bytes, of which the first `need` are used.
    pub fn fragment_block(codec: Codec, at: u64, len: u32, need: usize, limit: usize) -> Unit<'a> {
        Unit {
            at,
            kind: UnitKind::Block {
                codec,
                len,
                need,
                limit,
                what: "fragment block",
            },
        }
    }

    /// An interval of a deflate stream, restarted at image offset `at` (see `inflate::table`).
    pub fn restart(at: u64, restart: Restart<'a>) -> Unit<'a> {
        Unit {
            at,
            kind: UnitKind::Restart(restart),
        }
    }

    /// How many bytes the unit decodes to, when its kind fixes it (0 otherwise).
    pub fn decoded_len(&self) -> usize {
        match self.kind {
            UnitKind::Restart(r) => r.len,
            UnitKind::Block { need, .. } => need,
            UnitKind::DeflateStream { size, .. } => size as usize,
        }
    }

    pub fn deflate_stream(at: u64, size: u64, crc: Option<u32>) -> Unit<'a> {
        Unit {
            at,
            kind: UnitKind::DeflateStream { size, crc },
        }
    }

    /// The RAM cache key within the image.
    pub fn key(&self) -> u64 {
        self.at
    }
}

/// A placement that cannot be read as recorded: the image offset of the problem and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanError {
    pub at: u64,
    pub why: String,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.why)
    }
}

/// What restarting at a checkpoint takes: the leftover `bit_count` bits `bits` of the byte
/// before it, `window` (the output before it), and what the interval must be: `len` bytes of
/// CRC-32 `crc` (recorded when the stream was indexed), from `in_len` compressed bytes if known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restart<'a> {
    pub in_len: Option<u64>,
    pub bit_count: u8,
    pub bits: u8,
    pub window: Located<'a>,
    pub len: usize,
    pub crc: u32,
}

/// Bytes at hand, or `len` bytes at `at` of a file (an index or a spill file), read when
/// used: a checkpoint table's record, and a checkpoint's window in it. Windows are 1.6 % of a
/// stream's decoded size: read through a mapping they would stay in the daemon's memory, 640 MiB
/// after one pass over a member that inflates to 40 GiB; read with pread, they pass through the
/// decode buffer.
#[derive(Clone, Copy, Debug)]
pub enum Located<'a> {
    Bytes(&'a [u8]),
    File {
        file: &'a std::fs::File,
        at: u64,
        len: u64,
    },
}

impl<'a> Located<'a> {
    pub fn len(&self) -> u64 {
        match self {
            Located::Bytes(b) => b.len() as u64,
            Located::File { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `len` bytes from `from`, if they lie inside.
    pub fn part(&self, from: u64, len: u64) -> Option<Located<'a>> {
        let end = from.checked_add(len).filter(|&e| e <= self.len())?;
        Some(match *self {
            Located::Bytes(b) => Located::Bytes(&b[from as usize..end as usize]),
            Located::File { file, at, .. } => Located::File {
                file,
                at: at + from,
                len,
            },
        })
    }

    /// Copies the bytes into `out` (`len()` bytes).
    pub fn read_into(&self, out: &mut [u8]) -> io::Result<()> {
        match self {
            Located::Bytes(b) => {
                out.copy_from_slice(b);
                Ok(())
            }
            Located::File { file, at, .. } => {
                std::os::unix::fs::FileExt::read_exact_at(*file, out, *at)
            }
        }
    }
}

impl PartialEq for Located<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Located::Bytes(a), Located::Bytes(b)) => a == b,
            (
                Located::File { file, at, len },
                Located::File {
                    file: f2,
                    at: a2,
                    len: l2,
                },
            ) => std::ptr::eq(*file, *f2) && at == a2 && len == l2,
            _ => false,
        }
    }
}

impl Eq for Located<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_keep_their_codes_and_unknown_codes_are_none() {
        for (code, e) in Encoding::BY_CODE.iter().enumerate() {
            assert_eq!(e.code(), code as u32);
            assert_eq!(Encoding::from_code(code as u32), Some(*e));
        }
        assert_eq!(Encoding::from_code(7), None);
        assert_eq!(Encoding::from_code(u32::MAX), None);
    }
}
