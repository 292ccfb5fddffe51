//! `packfs ls`

use std::borrow::Cow;
use std::io::{IsTerminal, Write};

use packfs::catalog::{Kind, ROOT};

use super::args::{Images, Merge};
use super::progress::ScanBar;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    images: Images,
    /// Long listing: mode, size, mtime, path, symlink target.
    #[arg(short, long)]
    long: bool,
    /// Show where each file's bytes lie: image, encoding and byte offsets (squashfs: the first
    /// and end offsets of its data blocks, and its tail's fragment block).
    #[arg(long)]
    extents: bool,
    /// End each line with a NUL byte instead of a newline, names as stored (for `xargs -0` and
    /// scripts; names may hold newlines).
    #[arg(short = '0', long = "null")]
    null: bool,
    #[command(flatten)]
    merge: Merge,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let bar = ScanBar::new();
    let catalog = packfs::dataset::open(&args.images.images, &args.merge.options(), &|p| {
        bar.update(p)
    })?;
    drop(bar);
    // On a terminal, names with control characters are quoted as GNU ls quotes them, so that a
    // name cannot forge lines or send escape sequences to the terminal.
    let quote = !args.null && std::io::stdout().is_terminal();
    let shown = |name: &[u8]| -> Vec<u8> {
        if quote {
            shell_quoted(name).into_owned()
        } else {
            name.to_vec()
        }
    };
    let end: &[u8] = if args.null { b"\0" } else { b"\n" };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for id in catalog.walk(ROOT) {
        let e = catalog.entry(id)?;
        let path = shown(&catalog.path_of(id));
        if args.long {
            let kind = match e.kind() {
                Kind::Dir => 'd',
                Kind::File => '-',
                Kind::Symlink => 'l',
            };
            let size = if e.is_dir() { 0 } else { e.size };
            write!(
                out,
                "{kind}{:04o} {size:>12} {:>11} ",
                e.permissions(),
                e.mtime
            )?;
        }
        out.write_all(&path)?;
        if args.long && e.kind() == Kind::Symlink {
            out.write_all(b" -> ")?;
            out.write_all(&shown(catalog.symlink_target(e)?))?;
        }
        if args.extents && e.kind() == Kind::File {
            let layout = catalog.layout(e)?;
            let image = catalog.images()[e.image as usize].path.display();
            write!(out, "\t{image} {layout}")?;
        }
        out.write_all(end)?;
    }
    out.flush()?;
    Ok(())
}

/// `name` as GNU ls shows it on a terminal (its shell-escape style) when it holds control
/// characters or bytes that are not UTF-8: printable runs in single quotes, the rest as `$'\n'`
/// or `$'\377'`; unchanged otherwise.
fn shell_quoted(name: &[u8]) -> Cow<'_, [u8]> {
    let plain = std::str::from_utf8(name).is_ok_and(|s| !s.chars().any(char::is_control));
    if plain {
        return Cow::Borrowed(name);
    }
    let mut out = String::new();
    let mut quoted = false;
    let literal = |out: &mut String, quoted: &mut bool, c: char| {
        if !*quoted {
            out.push('\'');
            *quoted = true;
        }
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    };
    let escaped = |out: &mut String, quoted: &mut bool, b: u8| {
        if *quoted {
            out.push('\'');
            *quoted = false;
        }
        let e = match b {
            b'\x07' => "\\a".to_string(),
            b'\x08' => "\\b".to_string(),
            b'\t' => "\\t".to_string(),
            b'\n' => "\\n".to_string(),
            b'\x0b' => "\\v".to_string(),
            b'\x0c' => "\\f".to_string(),
            b'\r' => "\\r".to_string(),
            _ => format!("\\{b:03o}"),
        };
        out.push_str(&format!("$'{e}'"));
    };
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() {
                let mut buf = [0u8; 4];
                for &b in c.encode_utf8(&mut buf).as_bytes() {
                    escaped(&mut out, &mut quoted, b);
                }
            } else {
                literal(&mut out, &mut quoted, c);
            }
        }
        for &b in chunk.invalid() {
            escaped(&mut out, &mut quoted, b);
        }
    }
    if quoted {
        out.push('\'');
    }
    Cow::Owned(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::shell_quoted;

    fn q(name: &[u8]) -> String {
        String::from_utf8(shell_quoted(name).into_owned()).unwrap()
    }

    #[test]
    fn control_characters_are_quoted_as_gnu_ls_does() {
        assert_eq!(q(b"train/a b.jpg"), "train/a b.jpg");
        assert_eq!(q("é.txt".as_bytes()), "é.txt");
        assert_eq!(q(b"x\n/etc/passwd"), "'x'$'\\n''/etc/passwd'");
        assert_eq!(q(b"\x1b[31mred"), "$'\\033''[31mred'");
        assert_eq!(q(b"caf\xe9's"), "'caf'$'\\351''\'\\'\'s'");
    }
}
