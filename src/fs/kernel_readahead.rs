//! The kernel's readahead for the mount. FUSE offers the daemon at most the default 128 KiB
//! (`max_readahead` in INIT cannot exceed it), so a sample larger than 128 KiB cost two READ
//! requests in a row, and on a parallel file system two round trips to the source: measured on
//! the simulated PFS (bench/pfs.py, 20 000 ImageNet-sized files), 1.48 source reads per sample
//! and epoch 1 at 4.9 s; with 1 MiB, one read per sample and 3.8 s. Only root may raise it,
//! through the mount's backing device in sysfs, after the INIT handshake (which would lower it).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The sysfs file of the backing device of the file system mounted at `mountpoint`.
fn sysfs_path(mountpoint: &Path) -> io::Result<PathBuf> {
    let dev = std::fs::metadata(mountpoint)?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    Ok(PathBuf::from(format!(
        "/sys/class/bdi/{major}:{minor}/read_ahead_kb"
    )))
}

/// Sets the readahead of the mount at `mountpoint` to `bytes` (rounded down to KiB). Returns
/// the value in force afterwards, in bytes.
pub fn set(mountpoint: &Path, bytes: u64) -> io::Result<u64> {
    let path = sysfs_path(mountpoint)?;
    // sysfs attributes are not symlinks an attacker could plant: /sys is the kernel's.
    std::fs::write(&path, format!("{}\n", bytes / 1024))?;
    current(&path)
}

fn current(path: &Path) -> io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    text.trim()
        .parse::<u64>()
        .map(|kb| kb * 1024)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// The readahead in force for the mount at `mountpoint`, in bytes.
pub fn get(mountpoint: &Path) -> io::Result<u64> {
    current(&sysfs_path(mountpoint)?)
}
