//! `packfs ls`

use std::io::Write;

use packfs::catalog::{DuplicatePolicy, Kind, ROOT};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tar images (brace ranges and globs are expanded), or one index file.
    #[arg(required = true)]
    images: Vec<String>,
    /// Long listing: mode, size, mtime, path, symlink target.
    #[arg(short, long)]
    long: bool,
    #[arg(long, value_enum, default_value_t = DuplicatePolicy::Error)]
    duplicates: DuplicatePolicy,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let catalog = packfs::dataset::open(&args.images, args.duplicates)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for id in catalog.walk(ROOT) {
        let e = catalog.entry(id)?;
        let path = catalog.path_of(id);
        if args.long {
            let kind = match e.kind() {
                Kind::Dir => 'd',
                Kind::File => '-',
                Kind::Symlink => 'l',
            };
            let size = if e.is_dir() { 0 } else { e.size };
            write!(
                out,
                "{kind}{:04o} {size:>12} {:>11} ",
                e.permissions(),
                e.mtime
            )?;
        }
        out.write_all(&path)?;
        if args.long && e.kind() == Kind::Symlink {
            out.write_all(b" -> ")?;
            out.write_all(catalog.symlink_target(e)?)?;
        }
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
