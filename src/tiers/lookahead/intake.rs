//! How a sampler's list comes in, whoever hands it over (the mount's hints socket, or a sampler
//! in the same process through `python`): its samples taken one at a time, their bookkeeping
//! memory drawn from the budget a step at a time and never waited for (all lists together
//! within a quarter of it, so readers never queue behind a list), at most four times the files.

use std::sync::Arc;

use crate::catalog::Catalog;
use crate::tiers::budget::{MemoryBudget, Permit};

/// List bookkeeping bytes per sample (`lists::List`: entry, by entry, state, by place).
const BYTES_PER_SAMPLE: u64 = 37;
/// Memory is drawn for a list in steps of this many bytes (about 5 000 samples).
const PERMIT_STEP: u64 = 64 << 10;
/// Tries for a list's memory, 10 ms apart, before the list is refused.
const DRAW_TRIES: usize = 100;
/// All lists together hold at most this share of the memory budget: the rest is the readers'.
const LISTS_SHARE: u64 = 4;

/// The memory lists are drawn from.
pub struct Intake {
    memory: Arc<MemoryBudget>,
    /// The lists' share of `memory`: each list's bytes are drawn from both.
    lists: Arc<MemoryBudget>,
}

impl Intake {
    pub fn new(memory: Arc<MemoryBudget>) -> Intake {
        Intake {
            lists: MemoryBudget::new(memory.stats().total / LISTS_SHARE),
            memory,
        }
    }

    pub fn memory(&self) -> &MemoryBudget {
        &self.memory
    }

    pub fn lists(&self) -> &MemoryBudget {
        &self.lists
    }

    /// `bytes` for a list from its share and from the budget, at once or not at all: a list
    /// never waits for memory, so a sender that stalls in the middle of one holds only what it
    /// has.
    fn draw(&self, bytes: u64) -> Option<Vec<Permit>> {
        // The lists' own share is full only of lists: no use waiting for it.
        let share = self.lists.try_acquire(bytes)?;
        // The budget may be busy for a moment (a reader waiting its turn, the cache full): tried
        // again for up to a second, never in its queue.
        for _ in 0..DRAW_TRIES {
            if let Some(main) = self.memory.try_acquire_reclaiming(bytes) {
                return Some(vec![share, main]);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }

    /// A list of `catalog`'s files, to take in sample by sample.
    pub fn take<'a>(&'a self, catalog: &Catalog) -> Taking<'a> {
        Taking {
            intake: self,
            most: (catalog.file_count() as usize)
                .saturating_mul(4)
                .saturating_add(1024),
            entries: Vec::new(),
            permits: Vec::new(),
            drawn: 0,
            truncated: false,
            no_room: 0,
        }
    }
}

/// A list being taken in.
pub struct Taking<'a> {
    intake: &'a Intake,
    most: usize,
    entries: Vec<u32>,
    permits: Vec<Permit>,
    drawn: u64,
    /// Samples past four times the files were left out.
    pub truncated: bool,
    /// Samples refused for want of memory (the whole list is then refused).
    pub no_room: u64,
}

impl Taking<'_> {
    /// Takes the next sample's catalog entry, if there is room for it.
    pub fn push(&mut self, entry: u32) {
        if self.entries.len() >= self.most {
            self.truncated = true;
            return;
        }
        if self.no_room > 0 {
            // Refused: the rest is counted (a message must still be read to its end), not held.
            self.no_room += 1;
            return;
        }
        let need = (self.entries.len() as u64 + 1) * BYTES_PER_SAMPLE;
        if need > self.drawn {
            match self.intake.draw(PERMIT_STEP) {
                Some(more) => {
                    self.drawn += PERMIT_STEP;
                    self.permits.extend(more);
                }
                None => {
                    self.no_room = 1;
                    self.entries = Vec::new();
                    self.permits.clear();
                    return;
                }
            }
        }
        self.entries.push(entry);
    }

    /// The entries taken and the memory they hold (none if the list was refused).
    pub fn finish(mut self) -> (Vec<u32>, Vec<Permit>) {
        self.entries.shrink_to_fit();
        (self.entries, self.permits)
    }
}
