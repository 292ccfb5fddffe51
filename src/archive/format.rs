//! What an image format is to the scanner: how its images are known by content (never by file
//! name) and how they are scanned. The formats packfs knows are listed in `registry`.

use std::io;

use super::{ArchiveError, ScannedImage};
use crate::source::read_at::ReadAt;

/// The first bytes of a packfs index file.
pub const INDEX_MAGIC: &[u8; 8] = b"PACKFSIX";

/// What a format looks at to know its images: their first bytes (up to 512), and the image
/// itself for a format known elsewhere (a zip's end record).
pub struct Probe<'a> {
    pub head: &'a [u8],
    pub file: &'a dyn ReadAt,
    pub len: u64,
}

/// Scans an image of the format into members, or refuses it (saying why, and what to do).
pub type Scan = fn(&dyn ReadAt, &mut ScannedImage) -> Result<(), ArchiveError>;

/// One format the scanner knows.
#[derive(Clone, Copy)]
pub struct ImageFormat {
    /// What it is, for messages: "a zip image", "a gzip-compressed tar".
    pub what: &'static str,
    pub detect: fn(&Probe) -> io::Result<bool>,
    pub scan: Scan,
    /// How an archive of the format is known as a member of another image (`dataset::nested`);
    /// `None`: never opened there.
    pub inside: Option<Inside>,
}

/// How a format is known inside another image: only under its names (a gzip sample `x.json.gz`
/// is no archive, and decoding every sample's start to find out would cost a decode each), then
/// by its content.
#[derive(Clone, Copy, Debug)]
pub struct Inside {
    /// A tar (opened with `--inner-archives tar`); else opened only with `all`.
    pub tar: bool,
    /// The names (lower case) a member of the format may have.
    pub names: &'static [&'static str],
    /// Of those, the names the member's directory keeps (`x.npz` stays `x.npz/`); the others are
    /// stripped with `--strip-inner-extension`.
    pub kept: &'static [&'static str],
    /// Content check inside, when not the format's own `detect`.
    pub detect: Option<fn(&Probe) -> io::Result<bool>>,
}

impl std::fmt::Debug for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.what)
    }
}
