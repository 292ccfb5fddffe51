//! Seekable inflate: deflate streams of any size read at any offset with bounded memory.
//!
//! A deflate stream can only be decoded from its start, unless the decoder is restarted at a
//! block boundary with the bits left over in the last byte and the 32 KiB of output before it
//! (the method of zlib's zran.c and indexed_gzip). The indexer inflates a stream once, at scan
//! time, and notes such a checkpoint at the first block boundary after every `SPACING` bytes of
//! output; the table goes into the catalog and the index. A read then inflates one interval (at
//! most `SPACING` plus one block) from the checkpoint before it, as a `plan::Unit` that the RAM
//! cache keeps under its byte budget, and checks the interval's CRC-32 recorded at scan time.
//!
//! This serves zip members deflated beyond `SPACING` bytes and gzip-compressed tars (`.tar.gz`),
//! whose tar is scanned through the indexer. Block boundaries and restarts come from
//! miniz_oxide's block-boundary API (the decoder flate2 uses); the gzip framing is read here,
//! because its members must be followed one by one to place checkpoints at their starts.

mod gzip;
mod indexer;
mod restart;
pub mod table;

pub use crate::archive::plan::{Located, Restart};
pub use gzip::is_gzip;
pub use indexer::{Indexer, InflateError, Wrapper};
pub use restart::{READ as RESTART_READ, inflate_interval};
pub use table::Checkpoints;

/// Decoded bytes between checkpoints, unless `PACKFS_CHECKPOINT_SPACING` says otherwise when an
/// image is scanned. A read that misses the cache inflates one interval; the index keeps a 32 KiB
/// window per interval. Measured on a 2.6 GB .tar.gz of 110 KB JPEGs (docs/benchmarks.md,
/// "Seekable inflate"), cold random reads by 1 reader ran at 14.0, 6.9 and 3.8 MB/s with 1, 2 and
/// 4 MiB for an index of 3.1, 1.6 and 0.8 % of the decoded size; 2 MiB is the middle.
pub const SPACING: u64 = 2 << 20;

/// The spacing scans use: `SPACING`, or `PACKFS_CHECKPOINT_SPACING` (a size such as `1M`) between
/// 64 KiB and 32 MiB.
pub fn spacing() -> u64 {
    static SPACING_SET: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SPACING_SET.get_or_init(|| {
        let value = std::env::var("PACKFS_CHECKPOINT_SPACING").ok();
        spacing_from(value.as_deref()).unwrap_or_else(|why| {
            tracing::warn!(
                "PACKFS_CHECKPOINT_SPACING: {why}; using {} MiB",
                SPACING >> 20
            );
            SPACING
        })
    })
}

/// The spacing a `PACKFS_CHECKPOINT_SPACING` value asks for (`SPACING` when unset).
fn spacing_from(value: Option<&str>) -> Result<u64, String> {
    let Some(value) = value else {
        return Ok(SPACING);
    };
    match crate::util::size::parse_bytes(value)? {
        n if (64 << 10..=32 << 20).contains(&n) => Ok(n),
        n => Err(format!("{n} bytes is not from 64K to 32M")),
    }
}

/// The history a deflate restart needs.
pub const WINDOW: usize = 32 * 1024;

/// The longest interval a table may describe, and so the most one read can make the daemon
/// inflate and hold: the largest spacing plus the longest block a sane encoder writes (zlib's are
/// at most 16 K symbols of 258 bytes, 4 MiB). A stream with a longer block is refused at scan time.
pub const MAX_INTERVAL: usize = crate::archive::plan::MAX_UNIT;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spacing_values() {
        assert_eq!(spacing_from(None), Ok(SPACING));
        assert_eq!(spacing_from(Some("1M")), Ok(1 << 20));
        assert_eq!(spacing_from(Some("512k")), Ok(512 << 10));
        assert!(spacing_from(Some("64G")).is_err());
        assert!(spacing_from(Some("lots")).is_err());
    }
}
