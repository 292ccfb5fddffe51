//! Checkpoint tables kept on disk, never in memory: a deflate stream's table holds a 32 KiB
//! window per 2 MiB decoded (about 48 MB per inflated GiB), so a 42 MB zip that inflates to
//! 40 GiB, or an honest 140 GB `.tar.gz`, would otherwise take gigabytes of RAM to scan. The
//! indexer writes windows to a temporary file as it finds them (`Windows`); a finished table goes
//! to its image's `TableFile`, which the catalog maps (and `packfs index` copies into the index
//! file) without reading it into memory.
//!
//! The files are unlinked temporary files (O_TMPFILE, mode 0600) in the spill directory: the
//! index's own directory for `packfs index`, else `$TMPDIR` (see `set_dir`).

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;

static DIR: Mutex<Option<PathBuf>> = Mutex::new(None);

/// Where spill files go from now on (`packfs index` puts them beside the index it writes).
pub fn set_dir(dir: PathBuf) {
    *DIR.lock().unwrap_or_else(|p| p.into_inner()) = Some(dir);
}

/// A new unlinked temporary file in the spill directory.
fn temporary() -> io::Result<File> {
    let dir = DIR.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let dir = dir.unwrap_or_else(std::env::temp_dir);
    tempfile::tempfile_in(&dir).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "cannot create a temporary file in {} for checkpoint tables: {e} (set TMPDIR to \
                 a writable directory)",
                dir.display()
            ),
        )
    })
}

/// Bytes appended to a temporary file through a buffer; read back with `read_at`.
struct Appender {
    file: File,
    buf: Vec<u8>,
    /// Bytes in the file, not counting the buffer.
    flushed: u64,
}

/// Appended bytes are written out in pieces this large.
const BUFFER: usize = 1 << 20;

impl Appender {
    fn new() -> io::Result<Appender> {
        Ok(Appender {
            file: temporary()?,
            buf: Vec::new(),
            flushed: 0,
        })
    }

    fn len(&self) -> u64 {
        self.flushed + self.buf.len() as u64
    }

    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.buf.len() + bytes.len() > BUFFER {
            self.flush()?;
        }
        if bytes.len() >= BUFFER {
            self.file.write_all_at(bytes, self.flushed)?;
            self.flushed += bytes.len() as u64;
        } else {
            self.buf.extend_from_slice(bytes);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.write_all_at(&self.buf, self.flushed)?;
        self.flushed += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }
}

/// The windows of one stream being indexed, in the order found.
pub struct Windows {
    out: Option<Appender>,
}

impl Windows {
    pub fn new() -> Windows {
        Windows { out: None }
    }

    /// Stores `window`; returns where it starts among this stream's windows.
    pub fn push(&mut self, window: &[u8]) -> io::Result<u64> {
        if window.is_empty() {
            return Ok(self.len());
        }
        let out = match &mut self.out {
            Some(out) => out,
            None => self.out.insert(Appender::new()?),
        };
        let at = out.len();
        out.append(window)?;
        Ok(at)
    }

    pub fn len(&self) -> u64 {
        self.out.as_ref().map_or(0, Appender::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Windows {
    fn default() -> Self {
        Windows::new()
    }
}

/// Where a table lies in its image's `TableFile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableRef {
    pub at: u64,
    pub len: u64,
}

/// The finished checkpoint tables of one image, back to back in a temporary file.
pub struct TableFile {
    out: Appender,
}

impl std::fmt::Debug for TableFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableFile")
            .field("len", &self.len())
            .finish()
    }
}

impl TableFile {
    pub fn new() -> io::Result<TableFile> {
        Ok(TableFile {
            out: Appender::new()?,
        })
    }

    pub fn len(&self) -> u64 {
        self.out.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends one table: `head` (its head and entries, in memory), then the stream's windows,
    /// copied file to file in the kernel.
    pub fn append(&mut self, head: &[u8], windows: Windows) -> io::Result<TableRef> {
        let at = self.len();
        self.out.append(head)?;
        if let Some(mut w) = windows.out {
            w.flush()?;
            self.out.flush()?;
            let mut from = &w.file;
            let mut to = &self.out.file;
            use std::io::{Seek, SeekFrom};
            from.seek(SeekFrom::Start(0))?;
            to.seek(SeekFrom::Start(self.out.flushed))?;
            let copied = io::copy(&mut from.take(w.flushed), &mut to)?;
            if copied != w.flushed {
                return Err(io::Error::other("a spill file was cut short"));
            }
            self.out.flushed += copied;
        }
        // Every table whole in the file as soon as it is appended: the catalog maps the file.
        self.out.flush()?;
        Ok(TableRef {
            at,
            len: self.len() - at,
        })
    }

    /// The file, every table whole in it: for the catalog to map, and to copy into an index.
    pub fn file(&self) -> &File {
        &self.out.file
    }

    /// One table's bytes, read back (for tests and checks, not the serving path).
    pub fn read(&self, table: TableRef) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0; table.len as usize];
        self.out.file.read_exact_at(&mut bytes, table.at)?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_head_then_windows() {
        let mut windows = Windows::new();
        assert_eq!(windows.push(&[]).unwrap(), 0);
        assert_eq!(windows.push(&[1; 10]).unwrap(), 0);
        assert_eq!(windows.push(&vec![2; BUFFER + 5]).unwrap(), 10);
        assert_eq!(windows.push(&[3; 4]).unwrap(), BUFFER as u64 + 15);
        let mut tables = TableFile::new().unwrap();
        let first = tables.append(b"head", Windows::new()).unwrap();
        let second = tables.append(b"HEAD", windows).unwrap();
        assert_eq!(first, TableRef { at: 0, len: 4 });
        assert_eq!(second.at, 4);
        let bytes = tables.read(second).unwrap();
        assert_eq!(bytes.len(), 4 + BUFFER + 19);
        assert_eq!(&bytes[..4], b"HEAD");
        assert_eq!(&bytes[4..14], &[1; 10]);
        assert_eq!((bytes[4 + BUFFER + 14], bytes[4 + BUFFER + 15]), (2, 3));
        assert_eq!(
            tables.file().metadata().unwrap().len(),
            4 + 4 + BUFFER as u64 + 19
        );
    }
}
