//! Squashfs v4 inodes and directory listings, decoded from their metadata tables as the walk
//! reaches them (`metadata::Table`). Only what packfs serves is kept: type, permissions, mtime,
//! a directory's listing, a file's data, a symlink's target.

use super::metadata::{Pos, Table};

/// `frag_index` of a file without a tail fragment.
pub const NO_FRAGMENT: u32 = u32::MAX;
/// A symlink target longer than this (Linux's PATH_MAX) is corruption.
pub const MAX_TARGET: u32 = 4096;

pub struct Inode {
    /// Permission bits (with setuid, setgid, sticky).
    pub mode: u16,
    pub mtime: u32,
    pub kind: Kind,
}

pub enum Kind {
    Dir(Listing),
    File(File),
    Symlink(Vec<u8>),
    Device,
    Ipc,
}

/// Where a directory's entries are in the directory table, and how many bytes they take.
#[derive(Clone, Copy)]
pub struct Listing {
    pub block: u32,
    pub offset: u16,
    pub bytes: u32,
}

/// A file's data: its blocks from `blocks_start`, its tail in fragment `fragment` at
/// `fragment_offset`, and where its block size words start in the inode table.
pub struct File {
    pub blocks_start: u64,
    pub size: u64,
    pub fragment: u32,
    pub fragment_offset: u32,
    pub words_at: Pos,
}

impl File {
    /// How many data blocks the file has (its tail, if any, is in a fragment).
    pub fn block_count(&self, block_size: u32) -> u64 {
        match self.fragment {
            NO_FRAGMENT => self.size.div_ceil(block_size as u64),
            _ => self.size / block_size as u64,
        }
    }
}

/// Little-endian fields, read in order from a metadata table.
struct Fields<'t, 'r> {
    table: &'t mut Table<'r>,
    pos: Pos,
}

impl Fields<'_, '_> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut b = [0u8; N];
        self.table.read(&mut self.pos, &mut b)?;
        Ok(b)
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.bytes()?))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
}

/// The inode a reference (metadata block relative to the inode table << 16 | offset) names.
pub fn read(table: &mut Table, reference: u64) -> Result<Inode, String> {
    let offset = (reference & 0xffff) as usize;
    let pos = table.at(reference >> 16, offset);
    let mut f = Fields { table, pos };
    let kind = f.u16()?;
    let mode = f.u16()? & 0o7777;
    let _uid_gid = f.u32()?;
    let mtime = f.u32()?;
    let _number = f.u32()?;
    let kind = match kind {
        1 => {
            let block = f.u32()?;
            let _links = f.u32()?;
            let size = f.u16()?;
            let offset = f.u16()?;
            Kind::Dir(Listing {
                block,
                offset,
                bytes: (size as u32).saturating_sub(3),
            })
        }
        8 => {
            let _links = f.u32()?;
            let size = f.u32()?;
            let block = f.u32()?;
            let _parent = f.u32()?;
            let _index_count = f.u16()?;
            let offset = f.u16()?;
            Kind::Dir(Listing {
                block,
                offset,
                bytes: size.saturating_sub(3),
            })
        }
        2 => {
            let blocks_start = f.u32()? as u64;
            let fragment = f.u32()?;
            let fragment_offset = f.u32()?;
            let size = f.u32()? as u64;
            Kind::File(File {
                blocks_start,
                size,
                fragment,
                fragment_offset,
                words_at: f.pos,
            })
        }
        9 => {
            let blocks_start = f.u64()?;
            let size = f.u64()?;
            let _sparse = f.u64()?;
            let _links = f.u32()?;
            let fragment = f.u32()?;
            let fragment_offset = f.u32()?;
            let _xattr = f.u32()?;
            Kind::File(File {
                blocks_start,
                size,
                fragment,
                fragment_offset,
                words_at: f.pos,
            })
        }
        3 | 10 => {
            let _links = f.u32()?;
            let len = f.u32()?;
            if len > MAX_TARGET {
                return Err(format!(
                    "a symlink target of {len} bytes (at most {MAX_TARGET})"
                ));
            }
            let mut target = vec![0u8; len as usize];
            f.table.read(&mut f.pos, &mut target)?;
            Kind::Symlink(target)
        }
        4 | 5 | 11 | 12 => Kind::Device,
        6 | 7 | 13 | 14 => Kind::Ipc,
        other => return Err(format!("unknown inode type {other}")),
    };
    Ok(Inode { mode, mtime, kind })
}

/// One entry of a directory listing.
pub struct Entry {
    pub name: Vec<u8>,
    /// The entry's inode reference.
    pub inode: u64,
}

/// Reads a directory's entries from the directory table, in order, calling `each` for every
/// one. A listing is runs of entries, each run behind a header naming the inode block they share.
pub fn list(
    table: &mut Table,
    listing: Listing,
    mut each: impl FnMut(Entry),
) -> Result<(), String> {
    let mut left = listing.bytes as u64;
    let pos = table.at(listing.block as u64, listing.offset as usize);
    let mut f = Fields { table, pos };
    while left > 0 {
        if left < 12 {
            return Err(format!("the listing ends {left} bytes into a header"));
        }
        let count = f.u32()? as u64 + 1;
        let block = f.u32()? as u64;
        let _base = f.u32()?;
        left -= 12;
        // mksquashfs writes at most 256 entries a run; the kernel refuses more.
        if count > 256 {
            return Err(format!("a run of {count} entries (at most 256)"));
        }
        for _ in 0..count {
            if left < 8 {
                return Err("the listing ends inside an entry".into());
            }
            let offset = f.u16()? as u64;
            let _inode_delta = f.u16()?;
            let _kind = f.u16()?;
            let len = f.u16()? as u64 + 1;
            if len > 256 || left < 8 + len {
                return Err(format!(
                    "an entry name of {len} bytes past the listing's end"
                ));
            }
            let mut name = vec![0u8; len as usize];
            f.table.read(&mut f.pos, &mut name)?;
            left -= 8 + len;
            each(Entry {
                name,
                inode: block << 16 | offset,
            });
        }
    }
    Ok(())
}

/// A file's block size words (`count` of them) into `words`.
pub fn block_words(
    table: &mut Table,
    file: &File,
    count: u64,
    words: &mut Vec<u32>,
) -> Result<(), String> {
    words.clear();
    let mut pos = file.words_at;
    let mut raw = [0u8; 4];
    for _ in 0..count {
        table.read(&mut pos, &mut raw)?;
        words.push(u32::from_le_bytes(raw));
    }
    Ok(())
}
