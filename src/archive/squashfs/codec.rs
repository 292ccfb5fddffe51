//! Block decompression for squashfs images, with one decompression context per thread: a block is
//! decoded by whichever FUSE or I/O thread missed it, and contexts are costly to create (zstd's is
//! ~100 KB) but cheap to reset.

use std::cell::RefCell;
use std::io::Read;

use flate2::{Decompress, FlushDecompress, Status};

/// The compressors packfs decodes, with their squashfs superblock ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Codec {
    Gzip = 1,
    Xz = 4,
    Lz4 = 5,
    Zstd = 6,
}

impl Codec {
    /// The codec for a superblock compressor id; the error is a sentence for the user.
    pub fn from_id(id: u16) -> Result<Codec, String> {
        Ok(match id {
            1 => Codec::Gzip,
            4 => Codec::Xz,
            5 => Codec::Lz4,
            6 => Codec::Zstd,
            2 | 3 => {
                let name = if id == 2 { "lzma" } else { "lzo" };
                return Err(format!(
                    "{name}-compressed squashfs images are not supported; rebuild the image with \
                     `mksquashfs ... -comp zstd` (or gzip, xz, lz4)"
                ));
            }
            other => return Err(format!("unknown squashfs compressor id {other}")),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::Gzip => "gzip",
            Codec::Xz => "xz",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// Decodes one compressed block into `out` (replacing its content). A block that decodes to
    /// more than `limit` bytes is corrupt: squashfs blocks never exceed the image's block size.
    pub fn decompress(self, input: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), String> {
        out.clear();
        out.reserve_exact(limit);
        let failed = |e: &dyn std::fmt::Display| format!("{} data is corrupt: {e}", self.name());
        let result = match self {
            Codec::Zstd => ZSTD.with_borrow_mut(|ctx| {
                let ctx = match ctx {
                    Some(ctx) => ctx,
                    None => ctx.insert(zstd::bulk::Decompressor::new().map_err(|e| failed(&e))?),
                };
                // Writes into `out`'s spare capacity (at least `limit`) without reallocating.
                ctx.decompress_to_buffer(input, out)
                    .map(|_| ())
                    .map_err(|e| failed(&e))
            }),
            Codec::Gzip => ZLIB.with_borrow_mut(|z| {
                z.reset(true);
                match z.decompress_vec(input, out, FlushDecompress::Finish) {
                    Ok(Status::StreamEnd) => Ok(()),
                    Ok(_) if out.len() >= limit => {
                        Err(failed(&format!("it decodes to more than {limit} bytes")))
                    }
                    Ok(_) => Err(failed(&"the stream ends early")),
                    Err(e) => Err(failed(&e)),
                }
            }),
            Codec::Lz4 => {
                out.resize(limit, 0);
                lz4_flex::block::decompress_into(input, out)
                    .map(|n| out.truncate(n))
                    .map_err(|e| failed(&e))
            }
            Codec::Xz => {
                let stream = liblzma::stream::Stream::new_stream_decoder(u64::MAX, 0)
                    .map_err(|e| failed(&e))?;
                let mut reader = liblzma::bufread::XzDecoder::new_stream(input, stream);
                (&mut reader)
                    .take(limit as u64 + 1)
                    .read_to_end(out)
                    .map_err(|e| failed(&e))
                    .map(|_| ())
            }
        };
        result?;
        if out.len() > limit {
            return Err(failed(&format!("it decodes to more than {limit} bytes")));
        }
        Ok(())
    }
}

thread_local! {
    static ZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
    static ZLIB: RefCell<Decompress> = RefCell::new(Decompress::new(true));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn sample() -> Vec<u8> {
        (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    #[test]
    fn round_trips_and_limits() {
        let plain = sample();
        let zstd = zstd::bulk::compress(&plain, 3).unwrap();
        let mut gz = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain).unwrap();
        let gzip = gz.finish().unwrap();
        let lz4 = lz4_flex::block::compress(&plain);
        let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 1);
        xz.write_all(&plain).unwrap();
        let xz = xz.finish().unwrap();
        let mut out = Vec::new();
        for (codec, packed) in [
            (Codec::Zstd, &zstd),
            (Codec::Gzip, &gzip),
            (Codec::Lz4, &lz4),
            (Codec::Xz, &xz),
        ] {
            codec.decompress(packed, plain.len(), &mut out).unwrap();
            assert_eq!(out, plain, "{codec:?}");
            // Twice on the same thread: the reused context is reset.
            codec.decompress(packed, plain.len(), &mut out).unwrap();
            assert_eq!(out, plain, "{codec:?} again");
            let err = codec.decompress(packed, plain.len() - 1, &mut out);
            assert!(err.is_err(), "{codec:?} ignored its limit");
            let mut bad = packed.clone();
            let mid = bad.len() / 2;
            bad[mid] ^= 0x5a;
            bad.truncate(bad.len() - 3);
            let err = codec.decompress(&bad, plain.len(), &mut out).unwrap_err();
            assert!(err.contains(codec.name()), "{err}");
        }
    }

    #[test]
    fn unsupported_compressors_are_named() {
        assert!(Codec::from_id(3).unwrap_err().contains("lzo"));
        assert!(Codec::from_id(2).unwrap_err().contains("lzma"));
        assert!(Codec::from_id(9).unwrap_err().contains("9"));
        assert_eq!(Codec::from_id(6).unwrap(), Codec::Zstd);
    }
}
