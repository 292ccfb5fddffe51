//! Image locations that are URLs: `s3://bucket/key`, `http://host/path`, `https://host/path`.
//!
//! Images and indexes are named by `PathBuf` everywhere (catalog, index, messages); a URL is kept
//! in one as its text, and this module tells the two apart and parses the URL form.

use std::fmt;
use std::path::Path;

/// Where an object is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    S3 { bucket: String, key: String },
    Http(url::Url),
}

/// True if `path` is written as an object URL rather than a file path.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(looks_like_url)
}

fn looks_like_url(s: &str) -> bool {
    // `get`, not slicing: a path's non-ASCII character may straddle the scheme's length.
    ["s3://", "http://", "https://"].iter().any(|scheme| {
        s.len() > scheme.len()
            && s.get(..scheme.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(scheme))
    })
}

/// Query keys that sign a URL (besides S3's `X-Amz-*` and Google's `X-Goog-*`).
const SIGNING_KEYS: [&str; 5] = [
    "signature",
    "sig",
    "token",
    "awsaccesskeyid",
    "access_token",
];

/// A URL that cannot name an object.
#[derive(Debug, thiserror::Error)]
#[error("bad object URL {:?}: {why}", crate::util::redact::urls(url))]
pub struct BadUrl {
    pub url: String,
    pub why: String,
}

impl Location {
    /// Parses `s3://bucket/key` or an http(s) URL. Credentials in an http URL are refused: they
    /// would be recorded in the index and shown in every message.
    pub fn parse(text: &str) -> Result<Location, BadUrl> {
        let bad = |why: &str| BadUrl {
            url: text.to_string(),
            why: why.to_string(),
        };
        if !looks_like_url(text) {
            return Err(bad("expected s3://BUCKET/KEY or http(s)://HOST/PATH"));
        }
        if text[..5].eq_ignore_ascii_case("s3://") {
            let rest = &text[5..];
            let (bucket, key) = rest
                .split_once('/')
                .ok_or_else(|| bad("no key after the bucket"))?;
            if bucket.is_empty() || key.is_empty() {
                return Err(bad("the bucket and the key must not be empty"));
            }
            return Ok(Location::S3 {
                bucket: bucket.to_string(),
                key: key.to_string(),
            });
        }
        let url = url::Url::parse(text).map_err(|e| bad(&e.to_string()))?;
        if url.host_str().is_none() {
            return Err(bad("no host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(bad(
                "credentials in the URL would be recorded in the index and in logs; serve the \
                 shards through s3:// with AWS_* credentials instead",
            ));
        }
        // A presigned URL (S3's X-Amz-*, Google's X-Goog-*, an Azure SAS `sig`) is a
        // credential too, and one that expires: the index would keep it, and every mount of
        // the index would fail once it has.
        let signed = url.query_pairs().any(|(key, _)| {
            let key = key.to_ascii_lowercase();
            SIGNING_KEYS.contains(&key.as_str())
                || key.starts_with("x-amz-")
                || key.starts_with("x-goog-")
        });
        if signed {
            return Err(bad(
                "a presigned URL carries credentials that would be recorded in the index and \
                 expire; give s3://BUCKET/KEY with AWS_* credentials (or an --endpoint-url) \
                 instead",
            ));
        }
        Ok(Location::Http(url))
    }

    /// A short name for counters: `s3://bucket` or `http://host:port`.
    pub fn store(&self) -> String {
        match self {
            Location::S3 { bucket, .. } => format!("s3://{bucket}"),
            Location::Http(url) => {
                let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
                format!(
                    "{}://{}{port}",
                    url.scheme(),
                    url.host_str().unwrap_or_default()
                )
            }
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::S3 { bucket, key } => write!(f, "s3://{bucket}/{key}"),
            // A URL given with a query (a presigned one) shows none of its values.
            Location::Http(url) => f.write_str(&crate::util::redact::urls(url.as_str())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths_are_told_apart() {
        assert!(is_url(Path::new("s3://b/k.tar")));
        assert!(is_url(Path::new("HTTPS://h/x")));
        assert!(!is_url(Path::new("s3:/b/k")));
        assert!(!is_url(Path::new("/data/s3://x")));
        assert!(!is_url(Path::new("http://")));
        // Multi-byte characters across the 5th, 7th or 8th byte (once a panic).
        for path in [
            "/data/é.tar",
            "abcd€.tar",
            "/home/zoë/x.tar",
            "/mnt/ü/€€€.zip",
        ] {
            assert!(!is_url(Path::new(path)), "{path}");
        }
        assert_eq!(
            Location::parse("s3://bkt/dir/a.tar").unwrap(),
            Location::S3 {
                bucket: "bkt".into(),
                key: "dir/a.tar".into()
            }
        );
        assert!(Location::parse("s3://bkt").is_err());
        assert!(Location::parse("s3:///k").is_err());
        let err = Location::parse("https://user:pw@h/x").unwrap_err();
        assert!(err.to_string().contains("credentials"), "{err}");
        for signed in [
            "https://b.s3.amazonaws.com/k.tar?X-Amz-Credential=AKIA%2Fx&X-Amz-Signature=abc",
            "https://acct.blob.core.windows.net/c/k.tar?sv=2024&sig=abc",
            "https://h/k.tar?AWSAccessKeyId=AKIA&Signature=abc&Expires=1",
        ] {
            let err = Location::parse(signed).unwrap_err().to_string();
            assert!(err.contains("presigned") && !err.contains("abc"), "{err}");
        }
        assert!(Location::parse("https://h/k.tar?version=2").is_ok());
        let http = Location::parse("http://127.0.0.1:9000/d/a.tar").unwrap();
        assert_eq!(http.store(), "http://127.0.0.1:9000");
        assert_eq!(http.to_string(), "http://127.0.0.1:9000/d/a.tar");
    }
}
