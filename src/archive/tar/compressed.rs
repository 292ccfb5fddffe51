//! Compressed tars: the tar walked through the decoded stream of a gzip stream (inflated once,
//! with restart checkpoints noted on the way), of a zstd stream (decoded frame by frame) or of an
//! xz or bzip2 file (decoded block by block, several blocks at a time); the table that serves the
//! members' bytes later is kept in `image.stream`.

use std::path::Path;

use tracing::{debug, warn};

use super::stream::{Chunks, Decoded};
use super::walk;
use crate::archive::format::{ImageFormat, Inside};
use crate::archive::framed::{self, BlockIndexer};
use crate::archive::inflate::{self, Indexer, InflateError, Wrapper};
use crate::archive::{ArchiveError, ScannedImage};
use crate::source::read_at::ReadAt;

/// What a compressed tar's messages name: the compression, the command that checks it, the
/// suffix packfs serves and the command that decompresses anything else.
struct Compressed {
    name: &'static str,
    check: &'static str,
    suffix: &'static str,
    decompress: &'static str,
}

/// The error of a compressed stream, with the offset in the compressed file.
fn stream_error(path: &Path, c: &Compressed, e: InflateError) -> ArchiveError {
    match e {
        InflateError::Io(e) => ArchiveError::io(path, e),
        InflateError::Bad { at, why } => ArchiveError::malformed(
            path,
            at,
            format!(
                "{why} (this is a {}-compressed file; `{}` checks it)",
                c.name, c.check
            ),
        ),
    }
}

/// Walks the tar in the decoded stream of `stream`'s decoder: a failure of the stream itself is
/// reported as the stream's; a tar problem at offset 0 means the content is not a tar.
fn walk_decoded<C: Chunks>(
    stream: &mut Decoded<C>,
    image: &mut ScannedImage,
    c: &Compressed,
) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let walked = walk(stream, image);
    if let Some(e) = stream.failed.take() {
        return Err(stream_error(&path, c, e));
    }
    match walked {
        Err(ArchiveError::Malformed { offset, reason, .. }) => {
            let reason = match offset {
                0 => format!(
                    "a {}-compressed file whose content is not a tar archive ({reason}): packfs \
                     serves {}; decompress anything else once (`{}`)",
                    c.name, c.suffix, c.decompress
                ),
                _ => format!("{reason} (the offset is in the decompressed tar)"),
            };
            Err(ArchiveError::malformed(&path, offset, reason))
        }
        other => other,
    }
}

const GZIP: Compressed = Compressed {
    name: "gzip",
    check: "gzip -t",
    suffix: ".tar.gz",
    decompress: "gzip -dk",
};

const ZSTD: Compressed = Compressed {
    name: "zstd",
    check: "zstd -t",
    suffix: ".tar.zst",
    decompress: "zstd -d",
};

const XZ: Compressed = Compressed {
    name: "xz",
    check: "xz -t",
    suffix: ".tar.xz",
    decompress: "xz -dk",
};

const BZIP2: Compressed = Compressed {
    name: "bzip2",
    check: "bzip2 -t",
    suffix: ".tar.bz2",
    decompress: "bzip2 -dk",
};

/// The compressed tars, for the format registry, each known by its stream's magic.
/// The names of compressed tars, whichever the compressor (a `.tgz` of zstd is opened too).
pub const COMPRESSED_NAMES: &[&str] = &[
    ".tar.gz", ".tgz", ".tar.zst", ".tzst", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tbz",
];

/// A compressed tar inside an image: under a compressed tar's name, by its magic.
const COMPRESSED_INSIDE: Inside = Inside {
    tar: true,
    names: COMPRESSED_NAMES,
    kept: &[],
    detect: None,
};

pub const GZIP_TAR: ImageFormat = ImageFormat {
    what: "a gzip-compressed tar",
    detect: |p| Ok(p.head.starts_with(b"\x1f\x8b")),
    scan: scan_gzip,
    inside: Some(COMPRESSED_INSIDE),
};

pub const ZSTD_TAR: ImageFormat = ImageFormat {
    what: "a zstd-compressed tar",
    // A zstd stream may open with a skippable frame (pzstd writes one before each frame).
    detect: |p| {
        let h = p.head;
        let skippable = h.len() >= 4 && h[1..4] == [0x2A, 0x4D, 0x18] && h[0] & 0xF0 == 0x50;
        Ok(h.starts_with(b"\x28\xb5\x2f\xfd") || skippable)
    },
    scan: scan_zstd,
    inside: Some(COMPRESSED_INSIDE),
};

pub const XZ_TAR: ImageFormat = ImageFormat {
    what: "an xz-compressed tar",
    detect: |p| Ok(p.head.starts_with(b"\xfd7zXZ\x00")),
    scan: scan_xz,
    inside: Some(COMPRESSED_INSIDE),
};

pub const BZIP2_TAR: ImageFormat = ImageFormat {
    what: "a bzip2-compressed tar",
    detect: |p| Ok(p.head.starts_with(b"BZh")),
    scan: scan_bzip2,
    inside: Some(COMPRESSED_INSIDE),
};

/// Scans a gzip-compressed tar: the tar is walked through its decoded stream, inflated once, and
/// the checkpoint table that serves the members' bytes later is kept in `image.stream`.
pub fn scan_gzip(file: &dyn ReadAt, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let failed = |e| stream_error(&path, &GZIP, e);
    let indexer = Indexer::new(file, image.size, 0, Wrapper::Gzip, inflate::spacing());
    let mut stream = Decoded::new(indexer.map_err(failed)?);
    walk_decoded(&mut stream, image, &GZIP)?;
    // The rest of the stream (after the end-of-archive blocks) is checked too, as `gzip -d`
    // would: a damaged trailer means a damaged file.
    let tables = image.tables().map_err(|e| ArchiveError::io(&path, e))?;
    let done = stream.indexer.finish(tables).map_err(failed)?;
    if let Some(t) = done.trailing {
        let what = if t.all_zero {
            "zero bytes"
        } else {
            "bytes that are not gzip data"
        };
        warn!(
            image = %path.display(),
            offset = t.at,
            "{what} follow the last gzip member; ignored, as gzip does"
        );
    }
    debug!(
        image = %path.display(),
        decoded = done.total,
        checkpoints = done.checkpoints,
        table_bytes = done.table.len,
        "indexed the gzip stream"
    );
    image.stream = Some(done.table);
    Ok(())
}

/// Scans a zstd-compressed tar written in frames: the frames are listed (from the seek table or
/// the headers), then decoded for the walk, and their table is kept in `image.stream`.
pub fn scan_zstd(file: &dyn ReadAt, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let frames =
        framed::zstd::frames(file, image.size).map_err(|e| stream_error(&path, &ZSTD, e))?;
    scan_blocks(BlockIndexer::new(file, frames), image, &ZSTD)
}

/// Scans an xz-compressed tar by block: the blocks are listed from the file's own index, then
/// decoded for the walk, and their table is kept in `image.stream`.
pub fn scan_xz(file: &dyn ReadAt, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let blocks = framed::xz::blocks(file, image.size).map_err(|e| stream_error(&path, &XZ, e))?;
    scan_blocks(BlockIndexer::new(file, blocks), image, &XZ)
}

/// Scans a bzip2-compressed tar by block: the blocks are found by their magics, then decoded for
/// the walk, and their table is kept in `image.stream`.
pub fn scan_bzip2(file: &dyn ReadAt, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let (blocks, trailing) =
        framed::bzip2::blocks(file, image.size).map_err(|e| stream_error(&path, &BZIP2, e))?;
    if let Some(at) = trailing {
        warn!(
            image = %path.display(),
            offset = at,
            "bytes that are not bzip2 data follow the last bzip2 stream; ignored, as bzip2 does"
        );
    }
    scan_blocks(BlockIndexer::new(file, blocks), image, &BZIP2)
}

fn scan_blocks(
    indexer: BlockIndexer,
    image: &mut ScannedImage,
    c: &Compressed,
) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let mut stream = Decoded::new(indexer);
    walk_decoded(&mut stream, image, c)?;
    // The rest of the file (after the end-of-archive blocks) is checked too, as its decompressor
    // would.
    let tables = image.tables().map_err(|e| ArchiveError::io(&path, e))?;
    let done = stream
        .indexer
        .finish(tables)
        .map_err(|e| stream_error(&path, c, e))?;
    debug!(
        image = %path.display(),
        decoded = done.total,
        blocks = done.frames,
        "indexed the {} file",
        c.name
    );
    image.stream = Some(done.table);
    Ok(())
}
