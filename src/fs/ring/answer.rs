//! Every request but READ, answered through the dispatcher into the ring entry it came in: the
//! reply types write the kernel's reply structures (`wire`) into the entry's payload buffer and
//! leave the errno and length for the commit.

use std::time::Instant;

use super::Server;
use super::wire::*;
use crate::fs::core::{Attr, DirEntry, Listing};
use crate::fs::dispatch::{AttrReply, DataReply, DirReply, EntryReply, Reply, StatfsReply};
use crate::fs::error::Refused;
use crate::util::le::{u32_at, u64_at};

/// A reply written into a ring entry's payload buffer; `out` gets what the commit needs: the
/// errno (negative, or 0) and the reply's length.
pub(super) struct InEntry<'a> {
    pub payload: &'a mut [u8],
    pub out: &'a mut (i32, usize),
}

impl Reply for InEntry<'_> {
    fn error(self, errno: i32) {
        *self.out = (-errno, 0);
    }
}

impl EntryReply for InEntry<'_> {
    fn entry(self, attr: &Attr) {
        *self.out = (0, put_entry(self.payload, attr));
    }
}

impl AttrReply for InEntry<'_> {
    fn attr(self, attr: &Attr) {
        *self.out = (0, put_attr_out(self.payload, attr));
    }
}

impl DataReply for InEntry<'_> {
    fn data(self, bytes: &[u8]) {
        let n = bytes.len().min(self.payload.len());
        self.payload[..n].copy_from_slice(&bytes[..n]);
        *self.out = (0, n);
    }
}

impl StatfsReply for InEntry<'_> {
    fn statfs(self, blocks: u64, files: u64) {
        *self.out = (0, put_statfs(self.payload, blocks, files));
    }
}

/// A listing written into the payload buffer.
struct DirOut<'a> {
    listing: DirBuffer<'a>,
    out: &'a mut (i32, usize),
}

impl Listing for DirOut<'_> {
    fn add(&mut self, e: DirEntry) -> bool {
        self.listing.add(e)
    }
}

impl Reply for DirOut<'_> {
    fn error(self, errno: i32) {
        *self.out = (-errno, 0);
    }
}

impl DirReply for DirOut<'_> {
    fn ok(self) {
        *self.out = (0, self.listing.len);
    }
}

/// Answers every request but READ through the dispatcher, into `payload` (which holds the
/// request's own payload, `in_len` bytes, on the way in). Returns the errno (negative, or 0) and
/// the reply's length.
pub(super) fn answer(
    server: &Server,
    h: &InHeader,
    op_in: &[u8],
    in_len: usize,
    payload: &mut [u8],
    started: Instant,
) -> (i32, usize) {
    let dispatch = &server.dispatch;
    let ino = h.nodeid;
    let mut out = (0, 0);
    match h.opcode {
        LOOKUP => {
            // A name is at most FUSE_NAME_MAX (1024) bytes: copied out of the payload, which the
            // reply overwrites, without an allocation.
            let mut name_buf = [0u8; 1024];
            let raw = &payload[..in_len];
            let name = raw.split(|&c| c == 0).next().unwrap_or(&[]);
            let n = name.len().min(name_buf.len());
            name_buf[..n].copy_from_slice(&name[..n]);
            let reply = InEntry {
                payload,
                out: &mut out,
            };
            dispatch.lookup(ino, &name_buf[..n], started, reply);
        }
        GETATTR => dispatch.getattr(ino, started, InEntry::new(payload, &mut out)),
        READLINK => dispatch.readlink(ino, started, InEntry::new(payload, &mut out)),
        READDIR | READDIRPLUS if op_in.len() >= 20 => {
            let plus = h.opcode == READDIRPLUS;
            let offset = u64_at(op_in, 8);
            let size = (u32_at(op_in, 16) as usize).min(payload.len());
            let reply = DirOut {
                listing: DirBuffer {
                    buf: &mut payload[..size],
                    len: 0,
                    plus,
                },
                out: &mut out,
            };
            dispatch.list(ino, offset, plus, started, reply);
        }
        OPEN => dispatch.refuse(Refused::Open, ino, started, InEntry::new(payload, &mut out)),
        OPENDIR => dispatch.refuse(
            Refused::Opendir,
            ino,
            started,
            InEntry::new(payload, &mut out),
        ),
        FLUSH => dispatch.refuse(
            Refused::Flush,
            ino,
            started,
            InEntry::new(payload, &mut out),
        ),
        IOCTL => dispatch.refuse(
            Refused::Ioctl,
            ino,
            started,
            InEntry::new(payload, &mut out),
        ),
        STATFS => dispatch.statfs(ino, started, InEntry::new(payload, &mut out)),
        // Nothing to release or tear down per request: acknowledged.
        RELEASE | RELEASEDIR | DESTROY => {}
        _ => dispatch.refuse(
            Refused::Unsupported,
            ino,
            started,
            InEntry::new(payload, &mut out),
        ),
    }
    out
}

impl<'a> InEntry<'a> {
    fn new(payload: &'a mut [u8], out: &'a mut (i32, usize)) -> InEntry<'a> {
        InEntry { payload, out }
    }
}
