//! AWS Signature Version 4 for one form-encoded POST to a service other than S3 (STS
//! AssumeRole). Written here because rusty-s3's signer is fixed to the `s3` service; the unit test
//! checks it against signatures botocore computed for the same requests.

use hmac::{KeyInit, Mac};
use jiff::Timestamp;
use sha2::{Digest, Sha256};

use super::{Creds, hex};

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// The headers to send with a POST of `body` to `host` (`sts.eu-west-1.amazonaws.com`, with
/// `:port` when it is not the scheme's), signed with `creds` for `service` in `region` at `now`:
/// `(name, value)` pairs, `Authorization` last.
pub fn sign_post(
    creds: &Creds,
    service: &str,
    region: &str,
    host: &str,
    body: &str,
    now: Timestamp,
) -> Vec<(String, String)> {
    let amz_date = now.strftime("%Y%m%dT%H%M%SZ").to_string();
    let day = &amz_date[..8];
    let mut headers = vec![
        (
            "content-type".to_string(),
            "application/x-www-form-urlencoded; charset=utf-8".to_string(),
        ),
        ("host".to_string(), host.to_string()),
        ("x-amz-date".to_string(), amz_date.clone()),
    ];
    if let Some(token) = creds.token.as_deref().filter(|t| !t.is_empty()) {
        headers.push(("x-amz-security-token".to_string(), token.to_string()));
    }
    // Already in name order, names lowercase.
    let canonical_headers: String = headers
        .iter()
        .map(|(k, v)| format!("{k}:{}\n", v.trim()))
        .collect();
    let signed: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
    let signed = signed.join(";");
    let canonical_request = format!(
        "POST\n/\n\n{canonical_headers}\n{signed}\n{}",
        hex(&Sha256::digest(body.as_bytes()))
    );
    let scope = format!("{day}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let key = hmac(format!("AWS4{}", creds.secret).as_bytes(), day);
    let key = hmac(&key, region);
    let key = hmac(&key, service);
    let key = hmac(&key, "aws4_request");
    let signature = hex(&hmac(&key, &string_to_sign));
    headers.push((
        "authorization".to_string(),
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            creds.key
        ),
    ));
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_botocores() {
        // botocore's SigV4Auth(Credentials(...), "sts", "eu-west-1") on the same POST at the same
        // time, with and without a session token.
        let body = "Action=AssumeRole&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012\
                    %3Arole%2Fml&RoleSessionName=packfs-test";
        let now: Timestamp = "2026-11-25T03:00:00Z".parse().unwrap();
        let mut creds = Creds {
            key: "AKIDEXAMPLE".into(),
            secret: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            token: None,
            expires: None,
        };
        let host = "sts.eu-west-1.amazonaws.com";
        let auth = |creds: &Creds| {
            sign_post(creds, "sts", "eu-west-1", host, body, now)
                .pop()
                .unwrap()
                .1
        };
        assert_eq!(
            auth(&creds),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261125/eu-west-1/sts/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=56ade23d65942bdfe0bf23adeaedbe8088f8521aeac71b6044004c993bd2b091"
        );
        creds.token = Some("TOKEN/with+chars=".into());
        assert_eq!(
            auth(&creds),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261125/eu-west-1/sts/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, \
             Signature=f6b2a4658b3f75e37896c779ba5a4276377f882824e9a86bb80ce7624b234d4b"
        );
    }
}
