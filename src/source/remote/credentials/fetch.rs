//! Fetching credentials from each source. Every answer is bounded (1 MiB) and checked before use,
//! and no error message quotes a token, a key or an answer's body: only status codes and the
//! error codes the services define.

use std::path::Path;
use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;

use super::super::xml_text;
use super::Creds;

/// The most read of any answer: credentials are a few kilobytes.
const MAX_ANSWER: u64 = 1 << 20;

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .build()
        .into()
}

/// The status and body of an answer, or why there is none.
fn answer(
    result: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    what: &str,
) -> Result<(u16, String), String> {
    let resp =
        result.map_err(|e| format!("{what}: {}", crate::util::redact::urls(&e.to_string())))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .with_config()
        .limit(MAX_ANSWER)
        .read_to_string()
        .map_err(|e| format!("{what}: reading the answer: {e}"))?;
    Ok((status, body))
}

fn read_secret_file(path: &Path, what: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the {what} {}: {e}", path.display()))?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err(format!("the {what} {} is empty", path.display()));
    }
    Ok(text)
}

/// STS AssumeRoleWithWebIdentity (an unsigned call: the token is the proof).
pub fn web_identity(
    token_file: &Path,
    role_arn: &str,
    session: &str,
    sts: &str,
) -> Result<Creds, String> {
    let token = read_secret_file(token_file, "web identity token file")?;
    let body = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("Action", "AssumeRoleWithWebIdentity")
        .append_pair("Version", "2011-06-15")
        .append_pair("RoleArn", role_arn)
        .append_pair("RoleSessionName", session)
        .append_pair("WebIdentityToken", &token)
        .finish();
    let url = format!("{}/", sts.trim_end_matches('/'));
    let what = format!("STS AssumeRoleWithWebIdentity at {url}");
    let answer = answer(
        agent(Duration::from_secs(10))
            .post(&url)
            .content_type("application/x-www-form-urlencoded")
            .send(&body),
        &what,
    );
    sts_credentials(answer, &what)
}

/// The role a profile assumes, as STS AssumeRole takes it.
pub struct Role<'a> {
    pub arn: &'a str,
    pub session: &'a str,
    pub external_id: Option<&'a str>,
    pub duration_s: Option<u32>,
}

/// STS AssumeRole, signed (SigV4) with `with`.
pub fn assume_role(with: &Creds, role: &Role, sts: &str, region: &str) -> Result<Creds, String> {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("Action", "AssumeRole")
        .append_pair("Version", "2011-06-15")
        .append_pair("RoleArn", role.arn)
        .append_pair("RoleSessionName", role.session);
    if let Some(id) = role.external_id {
        form.append_pair("ExternalId", id);
    }
    if let Some(d) = role.duration_s {
        form.append_pair("DurationSeconds", &d.to_string());
    }
    let body = form.finish();
    let url = format!("{}/", sts.trim_end_matches('/'));
    let what = format!("STS AssumeRole of {} at {url}", role.arn);
    let parsed = url::Url::parse(&url).map_err(|e| format!("{what}: {e}"))?;
    let host = match (parsed.host_str(), parsed.port()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_string(),
        (None, _) => return Err(format!("{what}: the URL has no host")),
    };
    let mut req = agent(Duration::from_secs(10)).post(&url);
    for (name, value) in
        super::sigv4::sign_post(with, "sts", region, &host, &body, Timestamp::now())
    {
        // ureq sets Host itself, from the URL: the same value.
        if name != "host" {
            req = req.header(&name, &value);
        }
    }
    sts_credentials(answer(req.send(&body), &what), &what)
}

/// The credentials in an STS answer (`<Credentials>` of AssumeRole and
/// AssumeRoleWithWebIdentity), or its error code.
fn sts_credentials(answer: Result<(u16, String), String>, what: &str) -> Result<Creds, String> {
    let (status, text) = answer?;
    if status != 200 {
        let code = xml_text(&text, "Code").unwrap_or("no error code");
        return Err(format!("{what}: status {status} ({code})"));
    }
    let field = |tag: &str| {
        xml_text(&text, tag)
            .map(str::to_string)
            .ok_or_else(|| format!("{what}: the answer has no {tag}"))
    };
    Ok(Creds {
        key: field("AccessKeyId")?,
        secret: field("SecretAccessKey")?,
        token: Some(field("SessionToken")?),
        expires: Some(timestamp(&field("Expiration")?).map_err(|e| format!("{what}: {e}"))?),
    })
}

/// The role credentials an SSO login's cached token buys at the portal.
pub fn sso(
    cache_file: &Path,
    account: &str,
    role: &str,
    portal: &str,
    profile: &str,
) -> Result<Creds, String> {
    let login = format!("run `aws sso login --profile {profile}`");
    let cached = std::fs::read_to_string(cache_file).map_err(|e| {
        format!(
            "no SSO login cached ({}: {e}); {login}",
            cache_file.display()
        )
    })?;
    let cached: Value = serde_json::from_str(&cached)
        .map_err(|e| format!("{} is not JSON ({e}); {login}", cache_file.display()))?;
    let token = cached["accessToken"]
        .as_str()
        .ok_or_else(|| format!("{} holds no accessToken; {login}", cache_file.display()))?;
    let expires = cached["expiresAt"].as_str().map(timestamp).transpose()?;
    if expires.is_some_and(|t| t <= Timestamp::now()) {
        return Err(format!("the SSO login has expired; {login}"));
    }
    let url = format!("{}/federation/credentials", portal.trim_end_matches('/'));
    let what = format!("the SSO portal {url}");
    let (status, text) = answer(
        agent(Duration::from_secs(10))
            .get(&url)
            .query("role_name", role)
            .query("account_id", account)
            .header("x-amz-sso_bearer_token", token)
            .call(),
        &what,
    )?;
    if status == 401 || status == 403 {
        return Err(format!("{what}: status {status}; {login}"));
    }
    if status != 200 {
        return Err(format!("{what}: status {status}"));
    }
    let doc = json(&text, &what)?;
    let c = &doc["roleCredentials"];
    let field = |name: &str| {
        c[name]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("{what}: the answer has no roleCredentials.{name}"))
    };
    let expires_ms = c["expiration"]
        .as_i64()
        .ok_or_else(|| format!("{what}: the answer has no roleCredentials.expiration"))?;
    Ok(Creds {
        key: field("accessKeyId")?,
        secret: field("secretAccessKey")?,
        token: Some(field("sessionToken")?),
        expires: Some(
            Timestamp::from_millisecond(expires_ms)
                .map_err(|e| format!("{what}: expiration {expires_ms}: {e}"))?,
        ),
    })
}

/// `credential_process`: the command, split as a POSIX shell would (no shell runs), prints
/// `{"Version": 1, "AccessKeyId": ..., "SecretAccessKey": ..., "SessionToken": ...,
/// "Expiration": ...}`. Its stderr goes to ours, as with the AWS CLI.
pub fn process(command: &str) -> Result<Creds, String> {
    // Never the command itself in a message: its arguments may hold a secret.
    let words = shlex::split(command)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| {
            "credential_process cannot be split into words (an unclosed quote?)".to_string()
        })?;
    let program = &words[0];
    let out = std::process::Command::new(program)
        .args(&words[1..])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("credential_process {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "credential_process {program} failed ({}); run it by hand to see why",
            out.status
        ));
    }
    let doc: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("credential_process {program} printed no JSON object: {e}"))?;
    if doc["Version"].as_i64() != Some(1) {
        return Err(format!(
            "credential_process {program}: \"Version\" must be 1 (the only version there is)"
        ));
    }
    json_creds(
        &doc,
        "SessionToken",
        &format!("credential_process {program}"),
    )
}

/// The container endpoint (ECS task role, EKS Pod Identity).
pub fn container(
    url: &str,
    token: Option<&str>,
    token_file: Option<&Path>,
) -> Result<Creds, String> {
    let token = match token_file {
        Some(f) => Some(read_secret_file(f, "container authorization token file")?),
        None => token.map(str::to_string),
    };
    let what = format!("the container credentials endpoint {url}");
    let mut req = agent(Duration::from_secs(2)).get(url);
    if let Some(t) = &token {
        req = req.header("Authorization", t);
    }
    let (status, text) = answer(req.call(), &what)?;
    if status != 200 {
        return Err(format!("{what}: status {status}"));
    }
    let doc = json(&text, &what)?;
    json_creds(&doc, "Token", &what)
}

/// EC2 instance metadata, IMDSv2: a session token from a PUT, then the role's name and its
/// credentials. `Ok(None)` where nothing answers or the instance has no role: not on EC2.
pub fn imds(endpoint: &str, timeout_s: f64) -> Result<Option<Creds>, String> {
    let agent = agent(Duration::from_secs_f64(timeout_s));
    let what = format!("EC2 instance metadata at {endpoint}");
    let Ok(resp) = agent
        .put(&format!("{endpoint}/latest/api/token"))
        .header("X-aws-ec2-metadata-token-ttl-seconds", "21600")
        .send_empty()
    else {
        // Nothing listens (or nothing answers in time): not an EC2 instance.
        return Ok(None);
    };
    let (status, session) = answer(Ok(resp), &what)?;
    // An instance that allows only IMDSv1 refuses the PUT; its metadata is read without a token.
    let session = match status {
        200 => Some(session.trim().to_string()),
        403..=405 => None,
        _ => {
            return Err(format!(
                "{what}: the token request answered status {status}"
            ));
        }
    };
    let get = |path: &str| {
        let mut req = agent.get(&format!(
            "{endpoint}/latest/meta-data/iam/security-credentials/{path}"
        ));
        if let Some(s) = &session {
            req = req.header("X-aws-ec2-metadata-token", s);
        }
        answer(req.call(), &what)
    };
    let (status, roles) = get("")?;
    if status == 404 {
        return Ok(None);
    }
    if status != 200 {
        return Err(format!("{what}: the role request answered status {status}"));
    }
    let Some(role) = roles.lines().map(str::trim).find(|r| !r.is_empty()) else {
        return Ok(None);
    };
    if !role
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "+=,.@_-".contains(c))
    {
        return Err(format!("{what}: the role name is not an IAM role name"));
    }
    let (status, text) = get(role)?;
    if status != 200 {
        return Err(format!("{what}: role {role} answered status {status}"));
    }
    let doc = json(&text, &what)?;
    if let Some(code) = doc["Code"].as_str().filter(|c| *c != "Success") {
        return Err(format!("{what}: role {role}: {code}"));
    }
    json_creds(&doc, "Token", &what).map(Some)
}

fn json(text: &str, what: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what}: the answer is not JSON: {e}"))
}

/// Credentials in the JSON shape IMDS, the container endpoint and `credential_process` share.
fn json_creds(doc: &Value, token_name: &str, what: &str) -> Result<Creds, String> {
    let field = |name: &str| {
        doc[name]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let (Some(key), Some(secret)) = (field("AccessKeyId"), field("SecretAccessKey")) else {
        return Err(format!(
            "{what}: the answer has no AccessKeyId and SecretAccessKey"
        ));
    };
    let expires = match field("Expiration") {
        Some(t) => Some(timestamp(&t).map_err(|e| format!("{what}: {e}"))?),
        None => None,
    };
    Ok(Creds {
        key,
        secret,
        token: field(token_name),
        expires,
    })
}

/// An ISO 8601 time as the services write it: `2026-11-25T04:00:00Z`, with fractions or an
/// offset, or the older SSO cache's `2026-11-25T04:00:00UTC`.
fn timestamp(text: &str) -> Result<Timestamp, String> {
    let t = text.trim();
    let t = t
        .strip_suffix("UTC")
        .map_or(t.to_string(), |s| format!("{s}Z"));
    t.parse::<Timestamp>()
        .map_err(|e| format!("cannot read the time {t:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_sts_answers_are_read_as_the_services_write_them() {
        for t in [
            "2026-11-25T04:00:00Z",
            "2026-11-25T04:00:00.000Z",
            "2026-11-25T04:00:00UTC",
            "2026-11-25T05:00:00+01:00",
        ] {
            assert_eq!(timestamp(t).unwrap().as_second(), 1795579200, "{t}");
        }
        assert!(timestamp("tomorrow").is_err());
        let xml = "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult>\
                   <Credentials><SessionToken>TOK</SessionToken><AccessKeyId>ASIA1</AccessKeyId>\
                   </Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>";
        assert_eq!(xml_text(xml, "AccessKeyId"), Some("ASIA1"));
        assert_eq!(xml_text(xml, "Expiration"), None);
    }

    #[test]
    fn credential_process_output_is_checked() {
        let ok = process(
            r#"printf '{"Version": 1, "AccessKeyId": "AK", "SecretAccessKey": "S", "Expiration": "2026-11-25T04:00:00Z"}'"#,
        )
        .unwrap();
        assert_eq!((ok.key.as_str(), ok.token), ("AK", None));
        let v2 = process(r#"printf '{"Version": 2, "AccessKeyId": "AK", "SecretAccessKey": "S"}'"#);
        assert!(v2.unwrap_err().contains("Version"));
        let failed = process("false").unwrap_err();
        assert!(failed.contains("failed"), "{failed}");
        // The command's arguments may hold a secret: no message shows them.
        let unbalanced = process("get-keys --password hunter2 'oops").unwrap_err();
        assert!(
            unbalanced.contains("cannot be split") && !unbalanced.contains("hunter2"),
            "{unbalanced}"
        );
    }
}
