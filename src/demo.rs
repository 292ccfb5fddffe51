//! `packfs demo`: the whole story in one command. Generates a small ImageFolder-style dataset of
//! JPEG-like files, packs it into shuffled tar shards with their index (`pack`), mounts the index,
//! walks and reads every file through the kernel, checks every byte against the original, and
//! reports the speed.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::catalog::DuplicatePolicy;
use crate::daemon::{self, MountError};
use crate::dataset;
use crate::engine::{Engine, EngineError, EngineOptions};
use crate::fs::{self, Core, FsOptions, Mounted};
use crate::pack::{self, PackError, PackOptions, ShardCount};
use crate::source::Stores;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("files, classes and shards must be positive")]
    Options,
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{what}: {error}")]
    Read { what: String, error: std::io::Error },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Pack(#[from] PackError),
    /// The mount did not serve what was packed.
    #[error("{0}")]
    Mismatch(String),
}

#[derive(Clone, Debug)]
pub struct DemoOptions {
    pub files: usize,
    pub classes: usize,
    pub shards: usize,
    /// Kept afterwards when given; otherwise a temporary directory is used and removed.
    pub workdir: Option<PathBuf>,
}

#[derive(Debug)]
pub struct DemoReport {
    pub files: usize,
    pub dirs: usize,
    pub bytes: u64,
    pub shards: usize,
    pub pack_time: Duration,
    pub mount_time: Duration,
    pub walk_time: Duration,
    pub read_time: Duration,
    pub workdir: PathBuf,
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mb = self.bytes as f64 / 1e6;
        let per_s = |n: f64, t: Duration| n / t.as_secs_f64().max(1e-9);
        writeln!(
            f,
            "packfs demo: {} files in {} directories, {mb:.1} MB, packed into {} tar shards under {}",
            self.files,
            self.dirs,
            self.shards,
            self.workdir.display()
        )?;
        writeln!(
            f,
            "  pack:  {} shards and their index in {:.3} s ({:.0} MB/s)",
            self.shards,
            self.pack_time.as_secs_f64(),
            per_s(mb, self.pack_time)
        )?;
        writeln!(
            f,
            "  mount: ready in {:.3} s (from the index)",
            self.mount_time.as_secs_f64()
        )?;
        writeln!(
            f,
            "  walk:  {} entries in {:.3} s ({:.0} entries/s)",
            self.files + self.dirs,
            self.walk_time.as_secs_f64(),
            per_s((self.files + self.dirs) as f64, self.walk_time)
        )?;
        write!(
            f,
            "  read:  {} files, {mb:.1} MB in {:.3} s ({:.0} files/s, {:.0} MB/s); every byte matches the original",
            self.files,
            self.read_time.as_secs_f64(),
            per_s(self.files as f64, self.read_time),
            per_s(mb, self.read_time)
        )
    }
}

/// Unmounts on drop, so a failed check never leaves a mount behind.
struct MountGuard(Option<Mounted>);

impl Drop for MountGuard {
    fn drop(&mut self) {
        if let Some(mut m) = self.0.take() {
            let _ = daemon::unmount(m.mountpoint(), true, false);
            m.wait(Some(Duration::from_secs(5)));
        }
    }
}

pub fn run_demo(opts: &DemoOptions) -> Result<DemoReport, DemoError> {
    if opts.files == 0 || opts.classes == 0 || opts.shards == 0 {
        return Err(DemoError::Options);
    }
    daemon::check_fuse_available()?;
    let tempdir;
    let workdir = match &opts.workdir {
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            dir.clone()
        }
        None => {
            tempdir = tempfile::Builder::new().prefix("packfs-demo-").tempdir()?;
            tempdir.path().to_path_buf()
        }
    };
    let source_dir = workdir.join("source");
    let shard_dir = workdir.join("shards");
    let mnt = workdir.join("mnt");
    for d in [&source_dir, &shard_dir, &mnt] {
        std::fs::create_dir_all(d)?;
    }

    let samples = generate_dataset(&source_dir, opts.files, opts.classes)?;
    let bytes = samples.iter().map(|s| s.1).sum();
    let started = Instant::now();
    let packed = pack::pack(
        &PackOptions {
            sources: vec![source_dir.join("train").display().to_string()],
            out_dir: shard_dir,
            name: None,
            shards: ShardCount::Count(opts.shards.min(opts.files)),
            shuffle: Some(42),
            deal: None,
            mtime: Some(1_700_000_000),
            resume: false,
            force: true,
            sync: false,
            readers: 8,
            jobs: 2,
            merge: DuplicatePolicy::Error.into(),
            compress: None,
            labels: None,
            stores: Stores::default(),
        },
        &|_| {},
    )?;
    let pack_time = started.elapsed();

    let started = Instant::now();
    let index = vec![packed.index.display().to_string()];
    let one_shot = EngineOptions::one_shot(index, DuplicatePolicy::Error.into());
    let engine = Engine::open(&one_shot, Stores::default(), None, &dataset::quiet)?;
    let mnt = daemon::check_mountpoint(&mnt, false)?;
    let fs_opts = FsOptions::default();
    let core = Arc::new(Core::over(&engine, fs_opts.owner()));
    let guard = MountGuard(Some(fs::mount(core, &mnt, &fs_opts, Arc::default())?));
    std::fs::metadata(&mnt)?;
    let mount_time = started.elapsed();

    let started = Instant::now();
    let (mut files, dirs) = walk(&mnt)?;
    let walk_time = started.elapsed();
    files.sort();
    let mut expected: Vec<PathBuf> = samples.iter().map(|s| s.0.clone()).collect();
    expected.sort();
    if files != expected {
        return Err(DemoError::Mismatch(format!(
            "the mount lists {} files, the dataset has {}",
            files.len(),
            expected.len()
        )));
    }

    let started = Instant::now();
    let mut read_bytes = 0u64;
    for rel in &files {
        let got = std::fs::read(mnt.join(rel)).map_err(|error| DemoError::Read {
            what: format!("reading {}", rel.display()),
            error,
        })?;
        read_bytes += got.len() as u64;
        let want = std::fs::read(source_dir.join(rel))?;
        if got != want {
            return Err(DemoError::Mismatch(format!(
                "{} differs from the original",
                rel.display()
            )));
        }
    }
    let read_time = started.elapsed();
    if read_bytes != bytes {
        return Err(DemoError::Mismatch(format!(
            "read {read_bytes} bytes, expected {bytes}"
        )));
    }
    drop(guard);

    Ok(DemoReport {
        files: files.len(),
        dirs,
        bytes,
        shards: packed.shards.len(),
        pack_time,
        mount_time,
        walk_time,
        read_time,
        workdir: opts.workdir.clone().unwrap_or_else(|| workdir.clone()),
    })
}

/// Writes `files` JPEG-like files into `classes` folders under `root/train`; returns each relative
/// path with its size.
fn generate_dataset(
    root: &Path,
    files: usize,
    classes: usize,
) -> std::io::Result<Vec<(PathBuf, u64)>> {
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    let mut samples = Vec::with_capacity(files);
    for class in 0..classes {
        std::fs::create_dir_all(root.join(format!("train/n{class:08}")))?;
    }
    for i in 0..files {
        let rel = PathBuf::from(format!("train/n{:08}/img_{i:06}.jpg", i % classes));
        let data = jpeg_like(&mut rng);
        std::fs::write(root.join(&rel), &data)?;
        samples.push((rel, data.len() as u64));
    }
    Ok(samples)
}

/// A JPEG header, a lognormal-sized random body (median ~8 KB) and the end-of-image marker.
fn jpeg_like(rng: &mut SmallRng) -> Vec<u8> {
    // Irwin-Hall: the sum of 12 uniforms minus 6 is close to a standard normal.
    let normal: f64 = (0..12).map(|_| rng.random::<f64>()).sum::<f64>() - 6.0;
    let size = (8000.0 * (0.6 * normal).exp()).clamp(1000.0, 100_000.0) as usize;
    let mut data = vec![
        0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10, b'J', b'F', b'I', b'F', 0x00, 0x01, 0x01, 0x00, 0x00,
        0x01, 0x00, 0x01, 0x00, 0x00,
    ];
    let body = size.saturating_sub(data.len() + 2);
    data.extend((0..body).map(|_| rng.random::<u8>()));
    data.extend([0xFF, 0xD9]);
    data
}

/// Lists every file below `root` (relative paths) and counts the directories.
fn walk(root: &Path) -> std::io::Result<(Vec<PathBuf>, usize)> {
    let (mut files, mut dirs) = (Vec::new(), 0);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&rel))? {
            let entry = entry?;
            let child = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                dirs += 1;
                stack.push(child);
            } else {
                files.push(child);
            }
        }
    }
    Ok((files, dirs))
}
