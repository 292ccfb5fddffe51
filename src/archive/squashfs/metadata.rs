//! Squashfs metadata (inodes, directories, the fragment table) read on demand: a metadata block
//! (at most 8 KiB decoded) is read and decoded when the walk reaches it, through a cache of a
//! few blocks, as squashfuse and the kernel read it. Holding the whole tables decoded made a
//! 69 KB image take 139 MB and a 774 KB one gigabytes (their tables claim to decode to that);
//! read this way, a scan holds a few blocks whatever the tables say.

use crate::archive::codec::Codec;
use crate::source::read_at::ReadAt;

/// Decoded bytes of a metadata block, at most.
pub const BLOCK: usize = 8192;
/// Decoded blocks kept: the walk alternates between a directory listing and its inodes, each
/// read front to back, so a few suffice.
const CACHED: usize = 16;

/// A place in a metadata table: the image offset of a block's header, and a byte in its
/// decoded contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pos {
    pub block: u64,
    pub offset: usize,
}

struct Cached {
    at: u64,
    /// The image offset of the block after it.
    next: u64,
    bytes: Vec<u8>,
    used: u64,
}

/// Reads the metadata blocks of one table, `[start, end)` of the image.
pub struct Table<'r> {
    file: &'r dyn ReadAt,
    codec: Codec,
    pub start: u64,
    end: u64,
    what: &'static str,
    cache: Vec<Cached>,
    tick: u64,
    packed: Vec<u8>,
}

impl<'r> Table<'r> {
    pub fn new(
        file: &'r dyn ReadAt,
        codec: Codec,
        start: u64,
        end: u64,
        what: &'static str,
    ) -> Table<'r> {
        Table {
            file,
            codec,
            start,
            end,
            what,
            cache: Vec::with_capacity(CACHED),
            tick: 0,
            packed: Vec::new(),
        }
    }

    /// The place of a reference's (block relative to the table's start, offset) pair.
    pub fn at(&self, block: u64, offset: usize) -> Pos {
        Pos {
            block: self.start.saturating_add(block),
            offset,
        }
    }

    /// Fills `buf` from `pos` on, across blocks, and moves `pos` past it. The error says where
    /// and why, for the user.
    pub fn read(&mut self, pos: &mut Pos, buf: &mut [u8]) -> Result<(), String> {
        let mut done = 0;
        while done < buf.len() {
            let slot = self.load(pos.block)?;
            let cached = &self.cache[slot];
            if pos.offset >= cached.bytes.len() {
                if pos.offset > cached.bytes.len() {
                    return Err(format!(
                        "a reference to byte {} of the {} block at offset {}, which holds {}",
                        pos.offset,
                        self.what,
                        pos.block,
                        cached.bytes.len()
                    ));
                }
                *pos = Pos {
                    block: cached.next,
                    offset: 0,
                };
                continue;
            }
            let n = (cached.bytes.len() - pos.offset).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&cached.bytes[pos.offset..pos.offset + n]);
            done += n;
            pos.offset += n;
        }
        Ok(())
    }

    /// The cache slot of the block whose header is at `at`, read and decoded if needed.
    fn load(&mut self, at: u64) -> Result<usize, String> {
        self.tick += 1;
        if let Some(i) = self.cache.iter().position(|c| c.at == at) {
            self.cache[i].used = self.tick;
            return Ok(i);
        }
        let bad = |why: String| format!("the {} block at offset {at}: {why}", self.what);
        if at < self.start || at.saturating_add(2) > self.end {
            return Err(bad(format!(
                "outside its table ({}..{})",
                self.start, self.end
            )));
        }
        let mut head = [0u8; 2];
        self.file
            .read_exact_at(&mut head, at)
            .map_err(|e| bad(e.to_string()))?;
        let word = u16::from_le_bytes(head);
        let (stored, len) = (word & 0x8000 != 0, (word & 0x7fff) as usize);
        let next = at + 2 + len as u64;
        if len == 0 || len > BLOCK || next > self.end {
            return Err(bad(format!(
                "its header says {len} bytes, a metadata block holds 1 to {BLOCK} and must end \
                 by offset {}",
                self.end
            )));
        }
        self.packed.resize(len, 0);
        self.file
            .read_exact_at(&mut self.packed, at + 2)
            .map_err(|e| bad(e.to_string()))?;
        let slot = if self.cache.len() < CACHED {
            self.cache.push(Cached {
                at,
                next,
                bytes: Vec::with_capacity(BLOCK),
                used: 0,
            });
            self.cache.len() - 1
        } else {
            let (i, _) = self
                .cache
                .iter()
                .enumerate()
                .min_by_key(|(_, c)| c.used)
                .expect("a full cache");
            i
        };
        let entry = &mut self.cache[slot];
        // Invalid until decoded: a failed decode must not leave another block's bytes here.
        entry.at = u64::MAX;
        if stored {
            entry.bytes.clear();
            entry.bytes.extend_from_slice(&self.packed);
        } else {
            self.codec
                .decompress(&self.packed, BLOCK, &mut entry.bytes)
                .map_err(|e| bad(e.to_string()))?;
        }
        if entry.bytes.is_empty() {
            return Err(bad("it decodes to nothing".into()));
        }
        entry.at = at;
        entry.next = next;
        entry.used = self.tick;
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two stored blocks of 5 and 3 bytes, then a block whose header claims 9000 bytes.
    fn image() -> Vec<u8> {
        let mut img = vec![0xee; 10];
        img.extend_from_slice(&(0x8000u16 | 5).to_le_bytes());
        img.extend_from_slice(b"hello");
        img.extend_from_slice(&(0x8000u16 | 3).to_le_bytes());
        img.extend_from_slice(b"abc");
        img.extend_from_slice(&(9000u16).to_le_bytes());
        img.extend_from_slice(&[0; 16]);
        img
    }

    #[test]
    fn reads_cross_blocks_and_bad_headers_are_named() {
        let img = image();
        let mut t = Table::new(&img, Codec::Zlib, 10, img.len() as u64, "inode table");
        let mut pos = t.at(0, 3);
        let mut buf = [0u8; 4];
        t.read(&mut pos, &mut buf).unwrap();
        assert_eq!(&buf, b"loab");
        assert_eq!(
            pos,
            Pos {
                block: 17,
                offset: 2
            }
        );
        let mut one = [0u8; 1];
        t.read(&mut pos, &mut one).unwrap();
        assert_eq!(&one, b"c");
        let err = t.read(&mut pos, &mut one).unwrap_err();
        assert!(
            err.contains("at offset 22") && err.contains("9000 bytes"),
            "{err}"
        );
        let mut far = t.at(1000, 0);
        let err = t.read(&mut far, &mut one).unwrap_err();
        assert!(err.contains("outside its table"), "{err}");
        let mut past = t.at(0, 6);
        let err = t.read(&mut past, &mut one).unwrap_err();
        assert!(err.contains("byte 6"), "{err}");
    }
}
