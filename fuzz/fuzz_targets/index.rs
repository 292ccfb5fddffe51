//! An index on arbitrary bytes, its checksums fixed first (they are plain xxh3: an attacker fixes
//! them too, so the checks behind them must hold alone). Then what a mount does with it: the
//! structure check, walks, lookups, layouts and reads planned and executed over in-memory images.
#![no_main]

#[path = "common.rs"]
mod common;

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    common::run_index(bytes);
});
