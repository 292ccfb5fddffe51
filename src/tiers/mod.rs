//! Where file bytes come from. For now one tier: the source images, read with `pread`. Later tiers
//! (RAM block cache, staged copies) sit in front of it behind the same call.

mod inflated;
mod source;

pub use inflated::Inflated;

pub use source::{Source, SourceError, SourceStats};
