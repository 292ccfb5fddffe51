//! `packfs ls`

use std::io::Write;

use packfs::catalog::{Kind, ROOT};

use super::args::{Images, Merge};
use super::progress::ScanBar;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    images: Images,
    /// Long listing: mode, size, mtime, path, symlink target.
    #[arg(short, long)]
    long: bool,
    /// Show where each file's bytes lie: image, encoding and byte offsets (squashfs: the first
    /// and end offsets of its data blocks, and its tail's fragment block).
    #[arg(long)]
    extents: bool,
    #[command(flatten)]
    merge: Merge,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let bar = ScanBar::new();
    let catalog =
        packfs::dataset::open(&args.images.images, args.merge.policy(), &|p| bar.update(p))?;
    drop(bar);
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
        if args.extents && e.kind() == Kind::File {
            let image = catalog.images()[e.image as usize].path.display();
            write!(out, "\t{image} {}", catalog.layout(e)?)?;
        }
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
