//! What a store's refusal says, in words a user can act on: which credential it refused and
//! why, from the S3 error code of its answer.

/// What a store's refusal code says of the credentials `key` (an access key id; `None`:
/// anonymous requests), and what to do. The key id is shown by its last 4 characters (enough to
/// tell keys apart in a log, not to reuse one); the secret never.
pub fn refusal(code: &str, key: Option<&str>) -> Option<String> {
    let Some(key) = key else {
        return (code == "AccessDenied").then(|| {
            "anonymous requests may not read this object; give credentials (AWS_PROFILE, \
             AWS_ACCESS_KEY_ID) or check the bucket's policy"
                .to_string()
        });
    };
    let tail: String = key
        .chars()
        .skip(key.chars().count().saturating_sub(4))
        .collect();
    let key = format!("access key id ...{tail}");
    Some(match code {
        "InvalidAccessKeyId" => format!("the store knows no {key}; use a key it issued"),
        "SignatureDoesNotMatch" => {
            format!("the secret key is not the one of {key}; give the matching secret")
        }
        "RequestTimeTooSkewed" => "this node's clock is more than 15 minutes off the store's; \
             sync it (chronyc tracking, timedatectl)"
            .to_string(),
        "AccessDenied" => format!(
            "{key} is known to the store but may not read this object; check the bucket's \
             policy and the key's permissions"
        ),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal says which credential and why, from the store's code: a wrong secret and an
    /// unknown key were both "access denied (403)". The key id shows its last 4 characters, the
    /// secret nothing.
    #[test]
    fn a_refusal_says_which_key_and_why() {
        let key = Some("AKIAEXAMPLE7Q2Z");
        let wrong = refusal("SignatureDoesNotMatch", key).unwrap();
        assert!(
            wrong.contains("secret key") && wrong.contains("...7Q2Z"),
            "{wrong}"
        );
        assert!(!wrong.contains("AKIA"), "{wrong}");
        let unknown = refusal("InvalidAccessKeyId", key).unwrap();
        assert!(
            unknown.contains("knows no access key id ...7Q2Z"),
            "{unknown}"
        );
        assert!(
            refusal("RequestTimeTooSkewed", key)
                .unwrap()
                .contains("clock")
        );
        assert!(refusal("AccessDenied", key).unwrap().contains("policy"));
        assert!(refusal("AccessDenied", None).unwrap().contains("anonymous"));
        assert_eq!(refusal("SlowDown", key), None);
        assert_eq!(refusal("", key), None);
    }
}
