//! Zip scanner: reads the central directory with the `zip` crate (zip64 included), then each
//! member's local header for its data offset and timestamps, and records stored members as plain
//! extents and deflated members as deflate streams.

use std::io::Read;

use zip::CompressionMethod;
use zip::extra_fields::ExtraField;

use super::inflate::{self, Indexer, InflateError, Wrapper};
use super::name::sanitize;
use super::placement::crc_record;
use super::spill::{TableFile, TableRef};
use super::{ArchiveError, Encoding, Member, MemberKind, ScannedImage, Span};
use crate::source::read_at::{Cursor, ReadAt};

/// Deflated members up to this size are inflated whole (one `placement::Unit`) into the RAM cache;
/// larger ones are inflated once at scan time to place restart checkpoints (`inflate`), and read
/// an interval at a time.
pub const MAX_WHOLE: u64 = inflate::SPACING;

/// A symlink's target is stored as the member's data; longer ones are treated as corruption.
const MAX_LINK: u64 = 64 * 1024;

const S_IFMT: u32 = 0o170000;
const S_IFLNK: u32 = 0o120000;
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFIFO: u32 = 0o010000;
const S_IFSOCK: u32 = 0o140000;

/// Hosts ("version made by") whose external attributes carry a Unix mode in their high 16 bits,
/// as Info-ZIP reads them: Unix, Atari, BeOS, OS X, AtheOS.
const UNIX_HOSTS: [u8; 5] = [3, 5, 16, 19, 30];

/// MS-DOS attribute bits in the low byte of the external attributes.
const DOS_READ_ONLY: u32 = 0x01;
const DOS_DIRECTORY: u32 = 0x10;

/// A member's mode as unzip restores it with `-K`: the stored Unix mode, setuid, setgid and
/// sticky bits and type included; for members made elsewhere (MS-DOS, Windows), 0644, 0444 when
/// read-only, 0755 for directories, and for a DOS directory attribute without a trailing '/'
/// (which unzip extracts as a file).
fn mode_of(member: &zip::read::ZipFile<'_, Cursor<'_>>) -> u32 {
    let attrs = member.external_attributes();
    if UNIX_HOSTS.contains(&(member.system() as u8)) {
        match attrs >> 16 {
            0 => member.unix_mode().unwrap_or(0o100644),
            mode => mode,
        }
    } else if member.is_dir() || attrs & DOS_DIRECTORY != 0 {
        0o755
    } else if attrs & DOS_READ_ONLY != 0 {
        0o444
    } else {
        0o644
    }
}

pub fn scan(file: &dyn ReadAt, image: &mut ScannedImage) -> Result<(), ArchiveError> {
    let path = image.path.clone();
    let malformed = |e: zip::result::ZipError| ArchiveError::malformed(&path, 0, e.to_string());
    let mut archive = zip::ZipArchive::new(Cursor::new(file, image.size)).map_err(malformed)?;
    let directory = archive.central_directory_start();
    let overlapping = overlapping_members(&mut archive);
    for i in 0..archive.len() {
        image.headers += 1;
        let mut unreadable = None;
        let Some(member) = archive
            .by_index_raw(i)
            .map_err(|e| unreadable = Some(e.to_string()))
            .ok()
        else {
            {
                let e = unreadable.unwrap_or_default();
                // A central directory entry whose local header is missing or unreadable (an offset
                // past the end): unzip skips that member too.
                let name = archive
                    .name_for_index(i)
                    .and_then(Result::ok)
                    .map(|n| n.into_owned())
                    .unwrap_or_else(|| format!("#{}", i + 1));
                let why = format!(
                    "entry {} of the central directory (which starts at offset {directory}) \
                     points to no readable local header: {e}",
                    i + 1
                );
                image.skip(directory, name.as_bytes(), &why);
                continue;
            }
        };
        let header_offset = member.header_start();
        let raw_name = member.name_raw().to_vec();
        let skip = |image: &mut ScannedImage, why: &str| image.skip(header_offset, &raw_name, why);
        if let Some(first) = overlapping.get(&i) {
            skip(
                image,
                &format!(
                    "its bytes overlap those of the member whose local header is at offset \
                     {first} (one member's bytes listed again under other names, as a zip bomb \
                     does; unzip refuses such an archive): re-create the zip with `zip -r`"
                ),
            );
            continue;
        }
        if member.encrypted() {
            skip(image, "encrypted members are not supported");
            continue;
        }
        let encoding = match member.compression() {
            CompressionMethod::Stored => Encoding::Stored,
            CompressionMethod::Deflated => Encoding::Deflate,
            other => {
                // Stored and deflated cover what zip, Python and Java write by default; 7-Zip
                // writes Deflate64 when asked (-mm=Deflate64), which packfs cannot inflate yet.
                let name = if other == CompressionMethod::DEFLATE64 {
                    "Deflate64".to_string()
                } else {
                    format!("{other:?}")
                };
                skip(
                    image,
                    &format!(
                        "compression method {name} is not supported (packfs serves stored and \
                         deflated members): re-pack with `zip -r` or `7z a -tzip -mm=Deflate`"
                    ),
                );
                continue;
            }
        };
        let Some(data_offset) = member.data_start() else {
            skip(image, "its local header is unreadable");
            continue;
        };
        let size = member.size();
        let crc = member.crc32();
        // Stored or deflated, the member's bytes must be in the file (a fuzzer found a deflated
        // member whose data started past the end; unzip reports such a member and goes on).
        let stored = member.compressed_size();
        if data_offset
            .checked_add(stored)
            .is_none_or(|e| e > image.size)
        {
            skip(
                image,
                &format!(
                    "its data runs past the end of the file: {stored} bytes at offset {data_offset}"
                ),
            );
            continue;
        }
        let checkpoints = if encoding == Encoding::Deflate && size > MAX_WHOLE && !member.is_dir() {
            let end = data_offset.saturating_add(member.compressed_size());
            let end = end.min(image.size);
            let tables = image.tables().map_err(|e| ArchiveError::io(&path, e))?;
            match checkpoint(file, data_offset, end, size, crc, tables) {
                Ok(table) => Some(table),
                Err(InflateError::Io(e)) => return Err(ArchiveError::io(&path, e)),
                Err(InflateError::Bad { at, why }) => {
                    image.skip(at, &raw_name, &why);
                    continue;
                }
            }
        } else {
            None
        };
        if encoding == Encoding::Stored
            && data_offset.checked_add(size).is_none_or(|e| e > image.size)
        {
            skip(
                image,
                &format!(
                    "its data runs past the end of the file: {size} bytes at offset {data_offset}"
                ),
            );
            continue;
        }
        let full_mode = mode_of(&member);
        let kind = match full_mode & S_IFMT {
            _ if member.is_dir() => MemberKind::Dir,
            S_IFDIR => MemberKind::Dir,
            S_IFLNK => MemberKind::Symlink,
            0 | S_IFREG => MemberKind::File,
            S_IFIFO => {
                skip(image, "FIFOs are not served");
                continue;
            }
            S_IFSOCK => {
                skip(image, "sockets are not served");
                continue;
            }
            _ => {
                skip(image, "device nodes are not served");
                continue;
            }
        };
        let mode = full_mode & 0o7777;
        let mtime = member
            .extra_data_fields()
            .find_map(|f| match f {
                ExtraField::ExtendedTimestamp(ts) => ts.mod_time(),
                _ => None,
            })
            .map(i64::from)
            .or_else(|| member.last_modified().map(dos_to_unix))
            .unwrap_or(0);
        let path_bytes = match sanitize(&raw_name) {
            Ok(path) => path,
            Err(why) => {
                skip(image, &why.to_string());
                continue;
            }
        };
        let path_bytes = path_bytes.into_owned();
        let link = if kind == MemberKind::Symlink {
            if size > MAX_LINK {
                skip(image, "symlink target longer than 64 KiB");
                continue;
            }
            drop(member);
            let mut target = Vec::new();
            let read = archive.by_index(i).and_then(|m| {
                m.take(MAX_LINK)
                    .read_to_end(&mut target)
                    .map_err(Into::into)
            });
            if let Err(e) = read {
                return Err(ArchiveError::malformed(
                    &path,
                    header_offset,
                    format!("cannot read symlink target: {e}"),
                ));
            }
            target
        } else if kind == MemberKind::File && checkpoints.is_none() {
            // The file's placement record: where its data is and the CRC-32 to check it against (a
            // checkpointed member's record is its table, in the image's table file).
            crc_record(data_offset, crc).to_vec()
        } else {
            Vec::new()
        };
        let encoding = match encoding {
            _ if checkpoints.is_some() => Encoding::Checkpointed,
            Encoding::Deflate => Encoding::ZipDeflated,
            _ => Encoding::StoredCrc,
        };
        let path_span = image.push_string(&path_bytes);
        let link_span = match checkpoints {
            Some(table) => Span {
                start: table.at as usize,
                len: table.len as usize,
            },
            None => image.push_string(&link),
        };
        image.members.push(Member {
            path: path_span,
            link: link_span,
            kind,
            mode,
            mtime,
            mtime_nsec: 0,
            size: if kind == MemberKind::File { size } else { 0 },
            data_offset,
            header_offset,
            encoding,
        });
    }
    Ok(())
}

/// The central directory entries whose bytes (local header to the end of their data) overlap
/// an earlier member's, each with the local header offset of the member it overlaps. A 2 MB
/// zip whose 20 000 entries all point at one stored tar of 2 000 files would otherwise be
/// 40 M members once archives inside images are opened: the first member at a place is
/// served, the others are skipped. Costs nothing more than the scan: each local header is
/// read once and its offset kept by the zip crate for the member's own turn.
fn overlapping_members<R: std::io::Read + std::io::Seek>(
    archive: &mut zip::ZipArchive<R>,
) -> std::collections::HashMap<usize, u64> {
    let mut spans = Vec::with_capacity(archive.len());
    for i in 0..archive.len() {
        // An unreadable entry is skipped with its own reason in the scan.
        let Ok(member) = archive.by_index_raw(i) else {
            continue;
        };
        let start = member.header_start();
        let Some(data) = member.data_start() else {
            continue;
        };
        let end = data.saturating_add(member.compressed_size());
        spans.push((start, end, i));
    }
    // By offset (at one offset, the shorter first, then the first listed): the first is kept.
    spans.sort_unstable();
    let mut overlapping = std::collections::HashMap::new();
    let mut reach: Option<(u64, u64)> = None; // (end of the bytes seen so far, whose header)
    for (start, end, i) in spans {
        match reach {
            Some((seen_end, owner)) if start < seen_end => {
                overlapping.insert(i, owner);
            }
            _ => reach = Some((end.max(start), start)),
        }
    }
    overlapping
}

/// Inflates a deflated member once (its compressed bytes lie in `start..end`), appends its
/// checkpoint table to `tables` and returns where it is, after checking its length and CRC-32
/// against the central directory's.
fn checkpoint(
    file: &dyn ReadAt,
    start: u64,
    end: u64,
    size: u64,
    crc: u32,
    tables: &mut TableFile,
) -> Result<TableRef, InflateError> {
    let done = Indexer::new(file, end, start, Wrapper::Raw, inflate::spacing())?.finish(tables)?;
    let bad = |why: String| InflateError::Bad { at: start, why };
    if done.total != size {
        return Err(bad(format!(
            "its deflate data inflates to {} bytes, the central directory says {size}",
            done.total
        )));
    }
    if done.crc != crc {
        return Err(bad(format!(
            "bad CRC-32: the archive records {crc:08x}, the bytes have {:08x} (the member is \
             damaged; unzip -t reports it too)",
            done.crc
        )));
    }
    Ok(done.table)
}

/// A DOS timestamp (no time zone; taken as UTC) as seconds since the epoch.
fn dos_to_unix(t: zip::DateTime) -> i64 {
    let (y, m, d) = (t.year() as i64, t.month() as i64, t.day() as i64);
    // Days from civil date (proleptic Gregorian), after H. Hinnant's algorithm.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    days * 86_400 + t.hour() as i64 * 3600 + t.minute() as i64 * 60 + t.second() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dos_times() {
        let t = zip::DateTime::from_date_and_time(2024, 2, 29, 13, 14, 16).unwrap();
        assert_eq!(dos_to_unix(t), 1_709_212_456);
        let t = zip::DateTime::from_date_and_time(1980, 1, 1, 0, 0, 0).unwrap();
        assert_eq!(dos_to_unix(t), 315_532_800);
    }
}
