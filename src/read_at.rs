//! Positioned reads from an image, whatever holds it: a local or parallel-filesystem file today,
//! an object store later, a fault-injecting wrapper in tests. The archive decoders and the tiers
//! read through this trait only.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub trait ReadAt: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`. Fewer bytes than asked are not an error (a
    /// backing store may answer short); 0 means `offset` is at or past the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// Fills `buf` from `offset`, retrying short and interrupted reads. Running out of data is an
    /// `UnexpectedEof` error: callers ask only for bytes the catalog promised.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the image ends before offset {offset}"),
                    ));
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads as many bytes as the image has at `offset`, up to `buf.len()`: short only at its end
    /// (retrying short and interrupted reads). For streams whose compressed length is not known.
    fn read_up_to(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.read_at(&mut buf[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }

    /// Hints that `len` bytes at `offset` will be read soon; the default does nothing.
    fn will_need(&self, _offset: u64, _len: u64) {}

    /// What the store says of the object now (size and modification time), to notice it being
    /// rewritten under a mount; `None` when it cannot tell (memory, test wrappers).
    fn current(&self) -> Option<io::Result<Stamp>> {
        None
    }
}

/// An image's size and modification time as its store reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: u32,
}

/// Opens an image (or index) for reading, refusing anything but a regular file. The open does not
/// block: a plain `open` of a FIFO waits for a writer forever (a glob that matched one hung
/// `packfs ls` and mounts), so the file is opened non-blocking and checked before any read.
pub fn open_regular(path: &std::path::Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    use std::os::unix::fs::FileTypeExt;
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file: give tar, zip or squashfs image files or an index"),
    ))
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }

    /// fstat of the open descriptor: a file rewritten in place shows its new size and mtime; one
    /// replaced by rename does not (this descriptor still reads the old, consistent bytes).
    fn current(&self) -> Option<io::Result<Stamp>> {
        use std::os::unix::fs::MetadataExt;
        Some(self.metadata().map(|m| Stamp {
            size: m.len(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec() as u32,
        }))
    }

    fn will_need(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on a descriptor this File owns; a failure only loses the hint.
        unsafe {
            libc::posix_fadvise(
                self.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            )
        };
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let Ok(start) = usize::try_from(offset) else {
            return Ok(0);
        };
        let Some(rest) = self.get(start..) else {
            return Ok(0);
        };
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.as_slice().read_at(buf, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers at most 3 bytes per call, and fails every other call with EINTR.
    struct Stingy(Vec<u8>, std::sync::atomic::AtomicU32);

    impl ReadAt for Stingy {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            if self
                .1
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .is_multiple_of(2)
            {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let n = buf.len().min(3);
            self.0.read_at(&mut buf[..n], offset)
        }
    }

    #[test]
    fn exact_reads_retry_short_and_interrupted_reads() {
        let data: Vec<u8> = (0..100).collect();
        let stingy = Stingy(data.clone(), Default::default());
        let mut buf = [0u8; 40];
        stingy.read_exact_at(&mut buf, 50).unwrap();
        assert_eq!(&buf[..], &data[50..90]);
        let err = stingy.read_exact_at(&mut buf, 80).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(data.read_at(&mut buf, 1 << 40).unwrap(), 0);
    }
}
