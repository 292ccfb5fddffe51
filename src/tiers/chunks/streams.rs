//! Readers that walk an image in order, across its files: pack order, `cp -r`, `tar`, `verify`,
//! WebDataset-style epochs, the shard-ordered sampler. Where stored bytes are otherwise read
//! exactly (an image larger than half the RAM cache, no stage), each file would cost a request of
//! its own: one GET per sample on an object store, one RPC per sample on a parallel file system.
//! A read that starts just after where a tracked run of reads ended (a tar header and padding
//! apart: the next file) extends the run by a file; one that continues it (the next request of
//! the same file, or a little behind when the kernel's requests overtake each other) extends it
//! without counting. From its `RUN`th file in a row (the image's consecutive reads) on, the run
//! is a stream, read in whole chunks through
//! the RAM tier, so the chunk read-ahead (`read_ahead`) fetches ahead of it. One large file read
//! alone in order is not a stream: chunks would add up to two chunks of its neighbours' bytes
//! to it, which a random epoch of large files would pay for every file. A read anywhere else starts a new
//! run in the least recently used slot: random readers stay exact, and a stream that jumps is
//! abandoned (its chunks stay in the cache until evicted).
//!
//! Runs belong to a reader (the process that asked, as the file system tells it: the read's
//! `ReadRequest`), so
//! DataLoader workers each walking their own slice of one shard are each found; where the reader
//! is not known (0), the image's reads are one reader's.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Runs tracked per image: a few readers' own walks at once (32 DataLoader workers over 8 shards
/// put 4 on each), with room for the random readers' runs that come and go between them.
const SLOTS: usize = 16;
/// How far past a run's end a read may start and still extend it: a tar header with its padding,
/// or a PAX header (a member's 512-byte header, up to 511 bytes of padding, a few KiB of PAX).
const GAP: u64 = 64 << 10;
/// How far before a run's end a read may start: the kernel's requests for one file travel on
/// several threads and arrive a little out of order.
const BEHIND: u64 = 1 << 20;
/// Files in a row before a run is a stream: three files read in order are a pattern, one or two
/// are chance.
const RUN: u32 = 3;

#[derive(Clone, Copy, Default)]
struct Run {
    /// Whose reads these are.
    reader: u32,
    end: u64,
    /// Files the run went through (0: an empty slot).
    files: u32,
    /// When the run was last extended (a counter per image), for replacing the oldest.
    used: u64,
    /// The catalog entry of the run's latest read, when known.
    file: Option<u32>,
}

#[derive(Default)]
struct Slots {
    runs: [Run; SLOTS],
    clock: u64,
}

pub struct Streams {
    images: Vec<Mutex<Slots>>,
    /// Runs that became streams, and bytes read as part of one.
    detected: AtomicU64,
    streamed: AtomicU64,
}

impl Streams {
    pub fn new(images: usize) -> Streams {
        Streams {
            images: (0..images).map(|_| Mutex::default()).collect(),
            detected: AtomicU64::new(0),
            streamed: AtomicU64::new(0),
        }
    }

    /// Notes a read by `reader` of `len` bytes at `offset` of `image`; whether it belongs to a
    /// stream.
    #[cfg(test)]
    pub fn note(&self, reader: u32, image: u32, offset: u64, len: u64) -> bool {
        self.note_of(reader, image, offset, len, None)
    }

    /// `note`, for a read of catalog entry `file` if known: a read past the run's end is the
    /// next file only if it is another file. The kernel's readahead requests for one large file
    /// travel on several threads, and one that overtakes another leaves a gap behind it: taken
    /// for the next file, three such made one file read alone a stream, read through chunks
    /// (two more copies of every byte).
    pub fn note_of(
        &self,
        reader: u32,
        image: u32,
        offset: u64,
        len: u64,
        file: Option<u32>,
    ) -> bool {
        let Some(slots) = self.images.get(image as usize) else {
            return false;
        };
        let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.clock += 1;
        let now = slots.clock;
        let end = offset.saturating_add(len);
        let extends = |r: &Run| {
            r.files > 0
                && r.reader == reader
                && offset <= r.end.saturating_add(GAP)
                && end > r.end.saturating_sub(BEHIND)
        };
        if let Some(j) = slots.runs.iter().position(extends) {
            // The reader's previous read of this image was in this run.
            let latest = slots
                .runs
                .iter()
                .filter(|r| r.files > 0 && r.reader == reader)
                .all(|r| r.used <= slots.runs[j].used);
            let run = &mut slots.runs[j];
            let same_file = file.is_some() && file == run.file;
            run.file = file.or(run.file);
            if offset > run.end && !same_file {
                // After a gap: the next file. It counts only as the reader's very next read of
                // the image: a random reader that comes back to where a run it left ended is not
                // walking in order (3 reads later, by chance, in a test of 10 files).
                run.files = match latest {
                    true => run.files.saturating_add(1),
                    false => 1,
                };
                if run.files == RUN {
                    self.detected.fetch_add(1, Ordering::Relaxed);
                }
            }
            run.end = run.end.max(end);
            run.used = now;
            if run.files >= RUN {
                self.streamed.fetch_add(len, Ordering::Relaxed);
                return true;
            }
            return false;
        }
        let oldest = (0..SLOTS)
            .min_by_key(|&j| slots.runs[j].used)
            .expect("SLOTS > 0");
        slots.runs[oldest] = Run {
            reader,
            end,
            files: 1,
            used: now,
            file,
        };
        false
    }

    /// Runs that became streams so far.
    pub fn detected(&self) -> u64 {
        self.detected.load(Ordering::Relaxed)
    }

    /// Bytes read as part of a stream so far.
    pub fn streamed(&self) -> u64 {
        self.streamed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Files of `sizes` laid out as a tar lays them out: a header before each, padding after.
    fn tar_layout(sizes: &[u64]) -> Vec<(u64, u64)> {
        let mut at = 0;
        sizes
            .iter()
            .map(|&s| {
                at += 512;
                let file = (at, s);
                at += s.div_ceil(512) * 512;
                file
            })
            .collect()
    }

    #[test]
    fn files_read_in_archive_order_become_a_stream_and_random_ones_do_not() {
        let files = tar_layout(&[3000, 110_000, 800, 40_000, 5, 70_000, 2_000_000, 100]);
        let s = Streams::new(2);
        let streamed: Vec<bool> = files.iter().map(|&(at, n)| s.note(0, 0, at, n)).collect();
        assert_eq!(streamed, [false, false, true, true, true, true, true, true]);
        assert_eq!(s.detected(), 1);
        // The same files in a scattered order, on another image: never a stream.
        let s = Streams::new(2);
        for k in [5, 1, 7, 3, 0, 6, 2, 4] {
            let (at, n) = files[k];
            assert!(!s.note(0, 1, at, n), "file {k}");
        }
        assert_eq!(s.detected(), 0);
    }

    #[test]
    fn a_reader_coming_back_to_where_a_run_ended_is_not_a_stream() {
        // Ten adjacent 300 kB files read in an order where two pairs happen to be adjacent,
        // with other reads between (a random epoch over few files).
        let f = tar_layout(&[300_000; 10]);
        let s = Streams::new(1);
        for k in [7, 8, 2, 6, 1, 9, 5, 3, 0, 4] {
            let (at, n) = f[k];
            assert!(!s.note(0, 0, at, n), "file {k}");
        }
        assert_eq!(s.detected(), 0);
        // Readers interleaved on one image, not told apart, are not found (each stays exact).
        let far = 1 << 30;
        let a = tar_layout(&[10_000; 20]);
        for &(at, n) in &a {
            assert!(!s.note(0, 0, at, n));
            assert!(!s.note(0, 0, far + at, n));
        }
    }

    #[test]
    fn readers_told_apart_are_each_found_walking_their_slice_of_one_image() {
        // 8 DataLoader workers, each walking its own contiguous slice of one shard, their reads
        // interleaved; and a random reader among them.
        let files = tar_layout(&[30_000; 400]);
        let s = Streams::new(1);
        let mut streamed = [0u32; 9];
        for k in 0..50 {
            for w in 0..8u32 {
                let (at, n) = files[w as usize * 50 + k];
                streamed[w as usize] += s.note(100 + w, 0, at, n) as u32;
            }
            let (at, n) = files[(k * 137) % 400];
            streamed[8] += s.note(7, 0, at + 4096, n - 4096) as u32;
        }
        assert_eq!(
            &streamed[..8],
            &[48; 8],
            "each worker's third file on is a stream"
        );
        assert_eq!(streamed[8], 0, "the random reader stays exact");
        assert_eq!(s.detected(), 8);
    }

    #[test]
    fn one_large_file_read_in_order_is_not_a_stream() {
        let s = Streams::new(1);
        for k in 0..64u64 {
            assert!(!s.note(0, 0, 512 + k * 131_072, 131_072), "request {k}");
        }
        // Its requests arriving a little out of order do not start new runs either.
        assert!(!s.note(0, 0, 512 + 10 * 131_072, 131_072));
        assert_eq!(s.detected(), 0);
    }

    /// The kernel's readahead requests for one file, answered by several threads, reach the
    /// tiers out of order. With READs of at most 254 pages (`fs::splice`), each 1 MiB of
    /// readahead is a request of 254 pages and one of 2. When a short one overtook the long one
    /// before it, the run's end stayed 8 KiB short of the next request, which was then taken for
    /// the next file: three times in a cold `dd` of a 512 MB file (the order below is the one
    /// recorded), and the file went through chunks, two more copies of every byte.
    #[test]
    fn one_large_files_requests_overtaking_each_other_are_not_a_stream() {
        let (batch, head) = (1u64 << 20, 254 * 4096);
        let long = |k: u64| (512 + k * batch, head);
        let short = |k: u64| (512 + k * batch + head, batch - head);
        let mut order = Vec::new();
        for k in 0..64u64 {
            if k % 6 == 1 {
                // The next short request overtakes this long one.
                order.extend([short(k), short(k + 1), long(k), long(k + 1)]);
            } else if k % 6 != 2 {
                order.extend([long(k), short(k)]);
            }
        }
        for (file, streams_expected) in [(None, 1), (Some(7), 0)] {
            let s = Streams::new(1);
            for &(at, n) in &order {
                s.note_of(0, 0, at, n, file);
            }
            assert_eq!(s.detected(), streams_expected, "reads of file {file:?}");
        }
        // Files read in order are still found: each read is of the next entry.
        let files = tar_layout(&[3000, 110_000, 800, 40_000]);
        let s = Streams::new(1);
        let streamed: Vec<bool> = files
            .iter()
            .enumerate()
            .map(|(i, &(at, n))| s.note_of(0, 0, at, n, Some(i as u32)))
            .collect();
        assert_eq!(streamed, [false, false, true, true]);
    }

    proptest! {
        /// Reads at random offsets far apart (more than a gap) never count as a stream.
        #[test]
        fn scattered_reads_are_never_a_stream(offsets in prop::collection::vec(0u64..1 << 40, 1..200)) {
            let s = Streams::new(1);
            let mut sorted = offsets.clone();
            sorted.sort();
            let spread = sorted.windows(2).all(|w| w[1] - w[0] > 4 * (GAP + BEHIND));
            prop_assume!(spread);
            for &o in &offsets {
                prop_assert!(!s.note(0, 0, o, 4096));
            }
        }
    }
}
