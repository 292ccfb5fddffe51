//! One image's local copy: a sparse data file as large as the source, its progress file, and per
//! chunk a state word, the expected checksum and the time of last use.
//!
//! A chunk's state word packs its state (low byte) with a generation that grows each time the
//! chunk's local bytes are dropped (eviction, a failed check). A reader that sees the same word
//! before and after its pread knows that no eviction punched the bytes out under it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::state_file::StateFile;
use crate::source::Fingerprint;
use crate::source::read_at::{ReadAt, Wait};

pub const ABSENT: u64 = 0;
/// Queued for the stager by a read that touched it.
pub const QUEUED: u64 = 1;
/// Being written or evicted by the stager.
pub const BUSY: u64 = 2;
/// Complete on local storage, not yet checked by this process.
pub const PRESENT: u64 = 3;
/// Complete and checked against its checksum since this process started.
pub const VERIFIED: u64 = 4;

pub fn state(word: u64) -> u64 {
    word & 0xff
}

pub fn with_state(word: u64, state: u64) -> u64 {
    (word & !0xff) | state
}

/// Whether a chunk in this state has complete local bytes.
pub fn is_local(word: u64) -> bool {
    matches!(state(word), PRESENT | VERIFIED)
}

/// The same chunk with its local bytes dropped: absent, next generation.
pub fn dropped(word: u64) -> u64 {
    ((word >> 8) + 1) << 8
}

pub struct Chunk {
    pub word: AtomicU64,
    pub sum: AtomicU64,
    pub last_use: AtomicU64,
}

pub struct StagedImage {
    /// Position of the image in the catalog.
    pub index: u32,
    pub source_path: PathBuf,
    pub data_path: PathBuf,
    pub data: File,
    pub state: StateFile,
    pub size: u64,
    pub chunk_size: u64,
    pub chunks: Vec<Chunk>,
}

/// What opening found on local storage.
pub struct Opened {
    pub image: StagedImage,
    pub reset: Option<String>,
}

impl StagedImage {
    /// Opens (or creates) the local copy of image `index` in `dir`.
    pub fn open(
        dir: &Path,
        index: u32,
        source_path: &Path,
        fp: &Fingerprint,
        chunk_size: u64,
    ) -> io::Result<Opened> {
        let name = stage_name(source_path);
        let chunks = fp.size.div_ceil(chunk_size) as usize;
        let loaded = StateFile::open(&dir.join(format!("{name}.state")), chunk_size, fp, chunks)?;
        let data_path = dir.join(format!("{name}.data"));
        let data = crate::util::safe_file::open_owned(&data_path)?;
        if loaded.reset.is_some() {
            data.set_len(0)?;
        }
        // Sparse: only the staged chunks take space.
        data.set_len(fp.size)?;
        let chunks = (0..chunks)
            .map(|i| {
                let sum = loaded.sums[i];
                Chunk {
                    word: AtomicU64::new(if sum.is_some() { PRESENT } else { ABSENT }),
                    sum: AtomicU64::new(sum.unwrap_or(0)),
                    last_use: AtomicU64::new(0),
                }
            })
            .collect();
        Ok(Opened {
            image: StagedImage {
                index,
                source_path: source_path.to_path_buf(),
                data_path,
                data,
                state: loaded.state,
                size: fp.size,
                chunk_size,
                chunks,
            },
            reset: loaded.reset,
        })
    }

    pub fn chunk_len(&self, i: usize) -> u64 {
        chunk_len(self.size, self.chunk_size, i)
    }

    pub fn chunk_start(&self, i: usize) -> u64 {
        i as u64 * self.chunk_size
    }

    /// Reads local bytes of chunk `i` from `within` it.
    pub fn read_local(&self, i: usize, within: u64, buf: &mut [u8], wait: Wait) -> io::Result<()> {
        self.data
            .read_exact_with(buf, self.chunk_start(i) + within, wait)
    }

    /// Frees the local bytes of chunk `i` (the file keeps its size).
    pub fn punch(&self, i: usize) -> io::Result<()> {
        let (start, len) = (self.chunk_start(i), self.chunk_len(i));
        // SAFETY: plain syscall on a descriptor we own.
        let rc = unsafe {
            libc::fallocate(
                self.data.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                start as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    pub fn word(&self, i: usize) -> u64 {
        self.chunks[i].word.load(Ordering::SeqCst)
    }

    /// Chunks that are complete locally: (count, bytes).
    pub fn local_extent(&self) -> (u64, u64) {
        (0..self.chunks.len())
            .filter(|&i| is_local(self.word(i)))
            .fold((0, 0), |(n, b), i| (n + 1, b + self.chunk_len(i)))
    }

    /// Gives claimed chunks (state BUSY over the word each had when claimed) back unchanged.
    pub fn release(&self, claimed: &[(usize, u64)]) {
        for &(i, word) in claimed {
            self.swap(i, with_state(word, BUSY), word);
        }
    }

    /// Moves chunk `i` from `from` to `to`; false when another thread changed it first.
    pub fn swap(&self, i: usize, from: u64, to: u64) -> bool {
        self.chunks[i]
            .word
            .compare_exchange(from, to, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }
}

pub fn chunk_len(size: u64, chunk_size: u64, i: usize) -> u64 {
    let start = i as u64 * chunk_size;
    chunk_size.min(size.saturating_sub(start))
}

/// `<file name>.<xxh3 of the absolute path>`: readable, and distinct for same-named shards in
/// different directories.
pub fn stage_name(source_path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let abs = std::path::absolute(source_path).unwrap_or_else(|_| source_path.to_path_buf());
    let hash = xxhash_rust::xxh3::xxh3_64(abs.as_os_str().as_bytes());
    let base = source_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "image".into());
    format!("{base}.{hash:016x}")
}
