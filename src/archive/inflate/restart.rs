//! Inflating one interval of a stream from its checkpoint: what a read that misses the cache does.

use std::io;

use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::inflate_flags::{
    TINFL_FLAG_HAS_MORE_INPUT, TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF,
};
use miniz_oxide::inflate::core::{BlockBoundaryState, DecompressorOxide, decompress};

use super::MAX_INTERVAL;
use crate::archive::plan::Restart;
use crate::source::read_at::ReadAt;

/// Compressed bytes read at a time when the interval's compressed length is not known (the last
/// interval of a stream) or larger than this.
pub const READ: u64 = 1 << 20;

/// Decodes the interval `restart` describes, whose compressed bytes start at image offset `at`.
pub fn inflate_interval(image: &dyn ReadAt, at: u64, restart: &Restart) -> io::Result<Vec<u8>> {
    let Restart {
        in_len,
        bit_count,
        bits,
        window,
        len,
        crc,
    } = *restart;
    let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
    if len > MAX_INTERVAL || bit_count > 7 {
        return Err(bad(format!(
            "a checkpoint interval of {len} bytes is invalid"
        )));
    }
    let state = BlockBoundaryState {
        num_bits: bit_count,
        bit_buf: bits,
        ..Default::default()
    };
    let mut decoder = Box::new(DecompressorOxide::from_block_boundary_state(&state));
    let w = window.len() as usize;
    if w > super::WINDOW {
        return Err(bad(format!("a checkpoint window of {w} bytes is invalid")));
    }
    let mut out = vec![0; w + len];
    window.read_into(&mut out[..w])?;
    let mut pos = w;
    let mut input = Vec::new();
    let mut next = at;
    let mut remaining_hint = in_len.unwrap_or(READ);
    let flags = TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF | TINFL_FLAG_HAS_MORE_INPUT;
    while pos < out.len() {
        let want = remaining_hint.clamp(1, READ) as usize;
        input.resize(want, 0);
        let n = image.read_up_to(&mut input, next)?;
        if n == 0 {
            return Err(bad(format!(
                "the deflate data from offset {at} runs past the end of the image"
            )));
        }
        remaining_hint = remaining_hint.saturating_sub(n as u64);
        let mut used = 0;
        while used < n && pos < out.len() {
            let (status, consumed, produced) =
                decompress(&mut decoder, &input[used..n], &mut out, pos, flags);
            used += consumed;
            pos += produced;
            match status {
                TINFLStatus::NeedsMoreInput | TINFLStatus::HasMoreOutput => {}
                TINFLStatus::Done if pos == out.len() => {}
                TINFLStatus::Done => {
                    return Err(bad(format!(
                        "the deflate stream ends {} bytes early in the interval from offset {at}",
                        out.len() - pos
                    )));
                }
                other => {
                    return Err(bad(format!(
                        "corrupt deflate data in the interval from offset {at}: {other:?}"
                    )));
                }
            }
            if consumed == 0 && produced == 0 {
                break;
            }
        }
        next += used as u64;
    }
    // Shifted in place: a second buffer of the interval's size would double the peak.
    out.drain(..w);
    let got = crc32fast::hash(&out);
    if got != crc {
        return Err(bad(format!(
            "the {len} bytes inflated from offset {at} have CRC-32 {got:08x}, the index recorded \
             {crc:08x} (the image changed or is damaged)"
        )));
    }
    Ok(out)
}
