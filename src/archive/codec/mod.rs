//! Decompression, one module per compression, shared by every format: squashfs blocks (gzip, xz,
//! lz4, zstd), zip members (raw deflate) and the pieces of framed streams (zstd frames, xz and
//! bzip2 blocks, `archive::framed`). Each decoder keeps its context per thread: a block is
//! decoded by whichever FUSE or I/O thread missed it, and contexts are costly to create (zstd's is
//! ~100 KB) but cheap to reset.

mod bzip2;
mod deflate;
mod lz4;
mod xz;
mod zstd;

use std::io;

use crate::source::read_at::ReadAt;

pub use deflate::READ_CHUNK;

/// Encoded bytes read at a time by a decoder that streams (`decompress_streamed`).
const STREAM_PIECE: usize = 1 << 20;
pub use xz::check_size as xz_check_size;

/// The compressions packfs decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// zlib-wrapped deflate (squashfs "gzip").
    Zlib,
    /// Raw deflate (zip method 8); a stream that ends itself.
    Deflate,
    /// A whole xz stream (squashfs "xz").
    Xz,
    Lz4,
    Zstd,
    /// One block of an xz stream, without the stream around it: the stream's check type and the
    /// block's padding (the bytes after its unpadded size) are needed to decode it.
    XzBlock {
        check: u8,
        pad: u8,
    },
    /// One bzip2 block, which starts at bit `shift` of its first byte and leaves the last `unused`
    /// bits of its last byte to what follows; `level` is its stream's block size (1 to 9).
    Bzip2Block {
        shift: u8,
        unused: u8,
        level: u8,
    },
}

impl Codec {
    pub fn name(self) -> &'static str {
        match self {
            Codec::Zlib => "gzip",
            Codec::Deflate => "deflate",
            Codec::Xz | Codec::XzBlock { .. } => "xz",
            Codec::Bzip2Block { .. } => "bzip2",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }

    /// Whether `decompress_streamed` decodes it from bytes read in turn.
    pub fn streams(self) -> bool {
        matches!(self, Codec::Xz | Codec::XzBlock { .. })
    }

    /// As `decompress`, for a piece of `len` encoded bytes that `input` gives in turn (read as
    /// they are decoded, never held whole); only for codecs that `streams`.
    pub fn decompress_streamed(
        self,
        input: impl io::Read,
        len: u64,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        // Pieces of 1 MiB from the image (a read each), as the decoder needs them.
        let input = io::BufReader::with_capacity(STREAM_PIECE, input.take(len));
        self.within_limit(limit, out, |out| match self {
            Codec::Xz => xz::decompress_from(input, limit, out),
            Codec::XzBlock { check, pad } => {
                xz::decompress_block_from(input, len, check, pad, limit, out)
            }
            _ => Err(io::Error::other("its pieces are decoded whole")),
        })
    }

    /// Decodes one whole compressed block into `out` (replacing its content). A block that
    /// decodes to more than `limit` bytes is corrupt. The error is a sentence naming the codec.
    pub fn decompress(self, input: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), String> {
        self.within_limit(limit, out, |out| match self {
            Codec::Zstd => zstd::decompress(input, out),
            Codec::Zlib | Codec::Deflate => {
                deflate::decompress(input, self == Codec::Zlib, limit, out)
                    .map_err(io::Error::other)
            }
            Codec::Lz4 => lz4::decompress(input, limit, out).map_err(io::Error::other),
            Codec::Xz => xz::decompress(input, limit, out),
            Codec::XzBlock { check, pad } => xz::decompress_block(input, check, pad, limit, out),
            Codec::Bzip2Block {
                shift,
                unused,
                level,
            } => bzip2::decompress_block(input, shift, unused, level, limit, out),
        })
    }

    /// Runs `decode` into `out` (emptied, with room for the limit), and says what went wrong as
    /// a sentence naming the codec: its error, or more than `limit` bytes.
    fn within_limit<E: std::fmt::Display>(
        self,
        limit: usize,
        out: &mut Vec<u8>,
        decode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), String> {
        out.clear();
        // The byte past the limit too: the decoders read one more to see an oversized piece,
        // and a full vector would double (a 16 MiB limit made a 32 MiB buffer).
        out.reserve_exact(limit.saturating_add(1));
        let failed = |e: &dyn std::fmt::Display| format!("{} data is corrupt: {e}", self.name());
        decode(out).map_err(|e| failed(&e))?;
        if out.len() > limit {
            return Err(failed(&format!("it decodes to more than {limit} bytes")));
        }
        Ok(())
    }
}

/// Appends what `reader` decodes to `out`, up to one byte past `limit` (so an oversized piece is
/// seen), touching no more memory than it fills plus a step. `read_to_end` zero-fills the room
/// it reads into ahead of the decoder, up to the whole capacity reserved for a unit: two 46 MB
/// bzip2 blocks held 64 MiB each.
pub fn read_bounded(mut reader: impl io::Read, limit: usize, out: &mut Vec<u8>) -> io::Result<()> {
    const STEP: usize = 1 << 20;
    let end = limit.saturating_add(1);
    while out.len() < end {
        let at = out.len();
        out.resize(at + STEP.min(end - at), 0);
        let n = loop {
            match reader.read(&mut out[at..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    out.truncate(at);
                    return Err(e);
                }
            }
        };
        out.truncate(at + n);
        if n == 0 {
            break;
        }
    }
    Ok(())
}

/// Inflates the raw deflate stream that starts at `offset` of `image` and must decode to exactly
/// `size` bytes; the stream ends itself, so its compressed length need not be known.
pub fn inflate_stream(image: &dyn ReadAt, offset: u64, size: u64) -> io::Result<Vec<u8>> {
    deflate::inflate_stream(image, offset, size)
}

/// A codec whose pieces a checkpoint table lists (the framed formats, `archive::framed`): the
/// table's kind for it (never reused: indexes outlive builds), what the compression and its
/// pieces are called, and the codec's parameters as a table entry keeps them. Each is defined
/// beside its codec; a new framed codec is one more here.
pub struct Framing {
    pub kind: u32,
    pub names: (&'static str, &'static str),
    /// The parameters of `codec` if it is this framing's.
    pub encode: fn(Codec) -> Option<[u8; 8]>,
    /// The codec from an entry's parameters, if they are valid.
    pub decode: fn(&[u8; 8]) -> Option<Codec>,
}

pub const FRAMINGS: [Framing; 3] = [zstd::FRAMING, xz::FRAMING, bzip2::FRAMING];

/// The framing of table kind `kind`.
pub fn framing_of(kind: u32) -> Option<&'static Framing> {
    FRAMINGS.iter().find(|f| f.kind == kind)
}

impl Codec {
    /// This codec's framing and its parameters (a codec of no framing counts as zstd's, whose
    /// frames carry their own parameters).
    pub fn framing(self) -> (&'static Framing, [u8; 8]) {
        FRAMINGS
            .iter()
            .find_map(|f| Some((f, (f.encode)(self)?)))
            .unwrap_or((&FRAMINGS[0], [0; 8]))
    }
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
        let zstd = ::zstd::bulk::compress(&plain, 3).unwrap();
        let mut gz = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain).unwrap();
        let zlib = gz.finish().unwrap();
        let mut raw = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        raw.write_all(&plain).unwrap();
        let raw = raw.finish().unwrap();
        let lz4 = lz4_flex::block::compress(&plain);
        let mut xz = liblzma::write::XzEncoder::new(Vec::new(), 1);
        xz.write_all(&plain).unwrap();
        let xz = xz.finish().unwrap();
        let mut out = Vec::new();
        for (codec, packed) in [
            (Codec::Zstd, &zstd),
            (Codec::Zlib, &zlib),
            (Codec::Deflate, &raw),
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
    fn streams_inflate_from_any_reader() {
        let plain = sample();
        let mut raw = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        raw.write_all(&plain).unwrap();
        let mut image = vec![7u8; 1000];
        image.extend(raw.finish().unwrap());
        let size = plain.len() as u64;
        assert_eq!(inflate_stream(&image, 1000, size).unwrap(), plain);
        let short = inflate_stream(&image, 1000, size - 1).unwrap_err();
        assert!(short.to_string().contains("more than"), "{short}");
        let long = inflate_stream(&image, 1000, size + 1).unwrap_err();
        assert!(long.to_string().contains("expected"), "{long}");
        let cut = image[..image.len() - 10].to_vec();
        let cut = inflate_stream(&cut, 1000, size).unwrap_err();
        assert!(cut.to_string().contains("past the end"), "{cut}");
    }
}
