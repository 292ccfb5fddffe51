//! A store that fails as real ones do, for tests that run the engine over a store of their own
//! (through the same path as `s3://` and `http://`): HEAD, GET and LIST refused (the next few
//! requests, or every request for names that contain a text), and latency on every request.
//! Objects are replaced through the store it wraps (`MemoryStore::put`).

use std::io;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::client::ObjectMeta;
use super::location::Location;
use super::store::ObjectStore;

/// A kind of request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    Head,
    Get,
    List,
}

impl Request {
    fn index(self) -> usize {
        self as usize
    }
}

#[derive(Default)]
struct Faults {
    /// Requests of each kind still to fail.
    next: [u32; 3],
    /// Requests of each kind that fail for every name that contains one of these.
    names: [Vec<String>; 3],
    delay: Duration,
}

pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    faults: Mutex<Faults>,
    requests: [AtomicU64; 3],
    failed: [AtomicU64; 3],
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<FaultyStore> {
        Arc::new(FaultyStore {
            inner,
            faults: Mutex::default(),
            requests: Default::default(),
            failed: Default::default(),
        })
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `n` requests of kind `what` fail (503, as a busy gateway answers).
    pub fn fail_next(&self, what: Request, n: u32) {
        self.faults().next[what.index()] = n;
    }

    /// Every request of kind `what` for a name containing `part` fails (404 for a HEAD or a
    /// LIST's bucket, 500 for a GET), until `heal`.
    pub fn fail_names(&self, what: Request, part: &str) {
        self.faults().names[what.index()].push(part.to_string());
    }

    /// No more failures.
    pub fn heal(&self) {
        let mut faults = self.faults();
        faults.next = [0; 3];
        faults.names = Default::default();
    }

    /// Every request waits `delay` first (a store far away).
    pub fn delay(&self, delay: Duration) {
        self.faults().delay = delay;
    }

    /// Requests of kind `what` made, and of those failed here.
    pub fn requests(&self, what: Request) -> (u64, u64) {
        (
            self.requests[what.index()].load(Ordering::Relaxed),
            self.failed[what.index()].load(Ordering::Relaxed),
        )
    }

    /// Waits, then fails the request if a fault says so.
    fn pass(&self, what: Request, name: &str) -> io::Result<()> {
        self.requests[what.index()].fetch_add(1, Ordering::Relaxed);
        let (delay, fail) = {
            let mut faults = self.faults();
            let i = what.index();
            let by_name = faults.names[i].iter().any(|p| name.contains(p.as_str()));
            let next = faults.next[i] > 0;
            if next {
                faults.next[i] -= 1;
            }
            (faults.delay, by_name || next)
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if !fail {
            return Ok(());
        }
        self.failed[what.index()].fetch_add(1, Ordering::Relaxed);
        let (kind, status) = match what {
            Request::Head | Request::List => (io::ErrorKind::NotFound, "404 Not Found"),
            Request::Get => (io::ErrorKind::Other, "500 Internal Server Error"),
        };
        Err(io::Error::new(
            kind,
            format!("{name}: {status} (a fault of the test's store)"),
        ))
    }
}

impl ObjectStore for FaultyStore {
    fn head(&self, loc: &Location) -> io::Result<ObjectMeta> {
        self.pass(Request::Head, &loc.to_string())?;
        self.inner.head(loc)
    }

    fn get_range(
        &self,
        loc: &Location,
        offset: u64,
        buf: &mut [u8],
        opened: Option<&ObjectMeta>,
    ) -> io::Result<()> {
        self.pass(Request::Get, &loc.to_string())?;
        self.inner.get_range(loc, offset, buf, opened)
    }

    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        keep: &dyn Fn(&str) -> bool,
    ) -> io::Result<Vec<String>> {
        self.pass(Request::List, &format!("s3://{bucket}/{prefix}"))?;
        self.inner.list(bucket, prefix, keep)
    }
}
