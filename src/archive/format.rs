//! Telling image formats apart by content, never by file name.

use std::io;

use crate::source::read_at::ReadAt;

/// The first bytes of a packfs index file.
pub const INDEX_MAGIC: &[u8; 8] = b"PACKFSIX";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tar,
    Zip,
    Squashfs,
    /// Not an image: a packfs index (`catalog::index`), recognized here so that a scan reads each
    /// file's first bytes once.
    PackfsIndex,
    /// A compressed stream (a .tar.gz, .tar.zst, ...), refused with the command that unpacks it.
    Compressed(Compression),
    /// The JSON manifest `packfs pack` writes beside its shards (a wids shard index): given to
    /// `mount` by mistake, it was scanned as a tar and refused for a bad checksum.
    PackManifest,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    pub name: &'static str,
    /// The command that decompresses the file in place, keeping the original.
    pub command: &'static str,
}

/// Stream magics and what undoes them.
const COMPRESSIONS: [(&[u8], Compression); 6] = [
    (
        b"\x1f\x8b",
        Compression {
            name: "gzip",
            command: "gzip -dk",
        },
    ),
    (
        b"\x28\xb5\x2f\xfd",
        Compression {
            name: "zstd",
            command: "zstd -d",
        },
    ),
    (
        b"\xfd7zXZ\x00",
        Compression {
            name: "xz",
            command: "xz -dk",
        },
    ),
    (
        b"BZh",
        Compression {
            name: "bzip2",
            command: "bzip2 -dk",
        },
    ),
    (
        b"\x04\x22\x4d\x18",
        Compression {
            name: "lz4",
            command: "lz4 -d",
        },
    ),
    (
        b"LZIP",
        Compression {
            name: "lzip",
            command: "lzip -dk",
        },
    ),
];

/// How far from its end a zip's end record can be: its 22 bytes and a comment of up to 64 KiB.
const EOCD_REACH: u64 = 22 + 65_535;

impl Format {
    /// Zip by its first local header, or by its end record when something precedes the archive
    /// (self-extracting zips, padded ones) and the start is no tar header; squashfs by its
    /// superblock magic; compressed streams by their magic; anything else is scanned as tar
    /// (whose scanner names what is wrong).
    pub fn detect(file: &dyn ReadAt, len: u64) -> io::Result<Format> {
        let mut head = [0u8; 512];
        let n = file.read_up_to(&mut head, 0)?;
        let head = &head[..n];
        if head.starts_with(INDEX_MAGIC) {
            return Ok(Format::PackfsIndex);
        }
        if head.starts_with(b"PK\x03\x04") || head.starts_with(b"PK\x05\x06") {
            return Ok(Format::Zip);
        }
        if head.starts_with(b"hsqs") {
            return Ok(Format::Squashfs);
        }
        if let Some((_, c)) = COMPRESSIONS
            .iter()
            .find(|(magic, _)| head.starts_with(magic))
        {
            return Ok(Format::Compressed(*c));
        }
        // A zstd stream may open with a skippable frame (pzstd writes one before each frame).
        if head.len() >= 4 && head[1..4] == [0x2A, 0x4D, 0x18] && head[0] & 0xF0 == 0x50 {
            return Ok(Format::Compressed(COMPRESSIONS[1].1));
        }
        if n == 512 && super::tar::is_header(head) || head.iter().all(|&b| b == 0) {
            return Ok(Format::Tar);
        }
        if is_pack_manifest(head) {
            return Ok(Format::PackManifest);
        }
        Ok(if has_zip_end(file, len)? {
            Format::Zip
        } else {
            Format::Tar
        })
    }
}

/// A JSON object naming a shard list, as `pack::manifest` writes it.
fn is_pack_manifest(head: &[u8]) -> bool {
    let text = head.trim_ascii_start();
    text.starts_with(b"{")
        && [&b"\"shardlist\""[..], b"wids-shard-index"]
            .iter()
            .any(|key| text.windows(key.len()).any(|w| w == *key))
}

/// Whether a zip end-of-central-directory record lies within reach of the end of the file.
fn has_zip_end(file: &dyn ReadAt, len: u64) -> io::Result<bool> {
    let start = len.saturating_sub(EOCD_REACH);
    let mut tail = vec![0u8; (len - start) as usize];
    file.read_exact_at(&mut tail, start)?;
    Ok(tail.windows(4).any(|w| w == b"PK\x05\x06"))
}
