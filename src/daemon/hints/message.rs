//! One hints message as it is read: the connection's bytes through a limit (no field longer
//! than `MAX_FIELD`, no stall in the middle of a message), and its paths resolved to catalog
//! entries as they arrive, their memory drawn a step at a time (`tiers::lookahead::Intake`).

use std::io::{self, Read};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{MAX_FIELD, MAX_STREAM, STALL, Shared};
use crate::catalog::Catalog;
use crate::tiers::budget::Permit;

/// Counts the bytes read since the last `reset`, and fails past `MAX_FIELD`: a path (or any
/// field) is never longer, and serde would hold it whole. The socket has a read timeout
/// (`STALL`): between messages it only means a quiet sender and the read goes on; in the middle
/// of a message it ends the connection, and the list read so far with it.
pub(super) struct Limited<R> {
    pub(super) inner: R,
    pub(super) since: Arc<AtomicU64>,
    /// Whether a byte of the current message (other than white space) has come.
    pub(super) started: Arc<AtomicBool>,
}

impl<R> Limited<R> {
    fn check_field(&self) -> io::Result<()> {
        match self.since.load(Ordering::Relaxed) > MAX_FIELD {
            true => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("more than {MAX_FIELD} bytes without a path"),
            )),
            false => Ok(()),
        }
    }
}

impl<R: Read> Read for Limited<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check_field()?;
        let n = loop {
            match self.inner.read(buf) {
                Ok(n) => break n,
                Err(e) if is_timeout(&e) && !self.started.load(Ordering::Relaxed) => continue,
                Err(e) if is_timeout(&e) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "the sender stalled for {} s in the middle of a message",
                            STALL.as_secs()
                        ),
                    ));
                }
                Err(e) => return Err(e),
            }
        };
        if buf[..n].iter().any(|b| !b.is_ascii_whitespace()) {
            self.started.store(true, Ordering::Relaxed);
        }
        self.since.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A message as parsed: its fields, the paths already resolved.
#[derive(Default)]
pub(super) struct Message {
    pub(super) stream: Option<String>,
    pub(super) rank: Option<u32>,
    pub(super) epoch: Option<u64>,
    pub(super) end: bool,
    pub(super) entries: Option<Vec<u32>>,
    pub(super) unknown: u64,
    pub(super) first_unknown: Option<String>,
    pub(super) truncated: bool,
    /// Samples left out for want of memory (the lists' share or the budget full).
    pub(super) no_room: u64,
    pub(super) permits: Vec<Permit>,
}

pub(super) struct MessageSeed<'a> {
    pub(super) shared: &'a Shared,
    pub(super) since: &'a Arc<AtomicU64>,
}

impl<'de> DeserializeSeed<'de> for MessageSeed<'_> {
    type Value = Message;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Message, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MessageSeed<'_> {
    type Value = Message;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object with stream, rank, epoch and paths")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
        use serde::de::Error;
        let mut m = Message::default();
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                "stream" => {
                    let s: String = map.next_value()?;
                    if s.chars().count() > MAX_STREAM {
                        return Err(A::Error::custom(format!(
                            "a stream name is at most {MAX_STREAM} characters"
                        )));
                    }
                    m.stream = Some(s);
                }
                "rank" => m.rank = Some(map.next_value()?),
                "epoch" => m.epoch = Some(map.next_value()?),
                "end" => m.end = map.next_value()?,
                "paths" => {
                    let paths = map.next_value_seed(PathsSeed {
                        shared: self.shared,
                        since: self.since,
                        m: &mut m,
                    })?;
                    m.entries = Some(paths);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(m)
    }
}

struct PathsSeed<'a> {
    shared: &'a Shared,
    since: &'a Arc<AtomicU64>,
    m: &'a mut Message,
}

impl<'de> DeserializeSeed<'de> for PathsSeed<'_> {
    type Value = Vec<u32>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<u32>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for PathsSeed<'_> {
    type Value = Vec<u32>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of paths")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u32>, A::Error> {
        let catalog = &self.shared.catalog;
        let mut taking = self.shared.intake.take(catalog);
        while let Some(path) = seq.next_element::<String>()? {
            self.since.store(0, Ordering::Relaxed);
            match resolve(catalog, &self.shared.mountpoint, &path) {
                Some(entry) => taking.push(entry),
                None => {
                    self.m.unknown += 1;
                    if self.m.first_unknown.is_none() {
                        self.m.first_unknown = Some(path.chars().take(4096).collect());
                    }
                }
            }
        }
        self.m.truncated = taking.truncated;
        self.m.no_room = taking.no_room;
        let (entries, permits) = taking.finish();
        self.m.permits = permits;
        Ok(entries)
    }
}

/// The catalog entry of the file at `path` (relative to the mount's root, or absolute under
/// `mountpoint`).
fn resolve(catalog: &Catalog, mountpoint: &Path, path: &str) -> Option<u32> {
    let relative = match Path::new(path).strip_prefix(mountpoint) {
        Ok(rest) => rest.to_str()?,
        Err(_) if path.starts_with('/') => return None,
        Err(_) => path,
    };
    catalog.resolve_file(relative.trim_matches('/').as_bytes())
}
