//! The stager: one thread that copies source chunks to local storage. Chunks that reads touched
//! come first; in eager mode it then walks the images front to back in large sequential reads.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tracing::{info, warn};
use xxhash_rust::xxh3::xxh3_64;

use super::super::budget::Permit;
use super::super::ram_cache::Held;
use super::image::{ABSENT, BUSY, QUEUED, StagedImage, is_local, state, with_state};
use super::{Offer, Stage, StageMode, StageState, StopReason};

/// Source bytes read per request when copying runs of chunks (large sequential reads are what
/// parallel filesystems serve best).
const RUN_BYTES: u64 = 8 << 20;

/// How long the stager sleeps at most before it looks at the shutdown flag again.
const TICK: Duration = Duration::from_millis(100);

/// Keeps the stager's source reads under a rate.
struct Pace {
    rate: Option<u64>,
    next: Instant,
}

impl Pace {
    /// Waits until `bytes` more may be read; false if shutdown came first.
    fn wait(&mut self, stage: &Stage, bytes: u64) -> bool {
        let Some(rate) = self.rate else { return true };
        let now = Instant::now();
        self.next = self.next.max(now) + Duration::from_secs_f64(bytes as f64 / rate as f64);
        while Instant::now() + TICK < self.next {
            if stage.shutdown.load(Ordering::Relaxed) {
                return false;
            }
            std::thread::sleep(TICK);
        }
        std::thread::sleep(self.next.saturating_duration_since(Instant::now()));
        true
    }
}

/// The storing half of the stager, shared by the walk's writer thread and the offer path.
#[derive(Clone, Copy)]
struct Sink<'s> {
    stage: &'s Stage,
    progress: Option<Progress<'s>>,
}

/// A run of chunks read by the walk, on its way to the writer thread.
struct Batch {
    image: usize,
    claimed: Vec<(usize, u64)>,
    /// xxh3 of each claimed chunk, computed on the reading side to balance the two threads.
    sums: Vec<u64>,
    buf: Vec<u8>,
    /// The buffer's share of the mount's memory budget; it travels with the buffer.
    permit: Option<Permit>,
}

struct Copier<'s> {
    stage: &'s Stage,
    sink: Sink<'s>,
    /// The walk's runs go to the writer thread, so that reading the next run overlaps writing
    /// this one; spent buffers come back.
    to_writer: Sender<Batch>,
    spent: Receiver<(Vec<u8>, Option<Permit>)>,
    pace: Pace,
    /// Where the eager walk goes on: (image position, chunk).
    cursor: (usize, usize),
    /// Chunks the source could not deliver; not retried by the walk.
    unreadable: HashSet<(u32, usize)>,
    started: Instant,
    reported_done: bool,
}

/// Told the bytes staged so far, as the copy goes (a progress bar in `packfs stage`).
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Runs the stager until shutdown, or (with `until_done`) until every assigned chunk is staged
/// or staging stops.
pub fn run(stage: &Stage, until_done: bool, progress: Option<Progress>) {
    let sink = Sink { stage, progress };
    let (to_writer, batches) = crossbeam_channel::bounded::<Batch>(1);
    let (give_back, spent) = crossbeam_channel::unbounded();
    std::thread::scope(|scope| {
        let eager = stage.opts.mode == StageMode::Eager;
        let writer = scope.spawn(move || {
            // In eager mode the walking thread spends most of its time waiting on a run's source
            // read, while reads offer chunks they fetched whole: taken only between runs, the
            // offers overflowed their queue and the walk fetched those chunks a second time
            // (5.99 GB read for 2.62 GB on the simulated PFS, issue 17). The writer takes them
            // as they come.
            let offers = if eager {
                stage.offers.1.clone()
            } else {
                crossbeam_channel::never()
            };
            loop {
                crossbeam_channel::select! {
                    recv(batches) -> batch => {
                        let Ok(batch) = batch else { break };
                        sink.store_run(&batch);
                        let _ = give_back.send((batch.buf, batch.permit));
                    }
                    recv(offers) -> offer => {
                        if let Ok(offer) = offer {
                            sink.store_offered(offer);
                        }
                    }
                }
            }
        });
        let mut c = Copier {
            stage,
            sink,
            to_writer,
            spent,
            pace: Pace {
                rate: stage.opts.rate,
                next: Instant::now(),
            },
            cursor: (0, 0),
            unreadable: HashSet::new(),
            started: Instant::now(),
            reported_done: false,
        };
        c.walk_and_take_offers(until_done);
        drop(c);
        let _ = writer.join();
    });
    if let Some(progress) = progress {
        progress(stage.present_bytes.load(Ordering::Relaxed));
    }
}

impl Copier<'_> {
    fn walk_and_take_offers(&mut self, until_done: bool) {
        let stage = self.stage;
        self.stage.set_status(
            StageState::Copying,
            match stage.opts.mode {
                StageMode::Eager => "copying",
                StageMode::Lazy => "lazy: copying chunks as reads touch them",
            },
        );
        loop {
            if stage.shutdown.load(Ordering::Relaxed) || stage.stopped() {
                break;
            }
            if !stage.dir_present() {
                stage.stop(StopReason::DirectoryGone, format!(
                    "stage directory {} vanished; staging stopped, unstaged chunks are read from the source",
                    stage.dir().display()
                ));
                break;
            }
            while let Ok(offer) = stage.offers.1.try_recv() {
                self.take_offer(offer);
            }
            let walking = stage.opts.mode == StageMode::Eager && !self.done() && !stage.stopped();
            if walking && self.copy_next_run() {
                continue;
            }
            self.report_done();
            if until_done && (self.done() || stage.stopped()) {
                break;
            }
            if let Ok(offer) = stage.offers.1.recv_timeout(TICK) {
                self.take_offer(offer);
            }
        }
    }

    /// Every assigned chunk is staged, or cannot be read from the source.
    fn done(&self) -> bool {
        let s = self.stage;
        s.present_chunks.load(Ordering::Relaxed) + self.unreadable.len() as u64 >= s.total_chunks
    }

    fn report_done(&mut self) {
        let s = self.stage;
        if s.opts.mode != StageMode::Eager || !self.done() || s.stopped() || self.reported_done {
            return;
        }
        self.reported_done = true;
        let secs = self.started.elapsed().as_secs_f64();
        let copied = s.copied_bytes.load(Ordering::Relaxed);
        info!(
            copied_bytes = copied,
            unreadable_chunks = self.unreadable.len(),
            "staging complete in {secs:.1} s ({:.0} MB/s)",
            copied as f64 / secs.max(1e-3) / 1e6
        );
        s.set_status(
            StageState::Complete,
            if self.unreadable.is_empty() {
                "complete"
            } else {
                "complete except chunks the source could not deliver"
            },
        );
    }

    /// Copies the next run of absent chunks at or after the cursor; false when the walk found
    /// none (it then starts over from the first image next time).
    fn copy_next_run(&mut self) -> bool {
        let images = &self.stage.images;
        while self.cursor.0 < images.len() {
            let Some(img) = &images[self.cursor.0] else {
                self.cursor = (self.cursor.0 + 1, 0);
                continue;
            };
            let first = (self.cursor.1..img.chunks.len()).find(|&i| {
                state(img.word(i)) == ABSENT && !self.unreadable.contains(&(img.index, i))
            });
            let Some(first) = first else {
                self.cursor = (self.cursor.0 + 1, 0);
                continue;
            };
            // Claim consecutive absent chunks, up to one run.
            let mut claimed = Vec::new();
            let mut bytes = 0;
            let mut i = first;
            while i < img.chunks.len() && bytes < RUN_BYTES {
                let word = img.word(i);
                if state(word) != ABSENT
                    || self.unreadable.contains(&(img.index, i))
                    || !img.swap(i, word, with_state(word, BUSY))
                {
                    break;
                }
                claimed.push((i, word));
                bytes += img.chunk_len(i);
                i += 1;
            }
            self.cursor.1 = i;
            if claimed.is_empty() {
                continue;
            }
            self.copy_claimed(img, claimed, bytes);
            return true;
        }
        self.cursor = (0, 0);
        false
    }

    /// Reads the claimed consecutive chunks in one source read and hands them to the writer.
    fn copy_claimed(&mut self, img: &StagedImage, claimed: Vec<(usize, u64)>, bytes: u64) {
        if !self.pace.wait(self.stage, bytes) {
            return img.release(&claimed);
        }
        let start = img.chunk_start(claimed[0].0);
        let (mut buf, permit) = match self.spent.try_recv() {
            Ok(spent) => spent,
            // A new buffer: its room first (a run and a chunk at most).
            Err(_) => (
                Vec::new(),
                self.stage
                    .memory()
                    .map(|m| m.acquire(RUN_BYTES + self.stage.chunk_size())),
            ),
        };
        buf.resize(bytes as usize, 0);
        let source = &self.stage.source;
        if let Err(e) = source.read_for_stage(img.index, start, &mut buf) {
            warn!(
                "staging: cannot read {} bytes at offset {start} of {}: {e}; those chunks stay on the source",
                bytes,
                img.source_path.display()
            );
            for &(i, _) in &claimed {
                self.unreadable.insert((img.index, i));
            }
            return img.release(&claimed);
        }
        // Let the kernel fetch the next run while this one is written.
        source.will_need(img.index, start + bytes, RUN_BYTES);
        let mut at = 0;
        let sums = claimed
            .iter()
            .map(|&(i, _)| {
                let len = img.chunk_len(i) as usize;
                at += len;
                xxh3_64(&buf[at - len..at])
            })
            .collect();
        let batch = Batch {
            image: img.index as usize,
            claimed,
            sums,
            buf,
            permit,
        };
        if let Err(unsent) = self.to_writer.send(batch) {
            img.release(&unsent.into_inner().claimed);
        }
    }

    /// A chunk a read touched: take its bytes, or read them from the source.
    fn take_offer(&mut self, offer: Offer) {
        let Some((img, word)) = claim(self.stage, &offer) else {
            return;
        };
        let i = offer.chunk;
        let busy = with_state(word, BUSY);
        let give_back = || img.swap(i, busy, with_state(word, ABSENT));
        if self.stage.stopped() {
            give_back();
            return;
        }
        let from_read = offer.bytes.is_some();
        let bytes = match offer.bytes {
            Some(b) => b,
            None => {
                let len = img.chunk_len(i);
                if !self.pace.wait(self.stage, len) {
                    give_back();
                    return;
                }
                // Never waits for memory: this thread also takes the offers that hold it.
                let permit = match self.stage.memory().map(|m| m.try_acquire(len)) {
                    Some(None) => {
                        give_back();
                        return;
                    }
                    Some(permit) => permit,
                    None => None,
                };
                let mut b = vec![0u8; len as usize];
                if let Err(e) =
                    self.stage
                        .source
                        .read_for_stage(img.index, img.chunk_start(i), &mut b)
                {
                    warn!(
                        "staging: cannot read chunk {i} of {}: {e}",
                        img.source_path.display()
                    );
                    give_back();
                    return;
                }
                std::sync::Arc::new(match permit {
                    Some(permit) => Held::under(b, permit),
                    None => Held::unbudgeted(b),
                })
            }
        };
        if self.make_room(bytes.len() as u64)
            && self.sink.store(img, i, busy, &bytes, xxh3_64(&bytes))
        {
            if from_read {
                self.stage
                    .copied_from_reads
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
        } else {
            give_back();
        }
    }
    /// Makes room for `len` more local bytes under the budget: in lazy mode by dropping the least
    /// recently used chunks; in eager mode a full budget ends the copy.
    fn make_room(&mut self, len: u64) -> bool {
        let s = self.stage;
        let Some(budget) = s.opts.budget else {
            return true;
        };
        if s.present_bytes.load(Ordering::Relaxed) + len <= budget {
            return true;
        }
        if s.opts.mode == StageMode::Eager {
            return self.sink.fits_eager_budget(len);
        }
        // Evict a sixteenth of the budget beyond what is needed, so eviction runs in batches.
        let target = budget.saturating_sub(len + budget / 16);
        let mut candidates: Vec<(u64, usize, usize)> = Vec::new();
        for (pos, img) in s.images.iter().enumerate() {
            let Some(img) = img else { continue };
            for (i, c) in img.chunks.iter().enumerate() {
                if is_local(c.word.load(Ordering::Relaxed)) {
                    candidates.push((c.last_use.load(Ordering::Relaxed), pos, i));
                }
            }
        }
        candidates.sort_unstable();
        for (_, pos, i) in candidates {
            if s.present_bytes.load(Ordering::Relaxed) <= target {
                break;
            }
            let img = s.images[pos].as_ref().expect("assigned image");
            let word = img.word(i);
            if is_local(word) && s.drop_chunk(img, i, word) {
                s.evicted_bytes
                    .fetch_add(img.chunk_len(i), Ordering::Relaxed);
            }
        }
        s.present_bytes.load(Ordering::Relaxed) + len <= budget
    }
}

/// Takes an offered chunk for copying (queued -> busy): its image and its state word before, or
/// `None` if another thread took it or it is no longer queued.
fn claim<'s>(stage: &'s Stage, offer: &Offer) -> Option<(&'s StagedImage, u64)> {
    stage.offer_taken(offer.image, offer.chunk);
    let img = stage.images.get(offer.image as usize)?.as_ref()?;
    let word = img.word(offer.chunk);
    (state(word) == QUEUED && img.swap(offer.chunk, word, with_state(word, BUSY)))
        .then_some((img, word))
}

impl Sink<'_> {
    /// Stores a chunk a read offered in eager mode (with its bytes; eager mode takes no others).
    fn store_offered(&self, offer: Offer) {
        let s = self.stage;
        let Some((img, word)) = claim(s, &offer) else {
            return;
        };
        let i = offer.chunk;
        let busy = with_state(word, BUSY);
        let Some(bytes) = offer.bytes.filter(|_| !s.stopped()) else {
            img.swap(i, busy, with_state(word, ABSENT));
            return;
        };
        let len = bytes.len() as u64;
        if self.fits_eager_budget(len) && self.store(img, i, busy, &bytes, xxh3_64(&bytes)) {
            s.copied_from_reads.fetch_add(len, Ordering::Relaxed);
        } else {
            img.swap(i, busy, with_state(word, ABSENT));
        }
    }

    /// Stores each chunk of a run the walk read; on the first failure releases the rest.
    fn store_run(&self, batch: &Batch) {
        let img = self.stage.images[batch.image]
            .as_ref()
            .expect("assigned image");
        let mut at = 0usize;
        for (n, &(i, word)) in batch.claimed.iter().enumerate() {
            let len = img.chunk_len(i) as usize;
            let busy = with_state(word, BUSY);
            let fits = self.fits_eager_budget(len as u64);
            let bytes = &batch.buf[at..at + len];
            if !fits || !self.store(img, i, busy, bytes, batch.sums[n]) {
                return img.release(&batch.claimed[n..]);
            }
            at += len;
        }
    }

    /// In eager mode a full budget ends the copy.
    fn fits_eager_budget(&self, len: u64) -> bool {
        let s = self.stage;
        match s.opts.budget {
            Some(budget) if s.present_bytes.load(Ordering::Relaxed) + len > budget => {
                s.stop(StopReason::Budget, format!(
                    "stage budget of {budget} bytes reached in {}; the rest is read from the source",
                    s.dir().display()
                ));
                false
            }
            _ => true,
        }
    }

    /// Writes chunk `i` (claimed: state word `busy`) and records it, with progress; false when
    /// it was not stored (staging stopped), leaving the chunk claimed for the caller to release.
    fn store(&self, img: &StagedImage, i: usize, busy: u64, bytes: &[u8], sum: u64) -> bool {
        let stored = self.stage.store_chunk(img, i, busy, bytes, sum);
        if let (true, Some(progress)) = (stored, self.progress) {
            progress(self.stage.present_bytes.load(Ordering::Relaxed));
        }
        stored
    }
}
