//! The CRC-32 of a range of an image file, computed over a read-only mapping of it: the bytes
//! come into the file's page cache once and are checked there, without a copy into the daemon,
//! so the reads that follow splice the same pages (before, a stored member was read whole into
//! a buffer to check it, then read again for its replies: twice the bytes, docs/benchmarks).
//!
//! A mapping of a file that shrinks under it raises SIGBUS on access, where `pread` returns an
//! error. The pages are populated with `MADV_POPULATE_READ` (an error, not a signal, for pages
//! past the end), and while the checksum runs the range is registered with a SIGBUS handler:
//! a page truncated away in between is replaced by a page of zeros and the check reports the
//! image shrank. Faults anywhere else go to the handler that was there before.
//!
//! That handler is the process's, and only a process of packfs's own (the daemon, the command)
//! can count on it staying installed: in a training process, a library installed later
//! (`faulthandler`, a DataLoader worker's) takes SIGBUS over, and a page truncated away would
//! kill the process. The Python module therefore turns mapped checks off for its process
//! (`guest_process`): there `crc32` declines, and the caller reads the range with `pread`,
//! where a file that shrank is an error.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Whether this process checks through mappings: false once `guest_process` was called.
static MAPPED_CHECKS: AtomicBool = AtomicBool::new(true);

/// Says this process is not packfs's own (packfs is a module in it): no check goes through a
/// mapping from now on, so no correctness depends on a signal handler another library may
/// replace.
pub fn guest_process() {
    MAPPED_CHECKS.store(false, Ordering::Relaxed);
}

/// Whether ranges are checked through a mapping in this process (`guest_process`).
pub fn mapped_checks() -> bool {
    MAPPED_CHECKS.load(Ordering::Relaxed)
}

/// Checks running at once at most (more fall back to reading: `None`).
const SLOTS: usize = 64;

/// A registered range: the mapping's [start, end), and whether a fault in it was answered with
/// zeros. `start` 0 is a free slot.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

/// The ranges being checked, as the SIGBUS handler sees them (a handler is the process's).
static GUARDED: [Slot; SLOTS] = [FREE; SLOTS];
/// The SIGBUS action before ours, for faults that are not ours.
static BEFORE: std::sync::OnceLock<libc::sigaction> = std::sync::OnceLock::new();
static INSTALL: Once = Once::new();

fn page() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n).unwrap_or(4096).max(4096)
}

/// How the range comes into the page cache before it is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// Asked for whole at once (`POSIX_FADV_WILLNEED`): a range apart from the last one
    /// checked, whose pages the mapping's faults would otherwise read around one by one.
    /// Measured on 4 MiB ranges read cold in random order: 5.3-6.1 ms each, against 10-11 ms
    /// read through the file's readahead.
    Whole,
    /// Through the file's readahead (the range moved to /dev/null, which reads it into the
    /// page cache and copies nothing): a range right after the last one checked, where the
    /// kernel's sequential readahead already reads ahead into the next. Measured on 4 MiB
    /// ranges back to back, cold: 2.9-3.2 ms each, against 5.3-6.2 ms asked for whole.
    Sequential,
}

/// The CRC-32 of `len` bytes at `offset` of `file`, read through a mapping; `None` when no
/// mapping can be made or guarded (the caller reads the bytes instead).
pub fn crc32(
    file: BorrowedFd<'_>,
    offset: u64,
    len: u64,
    arrival: Arrival,
) -> Option<io::Result<u32>> {
    if len == 0 {
        return Some(Ok(crc32fast::hash(&[])));
    }
    if !mapped_checks() {
        return None;
    }
    let page = page();
    let start = offset - offset % page as u64;
    let skip = (offset - start) as usize;
    let map_len = usize::try_from(len).ok()?.checked_add(skip)?;
    install();
    match arrival {
        Arrival::Whole => {
            // SAFETY: plain syscall on a borrowed, open descriptor; a failure only loses the
            // hint.
            unsafe {
                libc::posix_fadvise(
                    file.as_raw_fd(),
                    offset as libc::off_t,
                    len as libc::off_t,
                    libc::POSIX_FADV_WILLNEED,
                );
            }
        }
        // A failure only loses the head start: the faults below read what is missing.
        Arrival::Sequential => read_ahead(file, offset, len),
    }
    // Only read below while registered with the SIGBUS guard, and unmapped before return.
    let map = map_shared(file, map_len, start)?;
    let result = checked(map as usize, map_len, skip, offset, len);
    // SAFETY: the mapping made above, no longer read.
    unsafe { libc::munmap(map, map_len) };
    result
}

/// Brings `len` bytes at `offset` of `file` into its page cache through the file's readahead:
/// `sendfile` to /dev/null reads them as a read would (sequential readahead included) and
/// discards them without a copy.
fn read_ahead(file: BorrowedFd<'_>, offset: u64, len: u64) {
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    let mut at = offset as libc::off_t;
    let mut left = len as usize;
    while left > 0 {
        // SAFETY: both descriptors are open for the call; `at` outlives it.
        let n = unsafe { libc::sendfile(null.as_raw_fd(), file.as_raw_fd(), &mut at, left) };
        match n {
            n if n > 0 => left -= n as usize,
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return,
        }
    }
}

/// The checksum of the mapping at `map` (`map_len` bytes; the range starts `skip` bytes in).
fn checked(
    map: usize,
    map_len: usize,
    skip: usize,
    offset: u64,
    len: u64,
) -> Option<io::Result<u32>> {
    let shrank = || {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "the image ends inside bytes {offset}..{} (it shrank under the mount)",
                offset + len
            ),
        )
    };
    // SAFETY: the range is the mapping's own.
    let populated =
        unsafe { libc::madvise(map as *mut libc::c_void, map_len, libc::MADV_POPULATE_READ) };
    if populated != 0 {
        return match io::Error::last_os_error().raw_os_error() {
            // Pages past the end of the file.
            Some(libc::EFAULT) => Some(Err(shrank())),
            // A kernel before 5.14, or a file system that cannot: read it instead.
            Some(libc::EINVAL | libc::EOPNOTSUPP) => None,
            _ => Some(Err(io::Error::last_os_error())),
        };
    }
    match guarded_crc(map, map_len, skip, len as usize)? {
        Some(crc) => Some(Ok(crc)),
        None => Some(Err(shrank())),
    }
}

/// The CRC-32 of `len` bytes `skip` into the mapping, with the range guarded: `Some(None)` when
/// a page of it was truncated away on the way (read as zeros); `None` when no slot is free.
fn guarded_crc(map: usize, map_len: usize, skip: usize, len: usize) -> Option<Option<u32>> {
    let slot = GUARDED.iter().find(|s| {
        s.start
            .compare_exchange(0, map, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    slot.faulted.store(false, Ordering::Relaxed);
    slot.end.store(map + map_len, Ordering::Release);
    // SAFETY: the mapping is readable for `map_len` bytes; a page truncated away meanwhile is
    // replaced with zeros by the handler (the slot covers it) instead of killing the process.
    let bytes = unsafe { std::slice::from_raw_parts((map + skip) as *const u8, len) };
    let crc = crc32fast::hash(bytes);
    let faulted = slot.faulted.load(Ordering::Acquire);
    slot.end.store(0, Ordering::Release);
    slot.start.store(0, Ordering::Release);
    Some((!faulted).then_some(crc))
}

/// A fresh shared read-only mapping of `len` bytes of `file` at `offset` (page-aligned).
pub fn map_shared(file: BorrowedFd<'_>, len: usize, offset: u64) -> Option<*mut libc::c_void> {
    // SAFETY: a new mapping the kernel places; nothing else refers to it.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    (map != libc::MAP_FAILED).then_some(map)
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: installs a handler that only reads atomics, maps a page of zeros over a page
        // of a guarded range, or puts the earlier action back (all async-signal-safe calls).
        unsafe {
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_sigbus as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut ours.sa_mask);
            let mut before: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, &ours, &mut before) == 0 {
                let _ = BEFORE.set(before);
            }
        }
    });
}

extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // Only a fault (not a signal someone sent) can be ours.
    if code > 0 {
        for slot in &GUARDED {
            let start = slot.start.load(Ordering::Acquire);
            if start != 0 && addr >= start && addr < slot.end.load(Ordering::Acquire) {
                let page = addr & !(page() - 1);
                // SAFETY: replaces one page of a mapping this module made and reads only.
                let zeros = unsafe {
                    libc::mmap(
                        page as *mut libc::c_void,
                        1,
                        libc::PROT_READ,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                        -1,
                        0,
                    )
                };
                if zeros != libc::MAP_FAILED {
                    slot.faulted.store(true, Ordering::Release);
                    return;
                }
            }
        }
    }
    // Not ours: the action before ours takes it (a fault faults again on return; a sent signal
    // is sent again, delivered once this handler returns).
    // SAFETY: restores the saved action, or the default one.
    unsafe {
        match BEFORE.get() {
            Some(before) => libc::sigaction(signal, before, std::ptr::null_mut()),
            None => {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut())
            }
        };
        if code <= 0 {
            libc::raise(signal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn the_checksum_of_a_range_is_that_of_its_bytes() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let ranges = [
            (0, 300_000),
            (1, 5),
            (4095, 4097),
            (12_345, 200_000),
            (299_999, 1),
        ];
        let arrivals = [Arrival::Whole, Arrival::Sequential];
        for ((at, len), arrival) in ranges.into_iter().flat_map(|r| arrivals.map(|a| (r, a))) {
            let got = crc32(f.as_fd(), at, len, arrival).unwrap().unwrap();
            let want = crc32fast::hash(&data[at as usize..(at + len) as usize]);
            assert_eq!(got, want, "{at}+{len} {arrival:?}");
        }
    }

    #[test]
    fn a_range_past_the_end_of_the_file_is_an_error_not_a_signal() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[1u8; 10_000]).unwrap();
        for arrival in [Arrival::Whole, Arrival::Sequential] {
            let err = crc32(f.as_fd(), 5_000, 20_000, arrival)
                .unwrap()
                .unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        }
    }

    #[test]
    fn a_page_truncated_away_during_the_check_reads_as_zeros_and_is_reported() {
        // The handler's half, as the check sees it: a guarded mapping whose file shrinks after
        // it was populated.
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![9u8; 3 * 4096]).unwrap();
        install();
        let len = 3 * 4096;
        let map = map_shared(f.as_fd(), len, 0).unwrap();
        f.set_len(4096).unwrap();
        let got = guarded_crc(map as usize, len, 0, len).unwrap();
        // SAFETY: the test's mapping.
        unsafe { libc::munmap(map, len) };
        assert_eq!(got, None, "the check saw a page that is gone");
        // The guard is released: a fault outside any check is not swallowed by it.
        assert!(
            GUARDED
                .iter()
                .all(|s| s.start.load(Ordering::Relaxed) != map as usize)
        );
    }
}
