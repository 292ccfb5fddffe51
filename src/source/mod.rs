//! Where an image's bytes come from, below everything that reads them: an `ImageLocation` (a
//! file, or an object named by URL), opened into a `ReadAt` with its `Fingerprint`. `read_at` is
//! the positioned-read trait every reader implements; `remote` reads objects from S3 and HTTP
//! stores; `blocks` batches a scan's small reads of an object.
//!
//! The catalog and the index keep an image's name (its path, or its URL as text);
//! `ImageLocation::new` reads a name back, and nothing outside this module tells the two apart.
//! A new kind of store is a new variant here and a `ReadAt` under it.

mod blocks;
pub mod fingerprint;
pub mod mapped;
pub mod read_at;
pub mod remote;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use fingerprint::Fingerprint;
use read_at::ReadAt;
use remote::{BadUrl, Location, RemoteObject};
pub use remote::{ObjectStore, StoreOptions, Stores};

/// Where an image (or an index) is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageLocation {
    /// A file, by its path.
    File(PathBuf),
    /// An object in a store, by its URL (`s3://`, `http(s)://`), kept as its text.
    Object(PathBuf),
    /// An archive stored as a member of another image (a class's tar inside ImageNet's tar),
    /// read through a window of that image.
    Within(Arc<Within>),
}

/// Where an inner archive lies in its outer image.
#[derive(Debug, PartialEq, Eq)]
pub struct Within {
    pub outer: ImageLocation,
    /// Its path among the outer image's members.
    pub member: PathBuf,
    /// Where its bytes start in the outer image, and how many there are.
    pub base: u64,
    pub len: u64,
    /// The outer image's name and the member's path, for messages.
    name: PathBuf,
}

impl ImageLocation {
    /// The location a name means: an object URL, or else a file path.
    pub fn new(name: &Path) -> ImageLocation {
        match remote::is_url(name) {
            true => ImageLocation::Object(name.to_path_buf()),
            false => ImageLocation::File(name.to_path_buf()),
        }
    }

    /// Whether a user's word names an object (a URL) rather than a file, before it is expanded.
    pub fn names_object(word: &str) -> bool {
        remote::is_url(Path::new(word))
    }

    /// A location as given by a user (an argument, a pattern's match): a URL must parse, and a
    /// file path is made absolute, so a daemon may change directory.
    pub fn from_arg(name: &Path) -> Result<ImageLocation, ArgError> {
        match ImageLocation::new(name) {
            ImageLocation::Object(url) => {
                let text = url.to_str().ok_or_else(|| {
                    ArgError::Url(BadUrl {
                        url: url.to_string_lossy().into_owned(),
                        why: "an object URL must be UTF-8".into(),
                    })
                })?;
                Location::parse(text).map_err(ArgError::Url)?;
                Ok(ImageLocation::Object(url))
            }
            ImageLocation::File(path) => std::path::absolute(&path)
                .map(ImageLocation::File)
                .map_err(|error| ArgError::Path { path, error }),
            within @ ImageLocation::Within(_) => Ok(within),
        }
    }

    /// The archive stored as `member` of `outer`, `len` bytes at `base`.
    pub fn within(outer: ImageLocation, member: PathBuf, base: u64, len: u64) -> ImageLocation {
        let name = outer.name().join(&member);
        ImageLocation::Within(Arc::new(Within {
            outer,
            member,
            base,
            len,
            name,
        }))
    }

    /// The name: the file's path, the object's URL, or for an inner archive its outer image's
    /// name and its member's path.
    pub fn name(&self) -> &Path {
        match self {
            ImageLocation::File(p) | ImageLocation::Object(p) => p,
            ImageLocation::Within(w) => &w.name,
        }
    }

    pub fn into_name(self) -> PathBuf {
        match self {
            ImageLocation::File(p) | ImageLocation::Object(p) => p,
            ImageLocation::Within(w) => w.name.clone(),
        }
    }

    pub fn is_object(&self) -> bool {
        match self {
            ImageLocation::Object(_) => true,
            ImageLocation::File(_) => false,
            ImageLocation::Within(w) => w.outer.is_object(),
        }
    }

    /// The image whose bytes these are: itself, or for an inner archive the outermost image
    /// that holds it.
    pub fn outermost(&self) -> &ImageLocation {
        match self {
            ImageLocation::Within(w) => w.outer.outermost(),
            _ => self,
        }
    }

    /// Whether it can be looked for: a file that exists now; an object is checked when opened.
    pub fn may_exist(&self) -> bool {
        match self {
            ImageLocation::File(p) => p.exists(),
            ImageLocation::Object(_) => true,
            ImageLocation::Within(w) => w.outer.may_exist(),
        }
    }

    /// Opens it for positioned reads, without a fingerprint (an object from `stores`).
    pub fn reader(&self, stores: &Stores) -> io::Result<Arc<dyn ReadAt>> {
        Ok(match self {
            ImageLocation::File(p) => Arc::new(read_at::open_regular(p)?),
            ImageLocation::Object(url) => Arc::new(RemoteObject::open(stores, url)?),
            ImageLocation::Within(w) => {
                Arc::new(read_at::Window::new(w.outer.reader(stores)?, w.base, w.len))
            }
        })
    }

    /// Opens it, with its fingerprint as now (an inner archive's is its outer image's: one
    /// changes when the other does).
    pub fn open(&self, stores: &Stores) -> io::Result<(Arc<dyn ReadAt>, Fingerprint)> {
        match self {
            ImageLocation::File(p) => {
                let file = read_at::open_regular(p)?;
                let fingerprint = Fingerprint::of(&file)?;
                Ok((Arc::new(file), fingerprint))
            }
            ImageLocation::Object(url) => {
                let object = RemoteObject::open(stores, url)?;
                let fingerprint = object.fingerprint()?;
                Ok((Arc::new(object), fingerprint))
            }
            ImageLocation::Within(w) => {
                let (outer, fingerprint) = w.outer.open(stores)?;
                Ok((w.window(outer), fingerprint))
            }
        }
    }

    /// As `open`, for a scan: an object is read through a few large blocks, so the scanner's many
    /// small reads cost few requests.
    pub fn open_for_scan(&self, stores: &Stores) -> io::Result<(Arc<dyn ReadAt>, Fingerprint)> {
        match self {
            ImageLocation::File(_) => self.open(stores),
            ImageLocation::Object(_) => {
                let (data, fingerprint) = self.open(stores)?;
                Ok((
                    Arc::new(blocks::Blocks::new(data, blocks::SCAN_BLOCK)),
                    fingerprint,
                ))
            }
            ImageLocation::Within(w) => {
                let (outer, fingerprint) = w.outer.open_for_scan(stores)?;
                Ok((w.window(outer), fingerprint))
            }
        }
    }
}

impl Within {
    /// This archive's bytes, read through `outer` (its outer image, opened).
    pub fn window(&self, outer: Arc<dyn ReadAt>) -> Arc<dyn ReadAt> {
        Arc::new(read_at::Window::new(outer, self.base, self.len))
    }
}

/// A location a user gave that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    #[error("{0}")]
    Url(BadUrl),
    #[error("{}: {error}", path.display())]
    Path { path: PathBuf, error: io::Error },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_back_as_files_or_objects() {
        let file = ImageLocation::new(Path::new("shards/a.tar"));
        assert_eq!(file, ImageLocation::File("shards/a.tar".into()));
        assert!(!file.is_object());
        for url in ["s3://bucket/a.tar", "HTTPS://host/a.tar", "http://host/x"] {
            let loc = ImageLocation::new(Path::new(url));
            assert!(loc.is_object(), "{url}");
            assert_eq!(loc.name(), Path::new(url));
        }
        // A directory that merely starts like a scheme is a file.
        assert!(!ImageLocation::new(Path::new("s3:/bucket")).is_object());
    }

    #[test]
    fn arguments_are_checked_and_files_made_absolute() {
        let loc = ImageLocation::from_arg(Path::new("a.tar")).unwrap();
        assert!(loc.name().is_absolute(), "{loc:?}");
        let err = ImageLocation::from_arg(Path::new("s3://bucket")).unwrap_err();
        assert!(err.to_string().contains("bad object URL"), "{err}");
        let err = ImageLocation::from_arg(Path::new("https://user:pw@host/a.tar")).unwrap_err();
        assert!(!err.to_string().contains("pw@"), "{err}");
    }
}
