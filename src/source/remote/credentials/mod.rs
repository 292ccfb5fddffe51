//! S3 credentials, found where the AWS CLI finds them and in its order, and renewed before they
//! expire: a mount lives for a whole training job, longer than the hour that temporary
//! credentials from EC2 instance metadata, web identity (EKS IRSA), SSO or a container endpoint
//! last. Nothing here logs or shows a secret; `Debug` of every type leaves them out.

mod chain;
mod fetch;
mod files;
mod lookup;
mod sigv4;
mod source;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use tracing::{info, warn};

pub use chain::find;
pub use files::AwsFiles;
pub use lookup::Lookup;
pub use source::Source;

/// One set of credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Creds {
    pub key: String,
    pub secret: String,
    pub token: Option<String>,
    /// When they stop working; `None` for long-term keys.
    pub expires: Option<Timestamp>,
}

impl std::fmt::Debug for Creds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Creds")
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// What `packfs status` and the stats file show of the credentials: never what they are.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct CredentialStats {
    /// Where they come from ("EC2 instance metadata (http://169.254.169.254)").
    pub from: String,
    /// When the credentials in use expire (RFC 3339); `None` for long-term keys or anonymous.
    pub expires: Option<String>,
    /// Fetches after the first: renewals before expiry, and after a store refused them.
    pub renewals: u64,
    /// Fetches that failed (each logged with the reason).
    pub failures: u64,
}

/// Renewed at most this long before expiry, and at least half their lifetime before it: an hour's
/// credentials are renewed 10 minutes early, as the AWS SDKs do, and short-lived ones (a test's
/// few seconds) half-way through.
const RENEW_EARLY: Duration = Duration::from_secs(600);
/// After a failed renewal, credentials still valid are kept and the next try waits this long.
const RETRY_AFTER: Duration = Duration::from_secs(2);
/// Credentials this close to expiry are not used: a request signed now may arrive after it.
const MARGIN: Duration = Duration::from_secs(2);

/// The credentials of one source, cached, renewed before expiry by the request that finds them
/// due, while the others go on with the current ones.
pub struct Provider {
    source: Source,
    held: RwLock<Held>,
    renewing: Mutex<Renewal>,
    renewals: AtomicU64,
    failures: AtomicU64,
}

#[derive(Clone, Default)]
struct Held {
    /// `None` before the first fetch, or for anonymous requests once `fetched`.
    creds: Option<Arc<Creds>>,
    fetched: bool,
    renew_at: Option<Timestamp>,
    /// A store refused `creds`: nobody uses them again, every request waits for new ones.
    refused: bool,
}

#[derive(Default)]
struct Renewal {
    /// No renewal before this (set after a failure).
    not_before: Option<Instant>,
    last_error: Option<String>,
}

impl Provider {
    pub fn new(source: Source) -> Provider {
        Provider {
            source,
            held: RwLock::new(Held::default()),
            renewing: Mutex::new(Renewal::default()),
            renewals: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// For `status`: `None` until a request needed credentials.
    pub fn stats(&self) -> Option<CredentialStats> {
        let held = self.held.read().expect("not poisoned").clone();
        let failures = self.failures.load(Ordering::Relaxed);
        if !held.fetched && failures == 0 {
            return None;
        }
        Some(CredentialStats {
            from: self.from(),
            expires: held
                .creds
                .and_then(|c| c.expires)
                .map(|t| t.round(jiff::Unit::Second).unwrap_or(t).to_string()),
            renewals: self.renewals.load(Ordering::Relaxed),
            failures,
        })
    }

    /// Where the credentials come from, for messages.
    pub fn from(&self) -> String {
        self.source.describe()
    }

    /// Whether credentials refused by a store may be fetched again (not static keys).
    pub fn renews(&self) -> bool {
        self.source.renews()
    }

    /// The credentials to sign a request with; `None` for anonymous requests.
    pub fn get(&self) -> std::io::Result<Option<Arc<Creds>>> {
        let now = Timestamp::now();
        let held = self.held.read().expect("not poisoned").clone();
        if held.fetched && !held.refused {
            if held.renew_at.is_none_or(|at| now < at) {
                return Ok(held.creds);
            }
            if usable(held.creds.as_deref(), now) {
                // Due but still valid: one request renews, the others go on meanwhile.
                if let Ok(mut renewal) = self.renewing.try_lock()
                    && renewal.not_before.is_none_or(|t| Instant::now() >= t)
                {
                    let _ = self.renew(&mut renewal, &held);
                }
                return Ok(self.held.read().expect("not poisoned").creds.clone());
            }
        }
        // None yet, or expired: every request waits for the one renewal.
        let mut renewal = self.renewing.lock().expect("not poisoned");
        let again = self.held.read().expect("not poisoned").clone();
        if again.fetched && !again.refused && usable(again.creds.as_deref(), Timestamp::now()) {
            return Ok(again.creds);
        }
        if renewal.not_before.is_some_and(|t| Instant::now() < t) {
            return Err(self.failed(renewal.last_error.as_deref().unwrap_or("")));
        }
        match self.renew(&mut renewal, &again) {
            Ok(()) => Ok(self.held.read().expect("not poisoned").creds.clone()),
            Err(why) => Err(self.failed(&why)),
        }
    }

    /// Forgets `used` after a store refused them as expired or unknown, so the next request
    /// fetches new ones; returns whether it did (never for static keys).
    pub fn refused(&self, used: &Arc<Creds>) -> bool {
        if !self.renews() {
            return false;
        }
        let mut held = self.held.write().expect("not poisoned");
        if held.creds.as_ref().is_some_and(|c| Arc::ptr_eq(c, used)) {
            held.refused = true;
        }
        true
    }

    /// Fetches new credentials into `held`; a failure keeps the current ones, is logged, and holds
    /// off the next try.
    fn renew(&self, renewal: &mut Renewal, before: &Held) -> Result<(), String> {
        let fetched = match self.source.fetch() {
            // A source that gave credentials once (instance metadata) and answers nothing now is
            // failing, not gone: requests must not turn anonymous.
            Ok(None) if before.creds.is_some() => {
                Err("it gave credentials before and now gives none".to_string())
            }
            other => other,
        };
        match fetched {
            Ok(creds) => {
                let first = !before.fetched;
                if !first {
                    self.renewals.fetch_add(1, Ordering::Relaxed);
                }
                let renew_at = creds.as_ref().and_then(|c| renew_at(c, Timestamp::now()));
                match (&creds, first) {
                    (None, _) => info!("no S3 credentials found; requests are anonymous"),
                    (Some(c), true) => info!(
                        "S3 credentials from {}{}",
                        self.from(),
                        until(c.expires.as_ref())
                    ),
                    (Some(c), false) => info!(
                        "S3 credentials from {} renewed{}",
                        self.from(),
                        until(c.expires.as_ref())
                    ),
                }
                *self.held.write().expect("not poisoned") = Held {
                    creds: creds.map(Arc::new),
                    fetched: true,
                    renew_at,
                    refused: false,
                };
                *renewal = Renewal::default();
                Ok(())
            }
            Err(why) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                warn!(
                    "S3 credentials from {} could not be fetched: {why}",
                    self.from()
                );
                renewal.not_before = Some(Instant::now() + RETRY_AFTER);
                renewal.last_error = Some(why.clone());
                Err(why)
            }
        }
    }

    fn failed(&self, why: &str) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("no valid S3 credentials from {}: {why}", self.from()),
        )
    }
}

/// Lowercase hex, as AWS writes hashes and signatures.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn usable(creds: Option<&Creds>, now: Timestamp) -> bool {
    creds
        .and_then(|c| c.expires)
        .is_none_or(|exp| now + MARGIN < exp)
}

/// When credentials fetched at `now` are due for renewal.
fn renew_at(creds: &Creds, now: Timestamp) -> Option<Timestamp> {
    let expires = creds.expires?;
    let lifetime = expires.duration_since(now).unsigned_abs();
    let early = RENEW_EARLY.min(lifetime / 2).max(MARGIN);
    Some(expires - early)
}

fn until(expires: Option<&Timestamp>) -> String {
    expires.map_or(String::new(), |t| format!(", valid until {t}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds(expires_in: i64) -> Creds {
        Creds {
            key: "AK".into(),
            secret: "SECRET".into(),
            token: None,
            expires: Some(Timestamp::now() + Duration::from_secs(expires_in as u64)),
        }
    }

    /// A process source that hands out a new key at each call, counted in `dir/n`.
    fn counting(dir: &std::path::Path, lifetime: &str) -> Source {
        let script = format!(
            "n=$(cat {d}/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > {d}/n; \
             printf '{{\"Version\": 1, \"AccessKeyId\": \"AK%s\", \"SecretAccessKey\": \"S\", \
             \"Expiration\": \"%s\"}}' $n $(date -u -d '{lifetime}' +%Y-%m-%dT%H:%M:%SZ)",
            d = dir.display()
        );
        Source::Process {
            command: format!("sh -c {}", shlex::try_quote(&script).unwrap()),
            profile: "test".into(),
        }
    }

    #[test]
    fn refused_keys_are_replaced_and_due_ones_renewed() {
        let dir = tempfile::tempdir().unwrap();
        let p = Provider::new(counting(dir.path(), "+1 hour"));
        let first = p.get().unwrap().unwrap();
        assert_eq!(first.key, "AK1");
        // Cached while valid and not due.
        assert!(Arc::ptr_eq(&first, &p.get().unwrap().unwrap()));
        assert!(p.refused(&first));
        assert_eq!(p.get().unwrap().unwrap().key, "AK2");
        // Keys with 3 s to live are due at once (renewed half-way, at most 2 s before expiry).
        let short = Provider::new(counting(dir.path(), "+3 seconds"));
        let a = short.get().unwrap().unwrap();
        std::thread::sleep(Duration::from_millis(1600));
        let b = short.get().unwrap().unwrap();
        assert_ne!(a.key, b.key);
    }

    #[test]
    fn instance_metadata_that_stops_answering_does_not_make_requests_anonymous() {
        // Nothing listens on port 1: "not an EC2 instance" for a first fetch.
        let imds = || Source::Imds {
            endpoint: "http://127.0.0.1:1".into(),
            timeout_s: 1.0,
        };
        assert!(Provider::new(imds()).get().unwrap().is_none());
        // After credentials came from it, the same silence is a failure.
        let p = Provider::new(imds());
        let had = Arc::new(creds(3600));
        *p.held.write().unwrap() = Held {
            creds: Some(had.clone()),
            fetched: true,
            renew_at: None,
            refused: false,
        };
        assert!(p.refused(&had));
        let err = p.get().unwrap_err();
        assert!(err.to_string().contains("now gives none"), "{err}");
    }

    #[test]
    fn credentials_are_renewed_early_but_not_too_early() {
        let now = Timestamp::now();
        // An hour's credentials: 10 minutes before expiry.
        let hour = creds(3600);
        let at = renew_at(&hour, now).unwrap();
        let before = hour.expires.unwrap().duration_since(at).as_secs();
        assert_eq!(before, 600);
        // Ten seconds' credentials: half-way.
        let short = creds(10);
        let at = renew_at(&short, now).unwrap();
        let before = short.expires.unwrap().duration_since(at).as_secs();
        assert!((4..=5).contains(&before), "{before}");
        // Long-term keys never.
        let long = Creds {
            expires: None,
            ..creds(0)
        };
        assert_eq!(renew_at(&long, now), None);
        assert!(usable(Some(&long), now));
        assert!(!usable(Some(&creds(1)), now));
        assert!(!format!("{:?}", creds(5)).contains("SECRET"));
    }
}
