//! The AWS CLI's two files, `~/.aws/credentials` and `~/.aws/config`, read once: a profile of
//! each, and the config file's other sections (`[sso-session NAME]`). Missing or unreadable files
//! read as empty, as the AWS CLI reads them.

use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Default)]
pub struct AwsFiles {
    credentials: String,
    config: String,
}

impl AwsFiles {
    pub fn read(credentials: Option<PathBuf>, config: Option<PathBuf>) -> AwsFiles {
        let text = |p: Option<PathBuf>| {
            p.and_then(|p| std::fs::read_to_string(p).ok())
                .unwrap_or_default()
        };
        AwsFiles {
            credentials: text(credentials),
            config: text(config),
        }
    }

    #[cfg(test)]
    pub fn of(credentials: &str, config: &str) -> AwsFiles {
        AwsFiles {
            credentials: credentials.into(),
            config: config.into(),
        }
    }

    /// Profile `name`'s pairs: `[name]` in the credentials file, `[profile name]` (or
    /// `[default]`) in the config file.
    pub fn profile(&self, name: &str) -> (HashMap<String, String>, HashMap<String, String>) {
        let in_config = if name == "default" {
            name.to_string()
        } else {
            format!("profile {name}")
        };
        (
            parse_section(&self.credentials, name),
            parse_section(&self.config, &in_config),
        )
    }

    /// Any `[section]` of the config file.
    pub fn section(&self, section: &str) -> HashMap<String, String> {
        parse_section(&self.config, section)
    }
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
            AwsFiles::of(credentials, "").profile("lab").0["aws_access_key_id"],
            "AK2"
        );
        assert_eq!(
            AwsFiles::of(credentials, "").profile("default").0["aws_secret_access_key"],
            "S1"
        );
        let config =
            "[default]\nregion = eu-west-1\n[profile lab]\nendpoint_url = http://minio:9000\n";
        assert_eq!(
            AwsFiles::of("", config).profile("lab").1["endpoint_url"],
            "http://minio:9000"
        );
        assert!(
            !AwsFiles::of("", config)
                .profile("lab")
                .1
                .contains_key("region")
        );
        assert_eq!(
            AwsFiles::of("", config).profile("default").1["region"],
            "eu-west-1"
        );
    }
}
