//! Where file bytes come from: the source images, read with `pread`; in front of them a RAM tier
//! (decoded blocks and aligned source chunks under one byte budget) and, optionally, a checked
//! copy staged on node-local storage.

mod file_reader;
mod images;
mod inflate;
mod ram_cache;
mod source;
pub mod stage;

pub use file_reader::{FileReader, ReadError, Served};
pub use images::{Fetch, Images, TierStats};
use inflate::inflate;
pub use ram_cache::{RamCache, RamStats};
pub use source::{Source, SourceError, SourceStats};

/// Chunk size shared by the RAM tier's source chunks and staging (see docs/design.md for the
/// measurement behind it).
pub const DEFAULT_CHUNK: u64 = 1 << 20;
