//! `packfs stage`: the mount's background copy as a blocking command, for prologues that prefer
//! to wait until the data is local.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use packfs::catalog::{self, ImageInfo};
use packfs::tiers::Source;
use packfs::tiers::stage::{Stage, StageMode, run_copier};

use super::staging::StageFlags;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// One index file, or images (brace ranges and globs expanded), in the order given to mount.
    #[arg(required = true, num_args = 1..)]
    images: Vec<String>,
    /// The stage directory that `packfs mount --stage DIR` will be given.
    #[arg(long, value_name = "DIR")]
    to: PathBuf,
    #[command(flatten)]
    staging: StageFlags,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (source, infos) = open_images(&args.images)?;
    let source = Arc::new(source);
    let opts = args.staging.options(args.to.clone(), StageMode::Eager)?;
    let holder = format!("pid {}: packfs stage", std::process::id());
    let stage = Stage::open(opts, source, &infos, &holder)?;
    let before = stage.stats();
    let bar = ProgressBar::with_draw_target(Some(before.total_bytes), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(
            "staging {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec}, eta {eta}",
        )
        .expect("valid template"),
    );
    bar.set_position(before.present_bytes);
    bar.reset_eta();
    let started = Instant::now();
    run_copier(&stage, true, Some(&bar));
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
        let budget_only = after.status.contains("stage budget");
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

/// The images opened, with their fingerprints: as the index recorded them (checked), or as found.
fn open_images(patterns: &[String]) -> anyhow::Result<(Source, Vec<ImageInfo>)> {
    let paths = packfs::dataset::image_paths(patterns)?;
    if let [index] = paths.as_slice()
        && catalog::index::is_index(index)
    {
        let infos = catalog::index::open(index)?.images().to_vec();
        return Ok((Source::open(&infos)?, infos));
    }
    Ok(Source::open_as_is(&paths)?)
}
