//! `--trace FILE`: every FUSE request as a Chrome/Perfetto trace event (JSON array format, one
//! event per line), the form DFTracer and Darshan users load into Perfetto or chrome://tracing.
//!
//! A request thread only sends a small fixed-size record to a bounded channel (never blocking: a
//! full channel drops the event and counts it); a writer thread turns records into JSON, naming
//! each inode's path from the catalog. The file stops growing at its byte limit; the last event
//! says how many were left out. Without `--trace` the dispatcher skips all of this on one branch.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use tracing::{info, warn};

mod event;
pub mod summary;

use std::borrow::Cow;

pub use event::{Event, MetaArgs, RequestArgs, TRACE_END};

use super::requests::{Op, Request};
use crate::catalog::Catalog;

/// Records waiting for the writer at most: 64 K x 64 bytes.
const QUEUE: usize = 64 * 1024;
/// How often the writer drains the queue.
const POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// One request, as the request thread saw it.
struct Record {
    op: Op,
    ino: u64,
    /// The name looked up in directory `ino`.
    name: Option<Box<[u8]>>,
    offset: u64,
    size: u32,
    /// Bytes replied, or the errno for a failed request.
    result: Result<u32, i32>,
    start_ns: u64,
    dur_ns: u64,
    tid: u32,
    tiers: crate::tiers::Tiers,
}

/// What the writer receives: requests, then `End` when the mount is over (the observer, and so
/// the sender, may outlive the session inside fuser).
enum Msg {
    Request(Record),
    End,
}

pub struct Trace {
    tx: Sender<Msg>,
    epoch: Instant,
    dropped: Arc<AtomicU64>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

thread_local! {
    static TID: u32 = nix::unistd::gettid().as_raw() as u32;
}

impl Trace {
    /// Creates `path` (not following a symlink, refusing to overwrite another file than a
    /// regular one) and starts the writer. The file ends once its size passes `limit` bytes.
    pub fn create(path: &Path, limit: u64, catalog: Arc<Catalog>) -> std::io::Result<Trace> {
        let file = crate::util::safe_file::create_truncate(path, crate::util::safe_file::PRIVATE)?;
        let (tx, rx) = crossbeam_channel::bounded(QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            out: BufWriter::with_capacity(1 << 20, file),
            path: path.to_path_buf(),
            written: 0,
            limit,
            catalog,
            dropped: dropped.clone(),
            over_limit: 0,
            threads: Vec::new(),
            paths: std::collections::HashMap::new(),
            line: Vec::with_capacity(512),
        };
        let handle = std::thread::Builder::new()
            .name("packfs-trace".into())
            .spawn(move || writer.run(rx))?;
        info!("tracing every request to {}", path.display());
        Ok(Trace {
            tx,
            epoch: Instant::now(),
            dropped,
            writer: Mutex::new(Some(handle)),
        })
    }

    /// Queues one answered request.
    pub fn record(&self, req: &Request, result: Result<u32, i32>) {
        let started = req.started;
        let start_ns = started.saturating_duration_since(self.epoch).as_nanos() as u64;
        let record = Record {
            op: req.op,
            ino: req.ino,
            name: req.name.map(Box::from),
            offset: req.offset,
            size: req.size,
            result,
            start_ns,
            dur_ns: started.elapsed().as_nanos() as u64,
            tid: TID.with(|t| *t),
            tiers: req.tiers,
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send(Msg::Request(record)) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Lets the writer drain the queue and close the JSON array; later requests are not traced.
    pub fn finish(&self) {
        let writer = self.writer.lock().expect("not poisoned").take();
        if let Some(w) = writer {
            let _ = self.tx.send(Msg::End);
            let _ = w.join();
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        self.finish();
    }
}

struct Writer {
    out: BufWriter<std::fs::File>,
    path: PathBuf,
    written: u64,
    limit: u64,
    catalog: Arc<Catalog>,
    dropped: Arc<AtomicU64>,
    over_limit: u64,
    threads: Vec<u32>,
    paths: std::collections::HashMap<u64, Box<str>>,
    /// The event being written.
    line: Vec<u8>,
}

impl Writer {
    fn run(mut self, rx: Receiver<Msg>) {
        let pid = std::process::id();
        let head = Event::named("process_name", pid, 0, "packfs".into());
        if let Err(e) = self.emit("[\n", &head) {
            warn!("cannot write the trace {}: {e}", self.path.display());
            return;
        }
        loop {
            // Polled, not waited on: a receiver blocked in `recv` makes every request's send a
            // futex wake-up and a context switch (measured: 12% fewer warm opens per second on
            // 2 vCPUs); drained every POLL, the queue holds 64 K requests in between.
            let r = match rx.try_recv() {
                Ok(Msg::Request(r)) => r,
                Ok(Msg::End) | Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => {
                    std::thread::sleep(POLL);
                    continue;
                }
            };
            if self.written >= self.limit {
                self.over_limit += 1;
                continue;
            }
            if let Err(e) = self.request(&r, pid) {
                warn!("trace {} stopped: {e}", self.path.display());
                return;
            }
        }
        let dropped = self.dropped.load(Ordering::Relaxed) + self.over_limit;
        let tail = Event::Meta {
            name: Cow::Borrowed(TRACE_END),
            pid,
            tid: 0,
            args: MetaArgs {
                dropped: Some(dropped),
                limit_bytes: Some(self.limit),
                ..MetaArgs::default()
            },
        };
        let ended = self
            .emit(",\n", &tail)
            .and_then(|_| self.out.write_all(b"\n]\n"))
            .and_then(|_| self.out.flush());
        match ended {
            Err(e) => warn!("cannot finish the trace {}: {e}", self.path.display()),
            Ok(()) if dropped > 0 => warn!(
                "trace {}: {dropped} request(s) left out (queue full or past {} bytes)",
                self.path.display(),
                self.limit
            ),
            Ok(()) => info!("trace {} complete", self.path.display()),
        }
    }

    /// Writes `before` and then `event`, counting the bytes against the limit.
    fn emit(&mut self, before: &str, event: &Event) -> std::io::Result<()> {
        self.line.clear();
        self.line.extend_from_slice(before.as_bytes());
        serde_json::to_writer(&mut self.line, event)?;
        self.out.write_all(&self.line)?;
        self.written += self.line.len() as u64;
        Ok(())
    }

    /// One record's event (a thread's first event is preceded by its name).
    fn request(&mut self, r: &Record, pid: u32) -> std::io::Result<()> {
        if !self.threads.contains(&r.tid) {
            self.threads.push(r.tid);
            let named = Event::named("thread_name", pid, r.tid, format!("packfs-{}", r.tid));
            self.emit(",\n", &named)?;
        }
        let path: Cow<str> = match &r.name {
            // A lookup: the directory's path and the name asked for (not cached: names vary).
            Some(name) => {
                let mut path = self.path_of(r.ino);
                if path.len() > 1 {
                    path.push(b'/');
                }
                path.extend_from_slice(name);
                Cow::Owned(String::from_utf8_lossy(&path).into_owned())
            }
            None => Cow::Owned(self.remembered_path(r.ino).to_string()),
        };
        let (bytes, errno) = match r.result {
            Ok(bytes) => (Some(bytes), None),
            Err(errno) => (None, Some(errno)),
        };
        let tier = (r.op == Op::Read).then(|| Cow::Borrowed(r.tiers.names()));
        let event = Event::Request {
            name: Cow::Borrowed(r.op.name()),
            cat: Cow::Borrowed("fuse"),
            ts: r.start_ns as f64 / 1000.0,
            dur: r.dur_ns as f64 / 1000.0,
            pid,
            tid: r.tid,
            args: RequestArgs {
                ino: r.ino,
                path,
                offset: r.offset,
                size: r.size,
                bytes,
                errno,
                tier,
            },
        };
        self.emit(",\n", &event)
    }

    /// The path of inode `ino`, from the catalog (`/` for the root or an unknown inode).
    fn path_of(&self, ino: u64) -> Vec<u8> {
        let mut path = b"/".to_vec();
        if let Some(id) = crate::fs::core::id_of(ino) {
            path.extend_from_slice(&self.catalog.path_of(id));
        }
        path
    }

    /// The path of `ino`, remembered: a file's reads come many at a time, and walking the
    /// catalog up to the root for each was most of the writer's time.
    fn remembered_path(&mut self, ino: u64) -> &str {
        if self.paths.len() >= PATHS_REMEMBERED {
            self.paths.clear();
        }
        if !self.paths.contains_key(&ino) {
            let path = String::from_utf8_lossy(&self.path_of(ino)).into_owned();
            self.paths.insert(ino, path.into());
        }
        &self.paths[&ino]
    }
}

/// Paths the writer remembers at most (about 100 bytes each).
const PATHS_REMEMBERED: usize = 1 << 20;
