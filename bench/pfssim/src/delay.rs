//! Replies sent at their simulated completion time by one timer thread, so that a request waiting
//! for its simulated latency holds no FUSE thread (a real client has many RPCs in flight at once).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

type Job = Box<dyn FnOnce() + Send>;

struct Due {
    at: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    // Earliest first in a max-heap.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Due>,
    seq: u64,
    closed: bool,
}

#[derive(Clone)]
pub struct Delay {
    shared: Arc<(Mutex<Queue>, Condvar)>,
}

impl Delay {
    /// Starts the timer thread.
    pub fn start() -> Delay {
        let delay = Delay {
            shared: Arc::new((Mutex::new(Queue::default()), Condvar::new())),
        };
        let worker = delay.clone();
        std::thread::Builder::new()
            .name("pfssim-timer".into())
            .spawn(move || worker.run())
            .expect("spawn the timer thread");
        delay
    }

    /// Runs `job` at `at`, or now if `at` has passed.
    pub fn at(&self, at: Instant, job: impl FnOnce() + Send + 'static) {
        if at <= Instant::now() {
            job();
            return;
        }
        let (lock, wake) = &*self.shared;
        let mut q = lock.lock().unwrap();
        if q.closed {
            drop(q);
            job();
            return;
        }
        q.seq += 1;
        let seq = q.seq;
        let earliest = q.heap.peek().is_none_or(|d| at < d.at);
        q.heap.push(Due {
            at,
            seq,
            job: Box::new(job),
        });
        if earliest {
            wake.notify_one();
        }
    }

    /// Runs what is still queued at once; later jobs run immediately.
    pub fn close(&self) {
        let (lock, wake) = &*self.shared;
        lock.lock().unwrap().closed = true;
        wake.notify_one();
    }

    fn run(self) {
        let (lock, wake) = &*self.shared;
        let mut q = lock.lock().unwrap();
        loop {
            let now = Instant::now();
            match q.heap.peek() {
                Some(d) if d.at <= now || q.closed => {
                    let job = q.heap.pop().unwrap().job;
                    drop(q);
                    job();
                    q = lock.lock().unwrap();
                }
                Some(d) => {
                    let wait = d.at - now;
                    q = wake.wait_timeout(q, wait).unwrap().0;
                }
                None if q.closed => return,
                None => q = wake.wait(q).unwrap(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn jobs_run_in_time_order_not_submission_order() {
        let d = Delay::start();
        let (tx, rx) = mpsc::channel();
        let t = Instant::now();
        for (i, ms) in [(0, 30u64), (1, 10), (2, 20)] {
            let tx = tx.clone();
            d.at(t + Duration::from_millis(ms), move || {
                tx.send((i, Instant::now())).unwrap()
            });
        }
        let got: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [1, 2, 0]);
        assert!(got[0].1 >= t + Duration::from_millis(10));
        assert!(got[2].1 >= t + Duration::from_millis(30));
    }
}
