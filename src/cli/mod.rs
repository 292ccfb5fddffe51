//! Command-line interface: one module per subcommand.

mod args;
mod cat;
mod demo;
mod generate;
pub mod hints;
mod index;
mod ls;
mod ls_json;
mod mount;
mod mount_helper;
mod pack;
mod progress;
use crate::util::size;
mod stage;
mod staging;
mod status;
mod trace;
mod umount;
mod verify;

use clap::{Parser, Subcommand};

/// The variables packfs and its Slurm kit read, in the top-level help.
const ENVIRONMENT: &str = "Environment:
  PACKFS_PROGRESS_EVERY  seconds between progress lines when stderr is not a terminal (30)
  RUST_LOG               log filter (overrides -v)
  PACKFS_SLURM_CONF      the Slurm kit's config (default /etc/packfs/slurm.conf; see
                         /usr/share/doc/packfs/examples/slurm/README.md)
  AWS_*, --endpoint-url  object stores, as the AWS CLI takes them (docs/configuration.md)";

#[derive(Parser, Debug)]
#[command(
    name = "packfs",
    version,
    about = "Mount the tar, zip and squashfs shards of a dataset (or their index) as one read-only tree",
    after_help = ENVIRONMENT
)]
pub struct Cli {
    /// More log output (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Less output: errors only, no progress or ready line; a mount's log keeps warnings only.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// S3 endpoint for `s3://` images and indexes (AIStore, MinIO, Ceph RGW): the same as
    /// AWS_ENDPOINT_URL, which it overrides.
    #[arg(long, global = true, value_name = "URL")]
    pub endpoint_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// What `--help` ends with: the commands a user types first (as ratarmount's help does).
const MOUNT_EXAMPLES: &str = "\
Examples:
  packfs mount /gpfs/datasets/imagenet/train.packfs-index /tmp/imagenet
  packfs mount 'train-{000000..000127}.tar' /tmp/imagenet          (scans first: index once instead)
  packfs mount --stage \"$(mktemp -d /dev/shm/packfs.XXXXXX)\" train.packfs-index /tmp/imagenet
  packfs mount --stage-share $SLURM_NODEID/$SLURM_NNODES --stage DIR train.packfs-index MNT
  packfs mount 's3://bucket/train/*.tar' /tmp/imagenet
  packfs mount --layout imagefolder 'wds-{0000..0099}.tar' /tmp/imagenet   (WebDataset shards as classes)
  packfs status /tmp/imagenet; packfs umount /tmp/imagenet";

const PACK_EXAMPLES: &str = "\
Examples:
  packfs pack /gpfs/raw/imagenet/train --shards 128 --shuffle --seed 1 -o /gpfs/datasets/imagenet
  packfs pack photos --shard-size 1G -o shards                     (shards of about 1 GB)
  packfs pack 'old-{0000..0015}.tar' --shards 64 -o new            (re-pack existing images)
  packfs pack photos --compress zstd -o shards                     (.tar.zst in frames, served by range)
  packfs pack photos --shards 64 -o shards --resume                (after an interrupted pack)";

const INDEX_EXAMPLES: &str = "\
Examples:
  packfs index '/gpfs/datasets/imagenet/train-{000000..000127}.tar' -o train.packfs-index
  packfs index data.tar.gz images.sqfs -o data.packfs-index        (formats mix in one tree)
  packfs index 's3://bucket/train/*.tar' -o train.packfs-index";

#[derive(Subcommand, Debug)]
enum Command {
    /// Mount images as one read-only directory tree.
    #[command(after_help = MOUNT_EXAMPLES)]
    // Boxed: its arguments are by far the largest (clippy::large_enum_variant).
    Mount(Box<mount::Args>),
    /// Pack directory trees or images into balanced (optionally shuffled) tar shards, with their
    /// index and a manifest.
    #[command(after_help = PACK_EXAMPLES)]
    Pack(pack::Args),
    /// Scan images once and write an index file, so that mounts start at once.
    #[command(after_help = INDEX_EXAMPLES)]
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
    /// Show packfs mounts: dataset, uptime, bytes per tier, requests and latencies, staging,
    /// cache, errors (all of this user's, or root's view of all).
    Status(status::Args),
    /// Read a trace written by `packfs mount --trace FILE`.
    Trace(trace::Args),
    /// Generate a small dataset, pack, mount, verify every byte and report the speed.
    Demo(demo::Args),
    /// Write the man pages (packfs.1, packfs-mount.1, ...) into a directory.
    Man(generate::ManArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(generate::CompletionsArgs),
}

impl Cli {
    /// Commands whose output is data for another program (`ls`, `cat`).
    pub fn writes_to_pipes(&self) -> bool {
        matches!(
            self.command,
            Command::Ls(_) | Command::Cat(_) | Command::Status(_) | Command::Trace(_)
        )
    }

    /// Where and how much to log: a mount daemon also logs INFO to its log.
    pub fn log_setup(&self) -> crate::util::logging::Setup {
        let mut setup = crate::util::logging::Setup {
            verbosity: self.verbose,
            quiet: self.quiet,
            ..Default::default()
        };
        if let Command::Mount(args) = &self.command {
            setup.daemon_log = args.daemon_log();
            setup.stderr_warnings_only = args.is_daemon();
        }
        setup
    }
}

/// When run as `mount.fuse.packfs` (by mount(8)): the `packfs` arguments it stands for. `Err`
/// with the exit status for a call that needs no mount (mount's `-f`) or cannot be understood.
pub fn mount_helper_args() -> Result<Option<Vec<std::ffi::OsString>>, std::process::ExitCode> {
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let name = std::path::Path::new(&argv0)
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    if !mount_helper::NAMES.contains(&name.as_str()) {
        return Ok(None);
    }
    let rest: Vec<std::ffi::OsString> = args.collect();
    match mount_helper::translate(&rest) {
        Ok(Some(packfs_args)) => Ok(Some(
            std::iter::once(std::ffi::OsString::from("packfs"))
                .chain(packfs_args)
                .collect(),
        )),
        Ok(None) => Err(std::process::ExitCode::SUCCESS),
        Err(why) => {
            eprintln!("{name}: {why}");
            // mount(8)'s status for a usage error.
            Err(std::process::ExitCode::from(1))
        }
    }
}

/// The engine and stores that `packfs mount`'s arguments ask for, for an engine opened in this
/// process (the Python module): `args` are a mount's images and options without its
/// mountpoint, parsed and checked as `packfs mount` does. A parse error is clap's message.
pub fn in_process(
    args: &[std::ffi::OsString],
) -> anyhow::Result<(crate::engine::EngineOptions, crate::source::StoreOptions)> {
    // The mountpoint is the last positional argument: a placeholder stands for it.
    let argv = ["packfs".into(), "mount".into()]
        .into_iter()
        .chain(args.iter().cloned())
        .chain(["(in-process)".into()]);
    let cli = Cli::try_parse_from(argv)?;
    let Command::Mount(mount) = &cli.command else {
        unreachable!("parsed as a mount");
    };
    let stores = crate::source::StoreOptions {
        endpoint: cli.endpoint_url.clone(),
    };
    Ok((mount.engine()?, stores))
}

/// Runs the command; `argv` is what it was parsed from (a mount re-executes itself with it).
pub fn run(cli: Cli, argv: &[std::ffi::OsString]) -> anyhow::Result<()> {
    // The stores this command reads objects from; a daemon started from here parses the same
    // argument.
    let store_options = crate::source::StoreOptions {
        endpoint: cli.endpoint_url.clone(),
    };
    let stores = crate::source::Stores::network(store_options.clone());
    match cli.command {
        Command::Mount(args) => mount::run(*args, cli.quiet, argv, store_options),
        Command::Pack(args) => pack::run(args, stores),
        Command::Index(args) => index::run(args, &stores),
        Command::Verify(args) => verify::run(args, stores),
        Command::Stage(args) => stage::run(args, &stores),
        Command::Umount(args) => umount::run(args),
        Command::Ls(args) => ls::run(args, &stores),
        Command::Cat(args) => cat::run(args, stores),
        Command::Status(args) => status::run(args),
        Command::Trace(args) => trace::run(args),
        Command::Demo(args) => demo::run(args),
        Command::Man(args) => generate::man(args),
        Command::Completions(args) => generate::completions(args),
    }
}

/// Whether `e` is a failure the daemon already explained on the terminal (`MountError::Reported`).
pub fn already_reported(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<crate::daemon::MountError>(),
        Some(crate::daemon::MountError::Reported(_))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command line as the shell splits it: words, with quoted parts kept whole.
    fn words(line: &str) -> Vec<String> {
        let (mut out, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
        for c in line.chars() {
            match (quote, c) {
                (None, '\'' | '"') => (quote, any) = (Some(c), true),
                (Some(q), _) if c == q => quote = None,
                (None, ' ') if any => {
                    out.push(std::mem::take(&mut word));
                    any = false;
                }
                (None, ' ') => {}
                _ => (word, any) = (word + &c.to_string(), true),
            }
        }
        if any {
            out.push(word);
        }
        out
    }

    #[test]
    fn every_example_in_help_parses() {
        let mut seen = 0;
        for examples in [MOUNT_EXAMPLES, PACK_EXAMPLES, INDEX_EXAMPLES] {
            for line in examples.lines().filter(|l| l.starts_with("  packfs ")) {
                // What follows three spaces and a parenthesis is a comment.
                let line = line.split("   (").next().unwrap();
                // Slurm's variables as a job on node 0 of 2 has them.
                let line = line
                    .replace("$SLURM_NODEID", "0")
                    .replace("$SLURM_NNODES", "2");
                for command in line.split(';') {
                    let args = words(command.trim());
                    let parsed = Cli::try_parse_from(&args);
                    assert!(parsed.is_ok(), "{args:?}: {}", parsed.unwrap_err());
                    seen += 1;
                }
            }
        }
        assert_eq!(seen, 16);
    }
}
