//! The zip scanner on arbitrary bytes, then reads of everything it found.
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    common::run(bytes, packfs::archive::zip::scan);
});
