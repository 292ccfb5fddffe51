//! Where `packfs pack` reads and writes: the sources opened (directories, or images and
//! indexes), the shards' name, the lock that keeps two packs of one name apart, and the refusals
//! to overwrite outputs or to write over a source.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tracing::warn;

use super::gather::{DirSource, Sources};
use super::shard::ShardPlan;
use super::{PackError, PackOptions};
use crate::tiers::{self, TierOptions};

/// Directories become directory sources; everything else is one set of images (or an index).
pub(super) fn open_sources(opts: &PackOptions, out_dir: &Path) -> Result<Sources, PackError> {
    let mut dirs = Vec::new();
    let mut patterns = Vec::new();
    for s in &opts.sources {
        let path = Path::new(s);
        if path.is_dir() {
            let root = path.canonicalize().map_err(|error| PackError::Read {
                path: path.to_path_buf(),
                error,
            })?;
            let Some(base) = root.parent().filter(|_| root.file_name().is_some()) else {
                return Err(PackError::Usage(format!(
                    "{s}: give a directory below /, whose name the members start with"
                )));
            };
            if out_dir.starts_with(&root) {
                return Err(PackError::Usage(format!(
                    "the output directory {} is inside the source {}: packfs never writes into \
                     a source tree; give an output directory elsewhere",
                    out_dir.display(),
                    root.display()
                )));
            }
            dirs.push(DirSource {
                base: base.to_path_buf(),
                root,
            });
        } else {
            patterns.push(s.clone());
        }
    }
    let images = if patterns.is_empty() {
        None
    } else {
        let catalog = Arc::new(crate::dataset::open(
            &patterns,
            &opts.merge,
            &opts.stores,
            &crate::dataset::quiet,
        )?);
        // Every byte is read once, in order: a chunk kept in RAM is never asked for again, and
        // a cache of the mount's size held 256 MiB of them (pack from tar shards peaked at
        // 373 MB against 107 MB from the same files in a directory). Room for the chunks in
        // flight, and for one decoded unit when an image is compressed.
        let compressed = catalog.images().iter().any(|i| i.stream.is_some());
        let cache = match compressed {
            true => tiers::ONE_SHOT_CACHE,
            false => PACK_READ_CACHE,
        };
        let tiers = TierOptions::direct(cache);
        let files = tiers::open(&catalog, &tiers, &opts.stores)?;
        Some((catalog, files))
    };
    let mut names: Vec<&std::ffi::OsStr> = dirs.iter().filter_map(|d| d.root.file_name()).collect();
    names.sort();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(PackError::Usage(format!(
            "two source directories are named {:?}: their members would have the same names",
            w[0]
        )));
    }
    Ok(Sources {
        dirs,
        images,
        image_patterns: patterns,
    })
}

/// The RAM cache of `pack` reading stored images: chunks read ahead of the members in flight.
const PACK_READ_CACHE: u64 = 16 << 20;

/// The name of the first source: a directory's name, or an image's without its shard number and
/// extension (`train-000003.tar` -> `train`).
pub(super) fn default_name(sources: &Sources) -> Result<String, PackError> {
    if let Some(d) = sources.dirs.first() {
        return Ok(d
            .root
            .file_name()
            .expect("checked")
            .to_string_lossy()
            .into_owned());
    }
    let (catalog, _) = sources.images.as_ref().expect("at least one source");
    let first = catalog
        .index_path()
        .or_else(|| catalog.images().first().map(|i| i.path()))
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut stem = first.as_str();
    for ext in [
        ".packfs-index",
        ".tar.gz",
        ".tgz",
        ".tar.zst",
        ".tar.xz",
        ".tar.bz2",
        ".tar",
        ".zip",
        ".sqfs",
        ".squashfs",
    ] {
        if let Some(s) = stem.strip_suffix(ext) {
            stem = s;
            break;
        }
    }
    let stem = stem.trim_end_matches(|c: char| c.is_ascii_digit());
    let stem = stem.trim_end_matches(['-', '_', '.']);
    if stem.is_empty() {
        return Err(PackError::Usage(
            "cannot tell a name for the shards from the sources: give --name".into(),
        ));
    }
    Ok(stem.to_string())
}

pub(super) fn check_name(name: &str) -> Result<(), PackError> {
    if name.is_empty() || name.starts_with('.') || name.contains('/') || name.len() > 200 {
        return Err(PackError::Usage(format!(
            "--name {name:?}: give a plain file name (no '/', not starting with '.')"
        )));
    }
    Ok(())
}

/// One pack per name and directory at a time: an exclusive flock on `.NAME.pack-lock`, a
/// file removed when the pack ends (while still held), so finished packs leave nothing beside
/// their shards.
pub(super) struct PackLock {
    path: PathBuf,
    held: Option<nix::fcntl::Flock<std::fs::File>>,
}

impl Drop for PackLock {
    fn drop(&mut self) {
        if self.held.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

pub(super) fn lock(dir: &Path, name: &str) -> Result<PackLock, PackError> {
    use std::os::unix::fs::MetadataExt;
    let path = dir.join(format!(".{name}.pack-lock"));
    loop {
        let file = crate::util::safe_file::no_follow()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|error| PackError::Write {
                path: path.clone(),
                error,
            })?;
        let held = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        {
            Ok(lock) => lock,
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(PackError::Busy {
                    dir: dir.to_path_buf(),
                    name: name.to_string(),
                });
            }
            // Some parallel file systems are mounted without flock support: go on unguarded.
            Err((_, errno)) => {
                warn!(
                    "cannot lock {}: {errno}; make sure no other pack writes {name} there",
                    dir.display()
                );
                return Ok(PackLock { path, held: None });
            }
        };
        // The pack that held it before may have removed the file once done: a lock on a file
        // no longer at the path guards nothing, so take the new one.
        let same = match (held.metadata(), std::fs::symlink_metadata(&path)) {
            (Ok(mine), Ok(now)) => (mine.dev(), mine.ino()) == (now.dev(), now.ino()),
            _ => false,
        };
        if same {
            return Ok(PackLock {
                path,
                held: Some(held),
            });
        }
    }
}

/// Refuses to replace shards, an index or a manifest unless told to; refuses to write a shard
/// over one of the images being read.
pub(super) fn check_outputs(
    opts: &PackOptions,
    out_dir: &Path,
    plans: &[ShardPlan],
    index_path: &Path,
    manifest_path: &Path,
    sources: &Sources,
) -> Result<(), PackError> {
    if let Some((catalog, _)) = &sources.images {
        let inputs: Vec<PathBuf> = catalog
            .images()
            .iter()
            .filter_map(|i| i.path().canonicalize().ok())
            .chain(catalog.index_path().and_then(|p| p.canonicalize().ok()))
            .collect();
        let outputs = plans
            .iter()
            .map(|p| p.path.as_path())
            .chain([index_path, manifest_path]);
        for out in outputs {
            if inputs.iter().any(|i| i == out) {
                return Err(PackError::Usage(format!(
                    "{} is one of the sources: give another --name or output directory",
                    out.display()
                )));
            }
        }
    }
    if opts.force {
        return Ok(());
    }
    let existing: Vec<&Path> = plans
        .iter()
        .map(|p| p.path.as_path())
        .filter(|p| p.symlink_metadata().is_ok())
        .collect();
    if !existing.is_empty() && !opts.resume {
        return Err(PackError::Exists {
            dir: out_dir.to_path_buf(),
            what: format!("{} of the {} shards", existing.len(), plans.len()),
            first: existing[0].display().to_string(),
        });
    }
    for path in [index_path, manifest_path] {
        if path.symlink_metadata().is_ok() && !opts.resume {
            return Err(PackError::Exists {
                dir: out_dir.to_path_buf(),
                what: "the index or manifest".into(),
                first: path.display().to_string(),
            });
        }
    }
    Ok(())
}
