//! Which source the credentials come from: the first one configured, in the AWS CLI's order
//! (environment, web identity, SSO, the shared credentials file, `credential_process`, the config
//! file, a container endpoint, EC2 instance metadata). A source that is configured but fails is
//! an error, never a silent step to the next one: other credentials would read other data.

use std::collections::HashMap;
use std::path::PathBuf;

use super::{Creds, fetch};

/// What the chain reads: the environment, and the selected profile of both AWS files.
pub struct Lookup<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub profile_name: String,
    /// The profile in ~/.aws/credentials.
    pub credentials: HashMap<String, String>,
    /// The profile in ~/.aws/config.
    pub config: HashMap<String, String>,
    /// The `[sso-session NAME]` section the profile names, if any.
    pub sso_session: HashMap<String, String>,
    pub home: Option<PathBuf>,
    pub region: String,
}

impl Lookup<'_> {
    fn env(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.trim().is_empty())
    }

    /// A value of the profile: the credentials file first, as the AWS CLI merges them.
    fn profile(&self, key: &str) -> Option<String> {
        self.credentials
            .get(key)
            .or(self.config.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    }

    /// The endpoint of another AWS service (`STS`, `SSO`): its own variable, then the global one.
    fn endpoint(&self, service: &str) -> Option<String> {
        self.env(&format!("AWS_ENDPOINT_URL_{service}"))
            .or(self.env("AWS_ENDPOINT_URL"))
            .or(self.profile("endpoint_url"))
    }
}

/// A place credentials come from.
#[derive(Clone, Default)]
pub enum Source {
    /// Keys that do not change: the environment's, or a profile's.
    Static { creds: Creds, from: String },
    /// STS AssumeRoleWithWebIdentity with the token in `token_file` (read again at each renewal:
    /// Kubernetes rotates it).
    WebIdentity {
        token_file: PathBuf,
        role_arn: String,
        session: String,
        sts: String,
    },
    /// The role credentials of an IAM Identity Center (SSO) login: the token `aws sso login`
    /// cached, exchanged at the portal.
    Sso {
        cache_file: PathBuf,
        account: String,
        role: String,
        portal: String,
        profile: String,
    },
    /// `credential_process` of the profile: its JSON on stdout.
    Process { command: String, profile: String },
    /// An ECS/EKS Pod Identity container endpoint.
    Container {
        url: String,
        token: Option<String>,
        token_file: Option<PathBuf>,
    },
    /// EC2 instance metadata (IMDSv2): the instance role's credentials, or anonymous requests
    /// where there is no instance metadata.
    Imds { endpoint: String, timeout_s: f64 },
    /// No credentials: anonymous requests (public buckets).
    #[default]
    Anonymous,
    /// A configuration packfs does not follow, with what to do instead.
    Unsupported(String),
}

impl Source {
    /// The first configured source of the chain.
    pub fn find(l: &Lookup) -> Source {
        let profile = &l.profile_name;
        if let (Some(key), Some(secret)) =
            (l.env("AWS_ACCESS_KEY_ID"), l.env("AWS_SECRET_ACCESS_KEY"))
        {
            return Source::Static {
                creds: Creds {
                    key,
                    secret,
                    token: l.env("AWS_SESSION_TOKEN"),
                    expires: None,
                },
                from: "environment (AWS_ACCESS_KEY_ID)".into(),
            };
        }
        // A role assumed with another profile's keys needs a signed STS call packfs does not
        // make; the AWS CLI can make it for packfs.
        if l.profile("role_arn").is_some() && l.profile("web_identity_token_file").is_none() {
            return Source::Unsupported(format!(
                "profile {profile} assumes a role with another profile's credentials \
                 (role_arn with source_profile or credential_source), which packfs does not do; \
                 add `credential_process = aws configure export-credentials --profile {profile} \
                 --format process` to a profile of its own and select that one with AWS_PROFILE"
            ));
        }
        let token_file = l
            .env("AWS_WEB_IDENTITY_TOKEN_FILE")
            .or(l.profile("web_identity_token_file"));
        let role_arn = l.env("AWS_ROLE_ARN").or(l.profile("role_arn"));
        if let (Some(token_file), Some(role_arn)) = (token_file, role_arn) {
            let session = l
                .env("AWS_ROLE_SESSION_NAME")
                .or(l.profile("role_session_name"))
                .unwrap_or_else(|| format!("packfs-{}", jiff::Timestamp::now().as_second()));
            let sts = l
                .endpoint("STS")
                .unwrap_or_else(|| format!("https://sts.{}.amazonaws.com", l.region));
            return Source::WebIdentity {
                token_file: PathBuf::from(token_file),
                role_arn,
                session,
                sts,
            };
        }
        if let Some(sso) = sso(l) {
            return sso;
        }
        if let (Some(key), Some(secret)) = (
            l.credentials.get("aws_access_key_id"),
            l.credentials.get("aws_secret_access_key"),
        ) {
            return static_profile(key, secret, l.credentials.get("aws_session_token"), profile);
        }
        if let Some(command) = l.profile("credential_process") {
            return Source::Process {
                command,
                profile: profile.clone(),
            };
        }
        if let (Some(key), Some(secret)) = (
            l.config.get("aws_access_key_id"),
            l.config.get("aws_secret_access_key"),
        ) {
            return static_profile(key, secret, l.config.get("aws_session_token"), profile);
        }
        if let Some(container) = container(l) {
            return container;
        }
        if l.env("AWS_EC2_METADATA_DISABLED")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return Source::Anonymous;
        }
        let endpoint = l
            .env("AWS_EC2_METADATA_SERVICE_ENDPOINT")
            .or(l.profile("ec2_metadata_service_endpoint"))
            .unwrap_or_else(|| "http://169.254.169.254".into());
        let timeout_s = l
            .env("AWS_METADATA_SERVICE_TIMEOUT")
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0 && *t <= 60.0)
            .unwrap_or(1.0);
        Source::Imds {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            timeout_s,
        }
    }

    /// For messages: where the credentials come from, never what they are.
    pub fn describe(&self) -> String {
        match self {
            Source::Static { from, .. } => from.clone(),
            Source::WebIdentity { role_arn, .. } => format!("web identity (role {role_arn})"),
            Source::Sso { profile, .. } => format!("SSO (profile {profile})"),
            Source::Process { profile, .. } => format!("credential_process (profile {profile})"),
            Source::Container { .. } => "the container credentials endpoint".into(),
            Source::Imds { endpoint, .. } => format!("EC2 instance metadata ({endpoint})"),
            Source::Anonymous => "none (anonymous requests)".into(),
            Source::Unsupported(_) => "an unsupported profile".into(),
        }
    }

    /// Whether fetching again may give other credentials.
    pub fn renews(&self) -> bool {
        !matches!(
            self,
            Source::Static { .. } | Source::Anonymous | Source::Unsupported(_)
        )
    }

    /// Credentials now; `Ok(None)` for anonymous requests.
    pub fn fetch(&self) -> Result<Option<Creds>, String> {
        match self {
            Source::Static { creds, .. } => Ok(Some(creds.clone())),
            Source::WebIdentity {
                token_file,
                role_arn,
                session,
                sts,
            } => fetch::web_identity(token_file, role_arn, session, sts).map(Some),
            Source::Sso {
                cache_file,
                account,
                role,
                portal,
                profile,
            } => fetch::sso(cache_file, account, role, portal, profile).map(Some),
            Source::Process { command, .. } => fetch::process(command).map(Some),
            Source::Container {
                url,
                token,
                token_file,
            } => fetch::container(url, token.as_deref(), token_file.as_deref()).map(Some),
            Source::Imds {
                endpoint,
                timeout_s,
            } => fetch::imds(endpoint, *timeout_s),
            Source::Anonymous => Ok(None),
            Source::Unsupported(why) => Err(why.clone()),
        }
    }
}

fn static_profile(key: &str, secret: &str, token: Option<&String>, profile: &str) -> Source {
    Source::Static {
        creds: Creds {
            key: key.to_string(),
            secret: secret.to_string(),
            token: token.cloned(),
            expires: None,
        },
        from: format!("profile {profile}"),
    }
}

/// An SSO profile: `sso_session` naming an `[sso-session]` section, or the older `sso_start_url`
/// in the profile itself. The token cache file is named by the SHA-1 of the session's name (or
/// of the start URL), as `aws sso login` names it.
fn sso(l: &Lookup) -> Option<Source> {
    let (cache_key, region) = match l.config.get("sso_session") {
        Some(name) => (name.clone(), l.sso_session.get("sso_region").cloned()),
        None => (
            l.config.get("sso_start_url")?.clone(),
            l.config.get("sso_region").cloned(),
        ),
    };
    let profile = l.profile_name.clone();
    let (Some(account), Some(role), Some(region)) = (
        l.config.get("sso_account_id"),
        l.config.get("sso_role_name"),
        region,
    ) else {
        return Some(Source::Unsupported(format!(
            "profile {profile} is an SSO profile without sso_account_id, sso_role_name or \
             sso_region; run `aws configure sso --profile {profile}`"
        )));
    };
    use sha1::Digest;
    let hash: String = sha1::Sha1::digest(cache_key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let home = l.home.clone().unwrap_or_default();
    let portal = l
        .endpoint("SSO")
        .unwrap_or_else(|| format!("https://portal.sso.{region}.amazonaws.com"));
    Some(Source::Sso {
        cache_file: home.join(".aws/sso/cache").join(format!("{hash}.json")),
        account: account.clone(),
        role: role.clone(),
        portal,
        profile,
    })
}

/// The container endpoint: a path on ECS's fixed address, or a full URL, which must be HTTPS or
/// on this host or the link-local container addresses (it is sent a bearer token).
fn container(l: &Lookup) -> Option<Source> {
    let url = match l.env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
        Some(path) => format!("http://169.254.170.2{path}"),
        None => {
            let url = l.env("AWS_CONTAINER_CREDENTIALS_FULL_URI")?;
            if !container_url_allowed(&url) {
                return Some(Source::Unsupported(format!(
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI {url} is neither HTTPS nor on this host \
                     or a container credentials address, so its token would cross the network \
                     in clear; use an https:// URL"
                )));
            }
            url
        }
    };
    Some(Source::Container {
        url,
        token: l.env("AWS_CONTAINER_AUTHORIZATION_TOKEN"),
        token_file: l
            .env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE")
            .map(PathBuf::from),
    })
}

fn container_url_allowed(text: &str) -> bool {
    let Ok(url) = url::Url::parse(text) else {
        return false;
    };
    if url.scheme() == "https" {
        return true;
    }
    match url.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => {
            ip.is_loopback()
                || ip.octets() == [169, 254, 170, 2]
                || ip.octets() == [169, 254, 170, 23]
        }
        Some(url::Host::Ipv6(ip)) => {
            ip.is_loopback() || ip == "fd00:ec2::23".parse::<std::net::Ipv6Addr>().unwrap()
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(
        env: &'a dyn Fn(&str) -> Option<String>,
        credentials: &[(&str, &str)],
        config: &[(&str, &str)],
    ) -> Lookup<'a> {
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        Lookup {
            env,
            profile_name: "lab".into(),
            credentials: map(credentials),
            config: map(config),
            sso_session: HashMap::new(),
            home: Some(PathBuf::from("/home/u")),
            region: "eu-west-1".into(),
        }
    }

    fn kind(s: &Source) -> String {
        s.describe()
    }

    #[test]
    fn the_first_configured_source_wins_in_the_aws_cli_order() {
        let none = |_: &str| None;
        let web = |k: &str| match k {
            "AWS_WEB_IDENTITY_TOKEN_FILE" => Some("/var/run/token".to_string()),
            "AWS_ROLE_ARN" => Some("arn:aws:iam::1:role/r".to_string()),
            _ => None,
        };
        let keys = [("aws_access_key_id", "AK"), ("aws_secret_access_key", "S")];
        let process = [("credential_process", "/bin/creds --x")];
        // Web identity before the shared credentials file.
        let l = lookup(&web, &keys, &[]);
        assert_eq!(
            kind(&Source::find(&l)),
            "web identity (role arn:aws:iam::1:role/r)"
        );
        match Source::find(&l) {
            Source::WebIdentity { sts, .. } => {
                assert_eq!(sts, "https://sts.eu-west-1.amazonaws.com")
            }
            _ => unreachable!(),
        }
        // The credentials file before credential_process in the config file.
        assert_eq!(
            kind(&Source::find(&lookup(&none, &keys, &process))),
            "profile lab"
        );
        // credential_process before the config file's keys.
        let mut both = process.to_vec();
        both.extend(keys);
        assert_eq!(
            kind(&Source::find(&lookup(&none, &[], &both))),
            "credential_process (profile lab)"
        );
        // Then the container endpoint, then instance metadata, unless disabled.
        let container =
            |k: &str| (k == "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").then(|| "/v2/c".into());
        match Source::find(&lookup(&container, &[], &[])) {
            Source::Container { url, .. } => assert_eq!(url, "http://169.254.170.2/v2/c"),
            s => panic!("{}", s.describe()),
        }
        assert_eq!(
            kind(&Source::find(&lookup(&none, &[], &[]))),
            "EC2 instance metadata (http://169.254.169.254)"
        );
        let off = |k: &str| (k == "AWS_EC2_METADATA_DISABLED").then(|| "true".into());
        assert_eq!(
            kind(&Source::find(&lookup(&off, &[], &[]))),
            "none (anonymous requests)"
        );
        // A role assumed with another profile's keys is refused, not skipped.
        let role = [
            ("role_arn", "arn:aws:iam::1:role/r"),
            ("source_profile", "base"),
        ];
        assert!(matches!(
            Source::find(&lookup(&none, &keys, &role)),
            Source::Unsupported(_)
        ));
    }

    #[test]
    fn sso_profiles_find_the_cache_file_aws_sso_login_wrote() {
        let none = |_: &str| None;
        let mut l = lookup(
            &none,
            &[],
            &[
                ("sso_session", "corp"),
                ("sso_account_id", "111122223333"),
                ("sso_role_name", "ML"),
            ],
        );
        l.sso_session = [("sso_region".to_string(), "us-east-2".to_string())].into();
        match Source::find(&l) {
            Source::Sso {
                cache_file, portal, ..
            } => {
                // sha1("corp")
                assert_eq!(
                    cache_file,
                    PathBuf::from(
                        "/home/u/.aws/sso/cache/ee0bfd2552fbd840c02cc48b6e823320543c450f.json"
                    )
                );
                assert_eq!(portal, "https://portal.sso.us-east-2.amazonaws.com");
            }
            s => panic!("{}", s.describe()),
        }
    }

    #[test]
    fn a_container_url_must_not_send_its_token_in_clear_across_the_network() {
        assert!(container_url_allowed("http://127.0.0.1:8080/creds"));
        assert!(container_url_allowed(
            "http://169.254.170.23/v1/credentials"
        ));
        assert!(container_url_allowed(
            "http://[fd00:ec2::23]/v1/credentials"
        ));
        assert!(container_url_allowed("https://creds.example.org/x"));
        assert!(!container_url_allowed("http://creds.example.org/x"));
        assert!(!container_url_allowed("http://10.0.0.5/x"));
    }
}
