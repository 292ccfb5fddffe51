//! `packfs cat`

use crate::engine::{Engine, EngineOptions};
use crate::source::Stores;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

use super::args::{Images, Merge};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    images: Images,
    /// Path of the file inside the merged tree (bytes, as the archive names it).
    path: OsString,
    #[command(flatten)]
    merge: Merge,
}

pub fn run(args: Args, stores: Stores) -> anyhow::Result<()> {
    let opts = EngineOptions::one_shot(args.images.images.clone(), args.merge.options());
    let engine = Engine::open(&opts, stores, None, &crate::dataset::quiet)?;
    let mut out = std::io::stdout().lock();
    crate::fs::cat::cat(&engine, args.path.as_bytes(), &mut out)?;
    out.flush()?;
    Ok(())
}
