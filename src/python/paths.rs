//! Paths as a process inside the mount would walk them: components from the dataset's root,
//! `..` to the parent, symlinks followed (relative ones; at most 40, as Linux allows), and the
//! listing of a directory.

use crate::catalog::{Kind, ROOT};
use crate::fs::{Core, DirEntry, Error, Listing, core::ino_of};

use super::errors::FsError;

/// Links followed in one walk at most, as Linux's ELOOP limit.
const MAX_LINKS: usize = 40;

/// The inode at `path` (relative to the dataset's root; a leading `/` is the same), its last
/// component followed if it is a symlink and `follow` says so.
pub fn resolve(core: &Core, path: &[u8], follow: bool) -> Result<u64, FsError> {
    let mut links = 0;
    walk(core, ino_of(ROOT), path, follow, &mut links)
}

fn walk(
    core: &Core,
    start: u64,
    path: &[u8],
    follow: bool,
    links: &mut usize,
) -> Result<u64, FsError> {
    let mut at = start;
    let parts: Vec<&[u8]> = path
        .split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        if *part == b".." {
            at = parent(core, at)?;
            continue;
        }
        let attr = core.lookup(at, part)?;
        if attr.kind == Kind::Symlink && (follow || !last) {
            *links += 1;
            if *links > MAX_LINKS {
                return Err(Error::Loop.into());
            }
            let target = core.readlink(attr.ino)?.to_vec();
            if target.starts_with(b"/") {
                return Err(Error::LinkOutside(target).into());
            }
            at = walk(core, at, &target, true, links)?;
        } else {
            at = attr.ino;
        }
    }
    Ok(at)
}

/// The directory holding `ino` (the root is its own): its catalog record names it.
fn parent(core: &Core, ino: u64) -> Result<u64, FsError> {
    let id = crate::fs::core::id_of(ino).ok_or(Error::NotFound)?;
    Ok(ino_of(core.catalog().entry(id)?.parent))
}

/// The names and kinds in directory `ino`, without `.` and `..`.
pub fn list(core: &Core, ino: u64) -> Result<Vec<(Vec<u8>, Kind)>, FsError> {
    let mut lines = Lines::default();
    core.list(ino, 2, false, &mut lines)?;
    Ok(lines.0.into_iter().map(|(n, k, _)| (n, k)).collect())
}

/// How many bytes a read of `size` at `offset` of file `ino` covers (a negative size: to its
/// end); a directory or a link is refused as `read(2)` would.
pub fn span(core: &Core, ino: u64, offset: u64, size: i64) -> Result<usize, FsError> {
    let attr = core.getattr(ino)?;
    match attr.kind {
        Kind::File => {}
        Kind::Dir => return Err(Error::IsDir.into()),
        Kind::Symlink => return Err(Error::NotFile.into()),
    }
    let left = attr.size.saturating_sub(offset);
    let want = u64::try_from(size).map_or(left, |s| s.min(left));
    // A 64-bit address space holds any file's size.
    Ok(usize::try_from(want).unwrap_or(usize::MAX))
}

#[derive(Default)]
struct Lines(Vec<(Vec<u8>, Kind, u64)>);

impl Listing for Lines {
    fn add(&mut self, entry: DirEntry) -> bool {
        self.0.push((entry.name.to_vec(), entry.kind, entry.ino));
        false
    }
}
