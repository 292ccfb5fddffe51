//! A bzip2-compressed tar on arbitrary bytes: the block finder and indexer under the tar scanner,
//! then reads of everything, one block decoded per read.
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    common::run(bytes, packfs::archive::tar::BZIP2_TAR.scan);
});
