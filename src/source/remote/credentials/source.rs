//! The places credentials come from, and fetching from each: `chain` picks the one to use.

use std::path::PathBuf;

use super::{Creds, fetch};

/// A place credentials come from.
#[derive(Default)]
pub enum Source {
    /// Keys that do not change: the environment's, or a profile's.
    Static { creds: Creds, from: String },
    /// STS AssumeRole, signed with the credentials of `source` (another profile's, the
    /// environment's, instance metadata's or a container's).
    AssumeRole {
        role_arn: String,
        session: String,
        external_id: Option<String>,
        duration_s: Option<u32>,
        sts: String,
        region: String,
        source: Box<Source>,
    },
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
    /// For messages: where the credentials come from, never what they are.
    pub fn describe(&self) -> String {
        match self {
            Source::Static { from, .. } => from.clone(),
            Source::AssumeRole {
                role_arn, source, ..
            } => format!("role {role_arn} assumed with {}", source.describe()),
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
            Source::AssumeRole {
                role_arn,
                session,
                external_id,
                duration_s,
                sts,
                region,
                source,
            } => {
                let Some(with) = source.fetch()? else {
                    return Err(format!("{} gave no credentials", source.describe()));
                };
                let role = fetch::Role {
                    arn: role_arn,
                    session,
                    external_id: external_id.as_deref(),
                    duration_s: *duration_s,
                };
                fetch::assume_role(&with, &role, sts, region).map(Some)
            }
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
