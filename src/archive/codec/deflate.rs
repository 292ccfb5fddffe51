//! Deflate, zlib-wrapped (squashfs gzip blocks) or raw (zip members), with flate2.

use std::cell::RefCell;
use std::io;

use flate2::{Decompress, FlushDecompress, Status};

use crate::source::read_at::ReadAt;

/// Compressed bytes read per request while inflating a stream.
pub const READ_CHUNK: usize = 256 * 1024;

thread_local! {
    static ZLIB: RefCell<Decompress> = RefCell::new(Decompress::new(true));
    static RAW: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

/// One whole block: `input` must hold the complete stream.
pub fn decompress(input: &[u8], zlib: bool, limit: usize, out: &mut Vec<u8>) -> Result<(), String> {
    let context = if zlib { &ZLIB } else { &RAW };
    context.with_borrow_mut(|z| {
        z.reset(zlib);
        match z.decompress_vec(input, out, FlushDecompress::Finish) {
            Ok(Status::StreamEnd) => Ok(()),
            Ok(_) if out.len() >= limit => Err(format!("it decodes to more than {limit} bytes")),
            Ok(_) => Err("the stream ends early".into()),
            Err(e) => Err(e.to_string()),
        }
    })
}

/// A raw deflate stream read from `image` in large positioned reads until it ends.
pub fn inflate_stream(image: &dyn ReadAt, offset: u64, size: u64) -> io::Result<Vec<u8>> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut out = Vec::with_capacity(size as usize);
    let mut inflater = Decompress::new(false);
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut pos = offset;
    loop {
        let n = image.read_up_to(&mut chunk, pos)?;
        if n == 0 {
            return Err(bad(format!(
                "deflate stream at offset {offset} runs past the end"
            )));
        }
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
