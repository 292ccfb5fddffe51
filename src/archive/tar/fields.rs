//! Header fields and PAX records, parsed as GNU tar reads them: numeric fields in octal (one
//! leading NUL and leading spaces skipped, a NUL or space terminator, an empty field as 0) or
//! base-256; the checksum
//! (unsigned, or the signed sum some old tars wrote); PAX records by their length prefix, so
//! values may hold newlines and binary bytes.

/// A numeric field of a ustar header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Mode,
    Size,
    Mtime,
}

impl Field {
    fn range(self) -> std::ops::Range<usize> {
        match self {
            Field::Mode => 100..108,
            Field::Size => 124..136,
            Field::Mtime => 136..148,
        }
    }
}

/// The value of a numeric field that cannot be negative (mode, size).
pub fn number(block: &[u8; 512], field: Field) -> Result<u64, String> {
    let value = signed(block, field)?;
    u64::try_from(value).map_err(|_| format!("negative ({value})"))
}

/// The value of a numeric field; the error says what is wrong with it.
pub fn signed(block: &[u8; 512], field: Field) -> Result<i64, String> {
    signed_at(&block[field.range()])
}

/// A numeric field that cannot be negative, anywhere in a header (sparse maps have their own).
pub fn unsigned_at(raw: &[u8]) -> Result<u64, String> {
    let value = signed_at(raw)?;
    u64::try_from(value).map_err(|_| format!("negative ({value})"))
}

fn signed_at(raw: &[u8]) -> Result<i64, String> {
    if raw[0] & 0x80 != 0 {
        // Base-256 (GNU): two's complement, big-endian, after the marker bit; 0xff starts a
        // negative number (an mtime before 1970).
        let negative = raw[0] == 0xff;
        let mut value: i128 = if negative {
            -1
        } else {
            (raw[0] & 0x7f) as i128
        };
        for &b in &raw[1..] {
            value = value * 256 + b as i128;
            if value.abs() > i64::MAX as i128 {
                return Err("larger than 64 bits".into());
            }
        }
        return Ok(value as i64);
    }
    // GNU tar skips one leading NUL (old tars let the previous field overflow into this one),
    // then spaces; the digits end at a NUL, a space or the field's end.
    let mut at = usize::from(raw[0] == 0);
    while at < raw.len() && raw[at].is_ascii_whitespace() {
        at += 1;
    }
    let start = at;
    while at < raw.len() && (b'0'..=b'7').contains(&raw[at]) {
        at += 1;
    }
    let (digits, rest) = (&raw[start..at], &raw[at..]);
    let text = trim_nul(raw);
    if rest
        .first()
        .is_some_and(|&b| b != 0 && !b.is_ascii_whitespace())
    {
        return Err(format!(
            "{:?} is not a number",
            String::from_utf8_lossy(text)
        ));
    }
    // An empty field (all NULs or spaces) is 0, as GNU tar and Python's tarfile read it.
    digits.iter().try_fold(0i64, |value, &d| match d {
        b'0'..=b'7' => value
            .checked_mul(8)
            .map(|v| v + (d - b'0') as i64)
            .ok_or_else(|| "larger than 64 bits".to_string()),
        _ => Err(format!(
            "{:?} is not a number",
            String::from_utf8_lossy(text)
        )),
    })
}

/// Checks the header checksum (unsigned sum, or the signed sum some old tars wrote).
pub fn verify_checksum(block: &[u8; 512]) -> Result<(), String> {
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

pub fn trim_nul(data: &[u8]) -> &[u8] {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    &data[..end]
}

/// What one PAX extended header says about the next member.
#[derive(Default)]
pub struct Pax {
    pub path: Option<Vec<u8>>,
    pub link: Option<Vec<u8>>,
    pub size: Option<u64>,
    pub mtime: Option<(i64, u32)>,
    /// Any GNU.sparse.* record: the member is sparse.
    pub sparse: bool,
    /// GNU sparse 0.0 (`offset`/`numbytes` records) and 0.1 (`map`): offsets and lengths in turn.
    pub sparse_map: Vec<u64>,
    /// The file's real size (`GNU.sparse.size`, or `realsize` in 1.0).
    pub sparse_size: Option<u64>,
    /// The file's real name (0.1 and 1.0 put a made-up one in `path`).
    pub sparse_name: Option<Vec<u8>>,
    /// 1 for format 1.0, whose map is at the start of the member's data.
    pub sparse_major: Option<u64>,
}

/// Applies the records of a PAX extended header: `LEN KEY=VALUE\n`, where LEN counts the whole
/// record, so a value may hold any byte, newlines included.
pub fn apply_pax(pax: &mut Pax, mut data: &[u8]) -> Result<(), String> {
    while !data.is_empty() {
        // Headers are padded with NULs to a block; GNU tar stops at the first.
        if data[0] == 0 {
            break;
        }
        let bad = |why: &str| format!("malformed PAX record: {why}");
        let space = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("no length"))?;
        let len: usize = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| bad("the length is not a number"))?;
        if len <= space + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(bad("its length does not match its content"));
        }
        let record = &data[space + 1..len - 1];
        let eq = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("no '='"))?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => pax.path = Some(value.to_vec()),
            b"linkpath" => pax.link = Some(value.to_vec()),
            b"size" => {
                let size = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("bad PAX size {:?}", String::from_utf8_lossy(value)))?;
                pax.size = Some(size);
            }
            b"mtime" => pax.mtime = parse_pax_time(value),
            _ if key.starts_with(b"GNU.sparse.") => {
                pax.sparse = true;
                let number = || {
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .ok_or_else(|| {
                            format!(
                                "bad PAX record {}={:?}",
                                String::from_utf8_lossy(key),
                                String::from_utf8_lossy(value)
                            )
                        })
                };
                match &key[b"GNU.sparse.".len()..] {
                    b"size" | b"realsize" => pax.sparse_size = Some(number()?),
                    b"name" => pax.sparse_name = Some(value.to_vec()),
                    b"major" => pax.sparse_major = Some(number()?),
                    b"offset" | b"numbytes" => pax.sparse_map.push(number()?),
                    b"map" => {
                        for n in value.split(|&b| b == b',').filter(|n| !n.is_empty()) {
                            let n = std::str::from_utf8(n)
                                .ok()
                                .and_then(|n| n.parse().ok())
                                .ok_or("bad GNU.sparse.map")?;
                            pax.sparse_map.push(n);
                        }
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        data = &data[len..];
    }
    Ok(())
}

/// Parses a PAX time such as `1700000000.123456789` or `-12.5` into seconds and nanoseconds.
pub fn parse_pax_time(value: &[u8]) -> Option<(i64, u32)> {
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

    fn block_with(field: Field, bytes: &[u8]) -> [u8; 512] {
        let mut b = [0u8; 512];
        let r = field.range();
        b[r.start..r.start + bytes.len()].copy_from_slice(bytes);
        b
    }

    #[test]
    fn numeric_fields_as_gnu_tar_reads_them() {
        let n = |bytes: &[u8]| number(&block_with(Field::Size, bytes), Field::Size);
        assert_eq!(n(b"00000001750\0"), Ok(1000));
        assert_eq!(n(b"     1750 \0"), Ok(1000));
        assert_eq!(n(b"1750"), Ok(1000));
        assert_eq!(n(b"\0\0\0\0\0\0\0\0\0\0\0\0"), Ok(0));
        // GNU tar reads past one leading NUL (Python's tarfile would say 0).
        assert_eq!(n(b"\x001750"), Ok(1000));
        assert_eq!(n(b"\x00\x001750"), Ok(0));
        assert_eq!(n(b"           "), Ok(0));
        assert_eq!(n(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0]), Ok(0x1000));
        assert!(n(b"12x4").unwrap_err().contains("not a number"));
        assert_eq!(n(b"17 5"), Ok(0o17));
        assert!(n(&[0xff; 12]).is_err());
        let mtime = |bytes: &[u8]| signed(&block_with(Field::Mtime, bytes), Field::Mtime);
        assert_eq!(mtime(&[0xff; 12]), Ok(-1));
        let mut before_1970 = [0xffu8; 12];
        before_1970[8..].copy_from_slice(&(-315_619_200i32).to_be_bytes());
        assert_eq!(mtime(&before_1970), Ok(-315_619_200));
    }

    #[test]
    fn pax_records_by_length() {
        let mut pax = Pax::default();
        let name = "dir/new\nline.txt";
        let record = |key: &str, value: &[u8]| {
            let body = [format!(" {key}=").as_bytes(), value, b"\n"].concat();
            let mut len = body.len() + 1;
            while len.to_string().len() + body.len() != len {
                len += 1;
            }
            [len.to_string().as_bytes(), &body].concat()
        };
        let mut data = record("path", name.as_bytes());
        data.extend(record("SCHILY.xattr.user.bin", b"\x00\n\xff=\n"));
        data.extend(record("mtime", b"1700000000.5"));
        data.extend([0u8; 100]);
        apply_pax(&mut pax, &data).unwrap();
        assert_eq!(pax.path.as_deref(), Some(name.as_bytes()));
        assert_eq!(pax.mtime, Some((1_700_000_000, 500_000_000)));
        let err = apply_pax(&mut Pax::default(), b"99 path=x\n").unwrap_err();
        assert!(err.contains("length"), "{err}");
    }

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
        let mut header = tar::Header::new_gnu();
        header.set_path("a/b.jpg").unwrap();
        header.set_size(10);
        header.set_cksum();
        let mut block: [u8; 512] = *header.as_bytes();
        assert!(verify_checksum(&block).is_ok());
        block[3] ^= 0x40;
        assert!(verify_checksum(&block).unwrap_err().contains("mismatch"));
    }
}
