//! The engine in the training process: the Python module `packfs._native` (the Python package's
//! `packfs.Engine` wraps it). One `Engine` opens a dataset from `packfs mount`'s arguments
//! (`cli::in_process`) and answers listings, stats and reads by path with no mount, no daemon
//! and no /dev/fuse. The GIL is released while it reads; many threads may read at once; a
//! forked child (a DataLoader worker) reopens what it must (`open::Current`).

mod errors;
mod hints;
mod open;
mod paths;

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::catalog::Kind;
use crate::fs::Attr;
use errors::{FsError, to_py};
use open::Current;

/// One dataset open in this process.
#[pyclass(module = "packfs._native", name = "Engine", frozen)]
struct Engine {
    current: Current,
}

/// What `stat` answers: kind ("f", "d" or "l"), size, permission bits, mtime (seconds,
/// nanoseconds) and inode number (the mount's).
type Stat = (&'static str, u64, u16, i64, u32, u64);

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::File => "f",
        Kind::Dir => "d",
        Kind::Symlink => "l",
    }
}

fn stat_of(attr: Attr) -> Stat {
    (
        kind_name(attr.kind),
        attr.size,
        attr.perm,
        attr.mtime,
        attr.mtime_nsec,
        attr.ino,
    )
}

/// A bytes object of `len` bytes whose content is not set yet (`PyBytes::new_with` would
/// zero it first: a second pass over every sample read, a tenth of a warm read's time).
fn uninit_bytes(py: Python<'_>, len: usize) -> PyResult<Bound<'_, PyBytes>> {
    let len = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| pyo3::exceptions::PyOverflowError::new_err("larger than a bytes object"))?;
    // SAFETY: a null source asks CPython for an object of `len` bytes left unset; a new
    // reference or null with the error set, which `from_owned_ptr_or_err` takes.
    unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len),
        )
        .map(|b| b.cast_into_unchecked())
    }
}

#[pymethods]
impl Engine {
    /// Opens the dataset that `args` (a mount's images and options, as `packfs mount` takes them,
    /// without the mountpoint) name; `holder` names this process for a stage's lock.
    /// `reopened`: opened again in a spawned worker from a pickled engine, where an image
    /// changed since fails its own files only (`EngineOptions::reopened`).
    #[new]
    #[pyo3(signature = (args, holder, reopened = false))]
    fn new(py: Python<'_>, args: Vec<Vec<u8>>, holder: String, reopened: bool) -> PyResult<Engine> {
        let args: Vec<OsString> = args.into_iter().map(OsString::from_vec).collect();
        let (mut opts, stores) = crate::cli::in_process(&args)
            // clap quotes a value it refuses: a URL's key stays out of the message.
            .map_err(|e| {
                let message = format!("{e:#}");
                pyo3::exceptions::PyValueError::new_err(
                    crate::util::redact::urls(&message).into_owned(),
                )
            })?;
        opts.holder = holder;
        opts.reopened = reopened;
        let current = py.detach(|| Current::open(opts, stores)).map_err(to_py)?;
        Ok(Engine { current })
    }

    /// Files in the dataset.
    fn __len__(&self) -> PyResult<usize> {
        let open = self.current.get().map_err(to_py)?;
        Ok(open.core.catalog().file_count() as usize)
    }

    /// The entry at `path` (following symlinks when `follow`).
    #[pyo3(signature = (path, follow = true))]
    fn stat(&self, py: Python<'_>, path: &[u8], follow: bool) -> PyResult<Stat> {
        py.detach(|| {
            let open = self.current.get()?;
            let ino = paths::resolve(&open.core, path, follow)?;
            Ok(stat_of(open.core.getattr(ino).map_err(FsError::from)?))
        })
        .map_err(|e: FsError| to_py(e.at(path)))
    }

    /// The names and kinds in directory `path`, in the catalog's (name) order.
    fn listdir(&self, py: Python<'_>, path: &[u8]) -> PyResult<Vec<(Py<PyBytes>, &'static str)>> {
        let lines = py
            .detach(|| {
                let open = self.current.get()?;
                let ino = paths::resolve(&open.core, path, true)?;
                paths::list(&open.core, ino)
            })
            .map_err(|e: FsError| to_py(e.at(path)))?;
        Ok(lines
            .into_iter()
            .map(|(name, kind)| (PyBytes::new(py, &name).unbind(), kind_name(kind)))
            .collect())
    }

    /// The target of symlink `path`.
    fn readlink<'py>(&self, py: Python<'py>, path: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
        let target = py
            .detach(|| {
                let open = self.current.get()?;
                let ino = paths::resolve(&open.core, path, false)?;
                Ok(open.core.readlink(ino).map_err(FsError::from)?.to_vec())
            })
            .map_err(|e: FsError| to_py(e.at(path)))?;
        Ok(PyBytes::new(py, &target))
    }

    /// `size` bytes of file `path` from `offset` (all of the rest with a negative size; fewer at
    /// its end), as bytes.
    #[pyo3(signature = (path, offset = 0, size = -1))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        path: &[u8],
        offset: u64,
        size: i64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let (open, ino, len) = py
            .detach(|| {
                let open = self.current.get()?;
                let ino = paths::resolve(&open.core, path, true)?;
                let len = paths::span(&open.core, ino, offset, size)?;
                Ok((open, ino, len))
            })
            .map_err(|e: FsError| to_py(e.at(path)))?;
        let bytes = uninit_bytes(py, len)?;
        // SAFETY: a bytes object of `len` bytes that nobody else holds until it is returned:
        // its buffer is written here, once, before anything reads it.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(pyo3::ffi::PyBytes_AsString(bytes.as_ptr()).cast(), len)
        };
        py.detach(|| open.read_into(ino, offset, dst))
            .map_err(|e| to_py(e.at(path)))?;
        Ok(bytes)
    }

    /// Reads file `path` from `offset` into the `len` bytes of writable memory at `address`
    /// (a buffer the caller holds for the call: `packfs.Engine.readinto` checks it); returns the
    /// bytes read (fewer at the file's end).
    #[pyo3(signature = (path, address, len, offset = 0))]
    fn read_into(
        &self,
        py: Python<'_>,
        path: &[u8],
        address: usize,
        len: usize,
        offset: u64,
    ) -> PyResult<usize> {
        if address == 0 && len > 0 {
            return Err(pyo3::exceptions::PyValueError::new_err("a null buffer"));
        }
        py.detach(|| {
            let open = self.current.get()?;
            let ino = paths::resolve(&open.core, path, true)?;
            let n = paths::span(&open.core, ino, offset, len as i64)?;
            // SAFETY: the caller hands `len` writable bytes at `address` and keeps them alive and
            // unshared for the call (the Python wrapper takes them from a writable, contiguous
            // buffer it holds); `n <= len`.
            let dst = unsafe { std::slice::from_raw_parts_mut(address as *mut u8, n) };
            open.read_into(ino, offset, dst)?;
            Ok(n)
        })
        .map_err(|e: FsError| to_py(e.at(path)))
    }

    /// Whole files, in the order of `paths`: one call for many small samples.
    fn read_many<'py>(
        &self,
        py: Python<'py>,
        paths: Vec<Vec<u8>>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        paths.iter().map(|p| self.read(py, p, 0, -1)).collect()
    }

    /// Hands a sampler's order to the lookahead (no socket: the lookahead is this process's):
    /// `paths` (relative to the root) are what `rank` of `stream` reads in epoch `epoch`, which
    /// replaces its previous list. Returns (samples taken, paths that are no file of the dataset,
    /// the first of those, whether the list was cut at four times the files); raises
    /// `MemoryError` when the budget has no room for the list (the next may fit), and
    /// `ValueError` when the engine takes no hints (no lookahead).
    #[pyo3(signature = (paths, stream, rank, epoch))]
    fn hint(
        &self,
        py: Python<'_>,
        paths: Vec<Vec<u8>>,
        stream: String,
        rank: u32,
        epoch: u64,
    ) -> PyResult<(u64, u64, Option<String>, bool)> {
        let open = self.current.get().map_err(to_py)?;
        let (Some(intake), Some(lookahead)) = (&open.intake, open.engine.lookahead()) else {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "this engine takes no hints: open it with a lookahead (the default: half of \
                 cache_size) and a cache_size above 0",
            ));
        };
        py.detach(|| hints::take(open, intake, lookahead, paths, stream, rank, epoch))
    }

    /// Ends the list of `rank` of `stream` (its sampler is through).
    fn end_hints(&self, stream: String, rank: u32) -> PyResult<()> {
        let open = self.current.get().map_err(to_py)?;
        if let Some(lookahead) = open.engine.lookahead() {
            lookahead.end(&hints::key(stream, rank));
        }
        Ok(())
    }

    /// The lookahead's counters as JSON (none without a lookahead).
    fn hint_stats(&self) -> PyResult<Option<String>> {
        let open = self.current.get().map_err(to_py)?;
        Ok(open
            .engine
            .lookahead()
            .map(|la| serde_json::to_string(&la.stats()).unwrap_or_default()))
    }

    /// Whether this process opened the engine itself (false in a forked child, which reopened
    /// what it reads with).
    fn opened_here(&self) -> PyResult<bool> {
        Ok(self.current.get().map_err(to_py)?.first)
    }

    /// Stops the background work (stager, watcher); reads still answer.
    fn close(&self) -> PyResult<()> {
        self.current.get().map_err(to_py)?.engine.stop();
        Ok(())
    }
}

/// `packfs._native`: the engine, and the version it was built as.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // What the engine warns of (a member skipped, a stale index) reaches the process's stderr,
    // redacted, as the command's does (RUST_LOG sets the level). A process that installed a
    // logger of its own (another Rust module) keeps it.
    let _ = crate::util::logging::init(&crate::util::logging::Setup::default());
    // This process is the user's: its signal handlers are not ours to rely on.
    crate::source::mapped::guest_process();
    m.add_class::<Engine>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
