//! The engine of this process, and of each child forked from it. A fork copies the engine's
//! memory but not its threads (lookahead, stager, watcher), and a lock one of them held stays
//! held forever in the child: a child never touches its parent's engine. It opens its own over
//! the parent's catalog (immutable, and lock-free to read: the index stays mapped), with fresh
//! tiers and stores, the first time it reads; the parent's is left to the parent (never
//! dropped in the child, whose drop would wait for threads that are not there).

use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::engine::{Engine, EngineOptions};
use crate::fs::{Core, FsOptions};
use crate::source::{StoreOptions, Stores};
use crate::tiers::lookahead::Intake;
use crate::tiers::{FileRange, ReadRequest};

use super::errors::FsError;

/// Bytes read per request from the tiers when a read cannot go straight to its image file:
/// what a decoded read holds at once besides the caller's buffer.
const STEP: usize = 8 << 20;

/// The engine a process reads with.
pub struct Open {
    pid: u32,
    /// Opened by this process (not reopened in a fork).
    pub first: bool,
    pub engine: Engine,
    pub core: Core,
    /// Where samplers' lists come in (none without a lookahead).
    pub intake: Option<Intake>,
}

impl Open {
    fn new(engine: Engine, first: bool) -> Open {
        let core = Core::over(&engine, FsOptions::default().owner());
        let intake = engine
            .lookahead()
            .map(|_| Intake::new(engine.files().images().ram().memory().clone()));
        Open {
            pid: std::process::id(),
            first,
            engine,
            core,
            intake,
        }
    }

    /// Reads `dst.len()` bytes of file `ino` at `offset` (the caller made sure it has them):
    /// stored bytes of a local image straight from its file into `dst`, others through the
    /// tiers (decoded units, chunks, objects) and copied once.
    pub fn read_into(&self, ino: u64, offset: u64, dst: &mut [u8]) -> Result<(), FsError> {
        // The reader is the thread, as the kernel names a mount's readers: the lookahead follows
        // each through a sampler's list.
        let reader = nix::unistd::gettid().as_raw() as u32;
        let req = ReadRequest::new(reader, crate::source::read_at::Wait::May);
        let mut scratch = Vec::new();
        let mut done = 0;
        while done < dst.len() {
            let at = offset + done as u64;
            let want = (dst.len() - done).min(STEP) as u32;
            if let Some(range) = self.core.file_range(&req, ino, at, want) {
                let n = range.len();
                range
                    .read_into(&mut dst[done..done + n])
                    .map_err(|error| self.failed(ino, &range, at, error))?;
                done += n;
                continue;
            }
            let served = self.core.read(&req, ino, at, want, &mut scratch)?;
            let bytes = served.bytes();
            if bytes.is_empty() {
                // The catalog's size and the tiers disagree: a read fails rather than come short.
                return Err(
                    crate::fs::Error::Damaged(crate::catalog::CatalogError::Invalid(format!(
                        "file {ino} ends before its size, at {at}"
                    )))
                    .into(),
                );
            }
            dst[done..done + bytes.len()].copy_from_slice(bytes);
            done += bytes.len();
        }
        Ok(())
    }
}

impl Open {
    /// A read straight from an image that failed, told as the mount tells it: the image, the
    /// offset in it, the file and the range of it.
    fn failed(&self, ino: u64, range: &FileRange<'_>, at: u64, error: std::io::Error) -> FsError {
        let entry = crate::fs::core::id_of(ino).unwrap_or_default();
        crate::fs::Error::Io {
            image: self
                .core
                .files()
                .images()
                .source()
                .image_path(range.image()),
            offset: range.offset(),
            path: self.core.catalog().path_of(entry),
            file_offset: at,
            len: range.len(),
            error,
        }
        .into()
    }
}

/// The engine of whichever process asks: the one it opened, or one reopened after a fork.
pub struct Current {
    opts: EngineOptions,
    stores: StoreOptions,
    /// Never freed while another process's: a fork leaves the parent's here, unused.
    now: AtomicPtr<Open>,
}

impl Current {
    /// Opens the dataset (scanning images or mapping an index) and starts its background work.
    pub fn open(opts: EngineOptions, stores: StoreOptions) -> Result<Current, FsError> {
        let engine = Engine::open(
            &opts,
            Stores::network(stores.clone()),
            None,
            &crate::dataset::quiet,
        )?;
        engine.start();
        let open = Box::into_raw(Box::new(Open::new(engine, true)));
        Ok(Current {
            opts,
            stores,
            now: AtomicPtr::new(open),
        })
    }

    /// This process's engine: reopened if this is a child forked since it was opened.
    pub fn get(&self) -> Result<&Open, FsError> {
        let ptr = self.now.load(Ordering::Acquire);
        // SAFETY: `now` always holds a leaked Box that is freed only by `drop`, in the process
        // that opened it.
        let open = unsafe { &*ptr };
        if open.pid == std::process::id() {
            return Ok(open);
        }
        let fresh = Box::into_raw(Box::new(self.reopen(open)?));
        match self
            .now
            .compare_exchange(ptr, fresh, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: just stored; lives until `drop`.
            Ok(_) => Ok(unsafe { &*fresh }),
            Err(_) => {
                // Another thread of this child reopened first: ours goes, theirs serves.
                // SAFETY: `fresh` was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                self.get()
            }
        }
    }

    /// A child's engine over the parent's catalog: the tiers, stores and lookahead anew, and no
    /// background work (the stage's stager and the watcher are the parent's; a stage directory
    /// is locked by the parent, so a child reads the images themselves).
    fn reopen(&self, parent: &Open) -> Result<Open, FsError> {
        let opts = EngineOptions {
            stage: None,
            save_index: None,
            // The parent serves the peers and reads from them; a child reads the images.
            peers: None,
            // An image changed since the parent opened it fails its own files here too.
            reopened: true,
            ..self.opts.clone()
        };
        let catalog = Arc::clone(parent.engine.catalog());
        let engine = Engine::over(catalog, &opts, Stores::network(self.stores.clone()), None)?;
        Ok(Open::new(engine, false))
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        let ptr = *self.now.get_mut();
        // SAFETY: a leaked Box (see `now`), alive until freed here.
        let pid = unsafe { &*ptr }.pid;
        if pid == std::process::id() {
            // SAFETY: this process's own, and no reference to it outlives `&mut self`.
            drop(unsafe { Box::from_raw(ptr) });
        }
    }
}
