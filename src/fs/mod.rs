//! The file system: `core` answers lookups, attributes, listings and reads from the catalog and
//! the tiers, with one error type and every errno chosen in `error`. `dispatch` does what every
//! FUSE transport does alike (the guard, the errno, the recording); the transports only decode
//! requests and encode replies: `classic` (fuser on /dev/fuse, the only module that knows fuser
//! besides `session`, which mounts with the `options`) and `ring` (FUSE over io_uring). `reads`
//! serves file data inline or from a worker pool, so that a slow read on the parallel filesystem
//! never holds up a lookup; `splice` answers the classic loop's reads of stored bytes by splicing
//! them from the image file into /dev/fuse (no copy in the daemon); `kernel_readahead` sets the kernel's readahead for the mount (the
//! tiers' own read-ahead is `tiers::read_ahead`); `requests` counts every request and its
//! latency, `trace` writes each one with `--trace`; `error_log` keeps a flood of failures from
//! flooding the log.

mod attr;
pub mod cat;
mod classic;
pub mod core;
mod dispatch;
pub mod error;
pub mod error_log;
pub mod kernel_readahead;
mod options;
pub mod page_cache;
mod reads;
pub mod requests;
mod ring;
mod session;
mod splice;
pub mod trace;

pub use self::core::{Attr, Core, DirEntry, Ino, Listing, Owner, ROOT_INO};
pub use classic::PackFs;
pub use dispatch::Observer;
pub use error::{Error, counts_as_error};
pub use options::{
    DEFAULT_IO_THREADS, DEFAULT_THREADS, FsOptions, ReaddirPlus, SUBTYPE, Transport,
};
pub use session::{Mounted, mount};
