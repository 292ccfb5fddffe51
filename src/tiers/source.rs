//! The source images, opened once and read with positioned reads.
//!
//! `pread` rather than mmap: the images live on parallel filesystems, where page faults turn into
//! synchronous 4 KiB round trips and a truncated file raises SIGBUS instead of an error.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::catalog::ImageInfo;

/// Counters of the operations issued on the backing files.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SourceStats {
    pub opens: u64,
    pub reads: u64,
    pub bytes: u64,
}

#[derive(Debug)]
pub struct Source {
    images: Vec<(PathBuf, File)>,
    reads: AtomicU64,
    bytes: AtomicU64,
}

impl Source {
    /// Opens every image once, read-only.
    pub fn open(images: &[ImageInfo]) -> io::Result<Source> {
        let images = images
            .iter()
            .map(|info| {
                File::open(&info.path)
                    .map(|f| (info.path.clone(), f))
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", info.path.display())))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Source {
            images,
            reads: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        })
    }

    pub fn image_path(&self, image: u32) -> &Path {
        &self.images[image as usize].0
    }

    /// Fills `buf` from `offset` of `image`. A short file (an image truncated after it was scanned)
    /// is an `UnexpectedEof` error rather than a short read: the catalog promised these bytes.
    pub fn read_exact_at(&self, image: u32, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let (_, file) = self
            .images
            .get(image as usize)
            .ok_or_else(|| io::Error::other(format!("no image #{image}")))?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        file.read_exact_at(buf, offset)?;
        self.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    pub fn stats(&self) -> SourceStats {
        SourceStats {
            opens: self.images.len() as u64,
            reads: self.reads.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}
