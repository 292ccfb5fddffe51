//! What every FUSE transport does alike, written once: run a request's answer under `guarded` (a
//! panic fails that request alone), reply with its errno (as `fs/error.rs` chooses it: from
//! `fs::Error`, or the table of requests refused on purpose), and record it with the `Observer`. A transport only decodes requests and
//! encodes replies, through the reply traits below: the classic loop (`classic.rs`, through fuser)
//! and FUSE over io_uring (`ring/`) are each one such adapter, and so would a third be.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, error};

use super::core::{Attr, Core, Ino, Listing};
use super::error::{Error, Refused, counts_as_error, guarded};
use super::requests::{Op, Request, Requests};
use super::trace::Trace;
use crate::source::read_at::Wait;
use crate::tiers::{FileRange, ReadRequest, Served};

/// A read as a transport hands it over: what to read, when it came in (its latency includes any
/// wait for a worker) and who asked.
#[derive(Clone, Copy, Debug)]
pub struct ReadCall {
    pub ino: Ino,
    pub offset: u64,
    pub size: u32,
    pub started: Instant,
    /// The process that asked (0 if not known): readers walking a shard in order are found per
    /// process (`tiers::chunks::policy`).
    pub reader: u32,
}

/// Every reply can fail with an errno.
pub trait Reply {
    fn error(self, errno: i32);
}

/// The answer to LOOKUP: an entry with its attributes.
pub trait EntryReply: Reply {
    fn entry(self, attr: &Attr);
}

/// The answer to GETATTR.
pub trait AttrReply: Reply {
    fn attr(self, attr: &Attr);
}

/// The answer to READ and READLINK: bytes.
pub trait DataReply: Reply {
    fn data(self, bytes: &[u8]);

    /// Answers a read with what the core served; returns the bytes replied. A reply whose read
    /// was assembled in its own buffer takes the bytes where they are (the rings: no copy).
    fn served(self, served: Served) -> u32
    where
        Self: Sized,
    {
        let bytes = served.bytes();
        self.data(bytes);
        bytes.len() as u32
    }

    /// Whether this reply may be sent as a range of an image file (`splice`).
    fn can_splice(&self) -> bool {
        false
    }

    /// Answers with the bytes of `range` without copying them through the daemon; gives the
    /// reply back when it cannot (then it is answered the usual way).
    fn splice(self, _range: &FileRange<'_>) -> Result<(), Self>
    where
        Self: Sized,
    {
        Err(self)
    }
}

/// The answer to STATFS: the figures of `attr::statfs_figures`.
pub trait StatfsReply: Reply {
    fn statfs(self, blocks: u64, files: u64);
}

/// The answer to READDIR and READDIRPLUS: a `Listing` that is finished with `ok`.
pub trait DirReply: Reply + Listing {
    fn ok(self);
}

/// A data reply handed to another thread (the read pool), whichever transport it belongs to.
pub struct SentData(Box<dyn Pooled>);

/// `DataReply` for a boxed reply.
trait Pooled: Send {
    fn data(self: Box<Self>, bytes: &[u8]);
    fn error(self: Box<Self>, errno: i32);
    fn can_splice(&self) -> bool;
    fn splice(self: Box<Self>, range: &FileRange<'_>) -> Result<(), Box<dyn Pooled>>;
}

impl<R: DataReply + Send + 'static> Pooled for R {
    fn data(self: Box<Self>, bytes: &[u8]) {
        DataReply::data(*self, bytes)
    }

    fn error(self: Box<Self>, errno: i32) {
        Reply::error(*self, errno)
    }

    fn can_splice(&self) -> bool {
        DataReply::can_splice(self)
    }

    fn splice(self: Box<Self>, range: &FileRange<'_>) -> Result<(), Box<dyn Pooled>> {
        DataReply::splice(*self, range).map_err(|r| Box::new(r) as Box<dyn Pooled>)
    }
}

impl SentData {
    pub fn new<R: DataReply + Send + 'static>(reply: R) -> SentData {
        SentData(Box::new(reply))
    }
}

impl Reply for SentData {
    fn error(self, errno: i32) {
        self.0.error(errno)
    }
}

impl DataReply for SentData {
    fn data(self, bytes: &[u8]) {
        self.0.data(bytes)
    }

    fn can_splice(&self) -> bool {
        self.0.can_splice()
    }

    fn splice(self, range: &FileRange<'_>) -> Result<(), Self> {
        self.0.splice(range).map_err(SentData)
    }
}

/// Where every answered request is recorded: the counters always, the trace with `--trace`.
#[derive(Default)]
pub struct Observer {
    pub requests: Arc<Requests>,
    pub trace: Option<Trace>,
    /// Failures worth the log, named a few times a window and then counted (`error_log`).
    pub errors: Arc<super::error_log::ErrorLog>,
}

impl Observer {
    /// Records `req`, which replied `result` (bytes, or an errno).
    pub fn done(&self, req: &Request, result: Result<u32, i32>) {
        let failed = result.is_err_and(counts_as_error);
        let bytes = *result.as_ref().unwrap_or(&0) as u64;
        self.requests.record(req.op, req.started, bytes, failed);
        if let Some(trace) = &self.trace {
            trace.record(req, result);
        }
    }
}

/// The errno of a failed request, logged when the failure is the data's rather than the caller's.
fn failed(err: Error, log: &Arc<super::error_log::ErrorLog>) -> i32 {
    if err.is_worth_logging() && log.admit_flushing(&err.log_key(), Instant::now()) {
        match &err {
            Error::Io {
                image,
                offset,
                path,
                file_offset,
                len,
                error,
            } => error!(
                image = %image.display(),
                offset,
                file_offset,
                len,
                path = %String::from_utf8_lossy(path),
                "read failed, returning EIO: {error}"
            ),
            other => error!("request failed, returning EIO: {other}"),
        }
    } else {
        debug!("request failed: {err}");
    }
    err.errno()
}

/// The core and the observer, as every transport's requests reach them.
pub struct Dispatch {
    core: Arc<Core>,
    observer: Arc<Observer>,
}

impl Dispatch {
    pub fn new(core: Arc<Core>, observer: Arc<Observer>) -> Dispatch {
        Dispatch { core, observer }
    }

    pub fn observer(&self) -> &Observer {
        &self.observer
    }

    /// The engine's memory budget (reads waiting for it are not stuck).
    pub fn memory(&self) -> &Arc<crate::tiers::budget::MemoryBudget> {
        self.core.files().images().ram().memory()
    }

    /// Sends `answer` through `reply` (`send` returns the bytes replied), or its errno; records it.
    fn finish<T, R: Reply>(
        &self,
        req: Request,
        answer: Result<T, Error>,
        reply: R,
        send: impl FnOnce(R, T) -> u32,
    ) {
        let result = match answer {
            Ok(value) => Ok(send(reply, value)),
            Err(e) => {
                let errno = failed(e, &self.observer.errors);
                reply.error(errno);
                Err(errno)
            }
        };
        self.observer.done(&req, result);
    }

    pub fn lookup(&self, parent: Ino, name: &[u8], started: Instant, reply: impl EntryReply) {
        let answer = guarded(
            || format!("lookup of {:?} in inode {parent}", OsStr::from_bytes(name)),
            || self.core.lookup(parent, name),
        );
        let req = Request::new(Op::Lookup, parent, started).named(name);
        self.finish(req, answer, reply, |reply, attr| {
            reply.entry(&attr);
            0
        });
    }

    pub fn getattr(&self, ino: Ino, started: Instant, reply: impl AttrReply) {
        let answer = guarded(
            || format!("getattr of inode {ino}"),
            || self.core.getattr(ino),
        );
        let req = Request::new(Op::Getattr, ino, started);
        self.finish(req, answer, reply, |reply, attr| {
            reply.attr(&attr);
            0
        });
    }

    pub fn readlink(&self, ino: Ino, started: Instant, reply: impl DataReply) {
        let answer = guarded(
            || format!("readlink of inode {ino}"),
            || self.core.readlink(ino),
        );
        let req = Request::new(Op::Readlink, ino, started);
        self.finish(req, answer, reply, |reply, target| {
            reply.data(target);
            target.len() as u32
        });
    }

    /// One listing for READDIR (`with_attrs` false) and READDIRPLUS.
    pub fn list(
        &self,
        ino: Ino,
        offset: u64,
        with_attrs: bool,
        started: Instant,
        mut reply: impl DirReply,
    ) {
        let answer = guarded(
            || format!("listing of inode {ino}"),
            || self.core.list(ino, offset, with_attrs, &mut reply),
        );
        let op = if with_attrs {
            Op::Readdirplus
        } else {
            Op::Readdir
        };
        let req = Request::new(op, ino, started).at(offset, 0);
        self.finish(req, answer, reply, |reply, ()| {
            reply.ok();
            0
        });
    }

    pub fn statfs(&self, ino: Ino, started: Instant, reply: impl StatfsReply) {
        let (blocks, files) = super::attr::statfs_figures(self.core.usage());
        debug!(blocks, files, "statfs");
        reply.statfs(blocks, files);
        self.observer
            .done(&Request::new(Op::Statfs, ino, started), Ok(0));
    }

    /// Answers a request packfs refuses (see `Refused`).
    pub fn refuse(&self, what: Refused, ino: Ino, started: Instant, reply: impl Reply) {
        let (errno, op) = what.answer();
        reply.error(errno);
        if let Some(op) = op {
            self.observer
                .done(&Request::new(op, ino, started), Err(errno));
        }
    }

    /// Answers a read: spliced from its image file where the reply can be and the bytes lie
    /// there as they are (`tiers::FileRange`), else assembled in `buf` where it must be.
    pub fn read<R: DataReply>(&self, call: ReadCall, buf: &mut Vec<u8>, mut reply: R) {
        let req = ReadRequest::new(call.reader, Wait::May);
        if reply.can_splice() {
            reply = match self.splice_read(&req, call, reply) {
                Ok(()) => return,
                Err(reply) => reply,
            };
        }
        let answer = self.core_read(&req, call, buf);
        self.finish_read(&req, call, answer, reply);
    }

    /// The read spliced, recorded; the reply back if it was not.
    fn splice_read<R: DataReply>(
        &self,
        req: &ReadRequest,
        call: ReadCall,
        reply: R,
    ) -> Result<(), R> {
        let ReadCall {
            ino, offset, size, ..
        } = call;
        let range = guarded(
            || format!("read of {size} bytes at {offset} of inode {ino}"),
            || Ok(self.core.file_range(req, ino, offset, size)),
        );
        let Ok(Some(range)) = range else {
            return Err(reply);
        };
        reply.splice(&range)?;
        let done = Request::new(Op::Read, ino, call.started)
            .at(offset, size)
            .served_by(req.tiers());
        self.observer.done(&done, Ok(range.len() as u32));
        Ok(())
    }

    fn core_read<'b>(
        &self,
        req: &ReadRequest,
        call: ReadCall,
        buf: &'b mut Vec<u8>,
    ) -> Result<Served<'b>, Error> {
        let ReadCall {
            ino, offset, size, ..
        } = call;
        guarded(
            || format!("read of {size} bytes at {offset} of inode {ino}"),
            || self.core.read(req, ino, offset, size, buf),
        )
    }

    fn finish_read(
        &self,
        req: &ReadRequest,
        call: ReadCall,
        answer: Result<Served, Error>,
        reply: impl DataReply,
    ) {
        let done = Request::new(Op::Read, call.ino, call.started)
            .at(call.offset, call.size)
            .served_by(req.tiers());
        self.finish(done, answer, reply, |reply, served| reply.served(served));
    }

    /// As `read`, but only from memory (page cache, RAM cache, staged copy): a read that would
    /// wait for storage is not answered, and its reply comes back for the read pool.
    pub fn read_without_waiting<R: DataReply>(
        &self,
        call: ReadCall,
        buf: &mut Vec<u8>,
        reply: R,
    ) -> Result<(), R> {
        let req = ReadRequest::new(call.reader, Wait::Never);
        let answer = self.core_read(&req, call, buf);
        if let Err(Error::WouldWait) = &answer {
            return Err(reply);
        }
        self.finish_read(&req, call, answer, reply);
        Ok(())
    }
}
