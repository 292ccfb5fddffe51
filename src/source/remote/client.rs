//! One HTTP client for every store of the process: pooled keep-alive connections, a bound on the
//! requests in flight, timeouts, and retries with exponential backoff and full jitter on 5xx, 429
//! and transport errors. Each failure is logged with the URL, the range and the status, and
//! counted per store.

use std::collections::HashMap;
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tracing::warn;

use super::config::{Limits, S3Config};
use super::credentials::{CredentialStats, Creds, Provider};
use super::location::Location;
use super::refusal::refusal;

/// The S3 error code of a refusal: in the XML body (AWS), or, for HEAD, which has no body, in a
/// header where the store sends one (`x-minio-error-code`); "" when neither says.
fn error_code(resp: &mut ureq::http::Response<ureq::Body>) -> String {
    for name in ["x-amz-error-code", "x-minio-error-code"] {
        if let Some(code) = resp.headers().get(name).and_then(|v| v.to_str().ok()) {
            return code.to_string();
        }
    }
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 << 10)
        .read_to_string()
        .unwrap_or_default();
    super::xml_text(&body, "Code").unwrap_or("").to_string()
}

/// What a store said of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    pub size: u64,
    pub etag: Option<String>,
    /// Last-Modified, seconds since the epoch (0 when the store gives none).
    pub mtime: i64,
}

/// Requests, bytes, retries and errors of one store (`s3://bucket`, `http://host:port`).
#[derive(Debug, Default)]
pub struct StoreCounters {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub retries: AtomicU64,
    pub errors: AtomicU64,
}

/// The counters as numbers, for the stats file.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StoreStats {
    pub store: String,
    pub requests: u64,
    pub bytes: u64,
    pub retries: u64,
    pub errors: u64,
}

/// Pages of a listing followed at most: 100 million keys at S3's 1 000 per page, far more than a
/// glob of shards lists, and a bound on a store that never stops answering "truncated".
const MAX_LIST_PAGES: usize = 100_000;

pub struct Client {
    agent: ureq::Agent,
    s3: S3Config,
    credentials: Provider,
    limits: Limits,
    in_flight: Mutex<usize>,
    freed: Condvar,
    stores: Mutex<HashMap<String, Arc<StoreCounters>>>,
}

/// How one attempt ended, when it did not succeed.
enum Failure {
    /// Worth another attempt: 5xx, 429, a timeout, a dropped connection, a short body.
    Transient(String),
    /// Final: the error to return.
    Final(io::Error),
}

impl Client {
    pub(super) fn new(mut s3: S3Config, limits: Limits) -> Client {
        let agent = super::resolver::agent(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(limits.timeout))
                .timeout_connect(Some(limits.connect_timeout))
                .max_idle_connections(limits.in_flight * 2)
                .max_idle_connections_per_host(limits.in_flight * 2)
                // A redirect would lose the Range header's meaning on some servers; stores do
                // not redirect reads of objects they hold.
                .max_redirects(0)
                .build(),
        );
        Client {
            agent,
            // The provider holds the source from now on.
            credentials: Provider::new(std::mem::take(&mut s3.credentials)),
            s3,
            limits,
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
            stores: Mutex::new(HashMap::new()),
        }
    }

    /// The counters of `loc`'s store, created on first use.
    pub fn counters(&self, loc: &Location) -> Arc<StoreCounters> {
        let mut stores = self.stores.lock().expect("not poisoned");
        stores.entry(loc.store()).or_default().clone()
    }

    /// Where the S3 credentials come from, when they expire, how often they were renewed.
    pub fn credential_stats(&self) -> Option<CredentialStats> {
        self.credentials.stats()
    }

    /// Every store's counters so far, by name.
    pub fn stats(&self) -> Vec<StoreStats> {
        let stores = self.stores.lock().expect("not poisoned");
        let mut out: Vec<StoreStats> = stores
            .iter()
            .map(|(store, c)| StoreStats {
                store: store.clone(),
                requests: c.requests.load(Ordering::Relaxed),
                bytes: c.bytes.load(Ordering::Relaxed),
                retries: c.retries.load(Ordering::Relaxed),
                errors: c.errors.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by(|a, b| a.store.cmp(&b.store));
        out
    }

    /// The URL a request for `loc` goes to (presigned for S3, valid for an hour), and the
    /// credentials that signed it.
    fn url(&self, loc: &Location, head: bool) -> io::Result<(String, Option<Arc<Creds>>)> {
        match loc {
            Location::Http(url) => Ok((url.to_string(), None)),
            Location::S3 { bucket, key } => {
                use rusty_s3::S3Action;
                let bucket = self.bucket(bucket)?;
                let (creds, used) = self.credentials()?;
                let ttl = Duration::from_secs(3600);
                let url = if head {
                    bucket
                        .head_object(creds.as_ref(), key)
                        .sign(ttl)
                        .to_string()
                } else {
                    bucket.get_object(creds.as_ref(), key).sign(ttl).to_string()
                };
                Ok((url, used))
            }
        }
    }

    fn bucket(&self, name: &str) -> io::Result<rusty_s3::Bucket> {
        let endpoint = match &self.s3.endpoint {
            Some(e) => e.clone(),
            None => format!("https://s3.{}.amazonaws.com", self.s3.region),
        };
        let endpoint = url::Url::parse(&endpoint).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad S3 endpoint {endpoint:?} (AWS_ENDPOINT_URL): {e}"),
            )
        })?;
        let style = if self.s3.path_style {
            rusty_s3::UrlStyle::Path
        } else {
            rusty_s3::UrlStyle::VirtualHost
        };
        rusty_s3::Bucket::new(endpoint, style, name.to_string(), self.s3.region.clone()).map_err(
            |e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("bucket {name:?} cannot be addressed: {e}"),
                )
            },
        )
    }

    /// The credentials to sign with now (renewed when due), as rusty-s3 takes them.
    fn credentials(&self) -> io::Result<(Option<rusty_s3::Credentials>, Option<Arc<Creds>>)> {
        let Some(c) = self.credentials.get()? else {
            return Ok((None, None));
        };
        let signing = match &c.token {
            Some(token) => rusty_s3::Credentials::new_with_token(
                c.key.clone(),
                c.secret.clone(),
                token.clone(),
            ),
            None => rusty_s3::Credentials::new(c.key.clone(), c.secret.clone()),
        };
        Ok((Some(signing), Some(c)))
    }

    /// HEAD of an object: its size, ETag and modification time. A refusal is asked again as a
    /// GET of one byte: a HEAD's answer has no body, so no code saying which credential was
    /// refused and why (a wrong secret and an unknown key were both "access denied (403)").
    pub fn head(&self, loc: &Location) -> io::Result<ObjectMeta> {
        self.head_once(loc).map_err(|refused| {
            if refused.kind() != io::ErrorKind::PermissionDenied {
                return refused;
            }
            match self.get_range(loc, 0, &mut [0u8; 1], None) {
                Err(said) if said.kind() == io::ErrorKind::PermissionDenied => said,
                _ => refused,
            }
        })
    }

    fn head_once(&self, loc: &Location) -> io::Result<ObjectMeta> {
        let counters = self.counters(loc);
        self.attempts(loc, "HEAD", &counters, || {
            let (url, used) = self.url(loc, true).map_err(Failure::Final)?;
            let mut resp = self
                .agent
                .head(&url)
                .call()
                .map_err(|e| Failure::Transient(e.to_string()))?;
            self.check_status(loc, &mut resp, None, used.as_ref())?;
            meta_of(loc, resp.headers())
        })
    }

    /// `buf.len()` bytes at `offset`, refused with a "changed" error if the object's ETag or
    /// size is no longer the one it had when `opened`: asked with If-Match, and checked in the
    /// answer too (a store or proxy that ignores If-Match served 120 of 120 reads of a replaced
    /// object as if nothing had changed).
    pub fn get_range(
        &self,
        loc: &Location,
        offset: u64,
        buf: &mut [u8],
        opened: Option<&ObjectMeta>,
    ) -> io::Result<()> {
        let if_match = opened.and_then(|m| m.etag.as_deref());
        if buf.is_empty() {
            return Ok(());
        }
        let counters = self.counters(loc);
        let last = offset + buf.len() as u64 - 1;
        let what = format!("GET bytes {offset}-{last}");
        self.attempts(loc, &what, &counters, || {
            let (url, used) = self.url(loc, false).map_err(Failure::Final)?;
            let mut req = self
                .agent
                .get(&url)
                .header("Range", &format!("bytes={offset}-{last}"));
            if let Some(etag) = if_match {
                req = req.header("If-Match", etag);
            }
            let mut resp = req.call().map_err(|e| Failure::Transient(e.to_string()))?;
            self.check_status(loc, &mut resp, Some(offset), used.as_ref())?;
            if resp.status().as_u16() != 206
                && !(offset == 0 && content_length(resp.headers()) == Some(buf.len() as u64))
            {
                return Err(Failure::Final(io::Error::other(format!(
                    "{loc}: the server answered a range request with status {} and the whole \
                     object; it must support HTTP range requests (Accept-Ranges: bytes)",
                    resp.status().as_u16()
                ))));
            }
            let partial = resp.status().as_u16() == 206;
            super::answer::check_range(loc, resp.headers(), partial, (offset, last), opened)
                .map_err(Failure::Final)?;
            let mut body = resp.into_body();
            let mut reader = body.as_reader();
            let mut got = 0;
            while got < buf.len() {
                match reader.read(&mut buf[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Failure::Transient(format!("reading the body: {e}"))),
                }
            }
            if got < buf.len() {
                return Err(Failure::Transient(format!(
                    "the body ended after {got} of {} bytes",
                    buf.len()
                )));
            }
            // Read to the body's end, so the connection goes back to the pool: a body left
            // unfinished closes it, and every request paid a new connection (measured: half the
            // rate of a per-object GET loop at 20 ms with 32 readers).
            let mut more = [0u8; 1];
            if matches!(reader.read(&mut more), Ok(n) if n > 0) {
                return Err(Failure::Final(io::Error::other(format!(
                    "{loc}: the server sent more than the {} bytes asked for at offset {offset}",
                    buf.len()
                ))));
            }
            counters.bytes.fetch_add(got as u64, Ordering::Relaxed);
            Ok(())
        })
    }

    /// Keys of the objects of `bucket` whose key starts with `prefix` and that `keep` takes, in
    /// key order. Only kept keys are held, and a store whose listing does not end (a continuation
    /// token given twice, or more pages than any dataset has) is refused, not followed.
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        keep: impl Fn(&str) -> bool,
    ) -> io::Result<Vec<String>> {
        use rusty_s3::S3Action;
        let loc = Location::S3 {
            bucket: bucket.to_string(),
            key: prefix.to_string(),
        };
        let counters = self.counters(&loc);
        let b = self.bucket(bucket)?;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        // Every token seen (hashed: a store may send long ones): a store that repeats one would
        // be followed round a cycle forever.
        let mut tokens = std::collections::HashSet::new();
        loop {
            let page = self.attempts(&loc, "LIST", &counters, || {
                let (creds, used) = self.credentials().map_err(Failure::Final)?;
                let mut action = b.list_objects_v2(creds.as_ref());
                action.with_prefix(prefix);
                if let Some(t) = &token {
                    action.with_continuation_token(t.as_str());
                }
                let url = action.sign(Duration::from_secs(3600)).to_string();
                let mut resp = self
                    .agent
                    .get(&url)
                    .call()
                    .map_err(|e| Failure::Transient(e.to_string()))?;
                self.check_status(&loc, &mut resp, None, used.as_ref())?;
                let text = resp
                    .into_body()
                    .with_config()
                    .limit(64 << 20)
                    .read_to_string()
                    .map_err(|e| Failure::Transient(format!("reading the listing: {e}")))?;
                rusty_s3::actions::ListObjectsV2::parse_response(&text).map_err(|e| {
                    Failure::Final(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("s3://{bucket}: cannot parse the listing: {e}"),
                    ))
                })
            })?;
            let refuse = |why: String| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("s3://{bucket}/{prefix}*: {why}"),
                )
            };
            out.extend(page.contents.into_iter().map(|c| c.key).filter(|k| keep(k)));
            match page.next_continuation_token {
                Some(t) if !t.is_empty() => {
                    if tokens.len() >= MAX_LIST_PAGES {
                        return Err(refuse(format!(
                            "more than {MAX_LIST_PAGES} pages of listing; give a longer literal \
                             prefix before the first wildcard"
                        )));
                    }
                    if !tokens.insert(xxhash_rust::xxh3::xxh3_64(t.as_bytes())) {
                        return Err(refuse(
                            "the store gave a continuation token a second time, so its listing \
                             would never end (a store fault); name the objects with a brace \
                             range instead"
                                .to_string(),
                        ));
                    }
                    token = Some(t);
                }
                _ => break,
            }
        }
        // Sorted here: directory buckets (S3 Express) and some stores do not list in key order.
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Runs `attempt` until it succeeds, fails finally, or the attempts run out; waits for a free
    /// request slot before each.
    fn attempts<T>(
        &self,
        loc: &Location,
        what: &str,
        counters: &StoreCounters,
        mut attempt: impl FnMut() -> Result<T, Failure>,
    ) -> io::Result<T> {
        let mut backoff = self.limits.backoff;
        for n in 1..=self.limits.attempts {
            counters.requests.fetch_add(1, Ordering::Relaxed);
            let result = {
                let _slot = self.slot();
                attempt()
            };
            match result {
                Ok(v) => return Ok(v),
                Err(Failure::Final(e)) => {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
                Err(Failure::Transient(why)) if n < self.limits.attempts => {
                    counters.retries.fetch_add(1, Ordering::Relaxed);
                    // Full jitter: many readers retrying a busy store spread out.
                    let wait = backoff.mul_f64(rand::random::<f64>());
                    warn!(
                        "{loc}: {what} failed ({why}); retry {n} of {} in {} ms",
                        self.limits.attempts - 1,
                        wait.as_millis()
                    );
                    std::thread::sleep(wait);
                    backoff = (backoff * 2).min(self.limits.max_backoff);
                }
                Err(Failure::Transient(why)) => {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    return Err(io::Error::other(format!(
                        "{loc}: {what} failed after {} attempts: {why}",
                        self.limits.attempts
                    )));
                }
            }
        }
        unreachable!("attempts is at least 1")
    }

    /// Maps the status of an answer to success, a retry or a final error.
    fn check_status(
        &self,
        loc: &Location,
        resp: &mut ureq::http::Response<ureq::Body>,
        offset: Option<u64>,
        used: Option<&Arc<Creds>>,
    ) -> Result<(), Failure> {
        let status = resp.status().as_u16();
        let final_error =
            |kind: io::ErrorKind, msg: String| Err(Failure::Final(io::Error::new(kind, msg)));
        match status {
            200..=299 => Ok(()),
            429 | 500..=599 => Err(Failure::Transient(format!("status {status}"))),
            404 => final_error(
                io::ErrorKind::NotFound,
                format!("{loc}: no such object (404)"),
            ),
            400 | 401 | 403 => {
                let code = error_code(resp);
                if self.refused_credentials(&code, used) {
                    return Err(Failure::Transient(format!(
                        "status {status}: the store refused the credentials from {} ({code}); \
                         fetching new ones",
                        self.credentials.from(),
                    )));
                }
                let expired = code.contains("Expired") || code.contains("TokenRefresh");
                if status == 400 && !expired {
                    return final_error(
                        io::ErrorKind::Other,
                        format!("{loc}: status 400 ({code})"),
                    );
                }
                let from = self.credentials.from();
                let msg = if expired {
                    format!(
                        "{loc}: the credentials have expired ({code}); renew them (from {from}) \
                         and mount again"
                    )
                } else if let Some(why) = refusal(&code, used.map(|c| c.key.as_str())) {
                    format!(
                        "{loc}: access denied ({status} {code}): {why} (credentials from {from})"
                    )
                } else {
                    format!(
                        "{loc}: access denied ({status}{}); check the credentials (from {from}) \
                         and the bucket's policy",
                        if code.is_empty() {
                            String::new()
                        } else {
                            format!(" {code}")
                        },
                    )
                };
                final_error(io::ErrorKind::PermissionDenied, msg)
            }
            412 => final_error(
                io::ErrorKind::Other,
                super::answer::replaced(loc, "its ETag changed").to_string(),
            ),
            416 => final_error(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{loc}: the object ends before offset {} (416)",
                    offset.unwrap_or(0)
                ),
            ),
            _ => final_error(io::ErrorKind::Other, format!("{loc}: status {status}")),
        }
    }

    /// Whether a refusal with S3 error `code` was of credentials that may be renewed: then they
    /// are forgotten, and the request is tried again with new ones (a source can rotate them
    /// before the expiry it announced).
    fn refused_credentials(&self, code: &str, used: Option<&Arc<Creds>>) -> bool {
        const STALE: [&str; 5] = [
            "ExpiredToken",
            "InvalidToken",
            "InvalidAccessKeyId",
            "TokenRefreshRequired",
            "RequestExpired",
        ];
        match used {
            Some(c) if STALE.contains(&code) => self.credentials.refused(c),
            _ => false,
        }
    }

    /// Waits for one of the `in_flight` request slots; freed on drop.
    fn slot(&self) -> Slot<'_> {
        let mut busy = self.in_flight.lock().expect("not poisoned");
        while *busy >= self.limits.in_flight {
            busy = self.freed.wait(busy).expect("not poisoned");
        }
        *busy += 1;
        Slot(self)
    }
}

struct Slot<'a>(&'a Client);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *self.0.in_flight.lock().expect("not poisoned") -= 1;
        self.0.freed.notify_one();
    }
}

fn content_length(headers: &ureq::http::HeaderMap) -> Option<u64> {
    headers
        .get("content-length")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn meta_of(loc: &Location, headers: &ureq::http::HeaderMap) -> Result<ObjectMeta, Failure> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let size = content_length(headers).ok_or_else(|| {
        Failure::Final(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{loc}: the store gives no Content-Length for the object"),
        ))
    })?;
    let mtime = text("last-modified")
        .and_then(|t| {
            jiff::fmt::rfc2822::DateTimeParser::new()
                .parse_timestamp(t)
                .ok()
        })
        .map_or(0, |t| t.as_second());
    Ok(ObjectMeta {
        size,
        etag: text("etag").map(str::to_string),
        mtime,
    })
}
