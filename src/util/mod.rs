//! Small utilities every layer may use, the ground floor (they import nothing else of the
//! crate): little-endian record fields (`le`), sizes as users write them (`size`), files packfs
//! writes without following links (`safe_file`), secrets taken out of URLs in any text
//! (`redact`), and the log's setup (`logging`).

pub mod alloc;
pub mod latency;
pub mod le;
pub mod logging;
pub mod redact;
pub mod safe_file;
pub mod size;
pub mod userns;

/// Has glibc map buffers of 1 MiB or more and unmap them when freed. Its default threshold rises
/// to the size of the largest buffer freed, after which decoded intervals (4 MiB) were carved from
/// per-thread arenas that kept them resident: 686 MB peak RSS under a 256 MiB cache with 8
/// readers of a .tar.gz (a mount), and scans of 46 MB bzip2 blocks kept theirs too (`ls`,
/// `index`). Decoded units are few and large, so mapping them costs little. Call it first, before
/// any thread starts.
pub fn return_large_buffers() {
    // SAFETY: mallopt only changes allocator tuning.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}
