//! `packfs ls --json`: the catalog as JSON lines, a stable interface for programs (the Python
//! package reads it). docs/configuration.md specifies it; a change to it is a new `packfs_ls`
//! version, never a silent one.
//!
//! Names are bytes. A name that is UTF-8 is a JSON string; one that is not is written twice: as
//! text with U+FFFD for what is not UTF-8 (for people and for matching), and as its exact bytes
//! in base64 under the field's name plus `_b64`. Every JSON parser reads that (an escaped lone
//! surrogate, as Python's `surrogateescape` would have it, is refused by strict parsers).

use std::io::Write;
use std::os::unix::ffi::OsStrExt;

use crate::catalog::{Catalog, Kind, ROOT};
use crate::source::ImageLocation;

/// The version of this format, in the first line.
pub const VERSION: u32 = 1;

/// Writes `catalog` as JSON lines: a head, one line per image (with its share of `shares`, if
/// given), then one per entry, depth first in name order.
pub fn write(catalog: &Catalog, shares: Option<u32>, out: &mut impl Write) -> anyhow::Result<()> {
    let mut line = Vec::with_capacity(256);
    writeln!(
        out,
        "{{\"packfs_ls\":{VERSION},\"images\":{},\"entries\":{},\"checksummed_files\":{}}}",
        catalog.images().len(),
        catalog.len().saturating_sub(1),
        catalog.checksummed_files()
    )?;
    for (i, image) in catalog.images().iter().enumerate() {
        line.clear();
        write!(line, "{{\"kind\":\"image\",\"image\":{i}")?;
        field(&mut line, "path", image.path().as_os_str().as_bytes());
        // An archive inside another image: its size, and where it lies in the image around it.
        let (size, outermost) = match (&image.location, image.within) {
            (ImageLocation::Within(w), Some(outer)) => {
                write!(line, ",\"within\":{outer},\"base\":{}", w.base)?;
                (w.len, catalog.outermost(i as u32, 0).0 as usize)
            }
            _ => (image.fingerprint.size, i),
        };
        write!(line, ",\"size\":{size}")?;
        if let Some(world) = shares {
            // Staged with the image that holds its bytes.
            let share = crate::tiers::stage::share_of(outermost, world);
            write!(line, ",\"share\":{share}")?;
        }
        line.extend_from_slice(b"}\n");
        out.write_all(&line)?;
    }
    for id in catalog.walk(ROOT) {
        let e = catalog.entry(id)?;
        let kind = match e.kind() {
            Kind::Dir => "dir",
            Kind::File => "file",
            Kind::Symlink => "symlink",
        };
        line.clear();
        write!(line, "{{\"kind\":\"{kind}\"")?;
        field(&mut line, "path", &catalog.path_of(id));
        write!(line, ",\"mode\":{},\"mtime\":{}", e.permissions(), e.mtime)?;
        match e.kind() {
            Kind::File => {
                // Real byte positions: in the file or object that holds the bytes.
                let at = catalog.placement(e)?.image_offset();
                let (image, offset) = catalog.outermost(e.image, at);
                write!(
                    line,
                    ",\"size\":{},\"image\":{image},\"offset\":{offset}",
                    e.size
                )?;
                if let Some(crc) = catalog.placement(e)?.crc() {
                    write!(line, ",\"crc32\":\"{crc:08x}\"")?;
                }
            }
            Kind::Symlink => field(&mut line, "target", catalog.symlink_target(e)?),
            Kind::Dir => {}
        }
        line.extend_from_slice(b"}\n");
        out.write_all(&line)?;
    }
    Ok(())
}

/// `,"NAME":"text"` for `bytes`, and `,"NAME_b64":"..."` with the exact bytes when they are not
/// UTF-8 (see the module comment).
fn field(out: &mut Vec<u8>, name: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let _ = write!(out, ",\"{name}\":");
    // serde_json escapes exactly what JSON needs; a String always serializes.
    let _ = serde_json::to_writer(&mut *out, &*text);
    if let std::borrow::Cow::Owned(_) = text {
        use base64::Engine;
        let exact = base64::engine::general_purpose::STANDARD.encode(bytes);
        let _ = write!(out, ",\"{name}_b64\":\"{exact}\"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(bytes: &[u8]) -> serde_json::Value {
        let mut out = b"{\"x\":0".to_vec();
        field(&mut out, "path", bytes);
        out.push(b'}');
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn names_that_are_not_utf8_come_with_their_bytes() {
        let plain = json(b"a/b c.jpg");
        assert_eq!(plain["path"], "a/b c.jpg");
        assert!(plain.get("path_b64").is_none());
        assert_eq!(json(b"q\"\\\n\x01")["path"], "q\"\\\n\u{1}");
        let latin = json(b"caf\xe9");
        assert_eq!(latin["path"], "caf\u{fffd}");
        assert_eq!(latin["path_b64"], "Y2Fm6Q==");
    }
}
