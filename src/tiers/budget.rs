//! The one memory budget of the read path: every decoded unit, source chunk and staging run the
//! daemon holds draws a permit for its bytes before it is allocated, and gives it back when the
//! last reference goes. The RAM cache keeps at most `--cache-size` of them; the budget is that
//! plus `HEADROOM - OUTSIDE`, so that the daemon's peak stays within `--cache-size` + 64 MiB. A
//! request larger than the room left waits until nothing else is held (the cache's values are
//! evicted for it). Work that does not fit waits its turn, in arrival order; what a crafted image
//! declares never sizes an allocation beyond it.
//!
//! Holders that keep bytes for later (the RAM cache, read-ahead's window of chunks) register a
//! reclaimer: a request that has waited `PATIENCE` asks them to let go of what it lacks, so a full
//! cache never starves a reader.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Bytes the daemon may hold beyond the RAM cache's, in all: room for one unit of the largest
/// size (`plan::MAX_UNIT`)...
pub const HEADROOM: u64 = crate::archive::plan::MAX_UNIT as u64;
/// ...less what the process holds outside the budget: the replies being assembled
/// (`fs::reads::REPLY_ROOM`, 4 MiB, more while reads are stuck), the reply buffers 4 threads
/// keep (4 MiB), code and thread stacks (7 MiB idle, 40-50 threads under 32 readers), and what
/// the allocator keeps of freed small buffers: 28 MiB left 87 MiB peaks, once in a few runs, of
/// staging under 32 readers with a 16 MiB cache, and 36 MiB left 82-84 MiB once in about eight
/// (62-69 MiB typical). A unit of the largest size then waits until it is the only one held.
pub const OUTSIDE: u64 = 44 << 20;

/// How long a request waits before asking the holders to let go.
const PATIENCE: Duration = Duration::from_millis(20);

/// Lets go of about `bytes` held bytes (that are not in use elsewhere) when asked.
pub type Reclaimer = Box<dyn Fn(u64) + Send + Sync>;

pub struct MemoryBudget {
    total: u64,
    state: Mutex<State>,
    freed: Condvar,
    reclaimers: Mutex<Vec<Reclaimer>>,
    peak: AtomicU64,
    waits: AtomicU64,
    /// Requests that waited their patience and went ahead without room.
    overdrawn: AtomicU64,
    /// Requests waiting in `acquire` now: while memory is what reads wait for, they are not
    /// stuck in the source (`fs::reads` goes ahead without reply room only for a stall).
    waiting: AtomicU64,
}

struct State {
    free: u64,
    /// Tickets handed to requests, and the one served next: requests are served in order, so a
    /// large one is not starved by a stream of small ones.
    next: u64,
    serving: u64,
    /// Requests in `acquire_unless_stuck`, which take no ticket.
    untracked: u64,
}

impl State {
    fn somebody_waits(&self) -> bool {
        self.serving != self.next || self.untracked > 0
    }
}

/// What the budget has done, for `packfs status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct BudgetStats {
    pub total: u64,
    pub held: u64,
    pub peak: u64,
    /// Requests that had to wait for room.
    pub waits: u64,
    /// Requests that went ahead without room, their holders stuck (`acquire_unless_stuck`).
    pub overdrawn: u64,
}

/// Bytes drawn from a budget; given back when dropped.
pub struct Permit {
    budget: Arc<MemoryBudget>,
    bytes: u64,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Permit({} bytes)", self.bytes)
    }
}

impl MemoryBudget {
    pub fn new(total: u64) -> Arc<MemoryBudget> {
        Arc::new(MemoryBudget {
            total,
            state: Mutex::new(State {
                free: total,
                next: 0,
                serving: 0,
                untracked: 0,
            }),
            freed: Condvar::new(),
            reclaimers: Mutex::new(Vec::new()),
            peak: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            overdrawn: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
        })
    }

    /// The budget of a daemon whose RAM cache holds `cache_size` bytes.
    pub fn for_cache(cache_size: u64) -> Arc<MemoryBudget> {
        MemoryBudget::new(cache_size.saturating_add(HEADROOM - OUTSIDE))
    }

    /// Whether some request waits in `acquire` for this budget's memory now.
    pub fn anyone_waits(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Registers a holder to ask for bytes back when a request waits.
    pub fn add_reclaimer(&self, reclaimer: Reclaimer) {
        lock(&self.reclaimers).push(reclaimer);
    }

    /// `bytes` from the budget, waiting for them. A request larger than the whole budget waits
    /// until nothing else is held, and then takes it all.
    pub fn acquire(self: &Arc<Self>, bytes: u64) -> Permit {
        let want = bytes.min(self.total);
        let mut state = lock(&self.state);
        let ticket = state.next;
        state.next += 1;
        let mut waited = false;
        while !(state.serving == ticket && state.free >= want) {
            if !waited {
                waited = true;
                self.waits.fetch_add(1, Ordering::Relaxed);
                self.waiting.fetch_add(1, Ordering::Relaxed);
            }
            let (s, timeout) = self
                .freed
                .wait_timeout(state, PATIENCE)
                .unwrap_or_else(|p| p.into_inner());
            state = s;
            if timeout.timed_out() && state.serving == ticket && state.free < want {
                let lacking = want - state.free;
                drop(state);
                self.reclaim(lacking);
                state = lock(&self.state);
            }
        }
        if waited {
            self.waiting.fetch_sub(1, Ordering::Relaxed);
        }
        state.serving += 1;
        self.take(&mut state, want);
        let waiting = state.somebody_waits();
        drop(state);
        // The next in line may fit in what is left.
        if waiting {
            self.freed.notify_all();
        }
        Permit {
            budget: self.clone(),
            bytes: want,
        }
    }

    /// `bytes` from the budget, waiting for them; every `patience` the request asks `stuck`, and
    /// goes ahead without room (the budget overdrawn) if it says the holders are stuck: for what
    /// must not wait behind reads stuck in a slow region of the source while they hold the room,
    /// yet must wait behind reads that are only busy.
    pub fn acquire_unless_stuck(
        self: &Arc<Self>,
        bytes: u64,
        patience: Duration,
        stuck: impl Fn() -> bool,
    ) -> Permit {
        let want = bytes.min(self.total);
        let mut state = lock(&self.state);
        let mut waited = false;
        while state.serving != state.next || state.free < want {
            if !waited {
                waited = true;
                self.waits.fetch_add(1, Ordering::Relaxed);
                state.untracked += 1;
            }
            let (s, timeout) = self
                .freed
                .wait_timeout(state, patience)
                .unwrap_or_else(|p| p.into_inner());
            state = s;
            if timeout.timed_out() && stuck() {
                self.overdrawn.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
        if waited {
            state.untracked -= 1;
        }
        // Overdrawn, the permit takes only what was there: what it gives back never makes room
        // that was not.
        let taken = want.min(state.free);
        self.take(&mut state, taken);
        Permit {
            budget: self.clone(),
            bytes: taken,
        }
    }

    /// A permit for no bytes, to join others to.
    pub fn nothing(self: &Arc<Self>) -> Permit {
        Permit {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// `bytes` from the budget if they are free now and nobody waits before this request.
    pub fn try_acquire(self: &Arc<Self>, bytes: u64) -> Option<Permit> {
        let want = bytes.min(self.total);
        let mut state = lock(&self.state);
        if state.serving != state.next || state.free < want {
            return None;
        }
        self.take(&mut state, want);
        Some(Permit {
            budget: self.clone(),
            bytes: want,
        })
    }

    /// `try_acquire`, after asking the holders (the RAM cache, read-ahead) to let go of what is
    /// lacking: for what must never wait in line, yet should not be refused by a full cache.
    pub fn try_acquire_reclaiming(self: &Arc<Self>, bytes: u64) -> Option<Permit> {
        if let Some(permit) = self.try_acquire(bytes) {
            return Some(permit);
        }
        let lacking = bytes.saturating_sub(lock(&self.state).free);
        self.reclaim(lacking.max(bytes));
        self.try_acquire(bytes)
    }

    pub fn stats(&self) -> BudgetStats {
        let free = lock(&self.state).free;
        BudgetStats {
            total: self.total,
            held: self.total - free,
            peak: self.peak.load(Ordering::Relaxed),
            waits: self.waits.load(Ordering::Relaxed),
            overdrawn: self.overdrawn.load(Ordering::Relaxed),
        }
    }

    fn take(&self, state: &mut State, bytes: u64) {
        state.free -= bytes;
        self.peak
            .fetch_max(self.total - state.free, Ordering::Relaxed);
    }

    fn give_back(&self, bytes: u64) {
        let mut state = lock(&self.state);
        state.free = (state.free + bytes).min(self.total);
        // Waking costs a system call on every read's release: only when somebody waits.
        let waiting = state.somebody_waits();
        drop(state);
        if waiting {
            self.freed.notify_all();
        }
    }

    fn reclaim(&self, bytes: u64) {
        for reclaimer in lock(&self.reclaimers).iter() {
            reclaimer(bytes);
        }
    }
}

impl Permit {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// One permit for the bytes of both (of the same budget).
    pub fn join(mut self, mut other: Permit) -> Permit {
        debug_assert!(Arc::ptr_eq(&self.budget, &other.budget));
        self.bytes += std::mem::take(&mut other.bytes);
        self
    }

    /// Gives back what is held beyond `bytes` (a unit smaller than reserved for it). Growing is
    /// not possible: reserve the most first.
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.budget.give_back(self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.give_back(self.bytes);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn permits_are_given_back_when_dropped_or_shrunk() {
        let budget = MemoryBudget::new(100);
        let mut a = budget.acquire(60);
        assert!(budget.try_acquire(50).is_none());
        a.shrink_to(40);
        let b = budget.try_acquire(50).expect("room after the shrink");
        assert_eq!(budget.stats().held, 90);
        drop((a, b));
        assert_eq!(budget.stats().held, 0);
        assert_eq!(budget.stats().peak, 90);
    }

    #[test]
    fn a_request_larger_than_the_budget_waits_for_all_of_it() {
        let budget = MemoryBudget::new(100);
        let small = budget.acquire(30);
        let done = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (budget, done) = (budget.clone(), done.clone());
            std::thread::spawn(move || {
                let p = budget.acquire(1000);
                done.store(true, Ordering::SeqCst);
                p.bytes()
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        assert!(!done.load(Ordering::SeqCst), "took room that is held");
        drop(small);
        assert_eq!(waiter.join().unwrap(), 100);
        assert!(budget.stats().waits >= 1);
    }

    #[test]
    fn requests_are_served_in_order() {
        let budget = MemoryBudget::new(100);
        let held = budget.acquire(90);
        let big = {
            let budget = budget.clone();
            std::thread::spawn(move || drop(budget.acquire(80)))
        };
        std::thread::sleep(Duration::from_millis(50));
        // 10 bytes are free, but a request waits before this one.
        assert!(budget.try_acquire(10).is_none());
        drop(held);
        big.join().unwrap();
        assert!(budget.try_acquire(10).is_some());
    }

    #[test]
    fn a_request_goes_ahead_without_room_only_when_the_holders_are_stuck() {
        let budget = MemoryBudget::new(100);
        let held = budget.acquire(100);
        let asked = AtomicU64::new(0);
        // Busy holders: it keeps waiting (here until the third time it asks).
        let started = std::time::Instant::now();
        let p = budget.acquire_unless_stuck(10, Duration::from_millis(20), || {
            asked.fetch_add(1, Ordering::SeqCst) >= 2
        });
        assert!(started.elapsed() >= Duration::from_millis(60));
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        assert_eq!((p.bytes(), budget.stats().overdrawn), (0, 1));
        drop((p, held));
        assert_eq!(budget.stats().held, 0);
        // With room, at once.
        let p = budget.acquire_unless_stuck(10, Duration::ZERO, || unreachable!());
        assert_eq!(p.bytes(), 10);
    }

    #[test]
    fn a_request_that_waits_for_stuck_holders_is_woken_when_room_comes_back() {
        let budget = MemoryBudget::new(100);
        let held = budget.acquire(100);
        let waiter = {
            let budget = budget.clone();
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let p = budget.acquire_unless_stuck(10, Duration::from_secs(10), || false);
                (p.bytes(), started.elapsed())
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        let (bytes, waited) = waiter.join().unwrap();
        // Woken by the release, not by its patience running out.
        assert_eq!(bytes, 10);
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }

    #[test]
    fn a_request_that_never_waits_still_makes_the_holders_let_go() {
        let budget = MemoryBudget::new(100);
        let held = Arc::new(Mutex::new(vec![budget.acquire(60), budget.acquire(30)]));
        let cache = held.clone();
        budget.add_reclaimer(Box::new(move |_| {
            cache.lock().unwrap().pop();
        }));
        assert!(budget.try_acquire(20).is_none());
        let permit = budget
            .try_acquire_reclaiming(20)
            .expect("the holder let go");
        assert_eq!(permit.bytes(), 20);
        assert_eq!(held.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_waiting_request_asks_the_holders_to_let_go() {
        let budget = MemoryBudget::new(100);
        let kept = Arc::new(Mutex::new(Some(budget.acquire(100))));
        let asked = Arc::new(AtomicU64::new(0));
        {
            let (kept, asked) = (kept.clone(), asked.clone());
            budget.add_reclaimer(Box::new(move |bytes| {
                asked.store(bytes, Ordering::SeqCst);
                lock(&kept).take();
            }));
        }
        let p = budget.acquire(40);
        assert_eq!(p.bytes(), 40);
        assert_eq!(asked.load(Ordering::SeqCst), 40);
    }
}
