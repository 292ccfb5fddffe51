//! Command-line interface: one module per subcommand.

mod args;
mod cat;
mod demo;
mod index;
mod ls;
mod mount;
mod pack;
mod progress;
use packfs::size;
mod stage;
mod staging;
mod umount;
mod verify;

use std::path::Path;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "packfs",
    version,
    about = "Mount the tar, zip and squashfs shards of a dataset (or their index) as one read-only tree"
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Mount images as one read-only directory tree.
    Mount(mount::Args),
    /// Pack directory trees or images into balanced (optionally shuffled) tar shards, with their
    /// index and a manifest.
    Pack(pack::Args),
    /// Scan images once and write an index file, so that mounts start at once.
    Index(index::Args),
    /// Check an index (every byte) and its images' fingerprints; with --data, every file too.
    Verify(verify::Args),
    /// Copy images to a node-local stage directory (what `mount --stage` does in the background).
    Stage(stage::Args),
    /// Unmount a packfs mount (also a stale one whose daemon died).
    Umount(umount::Args),
    /// List the merged tree of images without mounting.
    Ls(ls::Args),
    /// Write one file of the merged tree to standard output.
    Cat(cat::Args),
    /// Generate a small dataset, pack, mount, verify every byte and report the speed.
    Demo(demo::Args),
}

impl Cli {
    /// Commands whose output is data for another program (`ls`, `cat`).
    pub fn writes_to_pipes(&self) -> bool {
        matches!(self.command, Command::Ls(_) | Command::Cat(_))
    }

    pub fn log_file(&self) -> Option<&Path> {
        match &self.command {
            Command::Mount(args) => args.log_file.as_deref(),
            _ => None,
        }
    }
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Mount(args) => mount::run(args),
        Command::Pack(args) => pack::run(args),
        Command::Index(args) => index::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Stage(args) => stage::run(args),
        Command::Umount(args) => umount::run(args),
        Command::Ls(args) => ls::run(args),
        Command::Cat(args) => cat::run(args),
        Command::Demo(args) => demo::run(args),
    }
}
