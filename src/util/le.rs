//! Little-endian fields of byte records: the index, catalog records, squashfs and gzip structures,
//! checkpoint tables, the staging progress file and the FUSE wire format all read and write them.
//! The caller has checked the record's length; a field outside it is a bug (a panic, which costs
//! one request where it happens under `fs::error::guarded`).

#[inline]
pub fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

#[inline]
pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

#[inline]
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

#[inline]
pub fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_as_written() {
        let mut b = [0u8; 16];
        put16(&mut b, 0, 0x0102);
        put32(&mut b, 2, 0x0304_0506);
        put64(&mut b, 6, 0x0708_090a_0b0c_0d0e);
        assert_eq!(b[0], 0x02, "little-endian");
        assert_eq!(u16_at(&b, 0), 0x0102);
        assert_eq!(u32_at(&b, 2), 0x0304_0506);
        assert_eq!(u64_at(&b, 6), 0x0708_090a_0b0c_0d0e);
    }
}
