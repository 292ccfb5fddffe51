//! Reads of an object through whole aligned blocks, for the scanner's many small reads (tar
//! headers, zip directory entries, squashfs metadata): a few requests instead of one per read.

use std::io;
use std::sync::{Arc, Mutex};

use super::read_at::ReadAt;

/// Block size of a scan's reads of an object.
pub const SCAN_BLOCK: u64 = 4 << 20;

/// Reads through whole aligned blocks, keeping the last two: for one reader walking an object
/// mostly forwards.
pub struct Blocks {
    inner: Arc<dyn ReadAt>,
    block: u64,
    kept: Mutex<Vec<(u64, Arc<Vec<u8>>)>>,
}

impl Blocks {
    pub fn new(inner: Arc<dyn ReadAt>, block: u64) -> Blocks {
        Blocks {
            inner,
            block,
            kept: Default::default(),
        }
    }

    fn block_at(&self, start: u64) -> io::Result<Arc<Vec<u8>>> {
        let mut kept = self.kept.lock().expect("not poisoned");
        if let Some((_, b)) = kept.iter().find(|(s, _)| *s == start) {
            return Ok(b.clone());
        }
        let mut bytes = vec![0u8; self.block as usize];
        let n = self.inner.read_up_to(&mut bytes, start)?;
        bytes.truncate(n);
        let bytes = Arc::new(bytes);
        if kept.len() == 2 {
            kept.remove(0);
        }
        kept.push((start, bytes.clone()));
        Ok(bytes)
    }
}

impl ReadAt for Blocks {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if buf.len() as u64 >= self.block {
            return self.inner.read_at(buf, offset);
        }
        let start = offset - offset % self.block;
        let block = self.block_at(start)?;
        let from = (offset - start) as usize;
        let n = block.len().saturating_sub(from).min(buf.len());
        buf[..n].copy_from_slice(&block[from..from + n]);
        Ok(n)
    }
}
