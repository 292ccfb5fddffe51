//! Zstandard blocks, with a bulk decompressor reused per thread.

use std::cell::RefCell;

thread_local! {
    static CONTEXT: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Writes into `out`'s spare capacity (the caller reserved the limit) without reallocating.
pub fn decompress(input: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    CONTEXT.with_borrow_mut(|ctx| {
        let ctx = match ctx {
            Some(ctx) => ctx,
            None => ctx.insert(zstd::bulk::Decompressor::new()?),
        };
        ctx.decompress_to_buffer(input, out).map(|_| ())
    })
}

/// Zstandard frames in a checkpoint table (`super::Framing`): no parameters.
pub const FRAMING: super::Framing = super::Framing {
    kind: 1,
    names: ("zstd", "frames"),
    encode: |c| matches!(c, super::Codec::Zstd).then_some([0; 8]),
    decode: |_| Some(super::Codec::Zstd),
};
