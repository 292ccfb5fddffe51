//! `packfs cat`

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::args::{Images, Merge};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    images: Images,
    /// Path of the file inside the merged tree (bytes, as the archive names it).
    path: OsString,
    #[command(flatten)]
    merge: Merge,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let catalog = Arc::new(packfs::dataset::open(
        &args.images.images,
        &args.merge.options(),
        &packfs::dataset::quiet,
    )?);
    let mut out = std::io::stdout().lock();
    packfs::fs::cat::cat(catalog, args.path.as_bytes(), &mut out)?;
    out.flush()?;
    Ok(())
}
