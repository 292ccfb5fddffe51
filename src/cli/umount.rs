//! `packfs umount`

use std::path::PathBuf;

use crate::daemon::{self, UnmountError, Unmounted};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Mount points to unmount.
    #[arg(required = true)]
    mountpoints: Vec<PathBuf>,
    /// Detach at once even if files are open (the daemon exits when they close).
    #[arg(short = 'z', long)]
    lazy: bool,
    /// Succeed when a mount point is not mounted (for a Slurm epilog: a failing epilog drains
    /// the node).
    #[arg(long)]
    if_mounted: bool,
    /// Unmount any FUSE file system, not only packfs mounts.
    #[arg(long)]
    force: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut failed = 0;
    for mountpoint in &args.mountpoints {
        match daemon::unmount(mountpoint, args.lazy, args.force) {
            Ok(Unmounted::Now) => {}
            Err(UnmountError::NotMounted(_) | UnmountError::Missing(_)) if args.if_mounted => {}
            Ok(Unmounted::Detached) => eprintln!(
                "packfs: {} detached; its daemon exits once the files still open under it are closed",
                mountpoint.display()
            ),
            Err(e) => {
                eprintln!("packfs: error: {e:#}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} of {} mount(s) not unmounted",
            args.mountpoints.len()
        );
    }
    Ok(())
}
