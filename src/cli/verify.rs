//! `packfs verify`

use std::path::PathBuf;

use anyhow::bail;
use packfs::catalog::index;
use packfs::tiers::Source;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// An index file written by `packfs index` or `mount --save-index`.
    index: PathBuf,
}

/// Checks all of an index (every chunk, not only those a mount touches) and its images'
/// fingerprints: for an admin after copying a dataset, or in a prologue that can afford it.
pub fn run(args: Args) -> anyhow::Result<()> {
    let catalog = index::open(&args.index)?;
    let damaged = catalog.verify_all();
    if damaged > 0 {
        bail!(
            "index {}: {damaged} damaged chunk(s); rebuild it with `packfs index`",
            args.index.display()
        );
    }
    Source::open(catalog.images())?;
    println!(
        "{}: ok: {} files, {} entries, {} images unchanged",
        args.index.display(),
        catalog.file_count(),
        catalog.len(),
        catalog.images().len()
    );
    Ok(())
}
