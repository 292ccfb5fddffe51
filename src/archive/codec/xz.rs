//! xz blocks, one liblzma stream decoder per block (squashfs xz blocks are whole xz streams).

use std::io::Read;

pub fn decompress(input: &[u8], limit: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
    let stream = liblzma::stream::Stream::new_stream_decoder(u64::MAX, 0)?;
    let mut reader = liblzma::bufread::XzDecoder::new_stream(input, stream);
    // One byte more than the limit, so an oversized block is seen.
    (&mut reader).take(limit as u64 + 1).read_to_end(out)?;
    Ok(())
}
