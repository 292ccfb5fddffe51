//! `packfs ls`

use std::io::Write;

use packfs::archive::Encoding;
use packfs::archive::squashfs::block_map::BlockMap;
use packfs::catalog::{DuplicatePolicy, Kind, ROOT};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tar, zip or squashfs images (brace ranges and globs are expanded), or one index file.
    #[arg(required = true)]
    images: Vec<String>,
    /// Long listing: mode, size, mtime, path, symlink target.
    #[arg(short, long)]
    long: bool,
    /// Show where each file's bytes lie: image, encoding and byte offsets (squashfs: the first
    /// and end offsets of its data blocks, and its tail's fragment block).
    #[arg(long)]
    extents: bool,
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
        if args.extents && e.kind() == Kind::File {
            let image = catalog.images()[e.image as usize].path.display();
            match e.encoding() {
                Encoding::Stored => write!(out, "\t{image} stored at {}", e.offset)?,
                Encoding::Deflate => write!(out, "\t{image} deflate at {}", e.offset)?,
                Encoding::Squashfs => {
                    let map =
                        BlockMap::decode(catalog.block_map(e)?).map_err(anyhow::Error::msg)?;
                    write!(out, "\t{image} {}", map.codec.name())?;
                    if map.count > 0 {
                        let first = map.block(0).start;
                        write!(
                            out,
                            " blocks {} at {first}..{}",
                            map.count,
                            map.blocks_end()
                        )?;
                    }
                    if let Some(t) = map.tail {
                        write!(out, " tail at {}+{}", t.block.start, t.offset)?;
                    }
                }
            }
        }
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}
