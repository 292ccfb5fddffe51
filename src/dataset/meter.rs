//! How far the scan of each image has come, in bytes: one compressed image (ImageNet as
//! downloaded is one file) is scanned for half a minute, and a count of finished images says
//! "0 of 1" all that time. The furthest byte a scan has asked of its image is its progress
//! (tar headers, a compressed stream and a zip's directory are all read front to back).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::source::read_at::ReadAt;
use crate::source::read_at::Stamp;

/// Per image: its size once opened, and the furthest byte its scan has read.
pub struct ScanMeter {
    sizes: Vec<AtomicU64>,
    reached: Vec<Arc<AtomicU64>>,
}

impl ScanMeter {
    pub fn new(images: usize) -> ScanMeter {
        ScanMeter {
            sizes: (0..images).map(|_| AtomicU64::new(0)).collect(),
            reached: (0..images).map(|_| Arc::new(AtomicU64::new(0))).collect(),
        }
    }

    /// `data`, image `i` of `size` bytes, read through a wrapper that moves the meter.
    pub fn watch(&self, i: usize, size: u64, data: Arc<dyn ReadAt>) -> Arc<dyn ReadAt> {
        self.sizes[i].store(size, Ordering::Relaxed);
        Arc::new(Metered {
            inner: data,
            reached: self.reached[i].clone(),
        })
    }

    /// Image `i` is scanned: all its bytes count as done.
    pub fn done(&self, i: usize) {
        let size = self.sizes[i].load(Ordering::Relaxed);
        self.reached[i].store(size, Ordering::Relaxed);
    }

    /// Bytes scanned and bytes of the images opened so far.
    pub fn bytes(&self) -> (u64, u64) {
        let mut done = 0u64;
        let mut total = 0u64;
        for (size, reached) in self.sizes.iter().zip(&self.reached) {
            let size = size.load(Ordering::Relaxed);
            total = total.saturating_add(size);
            done = done.saturating_add(reached.load(Ordering::Relaxed).min(size));
        }
        (done, total)
    }
}

struct Metered {
    inner: Arc<dyn ReadAt>,
    reached: Arc<AtomicU64>,
}

impl Metered {
    fn moved(&self, offset: u64, got: &io::Result<usize>) {
        if let Ok(n) = got {
            self.reached
                .fetch_max(offset.saturating_add(*n as u64), Ordering::Relaxed);
        }
    }
}

impl ReadAt for Metered {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let got = self.inner.read_at(buf, offset);
        self.moved(offset, &got);
        got
    }

    fn read_at_now(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let got = self.inner.read_at_now(buf, offset);
        self.moved(offset, &got);
        got
    }

    fn will_need(&self, offset: u64, len: u64) {
        self.inner.will_need(offset, len)
    }

    fn current(&self) -> Option<io::Result<Stamp>> {
        self.inner.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_furthest_byte_read_is_the_progress() {
        let meter = ScanMeter::new(2);
        let data: Arc<dyn ReadAt> = Arc::new(vec![7u8; 1000]);
        let watched = meter.watch(0, 1000, data);
        let mut buf = [0u8; 100];
        watched.read_at(&mut buf, 300).unwrap();
        watched.read_at(&mut buf, 0).unwrap();
        assert_eq!(meter.bytes(), (400, 1000));
        meter.watch(1, 500, Arc::new(vec![0u8; 500]));
        meter.done(0);
        assert_eq!(meter.bytes(), (1000, 1500));
    }
}
