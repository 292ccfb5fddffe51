//! A `ReadAt` that misbehaves on purpose at chosen byte ranges of an image: EIO, short reads,
//! latency and stalls. Tests run the read path over it to prove that every injected error becomes
//! the error of the read that met it (never wrong bytes), and that short or slow answers change
//! nothing but timing.

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::source::read_at::{ReadAt, Wait};

/// What happens to a read that touches a fault's range.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The read fails with EIO.
    Eio,
    /// The read returns at most this many bytes (at least one).
    Short(usize),
    /// The read is answered after this delay.
    Latency(Duration),
    /// The read waits until the gate opens.
    Stall(Arc<Gate>),
}

/// A gate that stalled reads wait on until `open` is called.
#[derive(Debug, Default)]
pub struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    pub fn open(&self) {
        *self.open.lock().expect("gate lock") = true;
        self.opened.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().expect("gate lock");
        while !*open {
            open = self.opened.wait(open).expect("gate lock");
        }
    }
}

pub struct Faulty {
    inner: Arc<dyn ReadAt>,
    faults: Vec<(Range<u64>, Fault)>,
    injected: AtomicU64,
}

impl Faulty {
    pub fn new(inner: Arc<dyn ReadAt>, faults: Vec<(Range<u64>, Fault)>) -> Faulty {
        Faulty {
            inner,
            faults,
            injected: AtomicU64::new(0),
        }
    }

    /// How many reads met a fault so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }
}

impl Faulty {
    fn read(&self, buf: &mut [u8], offset: u64, wait: Wait) -> io::Result<usize> {
        let asked = offset..offset.saturating_add(buf.len() as u64);
        let mut len = buf.len();
        for (range, fault) in &self.faults {
            if range.start >= asked.end || asked.start >= range.end {
                continue;
            }
            // A slow or stuck region is what a read that must not wait must not wait for.
            if matches!(fault, Fault::Latency(_) | Fault::Stall(_)) && wait == Wait::Never {
                return Err(crate::source::read_at::would_block());
            }
            self.injected.fetch_add(1, Ordering::Relaxed);
            match fault {
                Fault::Eio => return Err(io::Error::from_raw_os_error(libc::EIO)),
                Fault::Short(max) => len = len.min((*max).max(1)),
                Fault::Latency(delay) => std::thread::sleep(*delay),
                Fault::Stall(gate) => gate.wait(),
            }
        }
        self.inner.read_with(&mut buf[..len], offset, wait)
    }
}

impl ReadAt for Faulty {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read(buf, offset, Wait::May)
    }

    fn read_at_now(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.read(buf, offset, Wait::Never)
    }

    fn current(&self) -> Option<io::Result<crate::source::read_at::Stamp>> {
        self.inner.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_apply_only_to_their_range() {
        let data: Arc<dyn ReadAt> = Arc::new((0..=255u8).collect::<Vec<u8>>());
        let faulty = Faulty::new(
            data,
            vec![(100..110, Fault::Eio), (200..256, Fault::Short(7))],
        );
        let mut buf = [0u8; 50];
        faulty.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(buf[49], 49);
        let err = faulty.read_exact_at(&mut buf, 80).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert_eq!(faulty.read_at(&mut buf, 200).unwrap(), 7);
        faulty.read_exact_at(&mut buf, 200).unwrap();
        assert_eq!(buf[0], 200);
        assert_eq!(buf[49], 249);
        assert!(faulty.injected() >= 8);
    }

    #[test]
    fn stalled_reads_wait_for_the_gate() {
        let gate = Arc::new(Gate::default());
        let faulty = Arc::new(Faulty::new(
            Arc::new(vec![1u8; 10]),
            vec![(0..10, Fault::Stall(gate.clone()))],
        ));
        let reader = {
            let faulty = faulty.clone();
            std::thread::spawn(move || faulty.read_at(&mut [0u8; 4], 0).unwrap())
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!reader.is_finished());
        gate.open();
        assert_eq!(reader.join().unwrap(), 4);
    }

    #[test]
    fn stalls_refuse_reads_that_will_not_wait() {
        let gate = Arc::new(Gate::default());
        let faulty = Faulty::new(
            Arc::new(vec![7u8; 300]),
            vec![(100..200, Fault::Stall(gate.clone()))],
        );
        // Opened late: a read that waited would succeed after it, and fail the test.
        let opener = std::thread::spawn({
            let gate = gate.clone();
            move || {
                std::thread::sleep(std::time::Duration::from_secs(2));
                gate.open();
            }
        });
        let mut buf = [0u8; 50];
        let err = faulty
            .read_exact_with(&mut buf, 120, Wait::Never)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(faulty.injected(), 0, "a refusal is not an injected fault");
        // Outside the region, and once allowed to wait, reads go on.
        faulty.read_exact_with(&mut buf, 0, Wait::Never).unwrap();
        opener.join().unwrap();
        faulty.read_exact_at(&mut buf, 120).unwrap();
    }
}
