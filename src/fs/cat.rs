//! `packfs cat`: one file of the merged tree to a writer, through the same read path as the mount
//! (`fs::Core` over the tiers), without mounting.

use std::io::Write;

use super::{Core, FsOptions, core::ino_of};
use crate::catalog::CatalogError;
use crate::engine::Engine;
use crate::tiers;

/// Bytes read per request, as the kernel would ask.
const CHUNK: u32 = 1 << 20;

/// Why a file could not be written out.
#[derive(Debug, thiserror::Error)]
pub enum CatError {
    #[error("{path}: no such file in the images")]
    NotFound { path: String },
    #[error("{path} is a symlink to {target}")]
    Symlink { path: String, target: String },
    #[error("{path}: {error}")]
    Read {
        path: String,
        error: crate::fs::Error,
    },
    #[error("cannot write {path}: {error}")]
    Write { path: String, error: std::io::Error },
}

/// Writes the file at `path` (bytes, as the archive names it) of `engine`'s dataset to `out`; returns the
/// bytes written.
pub fn cat(engine: &Engine, path: &[u8], out: &mut dyn Write) -> Result<u64, CatError> {
    let catalog = engine.catalog();
    let shown = String::from_utf8_lossy(path).into_owned();
    let id = catalog.resolve(path).map_err(|e| match e {
        CatalogError::NotFound => CatError::NotFound {
            path: shown.clone(),
        },
        damaged => CatError::Read {
            path: shown.clone(),
            error: damaged.into(),
        },
    })?;
    let core = Core::over(engine, FsOptions::default().owner());
    let ino = ino_of(id);
    let failed = |error| CatError::Read {
        path: shown.clone(),
        error,
    };
    match core.readlink(ino) {
        Ok(target) => {
            return Err(CatError::Symlink {
                path: shown.clone(),
                target: String::from_utf8_lossy(target).into_owned(),
            });
        }
        Err(crate::fs::Error::NotSymlink) => {}
        Err(e) => return Err(failed(e)),
    }
    let mut buf = Vec::new();
    let mut done = 0u64;
    let req = tiers::ReadRequest::waiting();
    loop {
        let served = core
            .read(&req, ino, done, CHUNK, &mut buf)
            .map_err(failed)?;
        let bytes = served.bytes();
        if bytes.is_empty() {
            break;
        }
        out.write_all(bytes).map_err(|error| CatError::Write {
            path: shown.clone(),
            error,
        })?;
        done += bytes.len() as u64;
    }
    Ok(done)
}
