//! Inflating a zip member's raw deflate stream, read from its image in large positioned reads.
//!
//! A deflate stream can only be decoded from its start, so members are inflated whole (at most
//! `archive::zip::MAX_DEFLATED` bytes) and kept in the RAM cache.

use std::io;

use flate2::{Decompress, FlushDecompress, Status};

use super::images::{Fetch, Images};

/// Compressed bytes read per pread while inflating.
const READ_CHUNK: usize = 256 * 1024;

/// The `size` bytes that the deflate stream at `offset` of `image` inflates to.
pub fn inflate(images: &Images, image: u32, offset: u64, size: u64) -> io::Result<Vec<u8>> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut out = Vec::with_capacity(size as usize);
    let mut inflater = Decompress::new(false);
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut pos = offset;
    let end = images.image_size(image);
    loop {
        let n = READ_CHUNK.min(end.saturating_sub(pos) as usize);
        if n == 0 {
            return Err(bad(format!(
                "deflate stream at offset {offset} runs past the end"
            )));
        }
        images.read_exact_at(image, pos, &mut chunk[..n], Fetch::Exact)?;
        let mut used = 0;
        while used < n {
            if out.len() == out.capacity() {
                out.reserve(READ_CHUNK);
            }
            let (in_before, out_before) = (inflater.total_in(), out.len());
            let status = inflater
                .decompress_vec(&chunk[used..n], &mut out, FlushDecompress::None)
                .map_err(|e| bad(format!("corrupt deflate stream at offset {offset}: {e}")))?;
            used += (inflater.total_in() - in_before) as usize;
            if out.len() as u64 > size {
                return Err(bad(format!(
                    "deflate stream at offset {offset} inflates to more than {size} bytes"
                )));
            }
            if status == Status::StreamEnd {
                if out.len() as u64 != size {
                    return Err(bad(format!(
                        "deflate stream at offset {offset} inflates to {} bytes, expected {size}",
                        out.len()
                    )));
                }
                return Ok(out);
            }
            if inflater.total_in() == in_before && out.len() == out_before {
                break; // wants more input than this chunk holds
            }
        }
        pos += n as u64;
    }
}
