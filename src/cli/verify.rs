//! `packfs verify`

use std::os::unix::ffi::OsStrExt;

use crate::catalog::index;
use crate::engine::{Engine, EngineOptions};
use crate::source::Stores;
use crate::tiers::OpenedImages;
use anyhow::bail;

use super::args::{Images, Merge};
use super::progress::{ScanBar, bytes_bar};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// An index file written by `packfs index` or `mount --save-index`, or images.
    #[command(flatten)]
    images: Images,
    /// Also read every file through packfs's own readers, checking what can be checked: zip
    /// CRC-32s, squashfs blocks decoding to their exact length, data lying inside its image.
    #[arg(long)]
    data: bool,
    #[command(flatten)]
    merge: Merge,
}

/// Checks all of an index (every chunk, not only those a mount touches) and its images'
/// fingerprints, or that images scan; with `--data`, every byte of every file too: for an admin
/// after copying a dataset, or in a prologue that can afford it.
pub fn run(args: Args, stores: Stores) -> anyhow::Result<()> {
    // One index named as such is checked as an index even when its magic is damaged.
    let catalog = match args.images.images.as_slice() {
        [one] if one.ends_with(".packfs-index") => index::open(std::path::Path::new(one), &stores)?,
        patterns => {
            let bar = ScanBar::new();
            let catalog =
                crate::dataset::open(patterns, &args.merge.options(), &stores, &|p| bar.update(p))?;
            drop(bar);
            catalog
        }
    };
    let shown = catalog
        .index_path()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| crate::dataset::show_paths(catalog.images().iter().map(|i| i.path())));
    let damaged = catalog.verify_all();
    if damaged > 0 {
        bail!("index {shown}: {damaged} damaged chunk(s); rebuild it with `packfs index`");
    }
    // Checksums pass for any index someone wrote: check what the read path relies on as well.
    let problems = catalog.check_structure();
    if !problems.is_empty() {
        for p in &problems {
            eprintln!(
                "packfs: entry {} ({}): {}",
                p.entry,
                String::from_utf8_lossy(&p.path),
                p.what
            );
        }
        bail!(
            "{shown}: the catalog is inconsistent ({}{} problems, listed above): the index is \
             damaged or was not written by packfs; rebuild it with `packfs index`",
            if problems.len() >= 20 {
                "at least "
            } else {
                ""
            },
            problems.len()
        );
    }
    if args.data {
        // Opening the tiers checks every image's fingerprint, as `OpenedImages::open` does below.
        let catalog = std::sync::Arc::new(catalog);
        let opts = EngineOptions::one_shot(args.images.images.clone(), args.merge.options());
        let engine = Engine::over(catalog.clone(), &opts, stores, None)?;
        let files = engine.files();
        let bar = bytes_bar("reading", catalog.file_bytes());
        let report = crate::tiers::read_everything::read_everything(&catalog, files, &|n| {
            bar.set_position(n)
        });
        bar.finish_and_clear();
        for f in &report.failures {
            let mut path = std::io::stderr();
            use std::io::Write;
            let _ = path.write_all(b"packfs: ");
            let _ = path.write_all(std::ffi::OsStr::from_bytes(&f.path).as_bytes());
            let _ = writeln!(path, ": {}", f.error);
        }
        if !report.failures.is_empty() {
            bail!(
                "{shown}: {} of {} files cannot be read correctly (listed above)",
                report.failures.len(),
                report.files
            );
        }
        println!(
            "{shown}: ok: {} files, {} entries, {} images unchanged; all {} bytes read and checked",
            catalog.file_count(),
            catalog.len(),
            catalog.images().len(),
            report.bytes
        );
        return Ok(());
    }
    OpenedImages::open(catalog.images(), &stores)?;
    println!(
        "{shown}: ok: {} files, {} entries, {} images unchanged",
        catalog.file_count(),
        catalog.len(),
        catalog.images().len()
    );
    Ok(())
}
