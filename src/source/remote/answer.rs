//! What a store's answer to a ranged GET must say of the object before its body is taken: the
//! range asked for, and the same object as when it was opened (its size, its ETag). A store or
//! proxy that ignores If-Match answers a replaced object with its new bytes: compared here,
//! they are refused instead of served.

use std::io;

use super::client::ObjectMeta;
use super::location::Location;

/// Checks the headers of an answer to a GET of bytes `offset..=last` of the object at `loc`,
/// opened as `opened`: `partial` for a 206 (a 200 is the whole object, checked by the caller).
pub fn check_range(
    loc: &Location,
    headers: &ureq::http::HeaderMap,
    partial: bool,
    (offset, last): (u64, u64),
    opened: Option<&ObjectMeta>,
) -> io::Result<()> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if partial {
        let range = header("content-range").unwrap_or("");
        // A server (or a proxy) answering another range than asked would serve other bytes
        // as these.
        if !range.starts_with(&format!("bytes {offset}-{last}/")) {
            return Err(io::Error::other(format!(
                "{loc}: asked for bytes {offset}-{last}, the server answered Content-Range \
                 {range:?}"
            )));
        }
        let total = range.rsplit('/').next().and_then(|t| t.parse::<u64>().ok());
        if let (Some(opened), Some(total)) = (opened, total)
            && total != opened.size
        {
            return Err(replaced(
                loc,
                &format!(
                    "its size is {total} bytes, it was {} when opened",
                    opened.size
                ),
            ));
        }
    }
    let want = opened.and_then(|m| m.etag.as_deref());
    if let (Some(want), Some(got)) = (want, header("etag"))
        && !same_etag(want, got)
    {
        return Err(replaced(
            loc,
            &format!("the answer's ETag is {got}, it was {want} when opened"),
        ));
    }
    Ok(())
}

/// The error for an object replaced since it was opened: its files fail from then on.
pub fn replaced(loc: &Location, how: &str) -> io::Error {
    io::Error::other(format!(
        "{loc} was replaced since it was opened ({how}); its files fail until it is indexed \
         and mounted again"
    ))
}

/// Whether two ETags name the same version: a weak validator (`W/"x"`) matches its strong form,
/// as a proxy may weaken the ETag of what it passes on.
fn same_etag(a: &str, b: &str) -> bool {
    let strong = |t: &str| t.trim().trim_start_matches("W/").to_string();
    strong(a) == strong(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weak_etags_match_their_strong_form_and_other_versions_do_not() {
        assert!(same_etag("\"abc\"", "W/\"abc\""));
        assert!(!same_etag("\"abc\"", "\"abd\""));
    }
}
