//! Image arguments as WebDataset users write them: brace ranges (`train-{000000..000127}.tar`),
//! brace lists (`{train,val}.tar`) and globs (`shards/*.tar`), expanded by packfs itself because job
//! scripts quote them.

use std::path::PathBuf;

use crate::source::{ImageLocation, Stores};

/// A pattern that cannot be expanded.
#[derive(Debug, thiserror::Error)]
pub enum ExpandError {
    #[error("bad pattern {pattern:?}: {error}")]
    BadPattern {
        pattern: String,
        error: glob::PatternError,
    },
    #[error("cannot expand {pattern:?}: {error}")]
    Unreadable {
        pattern: String,
        error: glob::GlobError,
    },
    #[error("cannot expand {pattern:?}: {error}")]
    Remote {
        pattern: String,
        error: std::io::Error,
    },
    #[error("no file matches {0:?}")]
    NoMatch(String),
    #[error("bad step in range {{{0}}}")]
    BadStep(String),
    #[error("range {{{range}}} has {count} items")]
    TooLarge { range: String, count: u64 },
}

/// Expands every pattern, in order. A glob that matches nothing is an error; a plain path is kept
/// as is (a missing file is reported when it is opened, with its name).
pub fn expand_images(patterns: &[String], stores: &Stores) -> Result<Vec<PathBuf>, ExpandError> {
    let mut out = Vec::new();
    for pattern in patterns {
        for word in expand_braces(pattern)? {
            if ImageLocation::names_object(&word) {
                // A URL is never a local glob; an s3:// glob is expanded by listing the bucket.
                if word.contains(['*', '?', '[']) {
                    let matched =
                        crate::source::remote::expand_glob(stores, &word).map_err(|error| {
                            ExpandError::Remote {
                                pattern: word.clone(),
                                error,
                            }
                        })?;
                    if matched.is_empty() {
                        return Err(ExpandError::NoMatch(word));
                    }
                    out.extend(matched);
                } else {
                    out.push(PathBuf::from(word));
                }
            } else if word.contains(['*', '?', '[']) {
                let mut matched: Vec<PathBuf> = glob::glob(&word)
                    .map_err(|error| ExpandError::BadPattern {
                        pattern: word.clone(),
                        error,
                    })?
                    .collect::<Result<_, _>>()
                    .map_err(|error| ExpandError::Unreadable {
                        pattern: word.clone(),
                        error,
                    })?;
                if matched.is_empty() {
                    return Err(ExpandError::NoMatch(word));
                }
                matched.sort();
                out.append(&mut matched);
            } else {
                out.push(PathBuf::from(word));
            }
        }
    }
    Ok(out)
}

/// Bash-style brace expansion: `{a,b}` alternatives and `{000..127}` / `{0..10..2}` ranges, zero
/// padded when either bound is. Braces nest and several groups multiply out.
pub fn expand_braces(word: &str) -> Result<Vec<String>, ExpandError> {
    let Some((open, close)) = first_group(word) else {
        return Ok(vec![word.to_string()]);
    };
    let (prefix, body, suffix) = (&word[..open], &word[open + 1..close], &word[close + 1..]);
    let alternatives = match range(body)? {
        Some(items) => items,
        None => {
            let parts = split_top_level(body);
            if parts.len() < 2 {
                // `{x}` is literal in bash too; keep it and expand what follows.
                let rest = expand_braces(suffix)?;
                return Ok(rest
                    .into_iter()
                    .map(|r| format!("{prefix}{{{body}}}{r}"))
                    .collect());
            }
            let mut items = Vec::new();
            for part in parts {
                items.extend(expand_braces(part)?);
            }
            items
        }
    };
    let tails = expand_braces(suffix)?;
    let mut out = Vec::with_capacity(alternatives.len() * tails.len());
    for alt in &alternatives {
        for tail in &tails {
            out.push(format!("{prefix}{alt}{tail}"));
        }
    }
    Ok(out)
}

/// The byte positions of the first top-level `{` and its matching `}`.
fn first_group(word: &str) -> Option<(usize, usize)> {
    let open = word.find('{')?;
    let mut depth = 0;
    for (i, c) in word[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((open, open + i));
                }
            }
            _ => {}
        }
    }
    None
}

fn split_top_level(body: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&body[start..]);
    parts
}

/// Brace patterns that expand back to `paths`, in order: paths that differ only by a number
/// counting up by one (`train-000000.tar`, `train-000001.tar`, ...) become one
/// `train-{000000..000127}.tar`. For commands in messages: a rebuild command that names every
/// one of 1024 shards helps nobody.
pub fn as_patterns(paths: &[PathBuf]) -> Vec<String> {
    // (head, digits, tail) of each path: the last run of digits in its file name.
    let split = |p: &PathBuf| {
        let s = p.to_string_lossy().into_owned();
        let name_start = s.rfind('/').map_or(0, |i| i + 1);
        let end = s[name_start..]
            .rfind(|c: char| c.is_ascii_digit())
            .map(|i| name_start + i + 1);
        match end {
            Some(end) => {
                let start = s[..end]
                    .rfind(|c: char| !c.is_ascii_digit())
                    .map_or(0, |i| i + 1)
                    .max(name_start);
                (
                    s[..start].to_string(),
                    s[start..end].to_string(),
                    s[end..].to_string(),
                )
            }
            None => (s, String::new(), String::new()),
        }
    };
    let mut out: Vec<String> = Vec::new();
    // The run being built: head, first digits, last digits, last number, tail.
    let mut run: Option<(String, String, String, u64, String)> = None;
    let finish = |run: (String, String, String, u64, String), out: &mut Vec<String>| {
        let (head, first, last, _, tail) = run;
        if first == last {
            out.push(format!("{head}{first}{tail}"));
        } else {
            out.push(format!("{head}{{{first}..{last}}}{tail}"));
        }
    };
    for p in paths {
        let (head, digits, tail) = split(p);
        let number = digits.parse::<u64>().ok().filter(|_| digits.len() <= 18);
        let extends = match (&run, number) {
            (Some((h, f, _, n, t)), Some(k)) => {
                *h == head && *t == tail && f.len() == digits.len() && k == n + 1
            }
            _ => false,
        };
        if extends {
            let r = run.as_mut().expect("a run");
            r.2 = digits;
            r.3 += 1;
            continue;
        }
        if let Some(done) = run.take() {
            finish(done, &mut out);
        }
        match number {
            Some(n) => run = Some((head, digits.clone(), digits, n, tail)),
            None => out.push(format!("{head}{digits}{tail}")),
        }
    }
    if let Some(done) = run {
        finish(done, &mut out);
    }
    out
}

/// `first..last[..step]` with integer bounds, or `None` if `body` is not a range.
fn range(body: &str) -> Result<Option<Vec<String>>, ExpandError> {
    let parts: Vec<&str> = body.split("..").collect();
    if !(2..=3).contains(&parts.len()) {
        return Ok(None);
    }
    let num = |s: &str| s.parse::<i64>().ok();
    let (Some(first), Some(last)) = (num(parts[0]), num(parts[1])) else {
        return Ok(None);
    };
    let step = match parts.get(2) {
        Some(s) => match num(s) {
            Some(0) | None => return Err(ExpandError::BadStep(body.to_string())),
            Some(s) => s.unsigned_abs() as i64,
        },
        None => 1,
    };
    let padded =
        |s: &str| s.trim_start_matches('-').len() > 1 && s.trim_start_matches('-').starts_with('0');
    let width = if padded(parts[0]) || padded(parts[1]) {
        parts[0].len().max(parts[1].len())
    } else {
        0
    };
    let count = (first - last).unsigned_abs() / step as u64 + 1;
    if count > 10_000_000 {
        return Err(ExpandError::TooLarge {
            range: body.to_string(),
            count,
        });
    }
    let dir = if last >= first { step } else { -step };
    Ok(Some(
        (0..count as i64)
            .map(|k| format!("{:0width$}", first + k * dir, width = width))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_fold_into_brace_ranges_that_expand_back() {
        let paths: Vec<PathBuf> = [
            "/d/train-000008.tar",
            "/d/train-000009.tar",
            "/d/train-000010.tar",
            "/d/train-000011.tar",
            "/d/val-7.tar",
            "/d/val-9.tar",
            "/d/extra.zip",
            "/d9/x.tar",
            "/d/99.tar",
            "/d/100.tar",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let patterns = as_patterns(&paths);
        assert_eq!(
            patterns,
            [
                "/d/train-{000008..000011}.tar",
                "/d/val-7.tar",
                "/d/val-9.tar",
                "/d/extra.zip",
                "/d9/x.tar",
                "/d/99.tar",
                "/d/100.tar"
            ]
        );
        let back: Vec<PathBuf> = patterns
            .iter()
            .flat_map(|p| expand_braces(p).unwrap())
            .map(PathBuf::from)
            .collect();
        assert_eq!(back, paths);
    }

    fn ex(w: &str) -> Vec<String> {
        expand_braces(w).unwrap()
    }

    #[test]
    fn ranges_keep_zero_padding() {
        assert_eq!(
            ex("train-{000000..000002}.tar"),
            ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
        );
        assert_eq!(ex("s{8..11}"), ["s8", "s9", "s10", "s11"]);
        assert_eq!(ex("s{3..1}"), ["s3", "s2", "s1"]);
        assert_eq!(ex("s{0..6..3}"), ["s0", "s3", "s6"]);
        assert_eq!(ex("{08..10}"), ["08", "09", "10"]);
    }

    #[test]
    fn lists_nest_and_multiply() {
        assert_eq!(
            ex("{train,val}-{0..1}.tar"),
            ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]
        );
        assert_eq!(ex("{a,b{1,2}}"), ["a", "b1", "b2"]);
        assert_eq!(ex("plain.tar"), ["plain.tar"]);
        assert_eq!(ex("odd{x}.tar"), ["odd{x}.tar"]);
        assert_eq!(ex("open{.tar"), ["open{.tar"]);
    }

    #[test]
    fn globs_must_match() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["b.tar", "a.tar", "c.txt"] {
            std::fs::write(dir.path().join(n), b"").unwrap();
        }
        let pat = format!("{}/*.tar", dir.path().display());
        let got = expand_images(&[pat], &Stores::default()).unwrap();
        assert_eq!(got, [dir.path().join("a.tar"), dir.path().join("b.tar")]);
        let none = format!("{}/*.zip", dir.path().display());
        assert!(
            expand_images(&[none], &Stores::default())
                .unwrap_err()
                .to_string()
                .contains("no file matches")
        );
    }
}
