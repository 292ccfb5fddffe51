//! The gzip member framing (RFC 1952): a header before each deflate stream and a CRC-32 and
//! length after it. Read by hand: the indexer must know where each member's deflate data starts
//! (flate2's readers hide that), and the format is a few fields.

use crate::util::le;

/// Whether `head` starts like a gzip member.
pub fn is_gzip(head: &[u8]) -> bool {
    head.starts_with(&[0x1f, 0x8b])
}

const FHCRC: u8 = 0x02;
const FEXTRA: u8 = 0x04;
const FNAME: u8 = 0x08;
const FCOMMENT: u8 = 0x10;
const RESERVED: u8 = 0xe0;

/// A name or comment longer than this is taken for damage (gzip itself has no limit, but no
/// writer stores a megabyte of file name).
const MAX_STRING: usize = 1 << 20;

/// Parses a member header from `next(n)`, which yields the next `n` bytes of the file (or an
/// error). Returns the header's length.
pub fn header(mut next: impl FnMut(usize) -> Result<Vec<u8>, String>) -> Result<u64, String> {
    let fixed = next(10)?;
    if !is_gzip(&fixed) {
        return Err("not a gzip member header".into());
    }
    if fixed[2] != 8 {
        return Err(format!(
            "gzip compression method {} is unknown (gzip knows only 8, deflate)",
            fixed[2]
        ));
    }
    let flags = fixed[3];
    if flags & RESERVED != 0 {
        return Err(format!(
            "gzip header flags {flags:#04x} set reserved bits (gzip refuses such a file)"
        ));
    }
    let mut len = 10u64;
    if flags & FEXTRA != 0 {
        let x = next(2)?;
        let n = le::u16_at(&x, 0) as usize;
        next(n)?;
        len += 2 + n as u64;
    }
    for flag in [FNAME, FCOMMENT] {
        if flags & flag != 0 {
            let mut n = 0;
            while next(1)?[0] != 0 {
                n += 1;
                if n > MAX_STRING {
                    return Err("gzip header name or comment runs on for over 1 MiB".into());
                }
            }
            len += n as u64 + 1;
        }
    }
    if flags & FHCRC != 0 {
        next(2)?;
        len += 2;
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<u64, String> {
        let mut at = 0;
        header(|n| {
            let b = bytes.get(at..at + n).ok_or("cut short")?.to_vec();
            at += n;
            Ok(b)
        })
    }

    #[test]
    fn headers() {
        use std::io::Write;
        let mut gz = flate2::GzBuilder::new()
            .filename("a.tar")
            .comment("hi")
            .extra(vec![1, 2, 3])
            .write(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"x").unwrap();
        let bytes = gz.finish().unwrap();
        assert_eq!(parse(&bytes), Ok(10 + 2 + 3 + 6 + 3));
        assert!(
            parse(b"\x1f\x8b\x07\0\0\0\0\0\0\0")
                .unwrap_err()
                .contains("method 7")
        );
        assert!(
            parse(b"\x1f\x8b\x08\x20\0\0\0\0\0\0")
                .unwrap_err()
                .contains("reserved")
        );
        assert!(parse(b"\x1f\x8b\x08\x08\0\0\0\0\0\0abc").is_err());
    }
}
