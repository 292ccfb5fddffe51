//! `packfs cat`

use std::io::Write;

use anyhow::{Context, bail};
use packfs::archive::Encoding;
use packfs::catalog::{DuplicatePolicy, Kind};
use packfs::tiers::{Inflated, Source};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tar images (brace ranges and globs are expanded), or one index file.
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
    let source = Source::open(catalog.images())?;
    let mut out = std::io::stdout().lock();
    if e.encoding() == Encoding::Deflate {
        let bytes = Inflated::new(e.size.max(1))
            .member(&source, e.image, e.offset, e.size)
            .with_context(|| {
                format!(
                    "{}: cannot inflate {}",
                    source.image_path(e.image).display(),
                    args.path
                )
            })?;
        out.write_all(&bytes)?;
        out.flush()?;
        return Ok(());
    }
    let mut buf = vec![0u8; CHUNK.min(e.size) as usize];
    let mut done = 0;
    while done < e.size {
        let n = (e.size - done).min(CHUNK) as usize;
        source
            .read_exact_at(e.image, e.offset + done, &mut buf[..n])
            .with_context(|| {
                format!(
                    "{}: cannot read {n} bytes at offset {}",
                    source.image_path(e.image).display(),
                    e.offset + done
                )
            })?;
        out.write_all(&buf[..n])?;
        done += n as u64;
    }
    out.flush()?;
    Ok(())
}
