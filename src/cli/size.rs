//! Byte sizes on the command line: `512M`, `2G`, `1.5GiB`, `0`, or plain bytes.

/// Parses a byte count with an optional binary suffix (K, M, G, T; `iB`/`B` accepted).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let scale: u64 = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size suffix {other:?} in {text:?} (use K, M, G or T)"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (examples: 512M, 2G, 0)"))?;
    let bytes = value * scale as f64;
    if !(0.0..1.8e19).contains(&bytes) {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as u64)
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
