//! The formats packfs scans, in the order they are tried, each with how it is known (its first
//! bytes, or for a zip with something before it, its end record) and how it is scanned; and the
//! files it knows to refuse, with the reason. A new container or compressed stream is one
//! scanner file and one line in `STANDARD` (docs/design.md, "Adding a format").

use std::io;
use std::sync::LazyLock;

use super::format::{INDEX_MAGIC, ImageFormat, Inside, Probe};
use super::{ArchiveError, ScannedImage, squashfs, tar, zip};
use crate::source::read_at::ReadAt;

/// Formats in the order they are tried; what none claims is scanned as tar, whose scanner
/// names what is wrong.
pub struct Registry {
    formats: Vec<ImageFormat>,
}

/// Plain tar: what is left when no other format claims an image.
pub const TAR: ImageFormat = ImageFormat {
    what: "a tar image",
    detect: |_| Ok(true),
    scan: tar::scan,
    inside: None,
};

/// A plain tar inside an image: under any tar's name (a plain tar is often named `.tar.gz`), by
/// its first header's checksum; all zeros is no archive here (an empty sample).
const TAR_INSIDE: Inside = Inside {
    tar: true,
    names: &[
        ".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst", ".tar.xz", ".txz", ".tar.bz2", ".tbz2",
        ".tbz",
    ],
    kept: &[],
    detect: Some(|p| Ok(tar::is_header(p.head) && !is_zeros(p.head))),
};

static STANDARD: LazyLock<Registry> = LazyLock::new(|| {
    Registry::empty()
        .with(ImageFormat {
            what: "a packfs index",
            detect: |p| Ok(p.head.starts_with(INDEX_MAGIC)),
            scan: |_, image| {
                Err(ArchiveError::IsIndex {
                    image: image.path.clone(),
                })
            },
            inside: None,
        })
        .with(ImageFormat {
            what: "a zip image",
            detect: |p| Ok(p.head.starts_with(b"PK\x03\x04") || p.head.starts_with(b"PK\x05\x06")),
            scan: zip::scan,
            // Inside an image, a zip starts with its first record: the end-record form below
            // would read the end of every candidate.
            inside: Some(Inside {
                tar: false,
                names: &[".zip", ".npz"],
                kept: &[".npz"],
                detect: None,
            }),
        })
        .with(ImageFormat {
            what: "a squashfs image",
            detect: |p| Ok(p.head.starts_with(b"hsqs")),
            scan: squashfs::scan,
            inside: Some(Inside {
                tar: false,
                names: &[".squashfs", ".sqfs"],
                kept: &[],
                detect: None,
            }),
        })
        .with(tar::GZIP_TAR)
        .with(tar::ZSTD_TAR)
        .with(tar::XZ_TAR)
        .with(tar::BZIP2_TAR)
        .with(ImageFormat {
            what: UNREAD,
            detect: |p| Ok(p.head.starts_with(b"\x04\x22\x4d\x18")),
            scan: |_, image| Err(unpack_first(image, "lz4", "lz4 -d")),
            inside: None,
        })
        .with(ImageFormat {
            what: UNREAD,
            detect: |p| Ok(p.head.starts_with(b"LZIP")),
            scan: |_, image| Err(unpack_first(image, "lzip", "lzip -dk")),
            inside: None,
        })
        .with(ImageFormat {
            what: "a tar image",
            detect: |p| Ok(p.head.len() == 512 && tar::is_header(p.head) || is_zeros(p.head)),
            scan: tar::scan,
            inside: Some(TAR_INSIDE),
        })
        .with(ImageFormat {
            what: "the JSON manifest of `packfs pack`",
            detect: |p| Ok(is_pack_manifest(p.head)),
            scan: |_, image| {
                Err(ArchiveError::malformed(
                    &image.path,
                    0,
                    "the JSON manifest `packfs pack` writes beside its shards, not an image: \
                     mount the index it names (\"index\": NAME.packfs-index) or the shards \
                     (NAME-*.tar)",
                ))
            },
            inside: None,
        })
        .with(ImageFormat {
            what: "a zip image",
            detect: |p| has_zip_end(p.file, p.len),
            scan: zip::scan,
            inside: None,
        })
});

impl Registry {
    /// The formats packfs reads, and the files it knows to refuse with a reason.
    pub fn standard() -> &'static Registry {
        &STANDARD
    }

    /// None but the tar fallback.
    pub fn empty() -> Registry {
        Registry {
            formats: Vec::new(),
        }
    }

    /// `format` tried after those before it.
    pub fn with(mut self, format: ImageFormat) -> Registry {
        self.formats.push(format);
        self
    }

    /// The formats opened inside images: tars only, or `all` kinds.
    fn inside(&self, all: bool) -> impl Iterator<Item = (&ImageFormat, &Inside)> {
        self.formats
            .iter()
            .filter_map(|f| Some((f, f.inside.as_ref()?)))
            .filter(move |(_, inside)| all || inside.tar)
    }

    /// Whether a member named `name` may be an archive opened inside an image (`all`: zips and
    /// squashfs images too, else tars).
    pub fn inner_name(&self, name: &[u8], all: bool) -> bool {
        let lower = name.to_ascii_lowercase();
        self.inside(all)
            .any(|(_, i)| ends_with_any(&lower, i.names))
    }

    /// Whether `probe` (a member named `name`) is such an archive: one of the formats whose
    /// names it has claims its content.
    pub fn inner_archive(&self, probe: &Probe, name: &[u8], all: bool) -> bool {
        let lower = name.to_ascii_lowercase();
        self.inside(all).any(|(format, i)| {
            ends_with_any(&lower, i.names)
                && (i.detect.unwrap_or(format.detect))(probe).unwrap_or(false)
        })
    }

    /// `name` without the archive extension its format gives it (the longest that matches),
    /// if it has one, the directory does not keep it, and something is left.
    pub fn strip_extension<'a>(&self, name: &'a [u8]) -> Option<&'a [u8]> {
        let lower = name.to_ascii_lowercase();
        let ext = self
            .inside(true)
            .flat_map(|(_, i)| i.names.iter().filter(|n| !i.kept.contains(n)))
            .filter(|e| lower.ends_with(e.as_bytes()))
            .max_by_key(|e| e.len())?;
        (name.len() > ext.len()).then(|| &name[..name.len() - ext.len()])
    }

    /// The first format that claims the `len`-byte image `file`, else tar.
    pub fn detect(&self, file: &dyn ReadAt, len: u64) -> io::Result<ImageFormat> {
        let mut head = [0u8; 512];
        let n = file.read_up_to(&mut head, 0)?;
        let probe = Probe {
            head: &head[..n],
            file,
            len,
        };
        for format in &self.formats {
            if (format.detect)(&probe)? {
                return Ok(*format);
            }
        }
        Ok(TAR)
    }
}

/// What a compressed stream packfs does not read is called in messages.
const UNREAD: &str = "a compressed file packfs does not read";

/// The refusal of a `name`-compressed file, with the `command` that undoes it.
fn unpack_first(image: &ScannedImage, name: &str, command: &str) -> ArchiveError {
    ArchiveError::malformed(
        &image.path,
        0,
        format!(
            "a {name}-compressed file; packfs reads tar (plain, or compressed with gzip, zstd, xz \
             or bzip2), zip and squashfs images: decompress it once (`{command} {}`) and give the \
             .tar",
            image.path.display()
        ),
    )
}

fn ends_with_any(lower: &[u8], names: &[&str]) -> bool {
    names.iter().any(|e| lower.ends_with(e.as_bytes()))
}

fn is_zeros(head: &[u8]) -> bool {
    head.iter().all(|&b| b == 0)
}

/// A JSON object naming a shard list, as `pack::manifest` writes it.
fn is_pack_manifest(head: &[u8]) -> bool {
    let text = head.trim_ascii_start();
    text.starts_with(b"{")
        && [&b"\"shardlist\""[..], b"wids-shard-index"]
            .iter()
            .any(|key| text.windows(key.len()).any(|w| w == *key))
}

/// How far from its end a zip's end record can be: its 22 bytes and a comment of up to 64 KiB.
const EOCD_REACH: u64 = 22 + 65_535;

/// Whether a zip end-of-central-directory record lies within reach of the end of the file.
fn has_zip_end(file: &dyn ReadAt, len: u64) -> io::Result<bool> {
    let start = len.saturating_sub(EOCD_REACH);
    let mut tail = vec![0u8; (len - start) as usize];
    file.read_exact_at(&mut tail, start)?;
    Ok(tail.windows(4).any(|w| w == b"PK\x05\x06"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::{Encoding, Member, MemberKind, scan_with};
    use crate::source::Fingerprint;

    /// A toy container: `TOY1`, then the bytes of one file named `toy.txt`.
    const TOY: ImageFormat = ImageFormat {
        what: "a toy image",
        detect: |p| Ok(p.head.starts_with(b"TOY1")),
        scan: |_, image| {
            image.headers += 1;
            let path = image.push_string(b"toy.txt");
            image.members.push(Member {
                path,
                link: Default::default(),
                kind: MemberKind::File,
                mode: 0o644,
                mtime: 0,
                mtime_nsec: 0,
                size: image.size - 4,
                data_offset: 4,
                encoding: Encoding::Stored,
                header_offset: 0,
            });
            Ok(())
        },
        inside: None,
    };

    fn fingerprint(len: usize) -> Fingerprint {
        Fingerprint {
            size: len as u64,
            ..Fingerprint::default()
        }
    }

    /// A new format is a scanner and one registration: the registry dispatches on content.
    #[test]
    fn a_registered_format_is_scanned_by_its_own_scanner() {
        let bytes = b"TOY1hello, toy".to_vec();
        let path = &crate::source::ImageLocation::File("a.toy".into());
        let registry = Registry::empty().with(TOY);
        let image = scan_with(&registry, path, &bytes, fingerprint(bytes.len())).unwrap();
        assert_eq!(image.members.len(), 1);
        let member = image.members[0];
        assert_eq!(image.path_of(&member), b"toy.txt");
        let at = member.data_offset as usize;
        assert_eq!(&bytes[at..at + member.size as usize], b"hello, toy");
        // Unregistered, the same bytes are no image packfs knows.
        assert!(scan_with(Registry::standard(), path, &bytes, fingerprint(bytes.len())).is_err());
    }

    #[test]
    fn formats_are_told_apart_by_content() {
        let standard = Registry::standard();
        let what = |bytes: &[u8]| {
            standard
                .detect(&bytes.to_vec(), bytes.len() as u64)
                .unwrap()
                .what
        };
        assert_eq!(what(b"PK\x03\x04rest"), "a zip image");
        assert_eq!(what(b"hsqs...."), "a squashfs image");
        assert_eq!(what(b"\x1f\x8b\x08\x00"), "a gzip-compressed tar");
        assert_eq!(what(b"\x28\xb5\x2f\xfd"), "a zstd-compressed tar");
        assert_eq!(what(b"\x50\x2a\x4d\x18"), "a zstd-compressed tar");
        assert_eq!(what(b"\xfd7zXZ\x00"), "an xz-compressed tar");
        assert_eq!(what(b"BZh9"), "a bzip2-compressed tar");
        assert_eq!(what(b"LZIP\x01"), "a compressed file packfs does not read");
        assert_eq!(what(INDEX_MAGIC), "a packfs index");
        assert_eq!(
            what(b"{\"shardlist\": []}"),
            "the JSON manifest of `packfs pack`"
        );
        assert_eq!(what(&[0u8; 1024]), "a tar image");
        let mut prefixed = b"#!/bin/sh\nexit 0\n".to_vec();
        prefixed.extend_from_slice(b"PK\x05\x06");
        prefixed.extend_from_slice(&[0u8; 18]);
        assert_eq!(what(&prefixed), "a zip image");
    }
}
