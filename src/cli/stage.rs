//! `packfs stage`: the mount's background copy as a blocking command, for prologues that prefer
//! to wait until the data is local.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::tiers::stage::{Stage, StageMode, StopReason, run_copier};
use anyhow::bail;

use super::args::Images;
use super::progress::staging_bar;
use super::staging::StageFlags;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Images or one index, in the order given to mount (staged copies are matched by path).
    #[command(flatten)]
    images: Images,
    /// The stage directory that `packfs mount --stage DIR` will be given.
    #[arg(long, value_name = "DIR")]
    to: PathBuf,
    #[command(flatten)]
    staging: StageFlags,
    /// Look for the images of an index in this directory (by file name) first: for shards that
    /// moved since the index was written.
    #[arg(long, value_name = "DIR")]
    images_dir: Option<PathBuf>,
}

pub fn run(args: Args, stores: &crate::source::Stores) -> anyhow::Result<()> {
    let (source, infos) =
        crate::dataset::open_images(&args.images.images, args.images_dir.as_deref(), stores)?;
    let opts = args.staging.options(args.to.clone(), StageMode::Eager)?;
    let holder = format!("pid {}: packfs stage", std::process::id());
    let stage = Stage::open(opts, Arc::new(source), &infos, &holder, None)?;
    let before = stage.stats();
    let bar = staging_bar(before.total_bytes, before.present_bytes);
    let started = Instant::now();
    run_copier(&stage, true, Some(&|done| bar.set_position(done)));
    bar.finish_and_clear();
    let after = stage.stats();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "staged {} of {} bytes of {} image(s) in {}: copied {} bytes in {secs:.1} s ({:.0} MB/s)",
        after.present_bytes,
        after.total_bytes,
        after.images,
        args.to.display(),
        after.copied_bytes,
        after.copied_bytes as f64 / secs.max(1e-3) / 1e6
    );
    if after.present_bytes < after.total_bytes {
        let budget_only = after.stopped == Some(StopReason::Budget);
        if !budget_only {
            bail!(
                "staging incomplete ({}); a mount with --stage {} serves the rest from the source",
                after.status,
                args.to.display()
            );
        }
        eprintln!("{}", after.status);
    }
    Ok(())
}
