//! Where file bytes come from: the source images, read through `ReadAt`; in front of them a RAM
//! tier (decoded units and aligned source chunks under one byte budget) and, optionally, a
//! checked copy staged on node-local storage. `open` assembles the stack; `FileReader` executes
//! the read plans that the formats make; `chunks` fetches whole chunks and decides when. Nothing
//! here knows a format.

pub mod budget;
pub mod chunks;
/// Test-only: compiled for the tests (`testing` feature), never into a release build.
#[cfg(any(test, feature = "testing"))]
pub mod faults;
mod file_range;
mod file_reader;
mod images;
mod locate;
mod located;
pub mod lookahead;
mod opened;
mod ram_cache;
pub mod read_everything;
mod request;
mod source_stats;
pub mod stage;
pub mod waits;
pub mod window;

use std::path::PathBuf;
use std::sync::Arc;

pub use chunks::Fetch;
pub use file_range::FileRange;
pub use file_reader::{FileReader, Member, ReadError, Served};
pub use images::{Images, TierStats};
pub use opened::{OpenedImage, OpenedImages, SameBytes, SourceError, SourceStats};
pub use ram_cache::{Decoded, RamCache, RamStats};
pub use request::{ReadRequest, Tiers};
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
    /// Read every image's stored bytes in whole chunks through the RAM tier
    /// (`chunks::policy::choose`).
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
    /// An image is missing or changed; `stale` is set when an index describes it as it was.
    #[error(
        "{error}{}",
        stale.as_ref().map_or(String::new(), |s| format!(
            "; the index {} no longer describes it",
            s.index.display()
        ))
    )]
    Source {
        error: SourceError,
        stale: Option<StaleIndex>,
    },
    #[error(transparent)]
    Stage(#[from] StageError),
}

/// An index that no longer describes its images, and the images it names (for the command
/// that rebuilds it, which the CLI writes).
#[derive(Debug)]
pub struct StaleIndex {
    pub index: PathBuf,
    /// The images given to `packfs index` (not the archives inside them).
    pub images: Vec<PathBuf>,
    /// Whether it recorded checksums of its files, which the rebuild should keep.
    pub checksums: bool,
}

/// Opens the images of `catalog` (checking their fingerprints) and stacks the tiers over them.
/// Objects are read from `stores`.
pub fn open(
    catalog: &Catalog,
    opts: &TierOptions,
    stores: &crate::source::Stores,
) -> Result<FileReader, OpenError> {
    assemble(Arc::new(open_source(catalog, stores)?), catalog, opts)
}

/// The catalog's images, opened and checked against their fingerprints.
pub fn open_source(
    catalog: &Catalog,
    stores: &crate::source::Stores,
) -> Result<OpenedImages, OpenError> {
    OpenedImages::open(catalog.images(), stores).map_err(|error| {
        let stale = match (&error, catalog.index_path()) {
            (SourceError::Changed { .. }, Some(index)) => Some(StaleIndex {
                index: index.to_path_buf(),
                images: catalog
                    .images()
                    .iter()
                    .filter(|i| i.within.is_none())
                    .map(|i| i.path().to_path_buf())
                    .collect(),
                checksums: catalog.checksummed_files() > 0,
            }),
            _ => None,
        };
        OpenError::Source { error, stale }
    })
}

/// Stacks the tiers over an opened source (any `ReadAt` images, e.g. a fault injector in tests).
pub fn assemble(
    source: Arc<OpenedImages>,
    catalog: &Catalog,
    opts: &TierOptions,
) -> Result<FileReader, OpenError> {
    // One memory budget for everything the tiers hold: the cache's values (chunks pinned for
    // their readers included), the units and chunks readers hold and the stager's runs. A stage
    // is opened with it; `Images::new` takes it from the stage (or makes it, without one).
    let stage = match &opts.stage {
        Some((stage_opts, holder)) => Some(Arc::new(Stage::open(
            stage_opts.clone(),
            source.clone(),
            catalog.images(),
            holder,
            Some(budget::MemoryBudget::for_cache(opts.cache_size)),
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
