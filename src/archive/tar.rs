//! Tar scanner: walks the headers of an uncompressed tar (ustar, GNU, PAX) with positioned reads,
//! seeking over member data, and records each member's data extent.
//!
//! The `tar` crate parses the header fields; this module owns the walk because it must name the byte
//! offset of every problem, detect members that run past the end of a truncated shard, and read only
//! the headers (one small read per member on a parallel filesystem, not the data).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

use tar::{EntryType, Header, PaxExtensions};
use tracing::{debug, warn};

use super::name::sanitize;
use super::{ArchiveError, Member, MemberKind, ScannedImage, Span};

const BLOCK: u64 = 512;
/// While members are small, headers are read through windows this large, so a run of small
/// members costs one read (and the data read along with them is cheaper than more system calls).
const WIDE_WINDOW: usize = 256 * 1024;
/// While members are large, each header is read alone, with room for extension records; the data
/// between headers is skipped.
const NARROW_WINDOW: usize = 4 * 1024;
/// Headers closer together than this on average count as small members.
const SMALL_GAP: u64 = 16 * 1024;
/// GNU long names and PAX records larger than this are treated as corruption.
const MAX_EXTENSION: u64 = 1 << 20;
/// Hard links pointing at hard links are followed this many times at most.
const MAX_LINK_HOPS: usize = 32;

/// Extension records (GNU `L`/`K`, PAX `x`) that apply to the next real member.
#[derive(Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax_path: Option<Vec<u8>>,
    pax_link: Option<Vec<u8>>,
    pax_size: Option<u64>,
    pax_mtime: Option<(i64, u32)>,
    pax_sparse: bool,
    first_offset: Option<u64>,
}

/// Positioned reads through a buffer whose size follows the gaps between headers.
struct Window<'a> {
    file: &'a File,
    len: u64,
    buf: Vec<u8>,
    start: u64,
    /// Running mean of the distance between consecutive headers.
    mean_gap: u64,
}

impl<'a> Window<'a> {
    fn new(file: &'a File, len: u64) -> Self {
        Window {
            file,
            len,
            buf: Vec::with_capacity(WIDE_WINDOW),
            start: 0,
            mean_gap: 0,
        }
    }

    /// Records the distance from one header to the next.
    fn note_gap(&mut self, gap: u64) {
        self.mean_gap = (self.mean_gap * 7 + gap) / 8;
    }

    /// Returns `len` bytes at `offset`; the caller has checked that they lie inside the image.
    fn read(&mut self, offset: u64, len: usize) -> std::io::Result<&[u8]> {
        let end = offset + len as u64;
        let cached_end = self.start + self.buf.len() as u64;
        if offset < self.start || end > cached_end {
            let window = if self.mean_gap <= SMALL_GAP {
                WIDE_WINDOW
            } else {
                NARROW_WINDOW
            };
            let want = len.max(window).min((self.len - offset) as usize);
            self.buf.resize(want, 0);
            self.file.read_exact_at(&mut self.buf, offset)?;
            self.start = offset;
        }
        let at = (offset - self.start) as usize;
        Ok(&self.buf[at..at + len])
    }
}

/// Scans a tar image into `image` (whose path and size are set). Fails on anything that makes the
/// member table untrustworthy; skips (with a warning naming image and offset) members that cannot
/// be served.
pub fn scan(file: &File, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let path = path.as_path();
    let len = image.size;
    let mut window = Window::new(file, len);
    let mut pending = Pending::default();
    let mut pos = 0u64;
    let io_err = |e| ArchiveError::io(path, e);

    loop {
        if pos == len {
            // No end-of-archive blocks; tolerated (as GNU tar does) unless an extension dangles.
            break;
        }
        if pos + BLOCK > len {
            return Err(ArchiveError::malformed(
                path,
                pos,
                format!(
                    "truncated tar header: only {} bytes left in the file",
                    len - pos
                ),
            ));
        }
        let block: [u8; BLOCK as usize] = window
            .read(pos, BLOCK as usize)
            .map_err(io_err)?
            .try_into()
            .expect("block size");
        if block.iter().all(|&b| b == 0) {
            break;
        }
        verify_checksum(&block).map_err(|reason| {
            let reason = if pos == 0 {
                format!("not a tar archive ({reason})")
            } else {
                reason
            };
            ArchiveError::malformed(path, pos, reason)
        })?;
        let header = Header::from_byte_slice(&block);
        let entry_type = header.entry_type();
        let header_size = header
            .entry_size()
            .map_err(|e| ArchiveError::malformed(path, pos, format!("bad size field: {e}")))?;
        let data_offset = pos + BLOCK;
        let is_extension = matches!(
            entry_type,
            EntryType::GNULongName | EntryType::GNULongLink | EntryType::XHeader
        );
        // A PAX `size` overrides the header of the member it describes, never of an extension.
        let size = match (is_extension, pending.pax_size) {
            (false, Some(size)) => size,
            _ => header_size,
        };
        if data_offset.checked_add(size).is_none_or(|end| end > len) {
            return Err(ArchiveError::malformed(
                path,
                pos,
                format!(
                    "member runs past the end of the file: {size} bytes of data announced at \
                     offset {data_offset}, the file has {len} bytes (truncated shard?)"
                ),
            ));
        }

        if is_extension {
            if size > MAX_EXTENSION {
                return Err(ArchiveError::malformed(
                    path,
                    pos,
                    format!("extension record of {size} bytes is implausibly large"),
                ));
            }
            let data = window.read(data_offset, size as usize).map_err(io_err)?;
            pending.first_offset.get_or_insert(pos);
            match entry_type {
                EntryType::GNULongName => pending.long_name = Some(trim_nul(data).to_vec()),
                EntryType::GNULongLink => pending.long_link = Some(trim_nul(data).to_vec()),
                _ => apply_pax(&mut pending, data)
                    .map_err(|reason| ArchiveError::malformed(path, pos, reason))?,
            }
        } else {
            let first = pending.first_offset.unwrap_or(pos);
            let ext = std::mem::take(&mut pending);
            record_member(image, header, entry_type, ext, first, data_offset, size);
        }
        let next = data_offset + size.div_ceil(BLOCK) * BLOCK;
        window.note_gap(next - pos);
        // Data padding may be cut off at the very end of a file; the data itself was checked.
        pos = next.min(len);
    }
    if pending.first_offset.is_some() {
        return Err(ArchiveError::malformed(
            path,
            pending.first_offset.unwrap_or(pos),
            "extension header is not followed by a member (truncated shard?)",
        ));
    }
    resolve_hard_links(image);
    Ok(())
}

/// Adds a real member (after its extension records) or skips it with a warning.
fn record_member(
    image: &mut ScannedImage,
    header: &Header,
    entry_type: EntryType,
    ext: Pending,
    header_offset: u64,
    data_offset: u64,
    size: u64,
) {
    // Borrowed from the header in the common case: no allocation per member.
    let raw_name: Cow<[u8]> = match ext.pax_path.or(ext.long_name) {
        Some(name) => Cow::Owned(name),
        None => header.path_bytes(),
    };
    let skip = |image: &mut ScannedImage, why: &str| {
        let shown = String::from_utf8_lossy(&raw_name);
        warn!(
            image = %image.path.display(),
            offset = header_offset,
            "skipping member {shown:?}: {why}"
        );
        image.skipped += 1;
    };
    let kind = match entry_type {
        EntryType::Regular | EntryType::Continuous => MemberKind::File,
        EntryType::Directory => MemberKind::Dir,
        EntryType::Symlink => MemberKind::Symlink,
        EntryType::Link => MemberKind::HardLink,
        EntryType::GNUSparse => return skip(image, "sparse members are not supported"),
        EntryType::Char | EntryType::Block => return skip(image, "device nodes are not served"),
        EntryType::Fifo => return skip(image, "FIFOs are not served"),
        EntryType::XGlobalHeader => {
            debug!(image = %image.path.display(), offset = header_offset, "ignoring PAX global header");
            return;
        }
        other => {
            // GNU dumpdir ('D') is a directory whose data lists names; volume labels and
            // multi-volume continuations carry nothing to serve.
            if other.as_byte() == b'D' {
                MemberKind::Dir
            } else {
                return skip(
                    image,
                    &format!("unsupported member type {:?}", other.as_byte() as char),
                );
            }
        }
    };
    if ext.pax_sparse && kind == MemberKind::File {
        return skip(image, "sparse members are not supported");
    }
    let path = match sanitize(&raw_name) {
        Ok(path) => path,
        Err(why) => return skip(image, &why.to_string()),
    };
    let link_raw: Cow<[u8]> = match kind {
        MemberKind::HardLink | MemberKind::Symlink => match ext.pax_link.or(ext.long_link) {
            Some(link) => Cow::Owned(link),
            None => header.link_name_bytes().unwrap_or_default(),
        },
        _ => Cow::Borrowed(&[]),
    };
    let link = match kind {
        MemberKind::HardLink => match sanitize(&link_raw) {
            Ok(target) => target,
            Err(why) => return skip(image, &format!("hard-link target: {why}")),
        },
        _ => link_raw.clone(),
    };
    let (mtime, mtime_nsec) = ext
        .pax_mtime
        .unwrap_or_else(|| (header.mtime().unwrap_or(0) as i64, 0));
    let mode = header.mode().unwrap_or(0o644) & 0o7777;
    let path = image.push_string(&path);
    let link = image.push_string(&link);
    image.members.push(Member {
        path,
        link,
        kind,
        mode,
        mtime,
        mtime_nsec,
        size: if kind == MemberKind::File { size } else { 0 },
        data_offset,
        header_offset,
        encoding: super::Encoding::Stored,
    });
}

/// Gives each hard link the data extent and attributes of the file it names (tar stores the data
/// once, with the first name). A link whose target is missing is skipped with a warning.
fn resolve_hard_links(image: &mut ScannedImage) {
    if !image.members.iter().any(|m| m.kind == MemberKind::HardLink) {
        return;
    }
    let mut by_path: HashMap<&[u8], usize> = HashMap::new();
    for (i, m) in image.members.iter().enumerate() {
        by_path.insert(image.path_of(m), i);
    }
    let mut resolved: Vec<(usize, Option<usize>)> = Vec::new();
    for (i, m) in image.members.iter().enumerate() {
        if m.kind != MemberKind::HardLink {
            continue;
        }
        let mut target = by_path.get(image.link_of(m)).copied();
        for _ in 0..MAX_LINK_HOPS {
            match target {
                Some(t) if image.members[t].kind == MemberKind::HardLink && t != i => {
                    target = by_path.get(image.link_of(&image.members[t])).copied();
                }
                _ => break,
            }
        }
        let target = target.filter(|&t| image.members[t].kind == MemberKind::File);
        resolved.push((i, target));
    }
    let mut dropped = Vec::new();
    for (i, target) in resolved {
        match target {
            Some(t) => {
                let src = image.members[t];
                let m = &mut image.members[i];
                m.kind = MemberKind::File;
                m.size = src.size;
                m.data_offset = src.data_offset;
                m.mode = src.mode;
                m.mtime = src.mtime;
                m.mtime_nsec = src.mtime_nsec;
                m.link = Span::default();
            }
            None => {
                let m = image.members[i];
                warn!(
                    image = %image.path.display(),
                    offset = m.header_offset,
                    "skipping hard link {:?}: its target {:?} is not a regular file of this shard",
                    String::from_utf8_lossy(image.path_of(&m)),
                    String::from_utf8_lossy(image.link_of(&m)),
                );
                dropped.push(i);
            }
        }
    }
    if !dropped.is_empty() {
        image.skipped += dropped.len() as u64;
        let mut index = 0;
        image.members.retain(|_| {
            let keep = dropped.binary_search(&index).is_err();
            index += 1;
            keep
        });
    }
}

/// Checks the header checksum (unsigned sum, or the signed sum some old tars wrote).
fn verify_checksum(block: &[u8; BLOCK as usize]) -> Result<(), String> {
    let field = &block[148..156];
    let text = trim_nul(field);
    let text = std::str::from_utf8(text).unwrap_or("").trim();
    let stored = u32::from_str_radix(text, 8)
        .map_err(|_| format!("header checksum field {:?} is not a number", text))?;
    let (mut unsigned, mut signed) = (0u32, 0i32);
    for (i, &b) in block.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += b as u32;
        signed += b as i8 as i32;
    }
    if stored == unsigned || stored as i32 == signed {
        Ok(())
    } else {
        Err(format!(
            "header checksum mismatch (stored {stored}, computed {unsigned})"
        ))
    }
}

fn trim_nul(data: &[u8]) -> &[u8] {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    &data[..end]
}

/// Applies the records of a PAX extended header to the next member.
fn apply_pax(pending: &mut Pending, data: &[u8]) -> Result<(), String> {
    for ext in PaxExtensions::new(data) {
        let ext = ext.map_err(|e| format!("malformed PAX record: {e}"))?;
        let key = ext.key_bytes();
        let value = ext.value_bytes();
        match key {
            b"path" => pending.pax_path = Some(value.to_vec()),
            b"linkpath" => pending.pax_link = Some(value.to_vec()),
            b"size" => {
                let size = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("bad PAX size {:?}", String::from_utf8_lossy(value)))?;
                pending.pax_size = Some(size);
            }
            b"mtime" => pending.pax_mtime = parse_pax_time(value),
            _ if key.starts_with(b"GNU.sparse.") => pending.pax_sparse = true,
            _ => {}
        }
    }
    Ok(())
}

/// Parses a PAX time such as `1700000000.123456789` or `-12.5` into seconds and nanoseconds.
fn parse_pax_time(value: &[u8]) -> Option<(i64, u32)> {
    let text = std::str::from_utf8(value).ok()?;
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: i64 = whole.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    while digits.len() < 9 {
        digits.push('0');
    }
    let nanos: u32 = digits.parse().ok()?;
    if text.starts_with('-') && nanos > 0 {
        // -1.5 s is 2 s before the epoch plus 0.5 s.
        Some((secs - 1, 1_000_000_000 - nanos))
    } else {
        Some((secs, nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_times() {
        assert_eq!(parse_pax_time(b"1700000000"), Some((1700000000, 0)));
        assert_eq!(
            parse_pax_time(b"1700000000.123456789"),
            Some((1700000000, 123456789))
        );
        assert_eq!(parse_pax_time(b"12.5"), Some((12, 500000000)));
        assert_eq!(parse_pax_time(b"-1.5"), Some((-2, 500000000)));
        assert_eq!(parse_pax_time(b"x"), None);
    }

    #[test]
    fn checksum_detects_flips() {
        let mut header = Header::new_gnu();
        header.set_path("a/b.jpg").unwrap();
        header.set_size(10);
        header.set_cksum();
        let mut block: [u8; 512] = *header.as_bytes();
        assert!(verify_checksum(&block).is_ok());
        block[3] ^= 0x40;
        assert!(verify_checksum(&block).unwrap_err().contains("mismatch"));
    }
}
