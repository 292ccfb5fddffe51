//! packfs: serve millions of dataset sample files from a few large archive images through FUSE.
//!
//! The read path flows one way: `fs` (a transport-neutral dispatch, and two FUSE transports that
//! only decode requests and encode replies) answers from the `catalog` (the immutable merged tree
//! of all images), asks the format (`archive::placement`, in the vocabulary of `archive::plan`) which
//! pieces make up a byte range, and has `tiers` fetch them (staged copy, RAM cache, and the images
//! opened from `source`: files, or objects by URL). `archive` also scans images into members;
//! `daemon` owns the mount lifecycle; `dataset` turns image arguments into a catalog; `pack` writes
//! shards; `peers` lets the nodes of a job read each other's staged shares; `demo` is `packfs
//! demo` from end to end; `util` the small shared helpers.
//! See docs/design.md.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod archive;
pub mod catalog;
pub mod cli;
pub mod daemon;
pub mod dataset;
pub mod demo;
pub mod engine;
pub mod fs;
pub mod pack;
pub mod peers;
pub mod python;
pub mod source;
pub mod tiers;
pub mod util;

/// packfs's own buffers of 1 MiB or more are mapped for themselves and given back when freed
/// (`util::alloc`), in the binary and in a process the Python module is loaded into.
#[global_allocator]
static ALLOCATOR: util::alloc::LargeMapped = util::alloc::LargeMapped;
