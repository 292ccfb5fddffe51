//! What the chain of credential sources reads: the environment, and a profile of the AWS files.

use std::collections::HashMap;
use std::path::PathBuf;

use super::files::AwsFiles;

/// What the chain reads: the environment, and the selected profile of both AWS files.
pub struct Lookup<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    files: &'a AwsFiles,
    pub profile_name: String,
    /// The profile in ~/.aws/credentials.
    pub credentials: HashMap<String, String>,
    /// The profile in ~/.aws/config.
    pub config: HashMap<String, String>,
    /// The `[sso-session NAME]` section the profile names, if any.
    pub sso_session: HashMap<String, String>,
    pub home: Option<PathBuf>,
    pub region: String,
    /// Profiles followed through `source_profile` to get here.
    pub(super) depth: usize,
}

/// The environment of a profile reached through `source_profile`: the AWS CLI reads only the
/// files for it.
fn no_env(_: &str) -> Option<String> {
    None
}

impl<'a> Lookup<'a> {
    /// Profile `profile_name` of `files`; the region as the AWS CLI finds it (`AWS_REGION`,
    /// `AWS_DEFAULT_REGION`, the profile's, else us-east-1).
    pub fn new(
        env: &'a dyn Fn(&str) -> Option<String>,
        files: &'a AwsFiles,
        profile_name: &str,
        home: Option<PathBuf>,
    ) -> Lookup<'a> {
        let (credentials, config) = files.profile(profile_name);
        let sso_session = config
            .get("sso_session")
            .map(|name| files.section(&format!("sso-session {name}")))
            .unwrap_or_default();
        let mut lookup = Lookup {
            env,
            files,
            profile_name: profile_name.to_string(),
            credentials,
            config,
            sso_session,
            home,
            region: String::new(),
            depth: 0,
        };
        lookup.region = lookup
            .env("AWS_REGION")
            .or(lookup.env("AWS_DEFAULT_REGION"))
            .or(lookup.profile("region"))
            .unwrap_or_else(|| "us-east-1".into());
        lookup
    }

    /// Another profile of the same files, for `source_profile`: in the region of this one.
    pub(super) fn profile_named(&self, name: &str) -> Lookup<'a> {
        let mut other = Lookup::new(&no_env, self.files, name, self.home.clone());
        other.region = self.region.clone();
        other.depth = self.depth + 1;
        other
    }
}

impl Lookup<'_> {
    pub(super) fn env(&self, name: &str) -> Option<String> {
        (self.env)(name).filter(|v| !v.trim().is_empty())
    }

    /// A value of the profile: the credentials file first, as the AWS CLI merges them.
    pub(super) fn profile(&self, key: &str) -> Option<String> {
        self.credentials
            .get(key)
            .or(self.config.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    }

    /// The endpoint of an AWS service (`S3`, `STS`, `SSO`): its own variable, then the global
    /// one, then the profile's `endpoint_url`.
    pub fn endpoint(&self, service: &str) -> Option<String> {
        self.env(&format!("AWS_ENDPOINT_URL_{service}"))
            .or(self.env("AWS_ENDPOINT_URL"))
            .or(self.profile("endpoint_url"))
    }
}
