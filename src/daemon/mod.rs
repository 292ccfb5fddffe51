//! Mount lifecycle for batch jobs: `preflight` checks the mountpoint and FUSE, `serve` builds the
//! file system, mounts it, reports readiness and serves until unmounted or signalled, `launcher`
//! runs that in a detached daemon whose exit status is the mount's, `stats` publishes the
//! counters, `unmount` also cleans stale mounts.

pub mod hints;
mod launcher;
pub mod leftovers;
pub mod mounts;
pub mod owners;
mod preflight;
mod prometheus;
mod serve;
pub mod stats;
pub mod status;
mod unmount;

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;

pub use launcher::{detach_from_launcher, spawn_background};
pub use preflight::{check_fuse_available, check_mountpoint, is_dead};
pub use serve::{MountRequest, preflight, serve};
pub use unmount::{STANDARD_PATH, UnmountError, Unmounted, unmount, unmount_if_unused, user_name};

use crate::catalog::index::IndexError;
use crate::dataset::DatasetError;

impl From<crate::engine::EngineError> for MountError {
    /// The engine's errors keep their own variants, which the CLI's hints look for.
    fn from(e: crate::engine::EngineError) -> MountError {
        use crate::engine::EngineError;
        match e {
            EngineError::Dataset(e) => MountError::Dataset(e),
            EngineError::Index(e) => MountError::Index(e),
            EngineError::Tiers(e) => MountError::Tiers(e),
            EngineError::Peers(e) => MountError::Peers(e),
        }
    }
}

/// Why a mount could not be made or served.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("mountpoint {} does not exist", .0.display())]
    NoMountpoint(PathBuf),
    #[error("mountpoint {} is not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error(
        "{} is a stale mount whose daemon died; clean it with `packfs umount {}`",
        .0.display(),
        .0.display()
    )]
    Stale(PathBuf),
    #[error(
        "{} is already a mount point ({fstype} from {from}); unmount it first (`packfs umount {}`)",
        path.display(),
        path.display()
    )]
    AlreadyMounted {
        path: PathBuf,
        fstype: String,
        from: String,
    },
    #[error(
        "mountpoint {} is not empty: a mount would hide its files; use an empty directory, or \
         pass --nonempty to mount over them",
        .0.display()
    )]
    NotEmpty(PathBuf),
    #[error(
        "{0} (the runtime directory: it holds the mount's stats file and hints socket, also \
         with --stats-file; remove it if it is not yours, or set XDG_RUNTIME_DIR to a private \
         directory of your own, as a login session does)"
    )]
    StatsDir(crate::util::safe_file::DirError),
    #[error("cannot use mountpoint {}: {error}", path.display())]
    Mountpoint { path: PathBuf, error: io::Error },
    #[error(
        "--stage: {0} (make a directory of your own, e.g. `mktemp -d /dev/shm/packfs.XXXXXX`, \
         or one root made for you; see docs/semantics.md)"
    )]
    StageDir(crate::util::safe_file::DirError),
    #[error(
        "/dev/fuse does not exist: load the fuse kernel module (modprobe fuse) or give the \
         container the device"
    )]
    NoFuseDevice,
    #[error("cannot open /dev/fuse: {0}")]
    FuseDevice(io::Error),
    #[error("mounting as a non-root user needs fusermount3 (install the fuse3 package)")]
    NoFusermount,
    /// A signal while `packfs mount` waited: the daemon was stopped (the CLI exits as the
    /// signal would).
    #[error(
        "mount cancelled ({}): the daemon has stopped and nothing is mounted at {}",
        signal_name(*signal),
        mountpoint.display()
    )]
    Cancelled { signal: i32, mountpoint: PathBuf },
    /// fusermount3 cannot act as root for this user: it would fail "Operation not permitted".
    #[error(
        "{helper} cannot mount for this user: {why}; it mounts for ordinary users only as a \
         setuid-root program (`sudo chmod u+s {helper}`, as the fuse3 package installs it), \
         and a container must allow privilege gain (not `--security-opt no-new-privileges`); \
         or mount as root"
    )]
    FusermountNotSetuid { helper: String, why: &'static str },
    #[error(
        "/dev/fuse is not readable and writable by this user, so no FUSE file system can be \
         mounted without root; it needs mode 0666, as the fuse3 package's udev rule sets it"
    )]
    FuseDeviceMode,
    #[error(transparent)]
    Owner(#[from] owners::OwnerError),
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Tiers(#[from] crate::tiers::OpenError),
    #[error("{0}")]
    Peers(String),
    #[error("cannot write the trace {}: {error}", path.display())]
    Trace { path: PathBuf, error: io::Error },
    #[error("cannot write pid file {}: {error}", path.display())]
    PidFile { path: PathBuf, error: io::Error },
    #[error("cannot install signal handlers: {0}")]
    Signals(io::Error),
    #[error("cannot mount at {}: {error}", path.display())]
    Mount { path: PathBuf, error: io::Error },
    #[error(
        "cannot mount{at}: {why}, and there is no fusermount3 to mount instead. In a \
         container, run it with `--device /dev/fuse --cap-add SYS_ADMIN` (where AppArmor \
         confines containers, also `--security-opt apparmor=unconfined`), or mount on the host \
         and bind the mount in; or install fuse3 in the image"
    )]
    MountRefused {
        /// " at MOUNTPOINT", where known.
        at: String,
        why: &'static str,
    },
    #[error("the mount at {} does not answer: {error}", path.display())]
    NotAnswering { path: PathBuf, error: io::Error },
    #[error("the FUSE session of {} ended with an error: {error}", path.display())]
    Session { path: PathBuf, error: io::Error },
    #[error("cannot start a thread: {0}")]
    Thread(io::Error),
    #[error("cannot find the packfs executable: {0}")]
    NoExecutable(io::Error),
    #[error("cannot start the packfs daemon: {0}")]
    Spawn(io::Error),
    /// The daemon failed and printed why (relayed to the terminal already): nothing to add.
    #[error("the packfs daemon failed ({0}); its message is above")]
    Reported(ExitStatus),
    #[error("the packfs daemon exited before {} was mounted ({status})", mountpoint.display())]
    DaemonExited {
        mountpoint: PathBuf,
        status: ExitStatus,
    },
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGINT => "interrupted",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
