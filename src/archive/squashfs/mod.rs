//! Squashfs v4 images. The metadata (inodes, directories, fragment table) is parsed once with
//! backhand into members; each file's data blocks and tail become a `BlockMap` record, from which
//! packfs's own block reader serves reads (backhand's file reader serializes all reads behind one
//! lock and its fragment cache is unbounded, so it stays off the read path).

pub mod block_map;
mod superblock;

use std::io::BufReader;
use std::os::unix::ffi::OsStrExt;

use backhand::{FilesystemReader, InnerNode, SquashfsFileReader};

use super::codec::Codec;
use super::name::sanitize;
use super::{ArchiveError, Encoding, Member, MemberKind, ScannedImage, Span};
use crate::source::read_at::{Cursor, ReadAt};
use block_map::{BlockMap, Extent, STORED, Tail};
use superblock::Superblock;

/// `frag_index` of a file without a tail fragment.
const NO_FRAGMENT: usize = u32::MAX as usize;

pub fn scan(file: &dyn ReadAt, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let mut head = [0u8; superblock::LEN];
    let n = file
        .read_up_to(&mut head, 0)
        .map_err(|e| ArchiveError::io(&path, e))?;
    let sb = Superblock::decode(&head[..n], image.size)
        .map_err(|(offset, why)| ArchiveError::malformed(&path, offset, why))?;
    let reader = Cursor::new(file, image.size);
    // The parser is given untrusted metadata: a panic inside it is a corrupt image, not a crash.
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        FilesystemReader::from_reader(BufReader::with_capacity(64 * 1024, reader))
    }));
    let fs = match parsed {
        Ok(Ok(fs)) => fs,
        Ok(Err(e)) => return Err(metadata_error(&path, &sb, &e.to_string())),
        Err(_) => return Err(metadata_error(&path, &sb, "the parser failed on it")),
    };
    let fragments = fs.fragments.as_deref().unwrap_or(&[]);
    // Scratch buffers reused for every file.
    let (mut record, mut words) = (Vec::new(), Vec::new());
    for node in fs.files() {
        image.headers += 1;
        let raw = node.fullpath.as_os_str().as_bytes();
        let mut member = Member {
            path: Span::default(),
            link: Span::default(),
            kind: MemberKind::Dir,
            mode: (node.header.permissions & 0o7777) as u32,
            mtime: node.header.mtime as i64,
            mtime_nsec: 0,
            size: 0,
            data_offset: 0,
            encoding: Encoding::Stored,
            header_offset: 0,
        };
        let skip = |image: &mut ScannedImage, offset: u64, why: &str| image.skip(offset, raw, why);
        let clean = match sanitize(raw) {
            Ok(clean) => clean,
            Err(why) => {
                skip(image, 0, &why.to_string());
                continue;
            }
        };
        match &node.inner {
            InnerNode::Dir(_) => {}
            InnerNode::Symlink(link) => {
                member.kind = MemberKind::Symlink;
                member.link = image.push_string(link.link.as_os_str().as_bytes());
            }
            InnerNode::File(f) => {
                record.clear();
                match block_record(&sb, fragments, f, &mut words, &mut record) {
                    Ok(()) => {}
                    Err(why) => {
                        skip(image, f.blocks_start(), &why);
                        continue;
                    }
                }
                member.kind = MemberKind::File;
                member.size = f.file_len() as u64;
                member.data_offset = f.blocks_start();
                member.header_offset = f.blocks_start();
                member.encoding = Encoding::Squashfs;
                member.link = image.push_string(&record);
            }
            InnerNode::CharacterDevice(_) | InnerNode::BlockDevice(_) => {
                skip(image, 0, "device nodes are not served");
                continue;
            }
            InnerNode::NamedPipe | InnerNode::Socket => {
                skip(image, 0, "named pipes and sockets are not served");
                continue;
            }
        }
        member.path = image.push_string(&clean);
        image.members.push(member);
    }
    Ok(())
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

/// Encodes a file's block map into `out`, after checking that it stays inside the image.
fn block_record(
    sb: &Superblock,
    fragments: &[backhand::Fragment],
    f: &SquashfsFileReader,
    words: &mut Vec<u32>,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let size = f.file_len() as u64;
    let bs = sb.block_size;
    words.clear();
    for d in f.block_sizes() {
        if d.size() > bs {
            return Err(format!(
                "a data block of {} bytes is larger than the block size",
                d.size()
            ));
        }
        words.push(d.size() | if d.uncompressed() { STORED } else { 0 });
    }
    let tail = match f.frag_index() {
        NO_FRAGMENT => None,
        i => {
            let frag = fragments
                .get(i)
                .ok_or_else(|| format!("fragment {i} is not in the fragment table"))?;
            let word = frag.size.size() | if frag.size.uncompressed() { STORED } else { 0 };
            let block = Extent {
                start: frag.start,
                word,
            };
            if block.disk_len() > bs
                || block.start.saturating_add(block.disk_len() as u64) > sb.bytes_used
            {
                return Err(format!(
                    "fragment block {i} ({} bytes at offset {}) is corrupt",
                    block.disk_len(),
                    block.start
                ));
            }
            let tail_len = size % bs as u64;
            if f.block_offset() as u64 + tail_len > bs as u64 {
                return Err(format!(
                    "its tail ({tail_len} bytes at {} in fragment {i}) overruns the block",
                    f.block_offset()
                ));
            }
            Some(Tail {
                block,
                offset: f.block_offset(),
            })
        }
    };
    block_map::encode(
        sb.codec,
        sb.block_log as u8,
        f.blocks_start(),
        words,
        tail,
        out,
    );
    let map = BlockMap::decode(out).expect("a record just encoded");
    map.check_size(size)?;
    if map.blocks_end() > sb.bytes_used {
        return Err(format!(
            "its data blocks end at offset {}, past the end of the image ({})",
            map.blocks_end(),
            sb.bytes_used
        ));
    }
    Ok(())
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
