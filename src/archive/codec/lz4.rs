//! LZ4 blocks (squashfs stores raw LZ4 blocks, no frame), with lz4_flex's checked decoder.

pub fn decompress(
    input: &[u8],
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), lz4_flex::block::DecompressError> {
    out.resize(limit, 0);
    let n = lz4_flex::block::decompress_into(input, out)?;
    out.truncate(n);
    Ok(())
}
