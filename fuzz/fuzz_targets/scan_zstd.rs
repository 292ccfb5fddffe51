//! A zstd-compressed tar on arbitrary bytes: the frame indexer under the tar scanner, then reads
//! of everything, one frame decoded per read.
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    common::run(bytes, packfs::archive::tar::ZSTD_TAR.scan);
});
