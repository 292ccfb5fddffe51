//! `packfs pack`: directory trees, images or an index in; balanced, optionally shuffled tar shards
//! out (WebDataset's layout: a sample's files share a key and sit together), with the index of
//! what was written and a JSON manifest that webdataset's `wids` reads.
//!
//! Steps: gather the members (`gather`), group them into samples and cut the samples into shards
//! (`plan`), write the shards several at once (`shard`, headers from `tar_writer`), then build the
//! catalog from what was written (no re-scan) and write the index and the manifest.

pub mod compress;
pub mod gather;
mod labels;
mod manifest;
mod outputs;
pub mod plan;
pub mod shard;
pub mod tar_writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use tracing::{info, warn};

use crate::catalog::{self, DuplicatePolicy, index};
use gather::{Found, Item, ItemKind, Sources};
use outputs::{check_name, check_outputs, default_name, lock, open_sources};
use shard::{Done, ShardPlan, Writer};

/// How many shards to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardCount {
    Count(usize),
    /// As many as it takes for shards of about this many bytes.
    Size(u64),
}

#[derive(Clone, Debug)]
pub struct PackOptions {
    pub sources: Vec<String>,
    /// Where images given by URL are read from.
    pub stores: crate::source::Stores,
    pub out_dir: PathBuf,
    /// Shards are `NAME-000000.tar`...; the index `NAME.packfs-index`, the manifest `NAME.json`.
    pub name: Option<String>,
    pub shards: ShardCount,
    /// Seed of the shuffle of samples; `None` keeps them in path order.
    pub shuffle: Option<u64>,
    /// How shuffled samples are dealt to shards (`plan::deal`): `None` for `plan::DEAL`, or with
    /// `resume` the deal the interrupted pack began with (`deal_of_earlier_pack`).
    pub deal: Option<u32>,
    /// One mtime for every member, instead of the sources'.
    pub mtime: Option<i64>,
    pub resume: bool,
    pub force: bool,
    /// Sync each shard to disk before it takes its name (survives a crash of the node).
    pub sync: bool,
    /// Threads reading members (and walking directories).
    pub readers: usize,
    /// Shards written at once.
    pub jobs: usize,
    /// For image sources: what to do when two images hold one path.
    pub merge: crate::dataset::Merge,
    /// Write `.tar.zst` shards in the zstd seekable format (`compress`), not plain tars.
    pub compress: Option<compress::Compression>,
    /// Write a label member of this extension beside each sample of an ImageFolder tree
    /// (`labels`), e.g. `cls`.
    pub labels: Option<String>,
}

impl PackOptions {
    /// The shard file suffix.
    pub fn shard_suffix(&self) -> &'static str {
        match self.compress {
            Some(_) => compress::SUFFIX,
            None => ".tar",
        }
    }
}

/// Progress of a pack, for a progress display.
#[derive(Clone, Copy, Debug)]
pub enum Progress {
    /// Walking the sources: members and bytes found so far.
    Gathering { members: u64, bytes: u64 },
    /// Writing: members and data bytes done, of the totals.
    Writing {
        members: u64,
        bytes: u64,
        total_members: u64,
        total_bytes: u64,
    },
}

/// What a pack made.
#[derive(Debug)]
pub struct Report {
    pub shards: Vec<ShardReport>,
    pub index: PathBuf,
    pub manifest: PathBuf,
    pub samples: u64,
    pub files: u64,
    /// Bytes of file data.
    pub data_bytes: u64,
    /// Shards kept from an interrupted run (`--resume`).
    pub resumed: usize,
    /// Source entries left out (special files).
    pub skipped: u64,
    pub seconds: f64,
}

#[derive(Clone, Debug)]
pub struct ShardReport {
    pub path: PathBuf,
    pub samples: u64,
    pub members: u64,
    /// Size of the shard file.
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PackError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot read {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot write {}: {error}", path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}")]
    Source(String),
    #[error(transparent)]
    Dataset(#[from] crate::dataset::DatasetError),
    #[error(transparent)]
    Tiers(#[from] crate::tiers::OpenError),
    #[error(
        "{} exists and is not what this pack would write: {why}; remove it, or pass --force to \
         rewrite every shard",
        path.display()
    )]
    ShardDiffers { path: PathBuf, why: String },
    #[error("{what} already exist in {}: {first} ...; pass --resume to keep the complete shards \
             and write the rest, or --force to replace them", dir.display())]
    Exists {
        dir: PathBuf,
        what: String,
        first: String,
    },
    #[error("another pack is writing {name} in {}: wait for it, or give another --name", dir.display())]
    Busy { dir: PathBuf, name: String },
    #[error(transparent)]
    Build(#[from] catalog::BuildError),
    #[error(transparent)]
    Index(#[from] index::IndexError),
    #[error("stopped after another shard failed")]
    Aborted,
}

/// Packs `opts.sources` into shards in `opts.out_dir`.
pub fn pack(
    opts: &PackOptions,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Result<Report, PackError> {
    let started = Instant::now();
    std::fs::create_dir_all(&opts.out_dir).map_err(|error| PackError::Write {
        path: opts.out_dir.clone(),
        error,
    })?;
    let out_dir = opts
        .out_dir
        .canonicalize()
        .map_err(|error| PackError::Write {
            path: opts.out_dir.clone(),
            error,
        })?;
    let sources = open_sources(opts, &out_dir)?;
    let name = match &opts.name {
        Some(n) => n.clone(),
        None => default_name(&sources)?,
    };
    check_name(&name)?;
    let _lock = lock(&out_dir, &name)?;
    // Before the walk, which may take long: refuse at once what `check_outputs` would refuse.
    if !opts.force && !opts.resume {
        let first = out_dir.join(format!("{name}-000000{}", opts.shard_suffix()));
        let index_path = out_dir.join(format!("{name}.packfs-index"));
        if let Some(found) = [first, index_path]
            .into_iter()
            .find(|p| p.symlink_metadata().is_ok())
        {
            return Err(PackError::Exists {
                dir: out_dir.clone(),
                what: "shards or an index of this name".into(),
                first: found.display().to_string(),
            });
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.readers.max(1))
        .thread_name(|i| format!("pack-read-{i}"))
        .build()
        .map_err(|e| PackError::Source(format!("cannot start reader threads: {e}")))?;

    let deal = match opts.deal {
        Some(version) => version,
        None if opts.resume => deal_of_earlier_pack(&out_dir, &name)?,
        None => plan::DEAL,
    };
    if !(1..=plan::DEAL).contains(&deal) {
        return Err(PackError::Usage(format!(
            "deal {deal} is not one this packfs knows (1 to {})",
            plan::DEAL
        )));
    }
    let opts = &PackOptions {
        deal: Some(deal),
        ..opts.clone()
    };
    if opts.shuffle.is_some() {
        // Before any shard: a --resume of this pack, cut short, must deal as it did.
        let state = state_path(&out_dir, &name);
        crate::util::safe_file::replace(&state, format!("{{\"deal\":{deal}}}\n").as_bytes(), 0o644)
            .map_err(|error| PackError::Write { path: state, error })?;
    }
    let (items, dirs, skipped) = gather(opts, &sources, &pool, on_progress)?;
    info!(
        members = items.len(),
        "sources walked and sorted in {:.3} s",
        started.elapsed().as_secs_f64()
    );
    let plans = plan_shards(opts, &items, dirs, &out_dir, &name)?;
    let index_path = out_dir.join(format!("{name}.packfs-index"));
    let manifest_path = out_dir.join(format!("{name}.json"));
    check_outputs(
        opts,
        &out_dir,
        &plans,
        &index_path,
        &manifest_path,
        &sources,
    )?;
    let removed = shard::remove_partials(&out_dir, &name);
    if removed > 0 {
        info!("removed {removed} temporary file(s) of an interrupted pack");
    }

    let done = Done::default();
    let abort = AtomicBool::new(false);
    let writer = Writer {
        items: &items,
        sources: &sources,
        pool: &pool,
        done: &done,
        abort: &abort,
        force: opts.force,
        sync: opts.sync,
        compress: opts.compress,
    };
    let total_data: u64 = items.iter().map(|i| i.size).sum();
    let progress = || {
        on_progress(Progress::Writing {
            members: done.members.load(Ordering::Relaxed),
            bytes: done.bytes.load(Ordering::Relaxed),
            total_members: items.len() as u64,
            total_bytes: total_data,
        })
    };
    let (images, resumed) = with_ticker(&progress, || write_shards(opts, &plans, &writer))?;
    progress();
    info!("shards written at {:.3} s", started.elapsed().as_secs_f64());

    // The index, from what was written.
    let catalog = catalog::build(&images, DuplicatePolicy::Error)?;
    index::write_synced(&catalog, &index_path, opts.sync)?;
    let shards: Vec<ShardReport> = plans
        .iter()
        .zip(&images)
        .map(|(p, image)| ShardReport {
            path: p.path.clone(),
            samples: p.samples,
            members: p.members.len() as u64,
            bytes: image.size,
        })
        .collect();
    let report = Report {
        shards,
        index: index_path,
        manifest: manifest_path,
        samples: plans.iter().map(|p| p.samples).sum(),
        files: items.iter().filter(|i| i.kind == ItemKind::File).count() as u64,
        data_bytes: total_data,
        resumed,
        skipped,
        seconds: started.elapsed().as_secs_f64(),
    };
    manifest::write(&report, &name, opts, &sources)?;
    let extra = shard::extra_shards(&out_dir, &name, plans.len());
    if let Some(first) = extra.first() {
        warn!(
            "{} other shard(s) named like these are in {} ({} ...), left by an earlier pack: \
             they are not part of this dataset (the index and {} list the ones that are); \
             remove them before mounting by pattern",
            extra.len(),
            out_dir.display(),
            first.display(),
            report.manifest.display()
        );
    }
    Ok(report)
}

/// Runs `work`, calling `tick` every 100 ms meanwhile (for a progress display).
fn with_ticker<R: Send>(tick: &(dyn Fn() + Sync), work: impl FnOnce() -> R) -> R {
    let running = AtomicBool::new(true);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while running.load(Ordering::Relaxed) {
                tick();
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        });
        let result = work();
        running.store(false, Ordering::Relaxed);
        result
    })
}

/// Every member of the sources, directories first, then in sample order without duplicates;
/// returns them, the number of directories and the number of entries left out.
fn gather(
    opts: &PackOptions,
    sources: &Sources,
    pool: &rayon::ThreadPool,
    on_progress: &(dyn Fn(Progress) + Sync),
) -> Result<(Vec<Item>, usize, u64), PackError> {
    let found = Found::default();
    let tick = || {
        on_progress(Progress::Gathering {
            members: found.members.load(Ordering::Relaxed),
            bytes: found.bytes.load(Ordering::Relaxed),
        })
    };
    let (mut items, skipped) = with_ticker(&tick, || sources.gather(pool, &found))?;
    if let Some(ext) = &opts.labels {
        let labels = labels::members(&items, ext);
        items.extend(labels);
    }
    pool.install(|| {
        use rayon::prelude::*;
        items.par_iter_mut().for_each(|i| {
            i.set_key();
            if let Some(mtime) = opts.mtime {
                i.mtime = mtime;
            }
        })
    });
    order_items(&mut items, pool);
    let (items, dirs) = dedupe(items, sources)?;
    Ok((items, dirs, skipped))
}

/// Samples, their order and the shards: what each shard holds, in order.
fn plan_shards(
    opts: &PackOptions,
    items: &[Item],
    dirs: usize,
    out_dir: &Path,
    name: &str,
) -> Result<Vec<ShardPlan>, PackError> {
    let keys: Vec<&[u8]> = items[dirs..].iter().map(Item::key).collect();
    let bytes: Vec<u64> = items[dirs..].iter().map(tar_bytes).collect();
    let mut samples = plan::samples(&keys, &bytes);
    for s in &mut samples {
        s.members = (s.members.0 + dirs as u32, s.members.1 + dirs as u32);
    }
    if let Some(seed) = opts.shuffle {
        plan::shuffle(&mut samples, seed);
    }
    let total_bytes: u64 = samples.iter().map(|s| s.bytes).sum();
    let count = match opts.shards {
        ShardCount::Count(n) => n,
        // A size below one sample's means a shard per sample, not an error.
        ShardCount::Size(size) => (total_bytes.div_ceil(size.max(1)) as usize).min(samples.len()),
    }
    .max(1);
    if count > samples.len().max(1) {
        return Err(PackError::Usage(format!(
            "{count} shards for {} samples: give at most one shard per sample",
            samples.len()
        )));
    }
    // Shuffled: dealt for balance (the order is random anyway); sorted: contiguous runs, so a
    // shard holds neighbouring paths (whole classes of an ImageFolder tree).
    let assignment: Vec<Vec<usize>> = if samples.is_empty() {
        vec![Vec::new()]
    } else if opts.shuffle.is_some() {
        plan::deal(&samples, count, opts.deal.unwrap_or(plan::DEAL))
    } else {
        plan::split(&samples, count)
            .into_iter()
            .map(|r| r.collect())
            .collect()
    };
    Ok(assignment
        .iter()
        .enumerate()
        .map(|(k, picked)| {
            // The directories go first in the first shard: tiny, and every mount needs them.
            let mut members: Vec<u32> = if k == 0 {
                (0..dirs as u32).collect()
            } else {
                Vec::new()
            };
            for &s in picked {
                members.extend(samples[s].members.0..samples[s].members.1);
            }
            ShardPlan {
                path: out_dir.join(format!("{name}-{k:06}{}", opts.shard_suffix())),
                members,
                samples: picked.len() as u64,
            }
        })
        .collect())
}

/// Where a shuffled pack notes its deal before it writes a shard (`.NAME.pack-state`, kept
/// beside the lock file: the manifest, which records it too, comes only at the end).
fn state_path(out_dir: &Path, name: &str) -> PathBuf {
    out_dir.join(format!(".{name}.pack-state"))
}

/// The deal of the pack of `name` in `out_dir` that `--resume` goes on with: the one its state
/// file notes (a pack cut short), else its manifest's (a whole pack; none recorded: 1), else 1
/// if shards of it exist (written before deals had versions), else the current one.
fn deal_of_earlier_pack(out_dir: &Path, name: &str) -> Result<u32, PackError> {
    let read = |path: PathBuf| -> Result<Option<serde_json::Value>, PackError> {
        let file = match crate::util::safe_file::no_follow().read(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(PackError::Read { path, error }),
        };
        crate::util::safe_file::check_owned(&file, &path).map_err(|error| PackError::Read {
            path: path.clone(),
            error,
        })?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(&file, 1 << 24), &mut text)
            .map_err(|error| PackError::Read {
                path: path.clone(),
                error,
            })?;
        Ok(serde_json::from_str(&text).ok())
    };
    let deal_in =
        |doc: &serde_json::Value| doc.get("deal").and_then(|d| d.as_u64()).map(|d| d as u32);
    if let Some(state) = read(state_path(out_dir, name))? {
        return Ok(deal_in(&state).unwrap_or(1));
    }
    if let Some(manifest) = read(out_dir.join(format!("{name}.json")))? {
        return Ok(deal_in(&manifest).unwrap_or(1));
    }
    let earlier = std::fs::read_dir(out_dir)
        .map(|dir| {
            dir.flatten().any(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(&format!("{name}-")))
            })
        })
        .unwrap_or(false);
    Ok(if earlier { 1 } else { plan::DEAL })
}

/// Writes (or, resuming, checks) the shards, `opts.jobs` at a time, in order; a failure stops
/// the others and is the error returned. Also returns how many shards were kept.
fn write_shards(
    opts: &PackOptions,
    plans: &[ShardPlan],
    writer: &Writer,
) -> Result<(Vec<crate::archive::ScannedImage>, usize), PackError> {
    use rayon::prelude::*;
    let jobs = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.jobs.clamp(1, plans.len()))
        .thread_name(|i| format!("pack-write-{i}"))
        .build()
        .map_err(|e| PackError::Source(format!("cannot start writer threads: {e}")))?;
    let resumed = AtomicUsize::new(0);
    let results: Vec<Result<_, PackError>> = jobs.install(|| {
        plans
            .par_iter()
            .with_max_len(1)
            .map(|plan| {
                if writer.abort.load(Ordering::Relaxed) {
                    return Err(PackError::Aborted);
                }
                let result = if opts.resume && plan.path.exists() {
                    resumed.fetch_add(1, Ordering::Relaxed);
                    writer.check_existing(plan)
                } else {
                    writer.write(plan)
                };
                if result.is_err() {
                    writer.abort.store(true, Ordering::Relaxed);
                }
                result
            })
            .collect()
    });
    // The first real failure, not the shards stopped because of it.
    let mut images = Vec::with_capacity(plans.len());
    let mut first_error = None;
    for result in results {
        match result {
            Ok(image) => images.push(image),
            Err(PackError::Aborted) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => return Err(e),
        None if images.len() != plans.len() => return Err(PackError::Aborted),
        None => {}
    }
    Ok((images, resumed.into_inner()))
}

/// Refuses to merge two sources' members of one name (directories merge, as in a mount); the
/// items are in `order_items` order, so equal paths are neighbours. Returns the items kept and
/// the number of directories (first).
fn dedupe(items: Vec<Item>, sources: &Sources) -> Result<(Vec<Item>, usize), PackError> {
    let origin = |i: &Item| match i.origin {
        gather::Origin::Disk(d) => sources.dirs[d as usize].root.display().to_string(),
        gather::Origin::Catalog(_) => sources.image_patterns.join(" "),
        gather::Origin::Label(_) => "--labels".to_string(),
    };
    let clash = |a: &Item, b: &Item| {
        PackError::Usage(format!(
            "{:?} is in two sources: {} and {}",
            String::from_utf8_lossy(&b.path),
            origin(a),
            origin(b)
        ))
    };
    let mut out: Vec<Item> = Vec::with_capacity(items.len());
    for item in items {
        if let Some(last) = out.last_mut()
            && last.path == item.path
        {
            if last.kind == ItemKind::Dir && item.kind == ItemKind::Dir {
                *last = item;
                continue;
            }
            return Err(clash(last, &item));
        }
        out.push(item);
    }
    // A file of one source where another has a directory.
    let dirs = out.iter().take_while(|i| i.kind == ItemKind::Dir).count();
    let (dir_items, rest) = out.split_at(dirs);
    for item in rest {
        if let Ok(d) = dir_items.binary_search_by(|d| d.path.cmp(&item.path)) {
            return Err(clash(&dir_items[d], item));
        }
    }
    Ok((out, dirs))
}

/// Directories first (by path), then every other member by (key, path), so a sample's members
/// are adjacent and sorted. Stable: of two directories of one path, the later source's is last.
fn order_items(items: &mut [Item], pool: &rayon::ThreadPool) {
    use rayon::slice::ParallelSliceMut;
    pool.install(|| {
        items.par_sort_by(|a, b| {
            (a.kind != ItemKind::Dir)
                .cmp(&(b.kind != ItemKind::Dir))
                .then_with(|| match a.kind {
                    ItemKind::Dir => a.path.cmp(&b.path),
                    _ => a.key().cmp(b.key()).then_with(|| a.path.cmp(&b.path)),
                })
        })
    });
}

/// Bytes a member takes in a shard.
fn tar_bytes(item: &Item) -> u64 {
    let kind = item.header_kind();
    tar_writer::header_len(&item.path, kind, item.mtime)
        + item.size
        + tar_writer::padding(item.size)
}
