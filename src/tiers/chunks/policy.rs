//! Whether stored bytes are fetched in whole aligned chunks or exactly, for every source: the one
//! place that decides, for the mount (`choose`) and for each read (`Policy::plan`).

use super::streams::Streams;
use crate::catalog::ImageInfo;
use crate::tiers::ReadRequest;
pub use crate::tiers::located::Plan;
use crate::tiers::stage::Stage;

/// The mount's choice, and what to tell the user about it.
#[derive(Debug, PartialEq, Eq)]
pub struct Chunking {
    /// Fetch every image's stored bytes in chunks (a stage fetches the images it keeps in
    /// chunks whatever this says).
    pub every_image: bool,
    /// Said once at mount (info): how to read in fewer requests.
    pub advice: Option<String>,
    /// Said once at mount (warning): a RAM cache too small for the chunks.
    pub warning: Option<String>,
}

/// Chooses for a mount of `images` with a RAM cache of `cache_size` bytes: chunks of
/// `chunk_size` as the user `asked` (`--ram-chunks`), or else when the images are in an object
/// store (every request a billed round trip) and fit in half the cache. Whole chunks from a store
/// pay off only while they stay in RAM until their neighbours are read: measured with 441 MB of
/// shards behind a 64 MiB cache, shuffled reads fetched 9.6x the bytes in as many requests as
/// samples (docs/benchmarks/object-store.md).
pub fn choose(
    images: &[ImageInfo],
    cache_size: u64,
    chunk_size: u64,
    asked: Option<bool>,
    staged: bool,
    read_threads: usize,
) -> Chunking {
    let remote = crate::catalog::any_object(images);
    let bytes: u64 = images.iter().map(|i| i.fingerprint.size).sum();
    let fits = bytes <= cache_size / 2;
    let advice = (remote && !staged && asked.is_none() && !fits).then(|| {
        format!(
            "the images ({} MB) are more than half the RAM cache ({} MB): each sample is read \
             from the store with its own request; --stage DIR (node-local NVMe or /dev/shm, \
             --stage-mode lazy to copy only what is read) reads whole chunks and keeps them, \
             for far fewer requests and none in later epochs",
            bytes / 1_000_000,
            cache_size / 1_000_000
        )
    });
    let every_image = asked.unwrap_or(remote && fits);
    let warning = (remote && (every_image || staged))
        .then(|| small_cache_hint(cache_size, chunk_size, read_threads))
        .flatten();
    Chunking {
        every_image,
        advice,
        warning,
    }
}

/// A warning when the RAM cache holds fewer than two chunks per read thread: chunks from a store
/// are then evicted before their neighbours are read or staged, and fetched again. Measured with
/// 4 MiB chunks (112 of them), staging and 32 readers: 265 requests and 1.1 GB for 441 MB with a
/// 64 MiB cache, 170-182 with 128 MiB, 136-152 with 256 MiB (four chunks per read thread), 113
/// with 1 GiB (docs/benchmarks/object-store.md).
fn small_cache_hint(cache_size: u64, chunk_size: u64, read_threads: usize) -> Option<String> {
    let per_thread = |n: u64| {
        chunk_size
            .saturating_mul(n)
            .saturating_mul(read_threads.max(1) as u64)
    };
    (cache_size < per_thread(2)).then(|| {
        format!(
            "the RAM cache ({}) holds fewer than 2 chunks of {} per read thread ({}): \
             chunks read from the store will be evicted and fetched again; --cache-size {}M \
             (4 chunks per read thread) keeps them",
            binary_size(cache_size),
            binary_size(chunk_size),
            read_threads,
            per_thread(4).div_ceil(1 << 20)
        )
    })
}

/// `4 MiB`, `64 KiB`, `1000 B`: sizes as the flags take them.
fn binary_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// How a read wants its bytes fetched when they are not staged: what the read plan asks (stored
/// bytes in chunks, encoded bytes exactly), which `Policy::plan` weighs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Whole aligned chunks, kept in the RAM tier.
    Chunks,
    /// Exactly the bytes asked for.
    Exact,
}

/// What is asked of the plan: `len` bytes at `offset` of `image` (the outermost image), fetched
/// as `fetch` wants; `chunk_or_more`: the file read is at least a chunk long, in an image on a
/// local disk (spliced rather than read in chunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ask {
    pub image: u32,
    pub offset: u64,
    pub len: u64,
    pub fetch: Fetch,
    pub chunk_or_more: bool,
}

/// The per-read decision.
pub struct Policy {
    /// Every image in chunks (`Chunking::every_image`).
    every_image: bool,
    /// The RAM tier exists (the stage's chunks pass through it).
    has_ram: bool,
    /// The RAM tier can keep chunks for their readers (`chunks::PINNED_MAX`'s note): else only
    /// the stage reads by chunks.
    holds_chunks: bool,
    /// Readers walking an image in order across files, whose reads go in chunks.
    streams: Streams,
}

impl Policy {
    pub fn new(every_image: bool, has_ram: bool, holds_chunks: bool, images: usize) -> Policy {
        Policy {
            every_image: every_image && holds_chunks,
            has_ram,
            holds_chunks,
            streams: Streams::new(images),
        }
    }

    /// The plan for what `ask`s, for `req` (none: the lookahead, which fetches ahead of readers
    /// and so is never a walk in order).
    pub fn plan(&self, stage: Option<&Stage>, req: Option<&ReadRequest>, ask: Ask) -> Plan {
        let Ask {
            image,
            offset,
            len,
            fetch,
            chunk_or_more,
        } = ask;
        // Chunks are fetched whole so the stager can keep them. Where it will not (an image of
        // another node's share; staging stopped: budget reached, directory full), a whole chunk
        // for a small read is waste: 43x more bytes read than served was measured after a stop,
        // 7.6x the dataset per epoch for the other shares of 4 nodes. Read exactly then.
        let kept = stage.is_some_and(|s| s.keeps(image));
        let staging = stage.is_some_and(|s| s.copying(image));
        // Encoded bytes are read exactly (their decoded form is what the RAM tier keeps).
        let wants_chunks = fetch == Fetch::Chunks && self.has_ram;
        // A reader walking the image in order across files reads it in chunks (and so with
        // read-ahead): one request per chunk, not one per file (`streams`).
        // A read of a sample a sampler listed is not: the lookahead fetches what comes next.
        // Nor is a read of a file of a chunk or more in an image on a local disk: its own reads
        // are as large as the kernel makes them, the page cache's readahead runs ahead of them,
        // and they are spliced; chunks only copied each byte twice more, so a cold walk of 64 MB
        // files ran at 0.36-0.55x native files (docs/benchmarks/large.md).
        let streaming = wants_chunks
            && self.holds_chunks
            && !self.every_image
            && !staging
            && !chunk_or_more
            && req.is_some_and(|req| {
                !req.listed()
                    && self
                        .streams
                        .note_of(req.reader(), image, offset, len, req.file())
            });
        Plan {
            kept,
            staging,
            chunked: wants_chunks && (self.every_image || staging || streaming),
        }
    }

    /// Runs that became streams, and bytes read as part of one.
    pub fn streams(&self) -> (u64, u64) {
        (self.streams.detected(), self.streams.streamed())
    }

    pub fn every_image(&self) -> bool {
        self.every_image
    }

    pub fn has_ram(&self) -> bool {
        self.has_ram
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{Fingerprint, ImageLocation};

    fn image(name: &str, size: u64) -> ImageInfo {
        ImageInfo {
            location: ImageLocation::from_arg(std::path::Path::new(name)).unwrap(),
            fingerprint: Fingerprint {
                size,
                mtime: 0,
                mtime_nsec: 0,
                head: 0,
                tail: 0,
            },
            stream: None,
            within: None,
        }
    }

    #[test]
    fn a_store_goes_by_chunks_while_its_images_fit_in_half_the_cache() {
        let mib = 1 << 20;
        let store = [image("s3://bucket/a.tar", 10 * mib)];
        let fits = choose(&store, 64 * mib, mib, None, false, 16);
        assert!(fits.every_image && fits.advice.is_none() && fits.warning.is_none());
        let big = choose(&store, 16 * mib, mib, None, false, 4);
        assert!(!big.every_image);
        assert!(big.advice.unwrap().contains("--stage DIR"));
        // Staged: the stage reads in chunks, no advice to stage; the cache still too small.
        let staged = choose(&store, 16 * mib, mib, None, true, 16);
        assert!(!staged.every_image && staged.advice.is_none());
        assert!(staged.warning.unwrap().contains("--cache-size 64M"));
        // Files are read exactly unless asked, and the user's word goes.
        let files = [image("/data/a.tar", 10 * mib)];
        assert!(!choose(&files, 64 * mib, mib, None, false, 16).every_image);
        assert!(choose(&files, 64 * mib, mib, Some(true), false, 16).every_image);
        assert!(!choose(&store, 64 * mib, mib, Some(false), false, 16).every_image);
    }

    #[test]
    fn the_cache_hint_asks_for_two_chunks_per_read_thread() {
        // The defaults (64 MiB, 1 MiB chunks, 16 read threads) need no hint.
        assert_eq!(small_cache_hint(64 << 20, 1 << 20, 16), None);
        assert_eq!(small_cache_hint(128 << 20, 4 << 20, 16), None);
        let hint = small_cache_hint(64 << 20, 4 << 20, 16).unwrap();
        assert!(hint.contains("--cache-size 256M"), "{hint}");
        assert!(
            hint.contains("(64 MiB)") && hint.contains("of 4 MiB"),
            "{hint}"
        );
        let hint = small_cache_hint(100_000, 64 << 10, 1).unwrap();
        assert!(
            hint.contains("(100000 B)") && hint.contains("of 64 KiB"),
            "{hint}"
        );
        // No overflow on absurd values.
        assert!(small_cache_hint(0, 64 << 20, usize::MAX).is_some());
    }
}
