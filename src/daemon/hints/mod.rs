//! The hints channel: a Unix socket beside the mount's stats file through which a training job
//! tells the daemon which samples it reads next (docs/training.md, "Hints"). Each message is one
//! JSON object, newline-separated:
//!
//! ```text
//! {"stream": "train", "rank": 0, "epoch": 3, "paths": ["train/n01440764/a.JPEG", ...]}
//! {"stream": "train", "rank": 0, "end": true}
//! ```
//!
//! Paths are relative to the mount's root or absolute under the mount point. A list replaces
//! the previous one of its user, stream and rank. Each message is answered with one line:
//! `{"ok": true, "samples": N, "unknown": M, "first_unknown": "..."}` or `{"ok": false,
//! "error": "..."}`.
//!
//! Only the daemon's user, root and the user the mount serves (`--uid`) may connect: the socket
//! is theirs (mode 0600) in the private stats directory, and each peer's credentials are checked.
//! Paths are resolved as they arrive, never held: a list costs 13 bytes per sample, drawn from
//! the memory budget, and is at most four times the catalog's files.

use std::io::{self, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use serde::de::DeserializeSeed;
use tracing::{debug, info, warn};

use crate::catalog::Catalog;
use crate::tiers::budget::MemoryBudget;
use crate::tiers::lookahead::{Intake, ListKey, Lookahead, Submitted};

mod message;

use message::{Limited, Message, MessageSeed};

/// Connections at once, at most.
const MAX_CONNECTIONS: usize = 64;
/// Bytes of a message between two paths, at most (a path, or the fields before them).
const MAX_FIELD: u64 = 64 << 10;
/// Characters of a stream name, at most.
const MAX_STREAM: usize = 256;
/// A sender that stops in the middle of a message for this long is cut off (its list dropped);
/// between messages a connection may stay quiet for as long as it likes.
const STALL: std::time::Duration = std::time::Duration::from_secs(10);

/// Where the hints socket of the mount at `mountpoint` on `device` is: the stats file's path
/// with `.sock`, or, when that is longer than a socket address holds, the hash and device alone
/// in the same directory.
pub fn socket_path(mountpoint: &Path, device: &str) -> PathBuf {
    socket_beside(&super::stats::default_path(mountpoint, device))
}

/// The hints socket of the mount whose stats file is `stats_file` (a default path).
pub fn socket_beside(stats_file: &Path) -> PathBuf {
    let beside = stats_file.with_extension("sock");
    if beside.as_os_str().len() < 100 {
        return beside;
    }
    let name = beside.file_name().map(|n| n.to_string_lossy().into_owned());
    // NAME.HASH.DEVICE.sock: the hash and the device.
    let mut parts = name.as_deref().unwrap_or("").rsplit('.').skip(1);
    let (device, hash) = (parts.next(), parts.next());
    match (hash, device) {
        (Some(hash), Some(device)) => beside.with_file_name(format!("{hash}.{device}.sock")),
        _ => beside.with_file_name("hints.sock"),
    }
}

/// The listening socket; removed when dropped.
pub struct HintsSocket {
    path: PathBuf,
    /// The listening socket, shut down to wake the accepting thread when dropped.
    listening: UnixListener,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub enum HintsError {
    #[error("{}: {why}; remove it (no packfs daemon serves this mount point)", path.display())]
    Occupied { path: PathBuf, why: String },
    #[error("cannot listen at {}: {error}", path.display())]
    Bind { path: PathBuf, error: io::Error },
}

/// What the connections share.
struct Shared {
    catalog: Arc<Catalog>,
    lookahead: Arc<Lookahead>,
    mountpoint: PathBuf,
    /// Users who may send hints.
    allowed: Vec<u32>,
    connections: AtomicUsize,
    refused: AtomicU64,
    /// The memory lists are drawn from.
    intake: Intake,
}

impl HintsSocket {
    /// Listens for hints on `mountpoint`'s socket, for `allowed` users besides root (the
    /// daemon's and the one the mount serves; the socket is given to the latter).
    pub fn start(
        mountpoint: &Path,
        device: &str,
        catalog: Arc<Catalog>,
        lookahead: Arc<Lookahead>,
        memory: Arc<MemoryBudget>,
        serves: u32,
    ) -> Result<HintsSocket, HintsError> {
        let path = socket_path(mountpoint, device);
        clear_stale(&path)?;
        let listener = UnixListener::bind(&path).map_err(|error| HintsError::Bind {
            path: path.clone(),
            error,
        })?;
        let me = nix::unistd::geteuid().as_raw();
        let set_up = (|| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            if serves != me {
                std::os::unix::fs::lchown(&path, Some(serves), None)?;
            }
            io::Result::Ok(())
        })();
        if let Err(error) = set_up {
            let _ = std::fs::remove_file(&path);
            return Err(HintsError::Bind { path, error });
        }
        let shared = Arc::new(Shared {
            catalog,
            lookahead,
            mountpoint: mountpoint.to_path_buf(),
            allowed: vec![0, me, serves],
            connections: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            intake: Intake::new(memory),
        });
        let listening = listener.try_clone().map_err(|error| HintsError::Bind {
            path: path.clone(),
            error,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hints".into())
            .spawn(move || accept_loop(listener, &shared, &flag))
            .map_err(|error| HintsError::Bind {
                path: path.clone(),
                error,
            })?;
        info!("hints are heard at {}", path.display());
        Ok(HintsSocket {
            path,
            listening,
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for HintsSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread (accept fails with EINVAL). Not by connecting to the path:
        // with the socket file removed under it (the runtime directory cleaned, say) the
        // connection went nowhere and the daemon never exited after its unmount.
        // SAFETY: shutdown of a socket this value owns (a duplicate of the listener).
        unsafe { libc::shutdown(self.listening.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Removes the socket a daemon that died left for `mountpoint`, as its stats file is removed at
/// unmount (`stats::remove_if_orphaned`): one a daemon listens on, or anything not a socket, stays.
pub fn remove_if_orphaned(mountpoint: &Path, device: &str) {
    let _ = clear_stale(&socket_path(mountpoint, device));
}

/// Removes a socket a dead daemon left at `path`; anything else there is refused.
fn clear_stale(path: &Path) -> Result<(), HintsError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(HintsError::Bind {
                path: path.to_path_buf(),
                error,
            });
        }
    };
    let me = nix::unistd::geteuid().as_raw();
    let occupied = |why: String| HintsError::Occupied {
        path: path.to_path_buf(),
        why,
    };
    if !meta.file_type().is_socket() {
        return Err(occupied("it exists and is not a socket".into()));
    }
    if meta.uid() != me && me != 0 {
        return Err(occupied(format!("it belongs to uid {}", meta.uid())));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(occupied("another daemon listens on it".into()));
    }
    std::fs::remove_file(path).map_err(|error| HintsError::Bind {
        path: path.to_path_buf(),
        error,
    })
}

fn accept_loop(listener: UnixListener, shared: &Arc<Shared>, stop: &AtomicBool) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else {
            // Out of descriptors, say: not a reason to spin.
            std::thread::sleep(std::time::Duration::from_millis(100));
            continue;
        };
        let uid = match peer_uid(&stream) {
            Ok(uid) => uid,
            Err(e) => {
                debug!("hints: no credentials of a peer: {e}");
                continue;
            }
        };
        if !shared.allowed.contains(&uid) {
            if shared.refused.fetch_add(1, Ordering::Relaxed) < 3 {
                warn!(
                    "hints: refused a connection of uid {uid} (the mount serves uid {})",
                    shared.allowed[2]
                );
            }
            continue;
        }
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            let _ = reply(
                &mut &stream,
                &Reply::error(format!(
                    "more than {MAX_CONNECTIONS} connections; close some"
                )),
            );
            continue;
        }
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("hints-conn".into())
            .spawn(move || {
                serve_connection(stream, uid, &shared);
                shared.connections.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            warn!("hints: cannot start a connection thread: {e}");
        }
    }
}

fn peer_uid(stream: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a ucred of `len` bytes, as SO_PEERCRED fills.
    let done = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    match done {
        0 => Ok(cred.uid),
        _ => Err(io::Error::last_os_error()),
    }
}

/// One answer line.
#[derive(serde::Serialize, Default)]
struct Reply {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    samples: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unknown: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_unknown: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    truncated: Option<bool>,
    /// Refused for want of memory: the next list may fit (the sender keeps sending).
    #[serde(skip_serializing_if = "Option::is_none")]
    no_room: Option<bool>,
}

impl Reply {
    fn error(why: String) -> Reply {
        Reply {
            ok: false,
            error: Some(why),
            ..Reply::default()
        }
    }
}

fn reply(to: &mut impl Write, r: &Reply) -> io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("a reply serializes");
    line.push(b'\n');
    to.write_all(&line)
}

fn serve_connection(stream: UnixStream, uid: u32, shared: &Shared) {
    let since = Arc::new(AtomicU64::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let Ok(write_half) = stream.try_clone() else {
        return;
    };
    if stream.set_read_timeout(Some(STALL)).is_err() {
        return;
    }
    let mut out = write_half;
    // serde_json reads a byte at a time: the buffer under the limit keeps that cheap, and the
    // limit sees each byte as it is taken.
    let reader = Limited {
        inner: BufReader::new(stream),
        since: since.clone(),
        started: started.clone(),
    };
    let mut de = serde_json::Deserializer::from_reader(reader);
    loop {
        since.store(0, Ordering::Relaxed);
        started.store(false, Ordering::Relaxed);
        let seed = MessageSeed {
            shared,
            since: &since,
        };
        let message = match seed.deserialize(&mut de) {
            Ok(m) => m,
            Err(e) if e.is_eof() => return,
            Err(e) => {
                // The stream cannot be resynchronised after bad JSON: answer and close.
                if e.is_io() {
                    debug!("hints: connection of uid {uid} closed: {e}");
                }
                let _ = reply(&mut out, &Reply::error(format!("not a hints message: {e}")));
                return;
            }
        };
        let answer = take(message, uid, shared);
        if reply(&mut out, &answer).is_err() {
            return;
        }
    }
}

fn take(m: Message, uid: u32, shared: &Shared) -> Reply {
    let key = ListKey {
        uid,
        stream: m.stream.unwrap_or_default(),
        rank: m.rank.unwrap_or(0),
    };
    if m.end {
        shared.lookahead.end(&key);
        return Reply {
            ok: true,
            ..Reply::default()
        };
    }
    let Some(entries) = m.entries else {
        return Reply::error("a message needs \"paths\" (a list) or \"end\": true".into());
    };
    let samples = entries.len() as u64;
    if m.truncated {
        warn!(
            "hints: a list of stream {:?} rank {} was cut at {samples} samples (four times the \
             mount's files)",
            key.stream, key.rank
        );
    }
    if m.no_room > 0 {
        let share = shared.intake.lists().stats();
        warn!(
            "hints: a list of stream {:?} rank {} was refused: no memory for {} of its samples \
             (the lists hold {} of their {} share of the memory budget)",
            key.stream, key.rank, m.no_room, share.held, share.total
        );
        return Reply {
            no_room: Some(true),
            ..Reply::error(format!(
                "no memory for this list ({} samples could not be held: the lists hold {} of \
                 their {} bytes, the budget {} of {}); end other streams' lists, send shorter \
                 ones, or mount with a larger --cache-size",
                m.no_room,
                share.held,
                share.total,
                shared.intake.memory().stats().held,
                shared.intake.memory().stats().total
            ))
        };
    }
    shared.lookahead.submit(Submitted {
        key,
        epoch: m.epoch.unwrap_or(0),
        entries,
        unknown: m.unknown,
        permits: m.permits,
    });
    Reply {
        ok: true,
        samples: Some(samples),
        unknown: Some(m.unknown),
        first_unknown: m.first_unknown,
        truncated: m.truncated.then_some(true),
        ..Reply::default()
    }
}
