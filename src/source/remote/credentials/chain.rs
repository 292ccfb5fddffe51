//! Which source the credentials come from: the first one configured, in the AWS CLI's order
//! (environment, a role the profile assumes, web identity, SSO, the shared credentials file,
//! `credential_process`, the config file, a container endpoint, EC2 instance metadata). A source
//! that is configured but fails is an error, never a silent step to the next one: other
//! credentials would read other data.

use std::collections::HashMap;
use std::path::PathBuf;

use super::Creds;
use super::lookup::Lookup;
use super::source::Source;

/// The first configured source of the chain.
pub fn find(l: &Lookup) -> Source {
    let profile = &l.profile_name;
    if let Some(keys) = environment_keys(l) {
        return keys;
    }
    if let Some(role_arn) = l.profile("role_arn")
        && l.profile("web_identity_token_file").is_none()
    {
        return assume_role(l, role_arn);
    }
    let token_file = l
        .env("AWS_WEB_IDENTITY_TOKEN_FILE")
        .or(l.profile("web_identity_token_file"));
    let role_arn = l.env("AWS_ROLE_ARN").or(l.profile("role_arn"));
    if let (Some(token_file), Some(role_arn)) = (token_file, role_arn) {
        return Source::WebIdentity {
            token_file: PathBuf::from(token_file),
            role_arn,
            session: session_name(l),
            sts: sts_endpoint(l),
        };
    }
    if let Some(sso) = sso(l) {
        return sso;
    }
    if let Some(keys) = keys_in(&l.credentials, profile) {
        return keys;
    }
    if let Some(command) = l.profile("credential_process") {
        return Source::Process {
            command,
            profile: profile.clone(),
        };
    }
    if let Some(keys) = keys_in(&l.config, profile) {
        return keys;
    }
    if let Some(container) = container(l) {
        return container;
    }
    if l.env("AWS_EC2_METADATA_DISABLED")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Source::Anonymous;
    }
    imds(l)
}

/// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`).
fn environment_keys(l: &Lookup) -> Option<Source> {
    Some(Source::Static {
        creds: Creds {
            key: l.env("AWS_ACCESS_KEY_ID")?,
            secret: l.env("AWS_SECRET_ACCESS_KEY")?,
            token: l.env("AWS_SESSION_TOKEN"),
            expires: None,
        },
        from: "environment (AWS_ACCESS_KEY_ID)".into(),
    })
}

fn session_name(l: &Lookup) -> String {
    l.env("AWS_ROLE_SESSION_NAME")
        .or(l.profile("role_session_name"))
        .unwrap_or_else(|| format!("packfs-{}", jiff::Timestamp::now().as_second()))
}

fn sts_endpoint(l: &Lookup) -> String {
    l.endpoint("STS")
        .unwrap_or_else(|| format!("https://sts.{}.amazonaws.com", l.region))
}

/// A profile that assumes `role_arn` with the credentials of `source_profile` (followed up to 4
/// profiles deep, as chains of roles go) or of `credential_source`.
fn assume_role(l: &Lookup, role_arn: String) -> Source {
    match role_source(l) {
        Ok(source) => Source::AssumeRole {
            role_arn,
            session: session_name(l),
            external_id: l.profile("external_id"),
            duration_s: l
                .profile("duration_seconds")
                .and_then(|d| d.trim().parse().ok()),
            sts: sts_endpoint(l),
            region: l.region.clone(),
            source: Box::new(source),
        },
        Err(why) => Source::Unsupported(format!("profile {}: {why}", l.profile_name)),
    }
}

/// Whose credentials sign the AssumeRole call.
fn role_source(l: &Lookup) -> Result<Source, String> {
    let profile = &l.profile_name;
    if l.profile("mfa_serial").is_some() {
        return Err(format!(
            "the role is assumed with an MFA code, which a mount cannot ask for; run `aws \
             configure export-credentials --profile {profile} --format env` in the job and mount \
             with the keys it exports"
        ));
    }
    match (l.profile("source_profile"), l.profile("credential_source")) {
        (Some(name), None) if name == *profile => {
            keys_in(&l.credentials, profile).ok_or_else(|| {
                "it is its own source_profile but has no keys in the credentials file".into()
            })
        }
        (Some(_), None) if l.depth >= 4 => {
            Err("more than 4 profiles chained through source_profile".into())
        }
        (Some(name), None) => match find(&l.profile_named(&name)) {
            Source::Imds { .. } | Source::Anonymous => {
                Err(format!("its source_profile {name} has no credentials"))
            }
            Source::Unsupported(why) => Err(why),
            found => Ok(found),
        },
        (None, Some(cs)) => match cs.as_str() {
            "Environment" => environment_keys(l).ok_or_else(|| {
                "credential_source Environment, but AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY are not both set"
                    .into()
            }),
            "Ec2InstanceMetadata" => Ok(imds(l)),
            "EcsContainer" => container(l).ok_or_else(|| {
                "credential_source EcsContainer, but AWS_CONTAINER_CREDENTIALS_RELATIVE_URI and \
                 _FULL_URI are unset"
                    .into()
            }),
            other => Err(format!(
                "credential_source {other} is not one of Environment, Ec2InstanceMetadata, \
                 EcsContainer"
            )),
        },
        _ => Err(
            "it has role_arn but needs exactly one of source_profile and \
                  credential_source"
                .into(),
        ),
    }
}

/// EC2 instance metadata, where `AWS_EC2_METADATA_SERVICE_ENDPOINT` or the profile says.
fn imds(l: &Lookup) -> Source {
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

/// The keys a profile's section of one file holds.
fn keys_in(section: &HashMap<String, String>, profile: &str) -> Option<Source> {
    Some(Source::Static {
        creds: Creds {
            key: section.get("aws_access_key_id")?.clone(),
            secret: section.get("aws_secret_access_key")?.clone(),
            token: section.get("aws_session_token").cloned(),
            expires: None,
        },
        from: format!("profile {profile}"),
    })
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
    let hash = super::hex(&sha1::Sha1::digest(cache_key.as_bytes()));
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
    use crate::source::remote::credentials::files::AwsFiles;

    /// Profile `lab` with `credentials` and `config` pairs, and `more` config-file text.
    fn lookup_with<'a>(
        env: &'a dyn Fn(&str) -> Option<String>,
        credentials: &[(&str, &str)],
        config: &[(&str, &str)],
        more: &str,
    ) -> Lookup<'a> {
        let ini = |header: &str, pairs: &[(&str, &str)]| {
            let lines: String = pairs.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
            format!("[{header}]\n{lines}")
        };
        let files = AwsFiles::of(
            &ini("lab", credentials),
            &(ini("profile lab", config) + more),
        );
        // The files outlive the test's lookups.
        let files: &'static AwsFiles = Box::leak(Box::new(files));
        let mut l = Lookup::new(env, files, "lab", Some(PathBuf::from("/home/u")));
        l.region = "eu-west-1".into();
        l
    }

    fn lookup<'a>(
        env: &'a dyn Fn(&str) -> Option<String>,
        credentials: &[(&str, &str)],
        config: &[(&str, &str)],
    ) -> Lookup<'a> {
        lookup_with(env, credentials, config, "")
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
        assert_eq!(kind(&find(&l)), "web identity (role arn:aws:iam::1:role/r)");
        match find(&l) {
            Source::WebIdentity { sts, .. } => {
                assert_eq!(sts, "https://sts.eu-west-1.amazonaws.com")
            }
            _ => unreachable!(),
        }
        // The credentials file before credential_process in the config file.
        assert_eq!(kind(&find(&lookup(&none, &keys, &process))), "profile lab");
        // credential_process before the config file's keys.
        let mut both = process.to_vec();
        both.extend(keys);
        assert_eq!(
            kind(&find(&lookup(&none, &[], &both))),
            "credential_process (profile lab)"
        );
        // Then the container endpoint, then instance metadata, unless disabled.
        let container =
            |k: &str| (k == "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").then(|| "/v2/c".into());
        match find(&lookup(&container, &[], &[])) {
            Source::Container { url, .. } => assert_eq!(url, "http://169.254.170.2/v2/c"),
            s => panic!("{}", s.describe()),
        }
        assert_eq!(
            kind(&find(&lookup(&none, &[], &[]))),
            "EC2 instance metadata (http://169.254.169.254)"
        );
        let off = |k: &str| (k == "AWS_EC2_METADATA_DISABLED").then(|| "true".into());
        assert_eq!(
            kind(&find(&lookup(&off, &[], &[]))),
            "none (anonymous requests)"
        );
        // A role assumed with another profile's keys comes before everything but the
        // environment, and is never skipped: a source profile without keys is an error.
        let role = [
            ("role_arn", "arn:aws:iam::1:role/r"),
            ("source_profile", "base"),
        ];
        let base = "[profile base]\naws_access_key_id = BK\naws_secret_access_key = BS\n";
        assert_eq!(
            kind(&find(&lookup_with(&none, &keys, &role, base))),
            "role arn:aws:iam::1:role/r assumed with profile base"
        );
        assert!(matches!(
            find(&lookup(&none, &keys, &role)),
            Source::Unsupported(_)
        ));
        // Roles chained through profiles, and credential_source.
        let chain = "[profile mid]\nrole_arn = arn:aws:iam::1:role/mid\nsource_profile = base\n";
        let via_mid = [
            ("role_arn", "arn:aws:iam::1:role/r"),
            ("source_profile", "mid"),
        ];
        assert_eq!(
            kind(&find(&lookup_with(
                &none,
                &[],
                &via_mid,
                &(chain.to_string() + base)
            ))),
            "role arn:aws:iam::1:role/r assumed with role arn:aws:iam::1:role/mid assumed with \
             profile base"
        );
        let from_imds = [
            ("role_arn", "arn:aws:iam::1:role/r"),
            ("credential_source", "Ec2InstanceMetadata"),
        ];
        assert_eq!(
            kind(&find(&lookup(&none, &[], &from_imds))),
            "role arn:aws:iam::1:role/r assumed with EC2 instance metadata (http://169.254.169.254)"
        );
        let looped = "[profile base]\nrole_arn = arn:aws:iam::1:role/b\nsource_profile = lab\n";
        assert!(matches!(
            find(&lookup_with(&none, &[], &role, looped)),
            Source::Unsupported(_)
        ));
        let mfa = [
            ("role_arn", "arn:aws:iam::1:role/r"),
            ("source_profile", "base"),
            ("mfa_serial", "arn:mfa"),
        ];
        assert!(matches!(
            find(&lookup_with(&none, &[], &mfa, base)),
            Source::Unsupported(_)
        ));
    }

    #[test]
    fn sso_profiles_find_the_cache_file_aws_sso_login_wrote() {
        let none = |_: &str| None;
        let l = lookup_with(
            &none,
            &[],
            &[
                ("sso_session", "corp"),
                ("sso_account_id", "111122223333"),
                ("sso_role_name", "ML"),
            ],
            "[sso-session corp]\nsso_region = us-east-2\n",
        );
        match find(&l) {
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
