//! Who may read a node's staged chunks, and who can read what crosses the network: the
//! processes of the same job, which share a secret (a file of the user's, given to every node's
//! mount). Every request is signed with it over the node it is for (`Host`), what it asks, when,
//! and a random nonce (HMAC-SHA256): the signature is checked first, then the time (at most
//! `SKEW` off), then the nonce (`replay`: a request is answered once). Every answer is sealed
//! with AES-256-GCM under a key made for that answer alone from the secret, the request's nonce
//! and a random salt of the server's, bound to the request's signature: whoever sees or replays
//! the traffic reads nothing of it, and an answer cannot be made up or swapped on the way. The
//! secret itself never travels and is never logged.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{KeyInit, Mac};
use ring::aead;
use sha2::Sha256;

/// How far a request's time may be from the server's clock (nodes of a job run NTP).
pub const SKEW: Duration = Duration::from_secs(60);

/// Fewer bytes than this would be guessable.
const MIN_SECRET: usize = 16;

/// A job's shared secret, loaded from a file of the user's that nobody else can read.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("peer secret {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error(
        "peer secret {path} is readable by others (mode {mode:04o}): it lets anyone read the \
         job's staged data; chmod 600 it"
    )]
    Readable { path: String, mode: u32 },
    #[error(
        "peer secret {path} holds {len} bytes, fewer than {MIN_SECRET}: write a random one \
         (head -c 32 /dev/urandom | base64 > FILE)"
    )]
    Short { path: String, len: usize },
}

impl Secret {
    /// The secret in `path`: a regular file of this user's (never through a symlink), not
    /// readable or writable by group or others, with at least 16 bytes (trailing whitespace
    /// dropped: `echo`ed secrets end in a newline).
    pub fn load(path: &Path) -> Result<Secret, SecretError> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let shown = path.display().to_string();
        let read_err = |error| SecretError::Read {
            path: shown.clone(),
            error,
        };
        let file = crate::util::safe_file::no_follow()
            .read(true)
            .open(path)
            .map_err(read_err)?;
        crate::util::safe_file::check_owned(&file, path).map_err(read_err)?;
        let mode = file.metadata().map_err(read_err)?.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(SecretError::Readable { path: shown, mode });
        }
        let mut bytes = Vec::new();
        file.take(64 << 10)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        while bytes.last().is_some_and(|b| b.is_ascii_whitespace()) {
            bytes.pop();
        }
        if bytes.len() < MIN_SECRET {
            return Err(SecretError::Short {
                path: shown,
                len: bytes.len(),
            });
        }
        Ok(Secret(bytes))
    }

    #[cfg(test)]
    pub fn of(bytes: &[u8]) -> Secret {
        Secret(bytes.to_vec())
    }

    fn mac(&self, parts: &[&[u8]]) -> Vec<u8> {
        let mut mac = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        for part in parts {
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part);
        }
        mac.finalize().into_bytes().to_vec()
    }

    /// The signature of `request`.
    pub fn sign_request(&self, request: &SignedRequest<'_>) -> String {
        hex(&self.mac(&[
            b"packfs-peer-request-2",
            request.host.as_bytes(),
            request.what.as_bytes(),
            &request.time.to_le_bytes(),
            request.nonce.as_bytes(),
        ]))
    }

    /// Whether `signature` signs `request` with this job's secret, and then whether its time is
    /// within `SKEW` of now. The signature first: a stranger's request is refused for what it
    /// is, whatever time it claims, and costs no log line.
    pub fn verify_request(
        &self,
        request: &SignedRequest<'_>,
        signature: &str,
    ) -> Result<(), Refused> {
        if !same(&self.sign_request(request), signature) {
            return Err(Refused::Signature);
        }
        let now = unix_now();
        if now.abs_diff(request.time) > SKEW.as_secs() {
            return Err(Refused::Stale {
                skew: now as i64 - request.time as i64,
            });
        }
        Ok(())
    }

    /// The key of one answer: made from the secret, the request's nonce and the server's salt,
    /// so no two answers ever share one (the nonce given to the cipher can then be fixed).
    fn answer_key(&self, nonce: &str, salt: &[u8]) -> aead::LessSafeKey {
        let key = self.mac(&[b"packfs-peer-answer-key-2", nonce.as_bytes(), salt]);
        let key = aead::UnboundKey::new(&aead::AES_256_GCM, &key).expect("a 32-byte key");
        aead::LessSafeKey::new(key)
    }

    /// Seals `body` in place (its tag appended) as the answer to the request signed `request`
    /// with `nonce`, carrying `sum`; the salt to send with it, in hex.
    pub fn seal_answer(&self, request: &str, nonce: &str, sum: u64, body: &mut Vec<u8>) -> String {
        let mut salt = [0u8; SALT];
        fill_random(&mut salt);
        let aad = answer_aad(request, sum, body.len() as u64);
        self.answer_key(nonce, &salt)
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key([0; aead::NONCE_LEN]),
                aead::Aad::from(&aad),
                body,
            )
            .expect("an answer within the cipher's length");
        hex(&salt)
    }

    /// Opens in place an answer sealed by `seal_answer`: `body` the bytes without the tag,
    /// `tag` the last 16. False when it was not sealed with this job's secret for this request,
    /// or was changed on the way (`body` is then not to be used).
    pub fn open_answer(
        &self,
        request: &str,
        nonce: &str,
        salt: &str,
        sum: u64,
        body: &mut [u8],
        tag: &[u8; TAG],
    ) -> bool {
        let Some(salt) = unhex(salt).filter(|s| s.len() == SALT) else {
            return false;
        };
        let aad = answer_aad(request, sum, body.len() as u64);
        self.answer_key(nonce, &salt)
            .open_in_place_separate_tag(
                aead::Nonce::assume_unique_for_key([0; aead::NONCE_LEN]),
                aead::Aad::from(&aad),
                aead::Tag::from(*tag),
                body,
                0..,
            )
            .is_ok()
    }
}

/// What a request signs: the node it is for as the asker named it (its `Host`), the path and
/// range asked for, the time (Unix seconds) and a nonce of the asker's.
#[derive(Clone, Copy, Debug)]
pub struct SignedRequest<'a> {
    pub host: &'a str,
    pub what: &'a str,
    pub time: u64,
    pub nonce: &'a str,
}

/// Bytes of an answer's authentication tag.
pub const TAG: usize = 16;
/// Bytes of a server's salt per answer.
const SALT: usize = 16;
/// Bytes of a request's nonce.
pub const NONCE: usize = 16;

/// What an answer's tag covers besides its bytes: the request it answers (its signature), the
/// checksum it carries and its length.
fn answer_aad(request: &str, sum: u64, len: u64) -> Vec<u8> {
    let mut aad = b"packfs-peer-answer-2".to_vec();
    aad.extend_from_slice(&(request.len() as u64).to_le_bytes());
    aad.extend_from_slice(request.as_bytes());
    aad.extend_from_slice(&sum.to_le_bytes());
    aad.extend_from_slice(&len.to_le_bytes());
    aad
}

/// A fresh random nonce for a request, in hex.
pub fn new_nonce() -> String {
    let mut nonce = [0u8; NONCE];
    fill_random(&mut nonce);
    hex(&nonce)
}

fn fill_random(bytes: &mut [u8]) {
    use ring::rand::SecureRandom;
    // The system's generator (getrandom) fails only on a kernel without it: nothing can be
    // sealed or asked safely then.
    ring::rand::SystemRandom::new()
        .fill(bytes)
        .expect("the system's random generator");
}

/// Why a signed request was refused (the secret and the signatures are never said).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Signed with the job's secret, but its time is too far from ours (seconds: ours minus
    /// its): a clock off, or a request captured and sent again later.
    Stale { skew: i64 },
    /// Not signed with the job's secret.
    Signature,
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lowercase hex as bytes; `None` for anything else.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            let pair = text.get(i..i + 2)?;
            pair.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                .then(|| u8::from_str_radix(pair, 16).ok())?
        })
        .collect()
}

/// Equal strings, compared in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn request<'a>(host: &'a str, what: &'a str, time: u64, nonce: &'a str) -> SignedRequest<'a> {
        SignedRequest {
            host,
            what,
            time,
            nonce,
        }
    }

    #[test]
    fn requests_verify_only_with_the_same_secret_node_words_and_nonce() {
        let job = Secret::of(b"0123456789abcdef-job-a");
        let other = Secret::of(b"0123456789abcdef-job-b");
        let now = unix_now();
        let asked = request("n1:7797", "/v2/d/3/7 ", now, "00ff");
        let signed = job.sign_request(&asked);
        assert_eq!(job.verify_request(&asked, &signed), Ok(()));
        for changed in [
            request("n2:7797", "/v2/d/3/7 ", now, "00ff"),
            request("n1:7797", "/v2/d/3/8 ", now, "00ff"),
            request("n1:7797", "/v2/d/3/7 ", now + 1, "00ff"),
            request("n1:7797", "/v2/d/3/7 ", now, "00fe"),
        ] {
            assert_eq!(
                job.verify_request(&changed, &signed),
                Err(Refused::Signature)
            );
        }
        assert_eq!(
            other.verify_request(&asked, &signed),
            Err(Refused::Signature)
        );
        // The signature is checked before the time: a stale request not signed by the job is
        // refused as unsigned, one signed by it as stale.
        let old = request("n1:7797", "/v2/d/3/7 ", now - 120, "00ff");
        assert_eq!(
            job.verify_request(&old, &other.sign_request(&old)),
            Err(Refused::Signature)
        );
        assert!(matches!(
            job.verify_request(&old, &job.sign_request(&old)),
            Err(Refused::Stale { skew: 120 | 121 })
        ));
    }

    #[test]
    fn answers_are_sealed_for_their_request_and_open_only_with_the_secret() {
        let job = Secret::of(b"0123456789abcdef-job-a");
        let other = Secret::of(b"0123456789abcdef-job-b");
        let plain: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let nonce = new_nonce();
        assert_eq!(nonce.len(), 2 * NONCE);
        assert_ne!(nonce, new_nonce());
        let mut sealed = plain.clone();
        let salt = job.seal_answer("sig", &nonce, 42, &mut sealed);
        assert_eq!(sealed.len(), plain.len() + TAG);
        // Nothing of the bytes shows in what crosses the network.
        assert!(!sealed.windows(32).any(|w| w == &plain[1000..1032]));
        let open =
            |secret: &Secret, request: &str, nonce: &str, salt: &str, sum: u64, bytes: &[u8]| {
                let (body, tag) = bytes.split_at(bytes.len() - TAG);
                let mut body = body.to_vec();
                let ok = secret.open_answer(
                    request,
                    nonce,
                    salt,
                    sum,
                    &mut body,
                    tag.try_into().unwrap(),
                );
                ok.then_some(body)
            };
        assert_eq!(
            open(&job, "sig", &nonce, &salt, 42, &sealed),
            Some(plain.clone())
        );
        assert_eq!(open(&other, "sig", &nonce, &salt, 42, &sealed), None);
        assert_eq!(open(&job, "sig2", &nonce, &salt, 42, &sealed), None);
        assert_eq!(open(&job, "sig", &new_nonce(), &salt, 42, &sealed), None);
        assert_eq!(open(&job, "sig", &nonce, &salt, 43, &sealed), None);
        assert_eq!(open(&job, "sig", &nonce, "zz", 42, &sealed), None);
        let mut flipped = sealed.clone();
        flipped[500] ^= 1;
        assert_eq!(open(&job, "sig", &nonce, &salt, 42, &flipped), None);
        // The same bytes sealed twice look different (a fresh salt, so a fresh key).
        let mut again = plain.clone();
        let salt2 = job.seal_answer("sig", &nonce, 42, &mut again);
        assert_ne!(salt, salt2);
        assert_ne!(again, sealed);
    }

    #[test]
    fn hex_reads_back_only_lowercase_pairs() {
        assert_eq!(
            unhex(&hex(&[0, 1, 0xab, 0xff])),
            Some(vec![0, 1, 0xab, 0xff])
        );
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("AB"), None);
        assert_eq!(unhex("+1"), None);
        assert_eq!(unhex("é"), None);
    }

    #[test]
    fn a_secret_others_may_read_or_a_short_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "short\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            Secret::load(&path),
            Err(SecretError::Short { len: 5, .. })
        ));
        std::fs::write(&path, "a-long-enough-job-secret\n").unwrap();
        Secret::load(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let refused = Secret::load(&path).unwrap_err().to_string();
        assert!(refused.contains("chmod 600"), "{refused}");
        assert!(!format!("{:?}", Secret::of(b"0123456789abcdef")).contains("0123"));
    }
}
