//! The file system: `core` answers lookups, attributes, listings and reads from the catalog and
//! the tiers, with one error type (`error`). `dispatch` does what every FUSE transport does alike
//! (the guard, the errno, the refusals, the recording); the transports only decode requests and
//! encode replies: `classic` (fuser on /dev/fuse, the only module that knows fuser besides
//! `session`, which mounts with the `options`) and `ring` (FUSE over io_uring). `reads` serves file data inline or
//! from a worker pool, so that a slow read on the parallel filesystem never holds up a lookup;
//! `readahead` sets the kernel's readahead for the mount; `requests` counts every request and its
//! latency, `trace` writes each one with `--trace`; `error_log` keeps a flood of failures from
//! flooding the log.

mod attr;
mod classic;
pub mod core;
mod dispatch;
pub mod error;
pub mod error_log;
mod options;
pub mod readahead;
mod reads;
pub mod requests;
mod ring;
mod session;
pub mod trace;

pub use self::core::{Attr, Core, DirEntry, Ino, Listing, Owner, ROOT_INO};
pub use classic::PackFs;
pub use dispatch::{Observer, counts_as_error};
pub use error::Error;
pub use options::{
    DEFAULT_IO_THREADS, DEFAULT_THREADS, FsOptions, ReaddirPlus, SUBTYPE, Transport,
};
pub use session::{Mounted, mount};
