//! The file system both transports serve: a root directory with one file, `data`, answered from
//! memory with no cache in the kernel (zero timeouts, direct I/O), so that every operation the
//! client times is one round trip to this process and nothing else.

use crate::proto::*;

pub const DATA_INO: u64 = 2;
/// Big enough for reads at many offsets; its bytes are made on demand.
pub const DATA_SIZE: u64 = 1 << 30;

pub enum Reply {
    /// A reply with this many payload bytes, written at the start of the output.
    Data(usize),
    Error(i32),
    /// FORGET and friends take no reply.
    None,
}

fn root() -> Attr {
    Attr {
        ino: 1,
        size: 4096,
        mode: libc::S_IFDIR | 0o755,
        nlink: 2,
    }
}

fn data() -> Attr {
    Attr {
        ino: DATA_INO,
        size: DATA_SIZE,
        mode: libc::S_IFREG | 0o644,
        nlink: 1,
    }
}

/// Answers one request (not INIT, which `session` does): `op_in` is the opcode's fixed argument,
/// `rest` what follows it, `out` where the reply's payload goes.
pub fn handle(h: &InHeader, op_in: &[u8], rest: &[u8], out: &mut [u8]) -> Reply {
    match h.opcode {
        LOOKUP => {
            let name = rest.split(|&c| c == 0).next().unwrap_or(&[]);
            if h.nodeid == 1 && name == b"data" {
                Reply::Data(put_entry(out, &data()))
            } else {
                Reply::Error(libc::ENOENT)
            }
        }
        GETATTR => match h.nodeid {
            1 => Reply::Data(put_attr_out(out, &root())),
            DATA_INO => Reply::Data(put_attr_out(out, &data())),
            _ => Reply::Error(libc::ENOENT),
        },
        OPEN | OPENDIR => {
            out[..16].fill(0);
            if h.opcode == OPEN {
                put32(out, 8, FOPEN_DIRECT_IO);
            }
            Reply::Data(16)
        }
        READ if h.nodeid == DATA_INO && op_in.len() >= 40 => {
            let offset = u64_at(op_in, 8);
            let size = u32_at(op_in, 16) as u64;
            let n = DATA_SIZE.saturating_sub(offset).min(size) as usize;
            let n = n.min(out.len());
            // The data is made here, as a real file system makes it (a copy from its cache):
            // both transports pay the same for it.
            out[..n].fill(0x5a);
            Reply::Data(n)
        }
        READ => Reply::Error(libc::EISDIR),
        READDIR => Reply::Data(0),
        RELEASE | RELEASEDIR => Reply::Data(0),
        FLUSH => Reply::Error(libc::ENOSYS),
        IOCTL => Reply::Error(libc::ENOTTY),
        STATFS => {
            out[..80].fill(0);
            put32(out, 40, 4096);
            put32(out, 44, 255);
            Reply::Data(80)
        }
        FORGET | BATCH_FORGET | INTERRUPT => Reply::None,
        DESTROY => Reply::Data(0),
        _ => Reply::Error(libc::ENOSYS),
    }
}
