//! packfs: serve millions of dataset sample files from a few large archive images through FUSE.
//!
//! The read path flows one way: `fs` (the FUSE adapter) answers from the `catalog` (the immutable
//! merged tree of all images) and reads bytes through `tiers` (the source images); `archive` scans
//! images into members; `daemon` owns the mount lifecycle. See docs/DESIGN.md.

pub mod archive;
pub mod catalog;
pub mod daemon;
pub mod dataset;
pub mod demo;
pub mod expand;
pub mod fs;
pub mod logging;
pub mod read_at;
pub mod tiers;
