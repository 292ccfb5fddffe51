//! Seekable inflate: deflate streams of any size read at any offset with bounded memory.
//!
//! A deflate stream can only be decoded from its start, unless the decoder is restarted at a
//! block boundary with the bits left over in the last byte and the 32 KiB of output before it
//! (the method of zlib's zran.c and indexed_gzip). The indexer inflates a stream once, at scan
//! time, and notes such a checkpoint at the first block boundary after every `SPACING` bytes of
//! output; the table goes into the catalog and the index. A read then inflates one interval (at
//! most `SPACING` plus one block) from the checkpoint before it, as a `layout::Unit` that the RAM
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

pub use gzip::is_gzip;
pub use indexer::{Indexer, InflateError, Wrapper};
pub use restart::{Restart, inflate_interval};
pub use table::Checkpoints;

/// Decoded bytes between checkpoints. A read that misses the cache inflates one interval: 4 MiB
/// take ~10 ms on one core; the index keeps a 32 KiB window per interval (0.8 % of the decoded
/// size). Chosen by measurement: see docs/benchmarks.md, "Seekable inflate".
pub const SPACING: u64 = 4 << 20;

/// The history a deflate restart needs.
pub const WINDOW: usize = 32 * 1024;

/// The longest interval a table may describe, and so the most one read can make the daemon
/// inflate and hold: `SPACING` plus the longest block a sane encoder writes (zlib's are at most
/// 16 K symbols of 258 bytes, 4 MiB). A stream with a longer block is refused at scan time.
pub const MAX_INTERVAL: usize = 64 << 20;
