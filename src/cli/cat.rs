//! `packfs cat`

use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, bail};
use packfs::catalog::{DuplicatePolicy, Kind};
use packfs::tiers::{FileReader, Source};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tar, zip or squashfs images (brace ranges and globs are expanded), or one index file.
    #[arg(required = true, num_args = 1..)]
    images: Vec<String>,
    /// Path of the file inside the merged tree.
    path: String,
    #[arg(long, value_enum, default_value_t = DuplicatePolicy::Error)]
    duplicates: DuplicatePolicy,
}

const CHUNK: u64 = 1 << 20;

pub fn run(args: Args) -> anyhow::Result<()> {
    let catalog = packfs::dataset::open(&args.images, args.duplicates)?;
    let id = catalog
        .resolve(args.path.as_bytes())
        .with_context(|| format!("{}: no such file in the images", args.path))?;
    let e = catalog.entry(id)?;
    match e.kind() {
        Kind::File => {}
        Kind::Dir => bail!("{} is a directory", args.path),
        Kind::Symlink => bail!(
            "{} is a symlink to {}",
            args.path,
            String::from_utf8_lossy(catalog.symlink_target(e)?)
        ),
    }
    let source = Arc::new(Source::open(catalog.images())?);
    // Room for one decoded member or block: cat reads sequentially.
    let files = FileReader::direct(source, 64 << 20);
    let mut out = std::io::stdout().lock();
    let mut buf = Vec::new();
    let mut done = 0;
    while done < e.size {
        let n = (e.size - done).min(CHUNK) as usize;
        let served = files.read(&catalog, e, done, n, &mut buf).map_err(|err| {
            anyhow::anyhow!(
                "{}: cannot read {} at its offset {done}: {err}",
                files.source().image_path(e.image).display(),
                args.path
            )
        })?;
        out.write_all(served.bytes())?;
        done += n as u64;
    }
    out.flush()?;
    Ok(())
}
