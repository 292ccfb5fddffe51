//! How to reach the stores: S3 endpoint, region, addressing style and where the credentials come
//! from, read the way the AWS CLI reads them (the environment, then the profile in
//! ~/.aws/credentials and ~/.aws/config), plus packfs's own request limits. Secrets are never
//! logged or recorded.

use std::path::PathBuf;
use std::time::Duration;

use super::credentials::{AwsFiles, Lookup, Source, find};

/// S3 settings for every `s3://` location of this process.
#[derive(Default)]
pub struct S3Config {
    /// `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL` or the profile's `endpoint_url`; AWS when unset.
    pub endpoint: Option<String>,
    pub region: String,
    /// Path-style URLs (`endpoint/bucket/key`), as MinIO, Ceph RGW and AIStore expect: the default
    /// with a custom endpoint; virtual-hosted style (`bucket.endpoint/key`) for AWS itself.
    pub path_style: bool,
    /// Where the credentials come from (found once; fetched and renewed by the client).
    pub credentials: Source,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret or the token.
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("credentials", &self.credentials.describe())
            .finish()
    }
}

/// Limits on requests to the stores.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Requests in flight at once, over all stores (`PACKFS_REMOTE_REQUESTS`, default 64: what the lookahead needs to fetch ~3 000 samples a second at 20 ms).
    pub in_flight: usize,
    /// Attempts per request, the first included (`PACKFS_REMOTE_ATTEMPTS`, default 5).
    pub attempts: u32,
    /// One attempt's limit, connection to last byte (`PACKFS_REMOTE_TIMEOUT`, seconds, default 30).
    pub timeout: Duration,
    /// Connection limit (default 5 s).
    pub connect_timeout: Duration,
    /// First backoff before a retry; doubled each time, with full jitter, up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            in_flight: 64,
            attempts: 5,
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl Limits {
    pub fn from_env() -> Limits {
        let mut limits = Limits::default();
        let num = |name: &str| std::env::var(name).ok()?.trim().parse::<f64>().ok();
        if let Some(n) = num("PACKFS_REMOTE_REQUESTS").filter(|n| *n >= 1.0) {
            limits.in_flight = n as usize;
        }
        if let Some(n) = num("PACKFS_REMOTE_ATTEMPTS").filter(|n| *n >= 1.0) {
            limits.attempts = n as u32;
        }
        if let Some(s) = num("PACKFS_REMOTE_TIMEOUT").filter(|s| *s > 0.0) {
            limits.timeout = Duration::from_secs_f64(s);
            limits.connect_timeout = limits.connect_timeout.min(limits.timeout);
        }
        if let Some(ms) = num("PACKFS_REMOTE_BACKOFF_MS").filter(|ms| *ms >= 0.0) {
            limits.backoff = Duration::from_secs_f64(ms / 1000.0);
        }
        limits
    }
}

impl S3Config {
    /// From the environment and the AWS configuration files, as the AWS CLI resolves them.
    pub fn from_env() -> S3Config {
        S3Config::resolve(None)
    }

    /// As `from_env`, with `endpoint` (the mount's `--endpoint-url`) before any other.
    pub fn resolve(endpoint: Option<String>) -> S3Config {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let home = env("HOME").map(PathBuf::from);
        let file = |var: &str, rel: &str| {
            env(var)
                .map(PathBuf::from)
                .or(home.as_ref().map(|h| h.join(rel)))
        };
        let files = AwsFiles::read(
            file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"),
            file("AWS_CONFIG_FILE", ".aws/config"),
        );
        let profile_name = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let lookup = Lookup::new(
            &|name: &str| std::env::var(name).ok(),
            &files,
            &profile_name,
            home,
        );
        let endpoint = endpoint.or_else(|| lookup.endpoint("S3"));
        let path_style = match env("PACKFS_S3_ADDRESSING").as_deref() {
            Some("virtual") => false,
            Some("path") => true,
            _ => endpoint.is_some(),
        };
        S3Config {
            endpoint,
            region: lookup.region.clone(),
            path_style,
            credentials: find(&lookup),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_never_shows_a_secret() {
        let shown = format!(
            "{:?}",
            S3Config {
                credentials: Source::Static {
                    creds: super::super::credentials::Creds {
                        key: "AKID".into(),
                        secret: "TOPSECRET".into(),
                        token: None,
                        expires: None,
                    },
                    from: "environment".into(),
                },
                ..S3Config::default()
            }
        );
        assert!(
            !shown.contains("TOPSECRET") && !shown.contains("AKID"),
            "{shown}"
        );
    }
}
