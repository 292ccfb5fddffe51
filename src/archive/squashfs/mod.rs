//! Squashfs v4 images. The metadata (inodes, directories, the fragment table) is read on demand,
//! a metadata block at a time through a small cache (`metadata`, `inode`), and walked into
//! members; each file's data blocks and tail become a `BlockMap` record, from which packfs's own
//! block reader serves reads. A scan holds a few metadata blocks, not the tables: those can
//! claim to decode to far more than the image (a 69 KB image's to 139 MB, as backhand, which
//! packfs used before, held them).

pub mod block_map;
mod inode;
mod metadata;
mod superblock;

use std::collections::{HashSet, VecDeque};

use super::codec::Codec;
use super::name::sanitize;
use super::{ArchiveError, Encoding, Member, MemberKind, ScannedImage, Span};
use crate::source::read_at::ReadAt;
use block_map::{BlockMap, Extent, STORED, Tail};
use inode::{Kind, NO_FRAGMENT};
use metadata::{Pos, Table};
use superblock::Superblock;

/// The longest path a member may have (Linux's PATH_MAX): deeper entries are skipped.
const MAX_PATH: usize = 4096;
/// Fragment table entries per metadata block.
const FRAGMENTS_PER_BLOCK: u64 = 512;

pub fn scan(file: &dyn ReadAt, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let mut head = [0u8; superblock::LEN];
    let n = file
        .read_up_to(&mut head, 0)
        .map_err(|e| ArchiveError::io(&path, e))?;
    let sb = Superblock::decode(&head[..n], image.size)
        .map_err(|(offset, why)| ArchiveError::malformed(&path, offset, why))?;
    let mut walk = Walk {
        sb,
        file,
        inodes: Table::new(
            file,
            sb.codec,
            sb.inode_table,
            sb.end_of(sb.inode_table),
            "inode table",
        ),
        dirs: Table::new(
            file,
            sb.codec,
            sb.dir_table,
            sb.end_of(sb.dir_table),
            "directory table",
        ),
        fragments: Table::new(file, sb.codec, 0, sb.bytes_used, "fragment table"),
        fragment_index: None,
        // Every block word a record holds costs 4 bytes of catalog: an image cannot make packfs
        // keep more of them than it has bytes (plus room for sparse files).
        words_left: sb.bytes_used.saturating_add(1 << 20),
        words: Vec::new(),
        record: Vec::new(),
    };
    let root = inode::read(&mut walk.inodes, sb.root_inode)
        .map_err(|why| metadata_error(&path, &sb, &format!("the root inode: {why}")))?;
    let Kind::Dir(listing) = root.kind else {
        return Err(metadata_error(
            &path,
            &sb,
            "the root inode is not a directory",
        ));
    };
    image.headers += 1;
    let root_member = Member {
        path: image.push_string(b""),
        ..attributes(&root)
    };
    image.members.push(root_member);
    // Breadth first; each directory once (a listing that names an ancestor would loop).
    let mut seen = HashSet::from([sb.root_inode]);
    let mut queue = VecDeque::from([(Vec::new(), listing, sb.root_inode)]);
    let mut entries = Vec::new();
    while let Some((dir, listing, reference)) = queue.pop_front() {
        entries.clear();
        let listed = inode::list(&mut walk.dirs, listing, |e| entries.push(e));
        if let Err(why) = listed {
            let why = format!("cannot read its directory listing: {why}");
            if reference == sb.root_inode {
                return Err(metadata_error(&path, &sb, &why));
            }
            // The directory itself was served; what its listing held is lost, with a warning.
            image.headers += 1;
            image.skip(
                sb.dir_table,
                &dir,
                &format!("{why} (its entries are left out)"),
            );
        }
        for entry in entries.drain(..) {
            image.headers += 1;
            let mut raw = dir.clone();
            raw.push(b'/');
            raw.extend_from_slice(&entry.name);
            if entry.name.contains(&b'/') || entry.name == b"." || entry.name == b".." {
                image.skip(0, &raw, "an entry name with '/' or that is '.' or '..'");
                continue;
            }
            if raw.len() > MAX_PATH {
                image.skip(0, &raw, "its path is longer than 4096 bytes");
                continue;
            }
            match walk.member(image, &raw, entry.inode) {
                Ok(Some(listing)) => {
                    if seen.insert(entry.inode) {
                        queue.push_back((raw, listing, entry.inode));
                    } else {
                        image.headers += 1;
                        image.skip(0, &raw, "a directory listed twice (a loop in the image)");
                    }
                }
                Ok(None) => {}
                Err((offset, why)) => image.skip(offset, &raw, &why),
            }
        }
    }
    Ok(())
}

/// A member with an inode's mode and mtime, shaped as a directory (the caller sets the rest).
fn attributes(node: &inode::Inode) -> Member {
    Member {
        path: Span::default(),
        link: Span::default(),
        kind: MemberKind::Dir,
        mode: node.mode as u32,
        mtime: node.mtime as i64,
        mtime_nsec: 0,
        size: 0,
        data_offset: 0,
        encoding: Encoding::Stored,
        header_offset: 0,
    }
}

/// The walk's state: the tables it reads and the scratch buffers of block records.
struct Walk<'r> {
    sb: Superblock,
    file: &'r dyn ReadAt,
    inodes: Table<'r>,
    dirs: Table<'r>,
    fragments: Table<'r>,
    /// The last fragment index slot read: (slot, image offset of its metadata block).
    fragment_index: Option<(u64, u64)>,
    words_left: u64,
    words: Vec<u32>,
    record: Vec<u8>,
}

impl Walk<'_> {
    /// Adds the member `raw` whose inode `reference` names; a directory's listing is returned, to
    /// be walked. Errors are (offset, why) for a skip.
    fn member(
        &mut self,
        image: &mut ScannedImage,
        raw: &[u8],
        reference: u64,
    ) -> Result<Option<inode::Listing>, (u64, String)> {
        let at = self.sb.inode_table.saturating_add(reference >> 16);
        let node = inode::read(&mut self.inodes, reference)
            .map_err(|why| (at, format!("its inode is unreadable: {why}")))?;
        let clean = sanitize(raw).map_err(|why| (at, why.to_string()))?;
        let mut member = attributes(&node);
        let mut listing = None;
        match node.kind {
            Kind::Dir(l) => listing = Some(l),
            Kind::Symlink(target) => {
                member.kind = MemberKind::Symlink;
                member.link = image.push_string(&target);
            }
            Kind::File(f) => {
                self.block_record(&f).map_err(|why| (f.blocks_start, why))?;
                member.kind = MemberKind::File;
                member.size = f.size;
                member.data_offset = f.blocks_start;
                member.header_offset = f.blocks_start;
                member.encoding = Encoding::Squashfs;
                member.link = image.push_string(&self.record);
            }
            Kind::Device => return Err((at, "device nodes are not served".into())),
            Kind::Ipc => return Err((at, "named pipes and sockets are not served".into())),
        }
        member.path = image.push_string(&clean);
        image.members.push(member);
        Ok(listing)
    }

    /// Encodes a file's block map into `self.record`, after checking that it stays inside the
    /// image.
    fn block_record(&mut self, f: &inode::File) -> Result<(), String> {
        let sb = self.sb;
        let bs = sb.block_size;
        let count = f.block_count(bs);
        if count > self.words_left {
            return Err(format!(
                "its {count} data blocks are more than an image of {} bytes can hold",
                sb.bytes_used
            ));
        }
        self.words_left -= count;
        inode::block_words(&mut self.inodes, f, count, &mut self.words)
            .map_err(|why| format!("its block list is unreadable: {why}"))?;
        for &w in &self.words {
            let len = w & !STORED;
            if len > bs {
                return Err(format!(
                    "a data block of {len} bytes is larger than the block size"
                ));
            }
        }
        let tail = match f.fragment {
            NO_FRAGMENT => None,
            i => {
                let block = self.fragment(i)?;
                if block.disk_len() > bs
                    || block.start.saturating_add(block.disk_len() as u64) > sb.bytes_used
                {
                    return Err(format!(
                        "fragment block {i} ({} bytes at offset {}) is corrupt",
                        block.disk_len(),
                        block.start
                    ));
                }
                let tail_len = f.size % bs as u64;
                if f.fragment_offset as u64 + tail_len > bs as u64 {
                    return Err(format!(
                        "its tail ({tail_len} bytes at {} in fragment {i}) overruns the block",
                        f.fragment_offset
                    ));
                }
                Some(Tail {
                    block,
                    offset: f.fragment_offset,
                })
            }
        };
        self.record.clear();
        block_map::encode(
            sb.codec,
            sb.block_log as u8,
            f.blocks_start,
            &self.words,
            tail,
            &mut self.record,
        );
        let map = BlockMap::decode(&self.record).expect("a record just encoded");
        map.check_size(f.size)?;
        if map.blocks_end() > sb.bytes_used {
            return Err(format!(
                "its data blocks end at offset {}, past the end of the image ({})",
                map.blocks_end(),
                sb.bytes_used
            ));
        }
        Ok(())
    }

    /// Fragment block `i`: where it is and its size word, from the fragment table.
    fn fragment(&mut self, i: u32) -> Result<Extent, String> {
        let missing = || format!("fragment {i} is not in the fragment table");
        if i >= self.sb.fragment_count {
            return Err(missing());
        }
        let slot = i as u64 / FRAGMENTS_PER_BLOCK;
        let block = match self.fragment_index {
            Some((s, block)) if s == slot => block,
            _ => {
                let at = self.sb.fragment_table.saturating_add(slot * 8);
                if at.saturating_add(8) > self.sb.bytes_used {
                    return Err(missing());
                }
                let mut word = [0u8; 8];
                self.file
                    .read_exact_at(&mut word, at)
                    .map_err(|e| format!("cannot read the fragment table at offset {at}: {e}"))?;
                let block = u64::from_le_bytes(word);
                self.fragment_index = Some((slot, block));
                block
            }
        };
        let mut pos = Pos {
            block,
            offset: ((i as u64 % FRAGMENTS_PER_BLOCK) * 16) as usize,
        };
        let mut entry = [0u8; 16];
        self.fragments
            .read(&mut pos, &mut entry)
            .map_err(|why| format!("fragment {i}: {why}"))?;
        let start = u64::from_le_bytes(entry[0..8].try_into().expect("8 bytes"));
        let size = u32::from_le_bytes(entry[8..12].try_into().expect("4 bytes"));
        if size & !(STORED | (STORED - 1)) != 0 {
            return Err(format!("fragment {i} has a corrupt size word {size:#x}"));
        }
        Ok(Extent {
            start,
            // The on-disk word: length, and bit 24 for a block stored uncompressed (STORED).
            word: size,
        })
    }
}

/// The codec of a squashfs compressor id; the error is a sentence for the user.
pub fn codec_from_id(id: u16) -> Result<Codec, String> {
    Ok(match id {
        1 => Codec::Zlib,
        4 => Codec::Xz,
        5 => Codec::Lz4,
        6 => Codec::Zstd,
        2 | 3 => {
            let name = if id == 2 { "lzma" } else { "lzo" };
            return Err(format!(
                "{name}-compressed squashfs images are not supported; rebuild the image with \
                 `mksquashfs ... -comp zstd` (or gzip, xz, lz4)"
            ));
        }
        other => return Err(format!("unknown squashfs compressor id {other}")),
    })
}

/// The squashfs compressor id of a codec (the id block-map records keep).
pub fn codec_id(codec: Codec) -> u8 {
    match codec {
        Codec::Zlib => 1,
        Codec::Xz => 4,
        Codec::Lz4 => 5,
        Codec::Zstd => 6,
        // Never stored in a block map: squashfs has no such compressor.
        Codec::Deflate | Codec::XzBlock { .. } | Codec::Bzip2Block { .. } => 0,
    }
}

fn metadata_error(path: &std::path::Path, sb: &Superblock, why: &str) -> ArchiveError {
    ArchiveError::malformed(
        path,
        sb.inode_table,
        format!(
            "cannot read the squashfs inode and directory tables (inode table at offset {}, \
             directory table at offset {}): {why}; the image is corrupt or truncated",
            sb.inode_table, sb.dir_table
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_compressors_are_named() {
        assert!(codec_from_id(3).unwrap_err().contains("lzo"));
        assert!(codec_from_id(2).unwrap_err().contains("lzma"));
        assert!(codec_from_id(9).unwrap_err().contains("9"));
        assert_eq!(codec_from_id(6).unwrap(), Codec::Zstd);
        for codec in [Codec::Zlib, Codec::Xz, Codec::Lz4, Codec::Zstd] {
            assert_eq!(codec_from_id(codec_id(codec) as u16), Ok(codec));
        }
    }
}
