//! `packfs index`

use std::path::PathBuf;
use std::time::Instant;

use crate::catalog::index;

use super::args::{Images, Merge};
use super::progress::ScanBar;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    images: Images,
    /// The index file to write, e.g. DATASET.packfs-index beside the images (image paths are
    /// recorded relative to it, so the folder can move as a whole).
    #[arg(short, long, value_name = "PATH")]
    output: PathBuf,
    /// Replace the output file even if it is not a packfs index.
    #[arg(long)]
    force: bool,
    /// Record the CRC-32 of every stored member (one read of all the data, with progress), so
    /// that a mount checks each whole-file read against it, as it does for `packfs pack`'s
    /// shards and for zip members: an image rewritten in place then fails with EIO instead of
    /// serving bytes the index does not describe (docs/semantics.md).
    #[arg(long)]
    checksums: bool,
    #[command(flatten)]
    merge: Merge,
}

pub fn run(args: Args, stores: &crate::source::Stores) -> anyhow::Result<()> {
    index::check_replaceable(&args.output, args.force)?;
    // Checkpoint tables of compressed images are spilled beside the index they end up in (as
    // large as 1.6% of the decoded bytes: not for a small /tmp).
    if let Some(dir) = std::path::absolute(&args.output)?.parent() {
        crate::archive::spill::set_dir(dir.to_path_buf());
    }
    let started = Instant::now();
    let bar = ScanBar::new();
    let merge = crate::dataset::Merge {
        checksums: args.checksums,
        ..args.merge.options()
    };
    let catalog = crate::dataset::load(&args.images.images, &merge, stores, &|p| bar.update(p))?;
    drop(bar);
    let scanned = started.elapsed().as_secs_f64();
    let written = index::write(&catalog, &args.output)?;
    let checked = catalog.checksummed_files();
    println!(
        "{}: {} files ({checked} with checksums), {} entries, {} images; {} bytes ({:.1} per \
         entry); scanned in {:.2} s, written in {:.2} s",
        args.output.display(),
        catalog.file_count(),
        written.entries,
        catalog.images().len(),
        written.bytes,
        written.bytes as f64 / written.entries as f64,
        scanned,
        started.elapsed().as_secs_f64() - scanned
    );
    Ok(())
}
