//! The squashfs v4 superblock, checked before the metadata parser runs, so that a damaged or
//! unsupported image fails with a message naming the field and its offset.

use super::codec_from_id;
use crate::archive::codec::Codec;
use crate::util::le::{u16_at, u32_at, u64_at};

pub const LEN: usize = 96;
const NO_TABLE: u64 = u64::MAX;

#[derive(Clone, Copy, Debug)]
pub struct Superblock {
    pub codec: Codec,
    pub block_size: u32,
    pub block_log: u16,
    pub bytes_used: u64,
    pub inode_table: u64,
    pub dir_table: u64,
    /// The root directory's inode reference.
    pub root_inode: u64,
    pub fragment_count: u32,
    /// Where the fragment table's index (the image offsets of its metadata blocks) is, if any.
    pub fragment_table: u64,
    /// Every table's start (absent ones: `bytes_used`), for `end_of`.
    starts: [u64; 6],
}

impl Superblock {
    /// Where the table that starts at `start` ends: at the next table's start, or the image's end.
    pub fn end_of(&self, start: u64) -> u64 {
        self.starts
            .iter()
            .copied()
            .filter(|&s| s > start)
            .min()
            .unwrap_or(self.bytes_used)
            .min(self.bytes_used)
    }

    /// Decodes the superblock of an image of `file_len` bytes. Errors are (offset, reason).
    pub fn decode(b: &[u8], file_len: u64) -> Result<Superblock, (u64, String)> {
        if b.len() < LEN {
            return Err((
                0,
                format!("truncated squashfs superblock ({} bytes)", b.len()),
            ));
        }
        if &b[..4] != b"hsqs" {
            return Err((0, "no squashfs magic (hsqs)".into()));
        }
        let (major, minor) = (u16_at(b, 28), u16_at(b, 30));
        if (major, minor) != (4, 0) {
            return Err((
                28,
                format!("squashfs version {major}.{minor}; only version 4.0 is supported"),
            ));
        }
        let codec = codec_from_id(u16_at(b, 20)).map_err(|e| (20, e))?;
        let block_size = u32_at(b, 12);
        let block_log = u16_at(b, 22);
        if !(4096..=1 << 20).contains(&block_size)
            || !block_size.is_power_of_two()
            || 1u32.checked_shl(block_log as u32) != Some(block_size)
        {
            return Err((
                12,
                format!("bad block size {block_size} (block_log {block_log}): corrupt superblock"),
            ));
        }
        let bytes_used = u64_at(b, 40);
        let mut starts = [48, 56, 64, 72, 80, 88].map(|at| u64_at(b, at));
        for s in &mut starts {
            if *s == NO_TABLE {
                *s = bytes_used;
            }
        }
        let sb = Superblock {
            codec,
            block_size,
            block_log,
            bytes_used,
            inode_table: u64_at(b, 64),
            dir_table: u64_at(b, 72),
            root_inode: u64_at(b, 32),
            fragment_count: u32_at(b, 16),
            fragment_table: u64_at(b, 80),
            starts,
        };
        if sb.bytes_used > file_len {
            return Err((
                40,
                format!(
                    "the superblock says the image has {} bytes but the file has {file_len}: \
                     truncated copy?",
                    sb.bytes_used
                ),
            ));
        }
        let tables = [
            (48, "id table"),
            (56, "xattr table"),
            (64, "inode table"),
            (72, "directory table"),
            (80, "fragment table"),
            (88, "export table"),
        ];
        for (at, what) in tables {
            let start = u64_at(b, at);
            let optional = !matches!(at, 48 | 64 | 72);
            if (start == NO_TABLE && optional) || (start >= LEN as u64 && start < sb.bytes_used) {
                continue;
            }
            return Err((
                at as u64,
                format!(
                    "the {what} start {start} lies outside the image (0..{}): corrupt superblock",
                    sb.bytes_used
                ),
            ));
        }
        if sb.inode_table >= sb.dir_table {
            return Err((
                64,
                "the inode table does not come before the directory table: corrupt superblock"
                    .into(),
            ));
        }
        Ok(sb)
    }
}
