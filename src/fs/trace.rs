//! `--trace FILE`: every FUSE request as a Chrome/Perfetto trace event (JSON array format, one
//! event per line), the form DFTracer and Darshan users load into Perfetto or chrome://tracing.
//!
//! A request thread only sends a small fixed-size record to a bounded channel (never blocking: a
//! full channel drops the event and counts it); a writer thread turns records into JSON, naming
//! each inode's path from the catalog. The file stops growing at its byte limit; the last event
//! says how many were left out. Without `--trace` the adapter skips all of this on one branch.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TryRecvError, TrySendError};
use tracing::{info, warn};

use super::requests::{Op, Request};
use crate::catalog::Catalog;
use crate::tiers::served_by;

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
    tiers: u8,
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

    /// Queues one answered request; takes this thread's tier marks.
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
            tiers: served_by::take(),
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
}

impl Writer {
    fn run(mut self, rx: Receiver<Msg>) {
        let pid = std::process::id();
        let head = format!(
            "[\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":\"packfs\"}}}}"
        );
        if let Err(e) = self.emit(&head) {
            warn!("cannot write the trace {}: {e}", self.path.display());
            return;
        }
        let mut line = String::with_capacity(512);
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
            line.clear();
            self.event(&r, pid, &mut line);
            if let Err(e) = self.emit(&line) {
                warn!("trace {} stopped: {e}", self.path.display());
                return;
            }
        }
        let dropped = self.dropped.load(Ordering::Relaxed) + self.over_limit;
        let tail = format!(
            ",\n{{\"name\":\"packfs_trace_end\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"dropped\":{dropped},\"limit_bytes\":{}}}}}\n]\n",
            self.limit
        );
        let ended = self.emit(&tail).and_then(|_| self.out.flush());
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

    fn emit(&mut self, text: &str) -> std::io::Result<()> {
        self.out.write_all(text.as_bytes())?;
        self.written += text.len() as u64;
        Ok(())
    }

    /// `,\n{event}` for one record (a thread's first event is preceded by its name).
    fn event(&mut self, r: &Record, pid: u32, out: &mut String) {
        use std::fmt::Write as _;
        if !self.threads.contains(&r.tid) {
            self.threads.push(r.tid);
            let _ = write!(
                out,
                ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{},\"args\":{{\"name\":\"packfs-{}\"}}}}",
                r.tid, r.tid
            );
        }
        let path = match &r.name {
            // A lookup: the directory's path and the name asked for (not cached: names vary).
            Some(name) => {
                let mut path = self.path_of(r.ino).to_vec();
                if path.len() > 1 {
                    path.push(b'/');
                }
                path.extend_from_slice(name);
                json_string(&path)
            }
            None => self.json_path_of(r.ino).to_string(),
        };
        let _ = write!(
            out,
            ",\n{{\"name\":\"{}\",\"cat\":\"fuse\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":{pid},\"tid\":{},\"args\":{{\"ino\":{},\"path\":{},\"offset\":{},\"size\":{}",
            r.op.name(),
            r.start_ns as f64 / 1000.0,
            r.dur_ns as f64 / 1000.0,
            r.tid,
            r.ino,
            path,
            r.offset,
            r.size,
        );
        match r.result {
            Ok(bytes) => {
                let _ = write!(out, ",\"bytes\":{bytes}");
            }
            Err(errno) => {
                let _ = write!(out, ",\"errno\":{errno}");
            }
        }
        if r.op == Op::Read {
            let _ = write!(out, ",\"tier\":\"{}\"", served_by::names(r.tiers));
        }
        out.push_str("}}");
    }

    /// The path of inode `ino`, from the catalog (`/` for the root or an unknown inode).
    fn path_of(&self, ino: u64) -> Vec<u8> {
        let mut path = b"/".to_vec();
        if let Some(id) = crate::fs::core::id_of(ino) {
            path.extend_from_slice(&self.catalog.path_of(id));
        }
        path
    }

    /// The path of `ino` as a JSON string, remembered: a file's reads come many at a time, and
    /// walking the catalog up to the root and escaping for each was most of the writer's time.
    fn json_path_of(&mut self, ino: u64) -> &str {
        if self.paths.len() >= PATHS_REMEMBERED {
            self.paths.clear();
        }
        if !self.paths.contains_key(&ino) {
            let path = json_string(&self.path_of(ino));
            self.paths.insert(ino, path.into());
        }
        &self.paths[&ino]
    }
}

/// Paths the writer remembers at most (about 100 bytes each).
const PATHS_REMEMBERED: usize = 1 << 20;

/// `bytes` as a JSON string literal (lossy for non-UTF-8).
fn json_string(bytes: &[u8]) -> String {
    serde_json::Value::String(String::from_utf8_lossy(bytes).into_owned()).to_string()
}
