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

use tar::{EntryType, Header};
use tracing::debug;

mod fields;
mod sparse;

use super::name::sanitize;
use super::sparse_map;
use super::{ArchiveError, Member, MemberKind, ScannedImage, Span};
use fields::{Field, apply_pax, number, signed, trim_nul, verify_checksum};

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

/// Extension records (GNU `L`/`K`, PAX `x`) that apply to the next real member.
#[derive(Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: fields::Pax,
    first_offset: Option<u64>,
}

/// A real member's header, with its numeric fields parsed.
struct Raw<'h> {
    header: &'h Header,
    entry_type: EntryType,
    mode: u32,
    mtime: i64,
    header_offset: u64,
    data_offset: u64,
    size: u64,
    /// For a sparse member: its map, or why it cannot be read.
    sparse: Option<Result<sparse::Map, String>>,
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

/// Whether `block` is a tar header (its checksum matches, as the scanner checks it): format
/// detection asks before it looks for other formats further in the file.
pub fn is_header(block: &[u8]) -> bool {
    block
        .try_into()
        .is_ok_and(|b: &[u8; BLOCK as usize]| verify_checksum(b).is_ok())
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
        let bad_field = |f: Field| {
            move |why| ArchiveError::malformed(path, pos, format!("bad {f:?} field: {why}"))
        };
        // Old tars wrote a hard link's target size in its header; the data is the target's, and
        // GNU tar reads nothing after the header (a link carries no data).
        let header_size = match entry_type {
            EntryType::Link => 0,
            _ => number(&block, Field::Size).map_err(bad_field(Field::Size))?,
        };
        // An old GNU sparse header may continue its map in extension blocks before the data.
        let mut old_sparse = None;
        let data_offset = if entry_type == EntryType::GNUSparse {
            let (map, data_at) = sparse::old_gnu(&block, pos + BLOCK, len, |at| {
                window.read(at, BLOCK as usize).map(|b| b.to_vec())
            })
            .map_err(|reason| ArchiveError::malformed(path, pos, reason))?;
            old_sparse = Some(map);
            data_at
        } else {
            pos + BLOCK
        };
        let is_extension = matches!(
            entry_type,
            EntryType::GNULongName | EntryType::GNULongLink | EntryType::XHeader
        );
        // A PAX `size` overrides the header of the member it describes, never of an extension
        // (nor of a hard link, which carries no data).
        let size = match (is_extension, pending.pax.size) {
            (false, Some(size)) if entry_type != EntryType::Link => size,
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
                _ => {
                    // Only the last of several consecutive PAX headers applies (GNU tar, Go).
                    pending.pax = Default::default();
                    apply_pax(&mut pending.pax, data)
                        .map_err(|reason| ArchiveError::malformed(path, pos, reason))?
                }
            }
        } else {
            let first = pending.first_offset.unwrap_or(pos);
            let ext = std::mem::take(&mut pending);
            let mtime = signed(&block, Field::Mtime).map_err(bad_field(Field::Mtime))?;
            // A mode that does not parse is damage in a field GNU tar would reject too; 0644 keeps
            // the member readable (as before).
            let mode = number(&block, Field::Mode).unwrap_or(0o644) as u32;
            let sparse = match old_sparse {
                Some(map) => Some(Ok(map)),
                None if ext.pax.sparse => {
                    Some(sparse::from_pax(&ext.pax, data_offset, size, |n| {
                        window.read(data_offset, n).map(|b| b.to_vec())
                    }))
                }
                None => None,
            };
            let member = Raw {
                header,
                entry_type,
                mode,
                mtime,
                header_offset: first,
                data_offset,
                size,
                sparse,
            };
            record_member(image, member, ext);
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
fn record_member(image: &mut ScannedImage, raw: Raw, ext: Pending) {
    let Raw {
        header,
        entry_type,
        mode,
        mtime,
        header_offset,
        data_offset,
        size,
        sparse,
    } = raw;
    // Borrowed from the header in the common case: no allocation per member. A PAX sparse file
    // carries its real name apart (its `path` is made up).
    let raw_name: Cow<[u8]> = match ext.pax.sparse_name.or(ext.pax.path).or(ext.long_name) {
        Some(name) => Cow::Owned(name),
        None => header.path_bytes(),
    };
    let skip = |image: &mut ScannedImage, why: &str| image.skip(header_offset, &raw_name, why);
    let kind = match entry_type {
        // Old tars (V7 and early GNU) marked a directory only by the '/' that ends its name.
        EntryType::Regular if raw_name.ends_with(b"/") => MemberKind::Dir,
        EntryType::Regular | EntryType::Continuous => MemberKind::File,
        EntryType::Directory => MemberKind::Dir,
        EntryType::Symlink => MemberKind::Symlink,
        EntryType::Link => MemberKind::HardLink,
        EntryType::GNUSparse => MemberKind::File,
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
    // A sparse file: its real size, and where its data segments lie.
    let (size, encoding, record) = match sparse {
        Some(Ok(map)) if kind == MemberKind::File => {
            let mut record = Vec::new();
            let encoded = sparse_map::encode(
                &map.segments,
                map.size,
                map.data_at,
                map.stored,
                &mut record,
            );
            if let Err(why) = encoded {
                return skip(image, &format!("bad sparse map: {why}"));
            }
            (map.size, super::Encoding::Sparse, record)
        }
        Some(Err(why)) if kind == MemberKind::File => {
            return skip(image, &format!("bad sparse map: {why}"));
        }
        _ => (size, super::Encoding::Stored, Vec::new()),
    };
    let path = match sanitize(&raw_name) {
        Ok(path) => path,
        Err(why) => return skip(image, &why.to_string()),
    };
    let link_raw: Cow<[u8]> = match kind {
        MemberKind::HardLink | MemberKind::Symlink => match ext.pax.link.or(ext.long_link) {
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
    let (mtime, mtime_nsec) = ext.pax.mtime.unwrap_or((mtime, 0));
    let mode = mode & 0o7777;
    let path = image.push_string(&path);
    // A sparse file's record rides where a link target would (files have none).
    let link = image.push_string(if record.is_empty() { &link } else { &record });
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
        encoding,
    });
}

/// Gives each hard link the data extent and attributes of the file it names: the last member of
/// that path *before* the link, as extraction sees it (a later member of the same name replaces
/// the file, not what the link already points to). A link whose target is not a regular file
/// earlier in the shard is skipped with a warning, as GNU tar fails to extract it.
fn resolve_hard_links(image: &mut ScannedImage) {
    if !image.members.iter().any(|m| m.kind == MemberKind::HardLink) {
        return;
    }
    // Paths are owned here: members change while the map is in use.
    let mut by_path: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut dropped = Vec::new();
    for i in 0..image.members.len() {
        let m = image.members[i];
        if m.kind == MemberKind::HardLink {
            let target = by_path
                .get(image.link_of(&m))
                .copied()
                .filter(|&t| image.members[t].kind == MemberKind::File);
            match target {
                Some(t) => {
                    let src = image.members[t];
                    let link = &mut image.members[i];
                    link.kind = MemberKind::File;
                    link.size = src.size;
                    link.data_offset = src.data_offset;
                    link.mode = src.mode;
                    link.mtime = src.mtime;
                    link.mtime_nsec = src.mtime_nsec;
                    link.encoding = src.encoding;
                    link.link = Span::default();
                }
                None => {
                    let why = format!(
                        "hard link whose target {:?} is not a regular file earlier in this shard",
                        String::from_utf8_lossy(image.link_of(&m))
                    );
                    let name = image.path_of(&m).to_vec();
                    image.skip(m.header_offset, &name, &why);
                    dropped.push(i);
                    continue;
                }
            }
        }
        by_path.insert(image.path_of(&m).to_vec(), i);
    }
    if !dropped.is_empty() {
        let mut index = 0;
        image.members.retain(|_| {
            let keep = dropped.binary_search(&index).is_err();
            index += 1;
            keep
        });
    }
}
