//! Tar headers for the shards `packfs pack` writes: POSIX ustar, with a PAX extended header only
//! for what ustar cannot hold (a path or link target that does not fit the name/prefix fields, a
//! size of 8 GiB or more, an mtime outside 0..8^11). GNU tar, bsdtar, Python's tarfile and
//! webdataset read them all. Every field is fixed by the member (owner 0:0, no user or group
//! names), so the same members make the same bytes.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use tar::{EntryType, Header};

pub const BLOCK: u64 = 512;

/// What a member is, for its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderKind<'a> {
    File { size: u64 },
    Dir,
    Symlink { target: &'a [u8] },
}

/// The largest value an 11-digit octal field holds.
const OCTAL_MAX: u64 = (1 << 33) - 1;

/// Appends the header block(s) of a member named `path` to `out`; its data follows them.
pub fn append_header(
    out: &mut Vec<u8>,
    path: &[u8],
    kind: HeaderKind,
    mode: u32,
    mtime: i64,
) -> std::io::Result<()> {
    let mut pax: Vec<u8> = Vec::new();
    let mut name = path.to_vec();
    if kind == HeaderKind::Dir {
        name.push(b'/');
    }
    let mut header = Header::new_ustar();
    if header.set_path(OsStr::from_bytes(&name)).is_err() {
        pax_record(&mut pax, "path", &name);
        // What a reader that ignores PAX shows: the last component, cut to fit (as GNU tar does).
        header = Header::new_ustar();
        let last = name.rsplit(|&b| b == b'/').find(|c| !c.is_empty());
        let shown = &last.unwrap_or(b"@LongName")[..last.map_or(9, |c| c.len().min(99))];
        if header.set_path(OsStr::from_bytes(shown)).is_err() {
            header.set_path("@LongName")?;
        }
    }
    match kind {
        HeaderKind::File { size } => {
            header.set_entry_type(EntryType::Regular);
            if size > OCTAL_MAX {
                pax_record(&mut pax, "size", size.to_string().as_bytes());
            }
            header.set_size(size.min(OCTAL_MAX));
        }
        HeaderKind::Dir => {
            header.set_entry_type(EntryType::Directory);
            header.set_size(0);
        }
        HeaderKind::Symlink { target } => {
            header.set_entry_type(EntryType::Symlink);
            header.set_size(0);
            if target.len() > 100 || header.set_link_name_literal(target).is_err() {
                pax_record(&mut pax, "linkpath", target);
                // The start of the target in the header too: libarchive takes a PAX `linkpath`
                // over an empty link name for a hard link, and extracts an empty file.
                let _ = header.set_link_name_literal(&target[..target.len().min(100)]);
            }
        }
    }
    if std::str::from_utf8(&name).is_err()
        || matches!(kind, HeaderKind::Symlink { target } if std::str::from_utf8(target).is_err())
    {
        // PAX strings are UTF-8 unless the header says otherwise.
        if !pax.is_empty() {
            pax_record(&mut pax, "hdrcharset", b"BINARY");
        }
    }
    header.set_mode(mode & 0o7777);
    match u64::try_from(mtime) {
        Ok(t) if t <= OCTAL_MAX => header.set_mtime(t),
        _ => {
            pax_record(&mut pax, "mtime", mtime.to_string().as_bytes());
            header.set_mtime(0);
        }
    }
    header.set_uid(0);
    header.set_gid(0);
    header.set_cksum();
    if !pax.is_empty() {
        let mut ext = Header::new_ustar();
        ext.set_path("././@PaxHeader")?;
        ext.set_entry_type(EntryType::XHeader);
        ext.set_size(pax.len() as u64);
        ext.set_mode(0o644);
        ext.set_mtime(0);
        ext.set_uid(0);
        ext.set_gid(0);
        ext.set_cksum();
        out.extend_from_slice(ext.as_bytes());
        out.extend_from_slice(&pax);
        pad(out, pax.len() as u64);
    }
    out.extend_from_slice(header.as_bytes());
    Ok(())
}

/// Bytes the header(s) of a member take, without building them.
pub fn header_len(path: &[u8], kind: HeaderKind, mtime: i64) -> u64 {
    // The common case without building anything (planning a pack asks for every member).
    let name_len = path.len() + usize::from(kind == HeaderKind::Dir);
    let plain = name_len <= 100
        && (0..=OCTAL_MAX as i64).contains(&mtime)
        && std::str::from_utf8(path).is_ok()
        && match kind {
            HeaderKind::File { size } => size <= OCTAL_MAX,
            HeaderKind::Dir => true,
            HeaderKind::Symlink { target } => target.len() <= 100,
        };
    if plain {
        return BLOCK;
    }
    let mut out = Vec::with_capacity(1024);
    match append_header(&mut out, path, kind, 0o644, mtime) {
        Ok(()) => out.len() as u64,
        Err(_) => 3 * BLOCK,
    }
}

/// Zero bytes that bring data of `len` bytes to a whole block.
pub fn padding(len: u64) -> u64 {
    len.next_multiple_of(BLOCK) - len
}

pub fn pad(out: &mut Vec<u8>, len: u64) {
    out.resize(out.len() + padding(len) as usize, 0);
}

/// The end of an archive: two zero blocks.
pub const END: [u8; 1024] = [0; 1024];

/// One PAX record: `LEN KEY=VALUE\n`, where LEN counts the whole record, its own digits included.
fn pax_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    let body = key.len() + value.len() + 3; // space, '=', newline
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_length_counts_itself() {
        for value_len in [0usize, 1, 5, 6, 7, 90, 94, 95, 96, 995, 996, 9994] {
            let mut out = Vec::new();
            pax_record(&mut out, "path", &vec![b'x'; value_len]);
            let text = String::from_utf8(out.clone()).unwrap();
            let (len, _) = text.split_once(' ').unwrap();
            assert_eq!(len.parse::<usize>().unwrap(), out.len(), "{value_len}");
        }
    }

    use proptest::prelude::*;

    fn name_strategy() -> impl Strategy<Value = Vec<u8>> {
        // Components of 1-120 bytes (any byte but NUL and '/', not "." or ".."), 1-4 deep.
        let component = prop::collection::vec(1u8..=255, 1..120).prop_filter_map("no '/'", |c| {
            let c: Vec<u8> = c
                .into_iter()
                .map(|b| if b == b'/' { b'_' } else { b })
                .collect();
            (c != b"." && c != b"..").then_some(c)
        });
        prop::collection::vec(component, 1..4).prop_map(|cs| cs.join(&b'/'))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// What the writer writes, packfs's own tar scanner reads back: names, sizes, modes and
        /// mtimes (including those that need PAX records), data where the header says.
        #[test]
        fn scanner_reads_back_what_the_writer_wrote(
            members in prop::collection::vec(
                (name_strategy(), 0u64..3000, 0u32..0o7777, -5_000_000_000i64..20_000_000_000),
                1..12,
            ),
        ) {
            let mut seen = std::collections::HashSet::new();
            let members: Vec<_> = members.into_iter().filter(|m| seen.insert(m.0.clone())).collect();
            let mut out = Vec::new();
            for (i, (name, size, mode, mtime)) in members.iter().enumerate() {
                // Unique file names: no member is a parent of another.
                let mut name = name.clone();
                name.extend_from_slice(format!(".{i}").as_bytes());
                let before = out.len();
                let kind = HeaderKind::File { size: *size };
                append_header(&mut out, &name, kind, *mode, *mtime).unwrap();
                prop_assert_eq!(header_len(&name, kind, *mtime), (out.len() - before) as u64);
                out.extend((0..*size).map(|b| (b as u8) ^ (i as u8)));
                pad(&mut out, *size);
            }
            out.extend_from_slice(&END);
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), &out).unwrap();
            let image = crate::dataset::scan_image(
                &crate::source::ImageLocation::File(file.path().into()),
                &crate::source::Stores::default(),
            )
            .unwrap();
            prop_assert_eq!(image.members.len(), members.len());
            for (i, (m, (name, size, mode, mtime))) in image.members.iter().zip(&members).enumerate() {
                let mut want = name.clone();
                want.extend_from_slice(format!(".{i}").as_bytes());
                prop_assert_eq!(image.path_of(m), &want[..]);
                prop_assert_eq!((m.size, m.mode, m.mtime), (*size, *mode, *mtime));
                let data = &out[m.data_offset as usize..(m.data_offset + m.size) as usize];
                prop_assert!(data.iter().enumerate().all(|(b, &x)| x == (b as u8) ^ (i as u8)));
            }
        }
    }

    #[test]
    fn short_names_make_one_block_long_ones_a_pax_header() {
        let file = HeaderKind::File { size: 10 };
        assert_eq!(header_len(b"a/b.jpg", file, 1), 512);
        let long = "d/".repeat(60) + "x.jpg";
        assert_eq!(header_len(long.as_bytes(), file, 1), 512);
        let component = "y".repeat(120);
        assert_eq!(header_len(component.as_bytes(), file, 1), 512 * 3);
        assert_eq!(header_len(b"neg", file, -5), 512 * 3);
        let big = HeaderKind::File { size: 1 << 34 };
        assert_eq!(header_len(b"big", big, 0), 512 * 3);
    }
}
