//! The FUSE side: the only module that knows fuser.
//!
//! `adapter` answers kernel requests from the catalog; `reads` serves file data inline or from a
//! worker pool so that a slow read on the parallel filesystem never holds up a lookup; `session`
//! mounts and runs it.

mod adapter;
mod attr;
mod reads;
mod session;

pub use adapter::PackFs;
pub use session::{FsOptions, Mounted, ReaddirPlus, mount};
