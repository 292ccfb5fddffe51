//! FUSE over io_uring (Linux 6.14+, `CONFIG_FUSE_IO_URING`, fuse's `enable_uring` parameter):
//! requests reach packfs as completions on per-CPU rings instead of `read(2)`s on /dev/fuse, and
//! each reply is committed together with the fetch of the next request in one SQE. fuser (0.18)
//! has no such transport: it still mounts, answers INIT (offering the flag) and serves what the
//! kernel keeps sending through /dev/fuse (FORGET, INTERRUPT, and everything until the rings are
//! ready); `queue` serves the rest from the same `Core`, and `wire` writes the replies.
//!
//! Reads answered from memory are answered on the queue thread; the others go to the classic
//! loop's read pool (one pool for both): a queue thread stuck in a slow read would hold up every
//! request issued on its CPU.

mod answer;
mod queue;
pub mod wire;

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::info;

use super::dispatch::Dispatch;
use super::reads::Reads;

/// Entries per queue, and for all queues together. Every request in flight holds an entry until
/// it is answered, reads stuck on slow storage too, and a request that finds none free waits in
/// the kernel behind the others of its queue (which a newly registered entry does not pick up:
/// only the commit of an answer does). So entries are many: as many as the kernel lets reads run
/// in the background (`max_background`, 256) on a small node. Each holds a payload buffer of
/// `MAX_PAYLOAD`, touched only as far as requests use it (the kernel reuses the entry answered
/// last first), so a node with many CPUs gets fewer per queue; a queue also adds entries while
/// most of its own wait on the read pool (`queue.rs`).
pub(super) const MAX_DEPTH: usize = 256;
const ALL_ENTRIES: usize = 512;

fn depth(queues: usize) -> usize {
    (ALL_ENTRIES / queues.max(1)).clamp(8, MAX_DEPTH)
}
/// The largest request or reply the rings carry; INIT sets `max_write` to it, since the kernel
/// sizes every entry's payload buffer by `max_write` (fuser's default is 16 MiB).
pub const MAX_PAYLOAD: u32 = 1 << 20;

const PARAMETER: &str = "/sys/module/fuse/parameters/enable_uring";

/// Why this kernel will not take rings, if it will not: checked before mounting, so that the
/// mount says so and runs the classic loop.
pub fn unavailable() -> Option<String> {
    match std::fs::read_to_string(PARAMETER) {
        Ok(s) if s.trim() == "Y" => None,
        Ok(_) => Some(format!("{PARAMETER} is N (as root: echo Y > {PARAMETER})")),
        Err(_) => Some(format!(
            "this kernel has no FUSE over io_uring ({PARAMETER} is missing; Linux 6.14+ with CONFIG_FUSE_IO_URING has it)"
        )),
    }
}

/// The kernel's queues: one per possible CPU (a request goes to the queue of the CPU it was
/// issued on, and the rings are used only once every queue has entries).
fn queues() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            let last = s.trim().rsplit([',', '-']).next()?.parse::<usize>().ok()?;
            Some(last + 1)
        })
        .unwrap_or(1)
}

/// What the queues share.
pub(super) struct Server {
    pub dispatch: Arc<Dispatch>,
    pub reads: Arc<Reads>,
}

/// The queue threads; they end when the connection does (unmount).
pub struct Rings {
    threads: Vec<JoinHandle<()>>,
}

impl Rings {
    /// Registers `DEPTH` entries on every queue of the connection on `fd`, one pinned thread per
    /// queue. The kernel takes registrations only once INIT is answered: retried until then.
    /// `reads` is the classic loop's read pool: the rings hand it every read that must wait.
    pub fn start(fd: OwnedFd, dispatch: Arc<Dispatch>, reads: Arc<Reads>) -> io::Result<Rings> {
        let server = Arc::new(Server { dispatch, reads });
        let fd = Arc::new(fd);
        let n = queues();
        let depth = depth(n);
        let mut threads = Vec::with_capacity(n);
        let (tx, rx) = crossbeam_channel::bounded(n);
        for qid in 0..n {
            let (server, tx, fd) = (server.clone(), tx.clone(), fd.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("packfs-ring-{qid}"))
                    .spawn(move || queue::run(fd, qid as u16, depth, &server, tx))?,
            );
        }
        for _ in 0..n {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(io::Error::other("a ring queue did not register in 10 s")),
            }
        }
        info!(queues = n, depth, "requests go through FUSE over io_uring");
        Ok(Rings { threads })
    }

    /// Waits for the queue threads (after the connection has ended).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn entries_shrink_per_queue_on_large_nodes() {
        assert_eq!(super::depth(2), 256);
        assert_eq!(super::depth(16), 32);
        assert_eq!(super::depth(256), 8, "at least a few per queue");
    }
}
