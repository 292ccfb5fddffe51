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
