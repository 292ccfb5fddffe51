//! Where file bytes come from: the source images, read through `ReadAt`; in front of them a RAM
//! tier (decoded units and aligned source chunks under one byte budget) and, optionally, a
//! checked copy staged on node-local storage. `open` assembles the stack; `FileReader` executes
//! the read plans that the formats make. Nothing here knows a format.

pub mod faults;
mod file_reader;
mod images;
mod ram_cache;
mod read_ahead;
pub mod served_by;
mod source;
pub mod stage;

use std::sync::Arc;

pub use file_reader::{FileReader, ReadError, Served};
pub use images::{Fetch, Images, TierStats};
pub use ram_cache::{RamCache, RamStats};
pub use source::{Source, SourceError, SourceImage, SourceStats};
use stage::{Stage, StageError, StageOptions};

use crate::catalog::Catalog;

/// Chunk size shared by the RAM tier's source chunks and staging (see docs/configuration.md for
/// the measurement behind it).
pub const DEFAULT_CHUNK: u64 = 1 << 20;

/// RAM budget of the commands that read a few files once (`packfs cat`, the demo): room for one
/// decoded member or block.
pub const ONE_SHOT_CACHE: u64 = 64 << 20;

/// How to stack the tiers.
#[derive(Clone, Debug)]
pub struct TierOptions {
    /// Byte budget of the RAM tier (decoded units and source chunks); 0 for none.
    pub cache_size: u64,
    /// Size of the source chunks kept in RAM and of the staged chunks.
    pub chunk_size: u64,
    /// Read stored bytes in whole chunks through the RAM tier.
    pub ram_chunks: bool,
    /// Stage to node-local storage, and who holds the stage directory (for refusal messages).
    pub stage: Option<(StageOptions, String)>,
}

impl TierOptions {
    /// Reads straight from the source, with `cache_size` bytes of RAM for decoded units.
    pub fn direct(cache_size: u64) -> TierOptions {
        TierOptions {
            cache_size,
            chunk_size: DEFAULT_CHUNK,
            ram_chunks: false,
            stage: None,
        }
    }
}

/// Why the tiers could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// An image is missing or changed; `hint` says how to rebuild the index that names it.
    #[error("{error}{hint}")]
    Source { error: SourceError, hint: String },
    #[error(transparent)]
    Stage(#[from] StageError),
}

/// Opens the images of `catalog` (checking their fingerprints) and stacks the tiers over them.
pub fn open(catalog: &Catalog, opts: &TierOptions) -> Result<FileReader, OpenError> {
    let source = Source::open(catalog.images()).map_err(|error| {
        let hint = match (&error, catalog.index_path()) {
            (SourceError::Changed { .. }, Some(index)) => {
                let paths: Vec<_> = catalog.images().iter().map(|i| i.path.clone()).collect();
                let patterns: Vec<String> = crate::util::expand::as_patterns(&paths)
                    .iter()
                    .map(|p| shell_quoted(p))
                    .collect();
                format!(
                    "; the index {} no longer describes it: rebuild it with `packfs index -o {} {}`",
                    index.display(),
                    shell_quoted(&index.to_string_lossy()),
                    patterns.join(" ")
                )
            }
            _ => String::new(),
        };
        OpenError::Source { error, hint }
    })?;
    assemble(Arc::new(source), catalog, opts)
}

/// `word` as one shell word: single-quoted unless it is plain.
fn shell_quoted(word: &str) -> String {
    let plain = word
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Stacks the tiers over an opened source (any `ReadAt` images, e.g. a fault injector in tests).
pub fn assemble(
    source: Arc<Source>,
    catalog: &Catalog,
    opts: &TierOptions,
) -> Result<FileReader, OpenError> {
    let stage = match &opts.stage {
        Some((stage_opts, holder)) => Some(Arc::new(Stage::open(
            stage_opts.clone(),
            source.clone(),
            catalog.images(),
            holder,
        )?)),
        None => None,
    };
    let images = Images::new(
        source,
        opts.cache_size,
        opts.chunk_size,
        opts.ram_chunks,
        stage,
    );
    Ok(FileReader::new(Arc::new(images), catalog.len()))
}
