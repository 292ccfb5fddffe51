//! packfs: serve millions of dataset sample files from a few large archive images through FUSE.
//!
//! The read path flows one way: `fs` (a thin FUSE adapter over the file-system core) answers from
//! the `catalog` (the immutable merged tree of all images), asks the format (`archive::layout`)
//! which pieces make up a byte range, and has `tiers` fetch them (staged copy, RAM cache, source
//! through `read_at::ReadAt`); `archive` also scans images into members; `daemon` owns the mount
//! lifecycle; `dataset` turns image arguments into a catalog. See docs/design.md.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod archive;
pub mod catalog;
pub mod daemon;
pub mod dataset;
pub mod demo;
pub mod expand;
pub mod fs;
pub mod logging;
pub mod pack;
pub mod safe_file;
pub mod size;
pub mod source;
pub mod tiers;
pub mod trace_summary;
pub mod verify;
