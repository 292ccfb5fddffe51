//! A gzip-compressed tar on arbitrary bytes: the inflate indexer (checkpoints) under the tar
//! scanner, then reads of everything through the checkpoints.
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    common::run(bytes, packfs::archive::tar::GZIP_TAR.scan);
});
