//! Secrets out of text: every URL in a message or log line loses its userinfo and the values of
//! its query (a presigned S3 URL carries the access key id, a session token and a signature valid
//! for an hour; `https://user:pass@host/` a password). Applied where URLs are shown, and by the
//! log writers to every line, at every level, whatever crate wrote it.

use std::borrow::Cow;

/// What stands where a secret was.
pub const REDACTED: &str = "REDACTED";

/// `text` with the userinfo and query values of every URL in it replaced by `REDACTED`; borrowed
/// when there is nothing to hide (the common case costs one search for "://").
pub fn urls(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut changed = false;
    while let Some(at) = rest.find("://") {
        let (before, url_and_after) = rest.split_at(at + 3);
        out.push_str(before);
        // A URL ends at white space or a quote (as it stands in messages and in `Debug` output,
        // where quotes are escaped with a backslash), and after its userinfo at a bracket too: a
        // password may hold `[` or `?`, which must not end it early.
        let hard = url_and_after
            .find(|c: char| c.is_whitespace() || "\"'<>`\\".contains(c))
            .unwrap_or(url_and_after.len());
        let candidate = &url_and_after[..hard];
        let from = userinfo_end(candidate).map_or(0, |at| at + 1);
        let end = candidate[from..]
            .find(|c: char| "[]{}|^".contains(c))
            .map_or(hard, |at| from + at);
        let (url, after) = url_and_after.split_at(end);
        let cleaned = clean(url);
        changed |= cleaned != url;
        out.push_str(&cleaned);
        rest = after;
    }
    out.push_str(rest);
    match changed {
        true => Cow::Owned(out),
        false => Cow::Borrowed(text),
    }
}

/// One URL after its scheme's `://`: `user:pass@host/path?k=v#f` -> `REDACTED@host/path?k=REDACTED#f`.
fn clean(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let url = match userinfo_end(url) {
        Some(at) => {
            out.push_str(REDACTED);
            out.push('@');
            &url[at + 1..]
        }
        None => url,
    };
    let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
    let (authority, tail) = url.split_at(authority_end);
    out.push_str(authority);
    let (before_fragment, fragment) = match tail.find('#') {
        Some(at) => tail.split_at(at),
        None => (tail, ""),
    };
    match before_fragment.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((key, value)) if !value.is_empty() => {
                        out.push_str(key);
                        out.push('=');
                        out.push_str(REDACTED);
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        None => out.push_str(before_fragment),
    }
    out.push_str(fragment);
    out
}

/// Where the userinfo of a URL (after its `://`) ends: its `@`, if it has one. A password may
/// hold a `/`, `#`, `?` or `[` that a URL parser takes for the end of the host (AWS secret keys
/// often hold `/`; the parser's "invalid port number" then quotes the whole URL, and a glob's
/// error the whole pattern): so a `user:` before the first `@` makes that `@` the end too.
/// Hiding a little too much of a URL that holds both `:` and `@` is the price.
fn userinfo_end(url: &str) -> Option<usize> {
    let authority_end = url.find(['/', '?', '#', '[']).unwrap_or(url.len());
    if let Some(at) = url[..authority_end].rfind('@') {
        return Some(at);
    }
    let at = url.find('@')?;
    url[..at].contains(':').then_some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presigned_urls_and_passwords_are_hidden() {
        let line = "GET \"https://b.s3.example/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&\
                    X-Amz-Credential=AKIAEXAMPLE%2F20261124&X-Amz-Security-Token=tok&\
                    X-Amz-Signature=abc123\" failed";
        let clean = urls(line);
        for secret in ["AKIAEXAMPLE", "tok&", "abc123"] {
            assert!(!clean.contains(secret), "{clean}");
        }
        assert!(
            clean.contains("X-Amz-Signature=REDACTED\" failed"),
            "{clean}"
        );
        assert_eq!(
            urls("bad object URL \"https://user:secretpw@h:8/x.tar#f\": no"),
            "bad object URL \"https://REDACTED@h:8/x.tar#f\": no"
        );
        assert_eq!(urls("ftp://u@h"), "ftp://REDACTED@h");
        // A '/' or '#' in the password (AWS secret keys hold '/').
        assert_eq!(
            urls("invalid port number: https://AKIA:wJal/rXU#tn+F@s3.example:9000/b/k.tar?x=1"),
            "invalid port number: https://REDACTED@s3.example:9000/b/k.tar?x=REDACTED"
        );
        assert_eq!(urls("s3://AKIA:a/b/c@host/k"), "s3://REDACTED@host/k");
        // A '?' or '[' in the password, as a glob's error quotes the pattern.
        assert_eq!(
            urls("cannot expand \"https://u:pa?ss@h/t-*.tar\": no"),
            "cannot expand \"https://REDACTED@h/t-*.tar\": no"
        );
        assert_eq!(
            urls("bad pattern \"https://u:p[a]s@h/t-[0-9].tar\""),
            "bad pattern \"https://REDACTED@h/t-[0-9].tar\""
        );
        assert_eq!(urls("[http://h/x] y"), "[http://h/x] y");
        // '@' in a path alone (no 'user:' before it) is a path.
        assert_eq!(urls("https://h/a@b/c"), "https://h/a@b/c");
        // Escaped quotes in Debug output end the URL too.
        assert_eq!(
            urls(r#"\"http://h/p?a=1\" x"#),
            r#"\"http://h/p?a=REDACTED\" x"#
        );
    }

    #[test]
    fn text_without_secrets_is_not_copied() {
        for text in [
            "s3://bucket/train-000001.tar",
            "no url here",
            "http://h/a?flag",
            "x://",
        ] {
            assert!(matches!(urls(text), Cow::Borrowed(_)), "{text}");
        }
    }
}
