//! Tar scanner: walks the headers of a tar (ustar, GNU, PAX) with positioned reads, seeking over
//! member data, and records each member's data extent. A gzip-compressed tar is walked through
//! its decoded stream, inflated once (`inflate::Indexer`), and its members' extents lie in that
//! stream.
//!
//! The `tar` crate parses the header fields; this module owns the walk because it must name the byte
//! offset of every problem, detect members that run past the end of a truncated shard, and read only
//! the headers (one small read per member on a parallel filesystem, not the data).

use std::borrow::Cow;
use std::collections::HashMap;
use std::io;

use tar::{EntryType, Header};
use tracing::debug;

mod compressed;
mod fields;
pub use compressed::{BZIP2_TAR, GZIP_TAR, XZ_TAR, ZSTD_TAR};
mod sparse;
mod stream;

use super::name::sanitize;
use super::sparse_map;
use super::{ArchiveError, Member, MemberKind, ScannedImage, Span};
use crate::source::read_at::ReadAt;
use fields::{Field, apply_pax, number, signed, trim_nul, verify_checksum};
use stream::{Stream, Window};

const BLOCK: u64 = 512;
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
pub fn scan(file: &dyn ReadAt, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let mut window = Window::new(file, image.size);
    walk(&mut window, image)
}

/// Walks the headers of `stream` into `image`.
fn walk(stream: &mut dyn Stream, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let path = path.as_path();
    let mut pending = Pending::default();
    let mut pos = 0u64;
    let io_err = |e| ArchiveError::io(path, e);

    loop {
        stream.forget_before(pos);
        if stream.len_upto(pos + 1).map_err(io_err)? == pos {
            // No end-of-archive blocks; tolerated (as GNU tar does) unless an extension dangles.
            break;
        }
        let have = stream.len_upto(pos + BLOCK).map_err(io_err)?;
        if have < pos + BLOCK {
            return Err(ArchiveError::malformed(
                path,
                pos,
                format!(
                    "truncated tar header: only {} bytes left in {}",
                    have - pos,
                    stream.what()
                ),
            ));
        }
        let block: [u8; BLOCK as usize] = stream
            .read(pos, BLOCK as usize)
            .map_err(io_err)?
            .try_into()
            .expect("block size");
        if block.iter().all(|&b| b == 0) {
            break;
        }
        if let Err(reason) = verify_checksum(&block) {
            if pos == 0 {
                return Err(ArchiveError::malformed(
                    path,
                    pos,
                    format!("not a tar archive ({reason})"),
                ));
            }
            // GNU tar's "Skipping to next header": the member is lost, the image is not.
            let next = next_header(stream, pos + BLOCK).map_err(io_err)?;
            skip_damaged(image, &block, pos, next, &reason, &mut pending);
            pos = next;
            continue;
        }
        let header = Header::from_byte_slice(&block);
        image.headers += 1;
        // Solaris writes its extended headers as `X`: the same records as PAX `x` (GNU tar
        // applies both).
        let entry_type = match header.entry_type() {
            t if t.as_byte() == b'X' => EntryType::XHeader,
            t => t,
        };
        let bad_field = |f: Field| {
            move |why| ArchiveError::malformed(path, pos, format!("bad {f:?} field: {why}"))
        };
        // Old tars wrote a hard link's target size in its header; the data is the target's, and
        // GNU tar reads nothing after the header (a link carries no data). Some writers store a
        // directory's listing size in a type-5 header (Python's test archives carry one): GNU tar
        // ignores it and reads the next header right after, so the next member is not data.
        let carries_no_data = matches!(entry_type, EntryType::Link | EntryType::Directory);
        let header_size = match entry_type {
            _ if carries_no_data => 0,
            _ => number(&block, Field::Size).map_err(bad_field(Field::Size))?,
        };
        // An old GNU sparse header may continue its map in extension blocks before the data.
        let mut old_sparse = None;
        let data_offset = if entry_type == EntryType::GNUSparse {
            let (map, data_at) = sparse::old_gnu(&block, pos + BLOCK, |at| {
                if stream.len_upto(at + BLOCK)? < at + BLOCK {
                    return Ok(None);
                }
                stream.read(at, BLOCK as usize).map(|b| Some(b.to_vec()))
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
        // (nor of a hard link or a directory, which carry no data).
        let size = match (is_extension, pending.pax.size) {
            (false, Some(size)) if !carries_no_data => size,
            _ => header_size,
        };
        let data_end = data_offset.checked_add(size).ok_or_else(|| {
            ArchiveError::malformed(
                path,
                pos,
                format!("a member size of {size} bytes overflows"),
            )
        })?;
        // Whether the member's data lies inside the stream (decoding a compressed one that far).
        let check_end = |stream: &mut dyn Stream| -> Result<(), ArchiveError> {
            let have = stream.len_upto(data_end).map_err(io_err)?;
            if have < data_end {
                return Err(ArchiveError::malformed(
                    path,
                    pos,
                    format!(
                        "member runs past the end of {what}: {size} bytes of data announced at \
                         offset {data_offset}, {what} has {have} bytes (truncated shard?)",
                        what = stream.what()
                    ),
                ));
            }
            Ok(())
        };

        if is_extension {
            if size > MAX_EXTENSION {
                return Err(ArchiveError::malformed(
                    path,
                    pos,
                    format!("extension record of {size} bytes is implausibly large"),
                ));
            }
            check_end(stream)?;
            let data = stream.read(data_offset, size as usize).map_err(io_err)?;
            image.merged += 1;
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
                        let end = data_offset + n as u64;
                        if stream.len_upto(end)? < end {
                            return Err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "the sparse map is cut short",
                            ));
                        }
                        stream.read(data_offset, n).map(|b| b.to_vec())
                    }))
                }
                None => None,
            };
            stream.forget_before(data_end);
            check_end(stream)?;
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
        stream.note_gap(next - pos);
        // Data padding may be cut off at the very end of a file; the data itself was checked.
        pos = stream.len_upto(next).map_err(io_err)?;
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

/// Where the walk goes on after a header that failed its checksum at `from - 512`, as GNU tar
/// goes on: the next block that is a valid header or all zeros (which ends the archive), or the
/// end of the stream. The damaged member's data is searched too: a header stored in it is listed,
/// as GNU tar lists it.
fn next_header(stream: &mut dyn Stream, from: u64) -> io::Result<u64> {
    let mut at = from;
    loop {
        stream.forget_before(at);
        if stream.len_upto(at + BLOCK)? < at + BLOCK {
            return stream.len_upto(at);
        }
        let block: &[u8; BLOCK as usize] = stream
            .read(at, BLOCK as usize)?
            .try_into()
            .expect("block size");
        if block.iter().all(|&b| b == 0) || verify_checksum(block).is_ok() {
            return Ok(at);
        }
        at += BLOCK;
    }
}

/// Leaves out the member whose header at `at` failed its checksum (never served: any field of it
/// may be the damaged one), with the extension records that came for it, and warns with the
/// offsets of the damage and of the next header.
fn skip_damaged(
    image: &mut ScannedImage,
    block: &[u8; BLOCK as usize],
    at: u64,
    next: u64,
    reason: &str,
    pending: &mut Pending,
) {
    let ext = std::mem::take(pending);
    let name = ext
        .pax
        .path
        .or(ext.long_name)
        .unwrap_or_else(|| trim_nul(&block[..100]).to_vec());
    image.headers += 1;
    image.damaged_headers += 1;
    debug!(
        image = %image.path.display(),
        offset = at,
        "{reason}; the next header is at offset {next}"
    );
    // One reason for all damaged headers, so that many make one summary line.
    image.skip(
        ext.first_offset.unwrap_or(at),
        &name,
        "its tar header is damaged (checksum mismatch); the scan went on at the next valid \
         header, as GNU tar does",
    );
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
            image.merged += 1;
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
                    // A sparse target's map rides in its link span: the link shares it.
                    link.link = match src.encoding.has_record() {
                        true => src.link,
                        false => Span::default(),
                    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Fingerprint;

    fn scanned(bytes: Vec<u8>) -> ScannedImage {
        let fingerprint = Fingerprint {
            size: bytes.len() as u64,
            ..Fingerprint::default()
        };
        let location = crate::source::ImageLocation::File("t.tar".into());
        let mut image = ScannedImage::new(location, fingerprint);
        scan(&bytes, &mut image).unwrap();
        image
    }

    #[test]
    fn every_header_is_accounted_for() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = Header::new_gnu();
        let long = format!("dir/{}", "x".repeat(200));
        for (name, kind, data) in [
            ("dir", EntryType::Directory, &b""[..]),
            (long.as_str(), EntryType::Regular, b"long name"),
            ("dir/dev", EntryType::Char, b""),
            ("dir/link", EntryType::Link, b""),
        ] {
            h.set_entry_type(kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            if kind == EntryType::Link {
                b.append_link(&mut h, name, &long).unwrap();
            } else {
                b.append_data(&mut h, name, data).unwrap();
            }
        }
        let mut global = Header::new_ustar();
        global.set_entry_type(EntryType::XGlobalHeader);
        let record = b"18 comment=hello\n";
        global.set_size(record.len() as u64);
        b.append_data(&mut global, "global", &record[..]).unwrap();
        let image = scanned(b.into_inner().unwrap());
        // dir, the long name's `L` record and its file, the device, the long target's `K`
        // record and its link, the global header.
        assert_eq!(image.headers, 7);
        assert_eq!(
            (image.members.len(), image.merged, image.skipped),
            (3, 3, 1)
        );
        assert_eq!(image.unaccounted(), None);
    }

    #[test]
    fn a_directory_size_is_not_data() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = Header::new_ustar();
        h.set_entry_type(EntryType::Directory);
        h.set_size(0);
        h.set_mode(0o755);
        b.append_data(&mut h, "d", &b""[..]).unwrap();
        let mut h = Header::new_ustar();
        h.set_size(5);
        h.set_mode(0o644);
        b.append_data(&mut h, "d/next", &b"hello"[..]).unwrap();
        let mut bytes = b.into_inner().unwrap();
        // The directory's header says 512 bytes follow: the next header must still be read.
        let mut dir = Header::from_byte_slice(&bytes[..512]).clone();
        dir.set_size(512);
        dir.set_cksum();
        bytes[..512].copy_from_slice(dir.as_bytes());
        let image = scanned(bytes);
        let names: Vec<_> = image.members.iter().map(|m| image.path_of(m)).collect();
        assert_eq!(names, [&b"d"[..], b"d/next"]);
        assert_eq!(image.unaccounted(), None);
    }
}
