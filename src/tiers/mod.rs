//! Where file bytes come from: the source images, read with `pread`, and in front of them a RAM
//! cache of decoded (decompressed) bytes. Later tiers (RAM block cache, staged copies) sit in
//! front of the source behind the same calls.

mod decoded;
mod file_reader;
mod inflate;
mod source;

pub use decoded::{DecodedCache, DecodedStats};
pub use file_reader::{FileReader, ReadError, Served};
use inflate::inflate;
pub use source::{Source, SourceError, SourceStats};
