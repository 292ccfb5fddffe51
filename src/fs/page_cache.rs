//! Whether the kernel holds a file of the mount in its page cache (the lookahead's question,
//! `tiers::lookahead::PageCacheProbe`): then its reads never reach
//! the daemon, and fetching it ahead would read storage for nothing. Asked with `cachestat`
//! (Linux 6.5+), else `mincore` over a mapping (older kernels: RHEL 8 and 9); neither reads
//! the file.

use std::ffi::OsStr;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::catalog::Catalog;
use crate::tiers::lookahead::PageCacheProbe;

const PAGE: u64 = 4096;

/// `cachestat` is missing (ENOSYS): `mincore` from then on.
static NO_CACHESTAT: AtomicBool = AtomicBool::new(false);

/// The lookahead's question for the mount at `mountpoint`, asked of its files by path: the
/// kernel keeps a FUSE file's pages by the file, so the question is asked where it keeps them.
/// The tiers never see a path of the mount.
pub fn probe(mountpoint: std::path::PathBuf) -> PageCacheProbe {
    Arc::new(move |catalog, entry| holds(&mountpoint, catalog, entry))
}

/// Whether every page of catalog entry `entry`, under `mountpoint`, is in the page cache.
fn holds(mountpoint: &Path, catalog: &Catalog, entry: u32) -> bool {
    let Ok(e) = catalog.entry(entry) else {
        return false;
    };
    let path = mountpoint.join(OsStr::from_bytes(&catalog.path_of(entry)));
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
    else {
        return false;
    };
    let pages = e.size.div_ceil(PAGE);
    if pages == 0 {
        return true;
    }
    if !NO_CACHESTAT.load(Ordering::Relaxed) {
        match cached_pages(&file) {
            Some(n) => return n >= pages,
            None => NO_CACHESTAT.store(true, Ordering::Relaxed),
        }
    }
    resident(&file, e.size)
}

/// Pages of `file` in the page cache, by `cachestat`; `None` where the kernel lacks it.
fn cached_pages(file: &std::fs::File) -> Option<u64> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    /// The same number on every architecture (the syscall table is shared since 5.1).
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: 0, len: 0 };
    let mut stat = Stat::default();
    // SAFETY: `range` and `stat` are the kernel's `cachestat_range` and `cachestat`.
    let done = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    match done {
        0 => Some(stat.cache),
        _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) => None,
        // Any other failure: say nothing is cached (the sample is fetched, as without a check).
        _ => Some(0),
    }
}

/// Whether all `size` bytes of `file` are resident, by `mincore` over a shared read-only
/// mapping (mapping reads nothing).
fn resident(file: &std::fs::File, size: u64) -> bool {
    let pages = size.div_ceil(PAGE) as usize;
    use std::os::fd::AsFd;
    let Some(map) = crate::source::mapped::map_shared(file.as_fd(), size as usize, 0) else {
        return false;
    };
    // SAFETY: the mapping of `size` bytes made above, unmapped below; `vec` holds a byte per
    // page as mincore writes.
    unsafe {
        let mut vec = vec![0u8; pages];
        let done = libc::mincore(map, size as usize, vec.as_mut_ptr());
        libc::munmap(map, size as usize);
        done == 0 && vec.iter().all(|b| b & 1 == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_found_in_the_page_cache_once_read_and_not_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let size = 3 * PAGE + 10;
        // A hole: no page of it is cached until it is read.
        std::fs::File::create(&path).unwrap().set_len(size).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert!(!resident(&file, size));
        assert_eq!(cached_pages(&file).unwrap_or(0), 0);
        assert_eq!(std::fs::read(&path).unwrap().len(), size as usize);
        assert!(resident(&file, size));
        if let Some(n) = cached_pages(&file) {
            assert_eq!(n, 4);
        }
    }
}
