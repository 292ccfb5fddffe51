//! The fixed-size catalog record. One per file, directory or symlink; 48 bytes plus the name.

/// File type bits, as in `st_mode`.
pub const S_IFMT: u32 = 0o170000;
pub const S_IFDIR: u32 = 0o040000;
pub const S_IFREG: u32 = 0o100000;
pub const S_IFLNK: u32 = 0o120000;

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

/// A catalog record. `repr(C)` and free of pointers, so a table of them can later be written to and
/// mapped from an index file as it is.
///
/// The meaning of `size` and `offset` depends on the kind:
/// - file: `size` bytes of data at `offset` in image `image`;
/// - directory: `size` children stored contiguously from entry index `offset`, sorted by name;
/// - symlink: the target is `size` bytes at `offset` in the names arena.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    pub offset: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
    /// Full `st_mode`: type bits and permission bits.
    pub mode: u32,
    /// Entry index of the parent directory (the root is its own parent).
    pub parent: u32,
    /// Start of this entry's name in the names arena.
    pub name_off: u32,
    pub image: u32,
    pub name_len: u16,
    pub _reserved: u16,
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

    pub fn permissions(&self) -> u16 {
        (self.mode & 0o7777) as u16
    }
}
