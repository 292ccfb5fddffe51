//! Arguments shared by several subcommands, and the command-line names of library choices.

use std::path::PathBuf;

use crate::catalog::DuplicatePolicy;
use crate::dataset::classes::ClassSource;
use crate::dataset::nested::{InnerKinds, Nesting};
use crate::fs::{ReaddirPlus, Transport};
use crate::tiers::stage::StageMode;

/// The images a command works on.
#[derive(clap::Args, Debug, Clone)]
pub struct Images {
    /// Images (tar, zip, squashfs; recognized by content) or one index file. Brace ranges
    /// (`train-{000000..000127}.tar`) and globs (`shards/*.tar`) are expanded, so they can be
    /// quoted in job scripts.
    #[arg(required = true, num_args = 1.., value_name = "IMAGES|INDEX")]
    pub images: Vec<String>,
}

/// How images merge into one tree.
#[derive(clap::Args, Debug, Clone)]
pub struct Merge {
    /// What to do when two images hold the same path: `error` refuses, naming both; `last-wins`
    /// serves the one given last.
    #[arg(long, value_enum, default_value_t = Duplicates::Error)]
    pub duplicates: Duplicates,
    /// How the members make the tree: `as-stored`, or `imagefolder` for flat WebDataset shards:
    /// each sample `KEY.*` appears as `CLASS/KEY.*`, CLASS read from its `KEY.cls` member (or
    /// --class-field), as torchvision's ImageFolder expects. Applied when images are scanned.
    #[arg(long, value_enum, default_value_t = TreeLayout::AsStored)]
    pub layout: TreeLayout,
    /// With --layout imagefolder: take the class from this field of each sample's `.json`
    /// member instead of its `.cls` member.
    #[arg(long, value_name = "FIELD")]
    pub class_field: Option<String>,
    /// Look for the images of an index in this directory (by file name) first: for shards that
    /// moved since the index was written.
    #[arg(long, value_name = "DIR")]
    pub images_dir: Option<PathBuf>,
    /// Archives inside the images served as directories of their members (ImageNet's tar of
    /// class tars): `tar` (plain or compressed tars; a zip or squashfs member, such as a `.npz`
    /// sample, stays a file), `all` (zip and squashfs too) or `none`. Applied when images are
    /// scanned. Default: tar.
    #[arg(long, value_enum)]
    pub inner_archives: Option<Inner>,
    /// Levels of archives inside archives served as directories. Default: 4.
    #[arg(long, value_name = "N")]
    pub inner_depth: Option<u32>,
    /// Serve `n01440764.tar` inside an image as the directory `n01440764` (unless that name is
    /// taken), so ImageFolder's class names are the archives' names.
    #[arg(long)]
    pub strip_inner_extension: bool,
    /// Open at most N archives inside the images (the rest are served as files, with a
    /// warning). Default: as many as fit in half the memory budget at 1.5 KB each (43 690 with
    /// the default --cache-size of 64M; a mount's --cache-size raises it).
    #[arg(long, value_name = "N")]
    pub inner_max: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Inner {
    /// Tar archives, plain or compressed.
    Tar,
    /// Every format packfs reads.
    All,
    /// None: archives inside images are files.
    None,
}

impl Merge {
    pub fn options(&self) -> crate::dataset::Merge {
        let duplicates = match self.duplicates {
            Duplicates::Error => DuplicatePolicy::Error,
            Duplicates::LastWins => DuplicatePolicy::LastWins,
        };
        let classes = match (self.layout, &self.class_field) {
            (TreeLayout::AsStored, _) => None,
            (TreeLayout::Imagefolder, None) => Some(ClassSource::Cls),
            (TreeLayout::Imagefolder, Some(f)) => Some(ClassSource::JsonField(f.clone())),
        };
        let kinds = match self.inner_archives.unwrap_or(Inner::Tar) {
            Inner::Tar => InnerKinds::Tar,
            Inner::All => InnerKinds::All,
            Inner::None => InnerKinds::None,
        };
        crate::dataset::Merge {
            duplicates,
            classes,
            images_dir: self.images_dir.clone(),
            nesting: Nesting {
                kinds,
                depth: self
                    .inner_depth
                    .unwrap_or(crate::dataset::nested::DEFAULT_DEPTH),
                strip_extension: self.strip_inner_extension,
                budget: crate::dataset::nested::DEFAULT_BUDGET,
                most: self.inner_max,
            },
            checksums: false,
            // Given at all, even as the default: with an index they would be ignored.
            nesting_given: self.inner_archives.is_some()
                || self.inner_depth.is_some()
                || self.strip_inner_extension,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TreeLayout {
    /// Member paths as the images store them.
    AsStored,
    /// Samples under a directory per class (see --layout).
    Imagefolder,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Duplicates {
    /// Refuse, naming both images.
    Error,
    /// The image given last wins.
    LastWins,
}

/// Whether directory listings carry attributes (see docs/configuration.md for the measurements).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Listings {
    /// Names only: fastest for find, os.walk and ImageFolder scans; each file's first stat or
    /// open asks the daemon once.
    Never,
    /// The kernel's heuristic: attributes at least for the first part of every listing.
    Auto,
    /// Always attributes: fastest for stat-heavy walks (ls -l, du, rsync).
    Always,
}

impl From<Listings> for ReaddirPlus {
    fn from(l: Listings) -> Self {
        match l {
            Listings::Never => ReaddirPlus::Never,
            Listings::Auto => ReaddirPlus::Auto,
            Listings::Always => ReaddirPlus::Always,
        }
    }
}

/// How FUSE requests reach the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transports {
    /// read(2) and write(2) on /dev/fuse: every kernel.
    Classic,
    /// FUSE over io_uring: Linux 6.14+ with fuse's enable_uring=Y (falls back to classic, and
    /// says so, elsewhere).
    Uring,
}

impl From<Transports> for Transport {
    fn from(t: Transports) -> Self {
        match t {
            Transports::Classic => Transport::Classic,
            Transports::Uring => Transport::Uring,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Staging {
    /// Copy every assigned image, front to back, as fast as allowed.
    Eager,
    /// Copy only the chunks that reads touch (for datasets larger than local storage).
    Lazy,
}

impl From<Staging> for StageMode {
    fn from(s: Staging) -> Self {
        match s {
            Staging::Eager => StageMode::Eager,
            Staging::Lazy => StageMode::Lazy,
        }
    }
}

/// Absolute, so that a daemon that changes directory still finds it.
pub fn absolute(path: &Option<PathBuf>) -> std::io::Result<Option<PathBuf>> {
    path.as_ref().map(std::path::absolute).transpose()
}
