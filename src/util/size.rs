//! Byte sizes given by users (options, environment): `512M`, `2G`, `1.5GiB`, `0`, or plain bytes;
//! K, M, G and T are powers of 1024 (as in `--cache-size 64M`), parsed exactly by parse-size.

/// Parses a byte count with an optional binary suffix (K, M, G, T; `iB`/`B` accepted).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text.trim())
        .map_err(|e| match e {
            parse_size::Error::PosOverflow => {
                format!("{text:?} is out of range")
            }
            _ => format!(
                "{text:?} is not a size: a number with an optional size suffix (K, M, G or T), \
                 e.g. 512M, 2G, 0"
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("0"), Ok(0));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1.5g"), Ok(3 << 29));
        assert!(parse_bytes("12Q").unwrap_err().contains("suffix"));
        assert!(parse_bytes("lots").is_err());
    }
}
