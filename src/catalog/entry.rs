//! The fixed-size catalog record. One per file, directory or symlink; 48 bytes plus the name.

use crate::archive::Encoding;

/// File type bits, as in `st_mode`.
pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

/// Bits of `mode` above the `st_mode` ones that hold a file's `Encoding`.
const ENCODING_SHIFT: u32 = 16;

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// A catalog record. `repr(C)`, integers only and without padding, so a table of them is written to
/// an index file as it is and read back through a mapping (little-endian hosts only).
///
/// The meaning of `size` and `offset` depends on the kind:
/// - file: `size` bytes of data at `offset` in image `image`; for a squashfs file, `offset` is
///   where its block map record starts in the names arena;
/// - directory: `size` children stored contiguously from entry index `offset`, sorted by name;
/// - symlink: the target is `size` bytes at `offset` in the names arena.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    pub offset: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// Full `st_mode` (type bits and permission bits), and above them the file's encoding.
    pub mode: u32,
    /// Entry index of the parent directory (the root is its own parent).
    pub parent: u32,
    /// Start of this entry's name in the names arena: low 32 bits (see `name_offset`).
    pub name_off: u32,
    pub image: u32,
    pub name_len: u16,
    /// High 16 bits of the name offset: names may fill 256 TiB.
    pub name_off_hi: u16,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 48);

impl Entry {
    pub fn kind(&self) -> Kind {
        match self.mode & S_IFMT {
            S_IFDIR => Kind::Dir,
            S_IFLNK => Kind::Symlink,
            _ => Kind::File,
        }
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == Kind::Dir
    }

    pub fn name_offset(&self) -> u64 {
        (self.name_off_hi as u64) << 32 | self.name_off as u64
    }

    /// Sets the name offset; `None` if it does not fit in 48 bits.
    pub fn set_name_offset(&mut self, offset: u64) -> Option<()> {
        if offset >> 48 != 0 {
            return None;
        }
        self.name_off = offset as u32;
        self.name_off_hi = (offset >> 32) as u16;
        Some(())
    }

    /// How the file's bytes are stored at `offset` of its image; the code itself when no
    /// encoding has it (a damaged or crafted index: never read as stored bytes).
    pub fn encoding(&self) -> Result<Encoding, u32> {
        let code = self.mode >> ENCODING_SHIFT;
        Encoding::from_code(code).ok_or(code)
    }

    /// The `mode` bits that record `encoding`.
    pub fn encoding_bits(encoding: Encoding) -> u32 {
        encoding.code() << ENCODING_SHIFT
    }

    pub fn permissions(&self) -> u16 {
        (self.mode & 0o7777) as u16
    }
}
