//! `packfs pack`

use std::path::PathBuf;

use crate::pack::{PackOptions, Progress, ShardCount};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::args::Merge;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("count").args(["shards", "shard_size"])))]
pub struct Args {
    /// Directory trees (members are named from the directory's own name down, as `tar -C PARENT
    /// -c NAME` names them), images (tar, tar.gz, zip, squashfs; brace ranges and globs
    /// expanded) or one index, to reshard or convert.
    #[arg(required = true, num_args = 1.., value_name = "SOURCE")]
    sources: Vec<String>,
    /// Where the shards, the index and the manifest go (created if missing; never inside a
    /// source tree).
    #[arg(short, long, value_name = "OUTDIR")]
    output: PathBuf,
    /// Shards are NAME-000000.tar ..., the index NAME.packfs-index, the manifest NAME.json
    /// [default: the first source's name].
    #[arg(long)]
    name: Option<String>,
    /// Number of shards.
    #[arg(long, value_name = "N")]
    shards: Option<usize>,
    /// Make as many shards as it takes for about this size each (e.g. 1G, 512MiB).
    #[arg(long, value_name = "BYTES", value_parser = crate::util::size::parse_bytes)]
    shard_size: Option<u64>,
    /// Assign samples to shards (and order them inside) in a random order fixed by --seed, so
    /// every shard is a random sample of the dataset.
    #[arg(long)]
    shuffle: bool,
    /// Seed of --shuffle: the same seed, input and deal make the same bytes.
    #[arg(long, default_value_t = 0, requires = "shuffle")]
    seed: u64,
    /// How --shuffle deals samples to shards: 2 (the default: every shard within 1% of the mean
    /// bytes) or 1 (packfs 0.2's, to make an older pack's shards again from its seed). The
    /// manifest records it, and --resume keeps the deal of the pack it resumes.
    #[arg(long, value_name = "N", requires = "shuffle", value_parser = clap::value_parser!(u32).range(1..=2))]
    deal: Option<u32>,
    /// One modification time for every member (seconds since 1970), instead of the sources'.
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    mtime: Option<i64>,
    /// Keep the complete shards of an interrupted pack (checked against the plan and read once
    /// for their checksums) and write the rest.
    #[arg(long, conflicts_with = "force")]
    resume: bool,
    /// Replace existing shards, index and manifest of the same name.
    #[arg(long)]
    force: bool,
    /// Sync each shard to disk before it takes its name, so a crash of the node never leaves a
    /// shard unwritten under its name (costs the time the disk takes to write it all).
    #[arg(long)]
    sync: bool,
    /// Write the shards as NAME-000000.tar.zst ... in the zstd seekable format, at zstd's level
    /// 3 or LEVEL (1-22): frames cut between members, so `zstd -d`, `tar --zstd` and webdataset
    /// read them as ordinary .tar.zst, and packfs serves any member by decoding its frame.
    #[arg(long, value_name = "zstd[:LEVEL]")]
    compress: Option<String>,
    /// With --compress: decoded bytes per frame (a frame is cut at the next member boundary);
    /// a random read decodes about this much.
    #[arg(long, value_name = "BYTES", requires = "compress", value_parser = crate::util::size::parse_bytes)]
    frame_size: Option<u64>,
    /// Write a label member beside each sample of an ImageFolder tree (`train/n01/x.JPEG` gets
    /// `train/n01/x.EXT` holding the class number, ImageFolder's: its directory's place among
    /// its sibling directories in name order), so webdataset's `to_tuple("jpg", "cls")` and
    /// wids find the label. Usually `--labels cls`.
    #[arg(long, value_name = "EXT", value_parser = parse_label_ext)]
    labels: Option<String>,
    /// Threads reading source files (a parallel file system rewards many requests in flight).
    #[arg(long, default_value_t = 16, value_name = "N")]
    readers: usize,
    /// Shards written at once [default: 4, at most the number of shards].
    #[arg(long, default_value_t = 4, value_name = "N")]
    jobs: usize,
    #[command(flatten)]
    merge: Merge,
}

/// Shards of 1 GiB when neither --shards nor --shard-size is given: few files for the parallel
/// file system, yet enough of them to spread reads and staging over nodes.
const DEFAULT_SHARD_SIZE: u64 = 1 << 30;

pub fn run(args: Args, stores: crate::source::Stores) -> anyhow::Result<()> {
    let shards = match (args.shards, args.shard_size) {
        (Some(0), _) => anyhow::bail!("--shards 0: give at least 1"),
        (Some(n), _) => ShardCount::Count(n),
        (None, Some(size)) => ShardCount::Size(size),
        (None, None) => ShardCount::Size(DEFAULT_SHARD_SIZE),
    };
    let frame = args
        .frame_size
        .map_or(crate::pack::compress::DEFAULT_FRAME, |n| n as usize);
    let compress = args
        .compress
        .as_deref()
        .map(|c| crate::pack::compress::Compression::parse(c, frame))
        .transpose()
        .map_err(|why| anyhow::anyhow!("--compress: {why}"))?;
    let opts = PackOptions {
        sources: args.sources,
        out_dir: args.output,
        name: args.name,
        shards,
        shuffle: args.shuffle.then_some(args.seed),
        deal: args.deal,
        mtime: args.mtime,
        resume: args.resume,
        force: args.force,
        sync: args.sync,
        readers: args.readers,
        jobs: args.jobs,
        merge: args.merge.options(),
        compress,
        labels: args.labels,
        stores,
    };
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4));
    bar.set_style(ProgressStyle::with_template("gathering {msg}").expect("valid template"));
    let writing_style = ProgressStyle::with_template(
        "packing {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec}, {msg}, eta {eta}",
    )
    .expect("valid template");
    let log = super::progress::LogLines::new();
    let on_progress = |p: Progress| match p {
        Progress::Gathering { members, bytes } => {
            bar.set_message(format!(
                "{members} members, {}",
                indicatif::HumanBytes(bytes)
            ));
            log.say(|| {
                format!(
                    "gathering: {members} members, {}",
                    indicatif::HumanBytes(bytes)
                )
            });
        }
        Progress::Writing {
            members,
            bytes,
            total_members,
            total_bytes,
        } => {
            bar.set_message(format!("{members}/{total_members} members"));
            if bar.length() != Some(total_bytes) {
                bar.set_length(total_bytes);
                bar.set_style(writing_style.clone());
                bar.reset_eta();
            }
            bar.set_position(bytes);
            log.say(|| {
                format!(
                    "packing: {} of {} ({}%), {members} of {total_members} members",
                    indicatif::HumanBytes(bytes),
                    indicatif::HumanBytes(total_bytes),
                    bytes * 100 / total_bytes.max(1)
                )
            });
        }
    };
    say_how_to_resume_if_interrupted(&opts.out_dir, bar.clone());
    let report = crate::pack::pack(&opts, &on_progress)?;
    bar.finish_and_clear();
    let sizes: Vec<u64> = report.shards.iter().map(|s| s.bytes).collect();
    let counts: Vec<u64> = report.shards.iter().map(|s| s.samples).collect();
    let spread = |v: &[u64]| {
        let mean = v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
        let max = v.iter().copied().max().unwrap_or(0) as f64;
        let min = v.iter().copied().min().unwrap_or(0) as f64;
        (min / mean.max(1e-9), max / mean.max(1e-9))
    };
    let (bytes_lo, bytes_hi) = spread(&sizes);
    let (count_lo, count_hi) = spread(&counts);
    println!(
        "packed {} samples ({} files, {}) into {} shard(s) in {:.1} s ({:.0} MB/s, {:.0} files/s){}",
        report.samples,
        report.files,
        indicatif::HumanBytes(report.data_bytes),
        report.shards.len(),
        report.seconds,
        report.data_bytes as f64 / report.seconds.max(1e-3) / 1e6,
        report.files as f64 / report.seconds.max(1e-3),
        match report.resumed {
            0 => String::new(),
            n => format!("; {n} complete shard(s) kept"),
        }
    );
    println!(
        "  shards: {} .. {}; size {:.3}x..{:.3}x of the mean, samples {:.3}x..{:.3}x",
        report
            .shards
            .first()
            .map_or(String::new(), |s| s.path.display().to_string()),
        report
            .shards
            .last()
            .map_or(String::new(), |s| s.path.display().to_string()),
        bytes_lo,
        bytes_hi,
        count_lo,
        count_hi
    );
    println!("  index: {}", report.index.display());
    println!("  manifest: {}", report.manifest.display());
    if report.skipped > 0 {
        eprintln!(
            "warning: {} special file(s) (FIFOs, sockets, devices) left out; see the warnings above",
            report.skipped
        );
    }
    Ok(())
}

/// On Ctrl-C (or SIGTERM from a job's time limit), says what is kept and how to go on before
/// exiting as the signal would (130, 143): the next run would otherwise be the first to mention
/// `--resume`.
fn say_how_to_resume_if_interrupted(out_dir: &std::path::Path, bar: ProgressBar) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
        return;
    };
    let dir = out_dir.display().to_string();
    let spawned = std::thread::Builder::new()
        .name("packfs-pack-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                bar.finish_and_clear();
                eprintln!(
                    "packfs: pack interrupted; the shards completed in {dir} are kept: run the \
                     same command with --resume to keep them and write the rest (or --force to \
                     start over)"
                );
                std::process::exit(128 + signal);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch for Ctrl-C ({e}); an interrupted pack resumes with --resume");
    }
}

/// A member extension: letters, digits, `_` and `-` (it becomes part of every label's name).
fn parse_label_ext(text: &str) -> Result<String, String> {
    let ext = text.strip_prefix('.').unwrap_or(text);
    if !ext.is_empty()
        && ext
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        Ok(ext.to_string())
    } else {
        Err(format!("{text:?}: give an extension such as cls"))
    }
}
