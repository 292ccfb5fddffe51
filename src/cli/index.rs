//! `packfs index`

use std::path::PathBuf;
use std::time::Instant;

use packfs::catalog::{DuplicatePolicy, index};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tar images; brace ranges (`train-{000000..000127}.tar`) and globs are expanded.
    #[arg(required = true, num_args = 1..)]
    images: Vec<String>,
    /// The index file to write, e.g. DATASET.packfs-index beside the images (image paths are
    /// recorded relative to it, so the folder can move as a whole).
    #[arg(short, long, value_name = "PATH")]
    output: PathBuf,
    /// What to do when two images hold the same path.
    #[arg(long, value_enum, default_value_t = DuplicatePolicy::Error)]
    duplicates: DuplicatePolicy,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let catalog = packfs::dataset::load(&args.images, args.duplicates)?;
    let scanned = started.elapsed().as_secs_f64();
    let written = index::write(&catalog, &args.output)?;
    println!(
        "{}: {} files, {} entries, {} images; {} bytes ({:.1} per entry); scanned in {:.2} s, \
         written in {:.2} s",
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
