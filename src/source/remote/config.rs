//! How to reach the stores: S3 endpoint, region, addressing style and where the credentials come
//! from, read the way the AWS CLI reads them (the environment, then the profile in
//! ~/.aws/credentials and ~/.aws/config), plus packfs's own request limits. Secrets are never
//! logged or recorded.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::credentials::{Lookup, Source};

/// S3 settings for every `s3://` location of this process.
#[derive(Clone, Default)]
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
    /// Requests in flight at once, over all stores (`PACKFS_REMOTE_REQUESTS`, default 32).
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
            in_flight: 32,
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
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let profile_name = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
        let home = env("HOME").map(PathBuf::from);
        let file = |var: &str, rel: &str| {
            env(var)
                .map(PathBuf::from)
                .or(home.as_ref().map(|h| h.join(rel)))
        };
        let credentials = file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials")
            .map(|p| profile_of(&p, &profile_name, false))
            .unwrap_or_default();
        let config = file("AWS_CONFIG_FILE", ".aws/config")
            .map(|p| profile_of(&p, &profile_name, true))
            .unwrap_or_default();
        let from_profile = |k: &str| credentials.get(k).or(config.get(k)).cloned();

        let endpoint = env("AWS_ENDPOINT_URL_S3")
            .or(env("AWS_ENDPOINT_URL"))
            .or(from_profile("endpoint_url"));
        let region = env("AWS_REGION")
            .or(env("AWS_DEFAULT_REGION"))
            .or(from_profile("region"))
            .unwrap_or_else(|| "us-east-1".into());
        let path_style = match env("PACKFS_S3_ADDRESSING").as_deref() {
            Some("virtual") => false,
            Some("path") => true,
            _ => endpoint.is_some(),
        };
        let sso_session = match config.get("sso_session") {
            Some(name) => file("AWS_CONFIG_FILE", ".aws/config")
                .map(|p| section_of(&p, &format!("sso-session {name}")))
                .unwrap_or_default(),
            None => HashMap::new(),
        };
        let lookup = Lookup {
            env: &|name: &str| std::env::var(name).ok(),
            profile_name,
            credentials,
            config,
            sso_session,
            home,
            region: region.clone(),
        };
        S3Config {
            endpoint,
            region,
            path_style,
            credentials: Source::find(&lookup),
        }
    }
}

/// The `key = value` pairs of one profile of an AWS ini file (`[name]` in credentials,
/// `[profile name]` or `[default]` in config). Missing or unreadable files give nothing.
fn profile_of(path: &std::path::Path, name: &str, config_file: bool) -> HashMap<String, String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return HashMap::new();
    };
    parse_profile(&text, name, config_file)
}

fn parse_profile(text: &str, name: &str, config_file: bool) -> HashMap<String, String> {
    let wanted = if config_file && name != "default" {
        format!("profile {name}")
    } else {
        name.to_string()
    };
    parse_section(text, &wanted)
}

/// The pairs of any `[section]` of the config file (`[sso-session NAME]`).
fn section_of(path: &std::path::Path, section: &str) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .map(|text| parse_section(&text, section))
        .unwrap_or_default()
}

fn parse_section(text: &str, wanted: &str) -> HashMap<String, String> {
    let mut values = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = section.trim() == wanted;
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            values.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_read_as_the_aws_cli_reads_them() {
        let credentials = "[default]\naws_access_key_id = AK1\naws_secret_access_key=S1\n\n\
                           [lab]\n# comment\naws_access_key_id = AK2\naws_secret_access_key = S2\n";
        assert_eq!(
            parse_profile(credentials, "lab", false)["aws_access_key_id"],
            "AK2"
        );
        assert_eq!(
            parse_profile(credentials, "default", false)["aws_secret_access_key"],
            "S1"
        );
        let config =
            "[default]\nregion = eu-west-1\n[profile lab]\nendpoint_url = http://minio:9000\n";
        assert_eq!(
            parse_profile(config, "lab", true)["endpoint_url"],
            "http://minio:9000"
        );
        assert!(!parse_profile(config, "lab", true).contains_key("region"));
        assert_eq!(
            parse_profile(config, "default", true)["region"],
            "eu-west-1"
        );
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
