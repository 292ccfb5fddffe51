//! Member-name sanitizing shared by all formats: archive names are untrusted input.

use std::borrow::Cow;

/// Bytes of a name a message shows at most.
const SHOWN: usize = 160;

/// A name as a message shows it: quoted, at most `SHOWN` bytes of it and then its length. A
/// crafted name of any length would otherwise be copied whole into every warning (a 10 000-byte
/// one was).
pub fn shown(name: &[u8]) -> String {
    match name.get(..SHOWN) {
        Some(head) if name.len() > SHOWN => {
            format!(
                "{:?}... ({} bytes)",
                String::from_utf8_lossy(head),
                name.len()
            )
        }
        _ => format!("{:?}", String::from_utf8_lossy(name)),
    }
}

/// Why a member name was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadName {
    Nul,
    DotDot,
    EmptyComponent,
    TooLong,
}

/// The longest name component Linux accepts (NAME_MAX); GNU tar cannot extract longer ones
/// either ("File name too long"), and the kernel would never look one up.
pub const NAME_MAX: usize = 255;

impl std::fmt::Display for BadName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BadName::Nul => "name contains a NUL byte",
            BadName::DotDot => "name has a '..' component",
            BadName::EmptyComponent => "name has an empty component",
            BadName::TooLong => "a name component is longer than 255 bytes (NAME_MAX)",
        })
    }
}

/// Normalizes an archive member name into a relative path of plain components joined by `/`.
///
/// Leading `/` and `.` components are dropped (as GNU tar does when extracting), one trailing `/`
/// (directory members) is accepted. `..`, empty inner components (`a//b`) and NUL bytes are refused:
/// such a member would escape or alias the tree; so are components longer than `NAME_MAX`. The
/// empty result is the root directory.
pub fn sanitize(raw: &[u8]) -> Result<Cow<'_, [u8]>, BadName> {
    if raw.contains(&0) {
        return Err(BadName::Nul);
    }
    let mut rest = raw;
    while let [b'/', tail @ ..] = rest {
        rest = tail;
    }
    if let [head @ .., b'/'] = rest {
        rest = head;
    }
    if rest.is_empty() {
        return Ok(Cow::Borrowed(rest));
    }
    let mut clean = true;
    for comp in rest.split(|&b| b == b'/') {
        match comp {
            b"" => return Err(BadName::EmptyComponent),
            b".." => return Err(BadName::DotDot),
            b"." => clean = false,
            _ if comp.len() > NAME_MAX => return Err(BadName::TooLong),
            _ => {}
        }
    }
    if clean {
        return Ok(Cow::Borrowed(rest));
    }
    let mut out = Vec::with_capacity(rest.len());
    for comp in rest.split(|&b| b == b'/').filter(|c| *c != b".") {
        if !out.is_empty() {
            out.push(b'/');
        }
        out.extend_from_slice(comp);
    }
    Ok(Cow::Owned(out))
}

/// The key of a member path: the directory and the base name up to its first dot (`a/b/x.jpg`,
/// `a/b/x.seg.png` -> `a/b/x`), as WebDataset groups a sample's files.
pub fn key_of(path: &[u8]) -> &[u8] {
    let base = path.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
    match path[base..].iter().position(|&b| b == b'.') {
        // A name that starts with a dot (`.hidden`) is a key of its own.
        Some(0) | None => path,
        Some(dot) => &path[..base + dot],
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_name_is_shown_cut_with_its_length() {
        assert_eq!(super::shown(b"a/b.jpg"), "\"a/b.jpg\"");
        let long = vec![b'x'; 10_000];
        let said = super::shown(&long);
        assert!(
            said.len() < 200 && said.ends_with("... (10000 bytes)"),
            "{said}"
        );
    }

    use super::*;

    #[test]
    fn keys_follow_webdataset() {
        assert_eq!(key_of(b"a/b/x.jpg"), b"a/b/x");
        assert_eq!(key_of(b"a/b/x.seg.png"), b"a/b/x");
        assert_eq!(key_of(b"a.d/x"), b"a.d/x");
        assert_eq!(key_of(b"noext"), b"noext");
        assert_eq!(key_of(b"dir/.hidden"), b"dir/.hidden");
    }

    fn ok(raw: &str) -> String {
        String::from_utf8(sanitize(raw.as_bytes()).unwrap().into_owned()).unwrap()
    }

    #[test]
    fn strips_leading_slash_and_dot() {
        assert_eq!(ok("/abs/file"), "abs/file");
        assert_eq!(ok("///abs"), "abs");
        assert_eq!(ok("./a/b"), "a/b");
        assert_eq!(ok("./"), "");
        assert_eq!(ok("."), "");
        assert_eq!(ok("dir/"), "dir");
        assert_eq!(ok("a/./b"), "a/b");
        assert_eq!(ok("plain name.jpg"), "plain name.jpg");
    }

    #[test]
    fn refuses_unsafe_names() {
        assert_eq!(sanitize(b"../evil"), Err(BadName::DotDot));
        assert_eq!(sanitize(b"a/../../evil"), Err(BadName::DotDot));
        assert_eq!(sanitize(b"a//b"), Err(BadName::EmptyComponent));
        assert_eq!(sanitize(b"a\0b"), Err(BadName::Nul));
        assert!(sanitize(&[b'x'; 255]).is_ok());
        let long = [&b"dir/"[..], &[b'y'; 256]].concat();
        assert_eq!(sanitize(&long), Err(BadName::TooLong));
    }
}
