//! `packfs demo`

use std::path::PathBuf;

use crate::demo::{DemoOptions, run_demo};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of sample files to generate.
    #[arg(long, default_value_t = 3000)]
    files: usize,
    /// Number of class folders.
    #[arg(long, default_value_t = 50)]
    classes: usize,
    /// Number of tar shards.
    #[arg(long, default_value_t = 4)]
    shards: usize,
    /// Work in this directory (kept afterwards) instead of a temporary one.
    #[arg(long)]
    workdir: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let report = run_demo(&DemoOptions {
        files: args.files,
        classes: args.classes,
        shards: args.shards,
        workdir: args.workdir,
    })?;
    println!("{report}");
    Ok(())
}
