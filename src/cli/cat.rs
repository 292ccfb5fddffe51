//! `packfs cat`

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use anyhow::Context;
use packfs::fs::{Core, FsOptions, core::ino_of};
use packfs::tiers::{self, TierOptions};

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

/// Bytes read per request, as the kernel would ask.
const CHUNK: u32 = 1 << 20;

pub fn run(args: Args) -> anyhow::Result<()> {
    let catalog = Arc::new(packfs::dataset::open(
        &args.images.images,
        &args.merge.options(),
        &packfs::dataset::quiet,
    )?);
    let shown = args.path.to_string_lossy();
    let id = catalog
        .resolve(args.path.as_bytes())
        .with_context(|| format!("{shown}: no such file in the images"))?;
    let files = tiers::open(&catalog, &TierOptions::direct(tiers::ONE_SHOT_CACHE))?;
    let core = Core::new(catalog, Arc::new(files), FsOptions::default().owner());
    let ino = ino_of(id);
    match core.readlink(ino) {
        Ok(target) => anyhow::bail!(
            "{shown} is a symlink to {}",
            String::from_utf8_lossy(target)
        ),
        Err(packfs::fs::Error::NotSymlink) => {}
        Err(e) => return Err(e.into()),
    }
    let mut out = std::io::stdout().lock();
    let mut buf = Vec::new();
    let mut done = 0u64;
    loop {
        let served = core
            .read(ino, done, CHUNK, &mut buf)
            .with_context(|| format!("{shown}"))?;
        let bytes = served.bytes();
        if bytes.is_empty() {
            break;
        }
        out.write_all(bytes)?;
        done += bytes.len() as u64;
    }
    out.flush()?;
    Ok(())
}
