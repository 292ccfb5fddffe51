//! `packfs ls`

use std::borrow::Cow;
use std::io::{IsTerminal, Write};

use crate::catalog::{Kind, ROOT};

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
    /// JSON lines for programs: a head, the images, then every entry with its mode, mtime, size,
    /// image and offset (names as stored; the format is in docs/configuration.md).
    #[arg(long, conflicts_with_all = ["long", "extents", "null"])]
    json: bool,
    /// With --json: the share (0..N) of each image when N nodes stage N shares, by the rule
    /// `--stage-share K/N` stages by.
    #[arg(long, value_name = "N", requires = "json", value_parser = clap::value_parser!(u32).range(1..))]
    shares: Option<u32>,
    #[command(flatten)]
    merge: Merge,
}

pub fn run(args: Args, stores: &crate::source::Stores) -> anyhow::Result<()> {
    let bar = ScanBar::new();
    let catalog = crate::dataset::open(&args.images.images, &args.merge.options(), stores, &|p| {
        bar.update(p)
    })?;
    drop(bar);
    if args.json {
        let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
        super::ls_json::write(&catalog, args.shares, &mut out)?;
        out.flush()?;
        return Ok(());
    }
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
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
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
                "{kind}{} {size:>12} {} ",
                symbolic(e.permissions()),
                ls_date(e.mtime, now)
            )?;
        }
        out.write_all(&path)?;
        if args.long && e.kind() == Kind::Symlink {
            out.write_all(b" -> ")?;
            out.write_all(&shown(catalog.symlink_target(e)?))?;
        }
        if args.extents && e.kind() == Kind::File {
            let placement = catalog.placement(e)?;
            let image = catalog.images()[e.image as usize].path().display();
            write!(out, "\t{image} {placement}")?;
        }
        out.write_all(end)?;
    }
    out.flush()?;
    Ok(())
}

/// `rwxr-xr-x` for mode bits (with setuid, setgid and sticky as ls shows them).
fn symbolic(mode: u16) -> String {
    let bit = |mask: u16, c: char| if mode & mask != 0 { c } else { '-' };
    let special = |exec: bool, set: bool, on: char, off: char| match (exec, set) {
        (true, true) => on,
        (false, true) => off,
        (true, false) => 'x',
        (false, false) => '-',
    };
    [
        bit(0o400, 'r'),
        bit(0o200, 'w'),
        special(mode & 0o100 != 0, mode & 0o4000 != 0, 's', 'S'),
        bit(0o040, 'r'),
        bit(0o020, 'w'),
        special(mode & 0o010 != 0, mode & 0o2000 != 0, 's', 'S'),
        bit(0o004, 'r'),
        bit(0o002, 'w'),
        special(mode & 0o001 != 0, mode & 0o1000 != 0, 't', 'T'),
    ]
    .iter()
    .collect()
}

/// A modification time as `ls -l` shows it, in local time: `Nov 23 07:15` within six months of
/// `now`, `Nov 23  2024` otherwise.
fn ls_date(mtime: i64, now: i64) -> String {
    const SIX_MONTHS: i64 = 183 * 24 * 3600;
    let recent = (now - SIX_MONTHS..=now + 3600).contains(&mtime);
    let format = if recent { c"%b %e %H:%M" } else { c"%b %e  %Y" };
    let t: libc::time_t = mtime as libc::time_t;
    // SAFETY: localtime_r fills the zeroed struct we own; strftime writes at most buf.len()
    // bytes and returns how many.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return mtime.to_string();
        }
        let mut buf = [0u8; 64];
        let n = libc::strftime(buf.as_mut_ptr().cast(), buf.len(), format.as_ptr(), &tm);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }
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
    use super::{ls_date, shell_quoted, symbolic};

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

    #[test]
    fn long_listing_shows_modes_and_dates_as_ls_does() {
        assert_eq!(symbolic(0o644), "rw-r--r--");
        assert_eq!(symbolic(0o4755), "rwsr-xr-x");
        assert_eq!(symbolic(0o1777), "rwxrwxrwt");
        assert_eq!(symbolic(0o2640), "rw-r-S---");
        let now = 1_795_400_000;
        let recent = ls_date(now - 3600, now);
        assert!(recent.contains(':'), "{recent}");
        let old = ls_date(1_000_000_000, now);
        assert!(old.ends_with("2001"), "{old}");
    }
}
