//! GNU sparse members, as GNU tar writes them: the old 'S' type with its map in the header and in
//! extension blocks, and the PAX formats 0.0 (`offset`/`numbytes` records), 0.1 (`map`) and 1.0
//! (the map in decimal lines at the start of the member's data).

use super::fields::{Pax, unsigned_at};

const BLOCK: u64 = 512;
/// A 1.0 map larger than this is treated as damage.
const MAX_MAP: usize = 16 << 20;

/// A sparse member's map: (file offset, length) of each data segment, the file's real size, where
/// the stored data starts and how many bytes are stored there.
pub struct Map {
    pub segments: Vec<(u64, u64)>,
    pub size: u64,
    pub data_at: u64,
    pub stored: u64,
}

/// Reads (offset, numbytes) pairs of 12-byte octal fields from `area`, stopping at an empty one.
fn pairs(area: &[u8], into: &mut Vec<(u64, u64)>) -> Result<(), String> {
    for pair in area.chunks_exact(24) {
        if pair[0] == 0 {
            break;
        }
        into.push((unsigned_at(&pair[..12])?, unsigned_at(&pair[12..])?));
    }
    Ok(())
}

/// The map of an old GNU 'S' member whose header is `header` and whose extension blocks (if any)
/// start at `at`; `read(at)` gives the 512 bytes there (`None` past the end). Returns the map and where the data starts.
pub fn old_gnu(
    header: &[u8; 512],
    mut at: u64,
    mut read: impl FnMut(u64) -> std::io::Result<Option<Vec<u8>>>,
) -> Result<(Map, u64), String> {
    let mut segments = Vec::new();
    pairs(&header[386..482], &mut segments)?;
    let size = unsigned_at(&header[483..495])?;
    let stored = unsigned_at(&header[124..136])?;
    let mut extended = header[482] != 0;
    while extended {
        let ext = read(at)
            .map_err(|e| e.to_string())?
            .ok_or("the sparse map's extension blocks run past the end of the file")?;
        pairs(&ext[..504], &mut segments)?;
        extended = ext[504] != 0;
        at += BLOCK;
    }
    let map = Map {
        segments,
        size,
        data_at: at,
        stored,
    };
    Ok((map, at))
}

/// The map of a PAX sparse member whose data (`size` bytes, the map included for 1.0) starts at
/// `data_at`; `read(n)` gives its first `n` bytes.
pub fn from_pax(
    pax: &Pax,
    data_at: u64,
    size: u64,
    read: impl FnOnce(usize) -> std::io::Result<Vec<u8>>,
) -> Result<Map, String> {
    let real = pax.sparse_size.ok_or("no GNU.sparse.size or realsize")?;
    if pax.sparse_major == Some(1) {
        let head = read((size as usize).min(MAX_MAP)).map_err(|e| e.to_string())?;
        let (numbers, used) = decimal_lines(&head)?;
        let map_len = (used as u64).div_ceil(BLOCK) * BLOCK;
        if map_len > size {
            return Err("the sparse map runs past the member's data".into());
        }
        return Ok(Map {
            segments: numbers.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
            size: real,
            data_at: data_at + map_len,
            stored: size - map_len,
        });
    }
    if !pax.sparse_map.len().is_multiple_of(2) {
        return Err("an odd number of sparse map values".into());
    }
    Ok(Map {
        segments: pax
            .sparse_map
            .chunks_exact(2)
            .map(|p| (p[0], p[1]))
            .collect(),
        size: real,
        data_at,
        stored: size,
    })
}

/// The 1.0 map: a count, then that many offset/length pairs, one decimal number per line.
/// Returns the pairs' numbers and the bytes the map takes.
fn decimal_lines(data: &[u8]) -> Result<(Vec<u64>, usize), String> {
    let mut at = 0;
    let mut next = || -> Result<u64, String> {
        let end = data[at..]
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("the sparse map is cut short")?;
        let n = std::str::from_utf8(&data[at..at + end])
            .ok()
            .and_then(|n| n.parse().ok())
            .ok_or("a sparse map line is not a number")?;
        at += end + 1;
        Ok(n)
    };
    let count = next()?;
    if count > (MAX_MAP / 4) as u64 {
        return Err(format!("{count} sparse segments is implausible"));
    }
    let numbers = (0..count * 2)
        .map(|_| next())
        .collect::<Result<Vec<_>, _>>()?;
    Ok((numbers, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_maps() {
        let (n, used) = decimal_lines(b"2\n0\n10\n4096\n5\nrest").unwrap();
        assert_eq!((n, used), (vec![0, 10, 4096, 5], 14));
        assert!(decimal_lines(b"2\n0\n10\n40").is_err());
        assert!(decimal_lines(b"99999999999\n").is_err());
    }
}
