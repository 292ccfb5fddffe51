//! What one read asks of the tiers, besides its bytes: who reads (so a reader's walk through an
//! image is found among others'), whether it may wait for storage, and, filled in as it goes,
//! which tiers served it. Built once by the caller (the file system's dispatcher, a command) and
//! passed down by reference to the source: nothing about a read travels beside its arguments.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use super::located::Located;
use crate::source::read_at::Wait;

/// The tiers that served a read: a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tiers(u8);

impl Tiers {
    pub const NONE: Tiers = Tiers(0);
    pub const SOURCE: Tiers = Tiers(1);
    pub const RAM: Tiers = Tiers(2);
    pub const STAGE: Tiers = Tiers(4);

    pub fn with(self, other: Tiers) -> Tiers {
        Tiers(self.0 | other.0)
    }

    /// The names of the tiers, `+`-joined (`ram+source`); `none` for a read that needed no
    /// bytes (past the end of a file, or an empty one).
    pub fn names(self) -> &'static str {
        match self.0 & 7 {
            0 => "none",
            1 => "source",
            2 => "ram",
            4 => "stage",
            3 => "ram+source",
            5 => "stage+source",
            6 => "stage+ram",
            _ => "stage+ram+source",
        }
    }
}

/// One read's context, passed by reference (the decoders' image view holds one, and must be
/// `Sync`: hence an atomic for the tiers, touched a few times per read, relaxed).
#[derive(Debug)]
pub struct ReadRequest {
    /// The process that reads, as the file system tells it (0: not known).
    reader: u32,
    wait: Wait,
    served: AtomicU8,
    /// A sampler listed the file read (`lookahead`): it fetches what comes next, so the read is
    /// not taken for a walk in order (whose chunks and read-ahead would fetch it a second time).
    listed: std::sync::atomic::AtomicBool,
    /// The catalog entry read, once known (`NO_FILE` before), and its size.
    file: std::sync::atomic::AtomicU32,
    file_size: AtomicU64,
    /// Where the read's bytes were located when a splice was considered and declined
    /// (`Images::file_range`), for the read that follows: located (and noted) once. Keyed by
    /// what was asked (image, offset).
    located: std::sync::OnceLock<(u32, u64, Located)>,
}

const NO_FILE: u32 = u32::MAX;

impl ReadRequest {
    pub fn new(reader: u32, wait: Wait) -> ReadRequest {
        ReadRequest {
            reader,
            wait,
            served: AtomicU8::new(0),
            listed: std::sync::atomic::AtomicBool::new(false),
            file: std::sync::atomic::AtomicU32::new(NO_FILE),
            file_size: AtomicU64::new(0),
            located: std::sync::OnceLock::new(),
        }
    }

    /// A command's read (`cat`, `verify`, a scan's class list): no reader to tell apart, and it
    /// may wait.
    pub fn waiting() -> ReadRequest {
        ReadRequest::new(0, Wait::May)
    }

    pub fn reader(&self) -> u32 {
        self.reader
    }

    pub fn wait(&self) -> Wait {
        self.wait
    }

    /// Notes that a sampler listed the file read.
    pub fn set_listed(&self) {
        self.listed.store(true, Ordering::Relaxed);
    }

    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Relaxed)
    }

    /// Notes which catalog entry is read, and its size.
    pub fn set_file(&self, file: u32, size: u64) {
        self.file_size.store(size, Ordering::Relaxed);
        self.file.store(file, Ordering::Relaxed);
    }

    /// The catalog entry read, if known.
    pub fn file(&self) -> Option<u32> {
        Some(self.file.load(Ordering::Relaxed)).filter(|&f| f != NO_FILE)
    }

    /// The size of the file read, if known.
    pub fn file_size(&self) -> Option<u64> {
        self.file().map(|_| self.file_size.load(Ordering::Relaxed))
    }

    /// Keeps where the bytes at `offset` of `image` were found (`located`).
    pub(super) fn keep_located(&self, image: u32, offset: u64, found: Located) {
        let _ = self.located.set((image, offset, found));
    }

    /// Where the `len` bytes at `offset` of `image` were found, if this read located them
    /// already.
    pub(super) fn located(&self, image: u32, offset: u64, len: u64) -> Option<Located> {
        match self.located.get() {
            Some(&(i, o, found)) if i == image && o == offset && found.len == len => Some(found),
            _ => None,
        }
    }

    /// Notes that `tier` served some of the bytes.
    pub fn served_by(&self, tier: Tiers) {
        self.served.fetch_or(tier.0, Ordering::Relaxed);
    }

    /// The tiers that served the read so far.
    pub fn tiers(&self) -> Tiers {
        Tiers(self.served.load(Ordering::Relaxed))
    }
}

/// Who asks: a reader, or the lookahead fetching ahead of readers.
#[derive(Clone, Copy)]
pub enum Asker<'a> {
    Reader(&'a ReadRequest),
    Lookahead,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_accumulate_in_the_request() {
        let req = ReadRequest::waiting();
        assert_eq!(req.tiers().names(), "none");
        req.served_by(Tiers::RAM);
        req.served_by(Tiers::SOURCE);
        assert_eq!(req.tiers().names(), "ram+source");
        req.served_by(Tiers::STAGE);
        assert_eq!(req.tiers().names(), "stage+ram+source");
    }
}
