//! Who may read a node's staged chunks: the processes of the same job, which share a secret
//! (a file of the user's, given to every node's mount). Every request is signed with it over
//! what it asks and when (HMAC-SHA256; a signature older than `SKEW` is refused, so a request
//! seen on the wire is of no use later), and every answer is signed over the request's signature
//! and the bytes' checksum, so an answer cannot be made up or swapped on the way. The secret
//! itself never travels and is never logged.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{KeyInit, Mac};
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

    /// The signature of a request for `path` (what is asked) at `time` (Unix seconds).
    pub fn sign_request(&self, path: &str, time: u64) -> String {
        hex(&self.mac(&[
            b"packfs-peer-request-1",
            path.as_bytes(),
            &time.to_le_bytes(),
        ]))
    }

    /// Whether `signature` signs `path` at `time`, and `time` is within `SKEW` of now.
    pub fn verify_request(&self, path: &str, time: u64, signature: &str) -> Result<(), Refused> {
        let now = unix_now();
        if now.abs_diff(time) > SKEW.as_secs() {
            return Err(Refused::Stale {
                skew: now as i64 - time as i64,
            });
        }
        match same(&self.sign_request(path, time), signature) {
            true => Ok(()),
            false => Err(Refused::Signature),
        }
    }

    /// The signature of an answer to the request signed `request`: `len` bytes whose xxh3 is
    /// `sum`.
    pub fn sign_answer(&self, request: &str, sum: u64, len: u64) -> String {
        hex(&self.mac(&[
            b"packfs-peer-answer-1",
            request.as_bytes(),
            &sum.to_le_bytes(),
            &len.to_le_bytes(),
        ]))
    }

    pub fn verify_answer(&self, request: &str, sum: u64, len: u64, signature: &str) -> bool {
        same(&self.sign_answer(request, sum, len), signature)
    }
}

/// Why a request was refused (said to the log, never the secret or the signatures).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its time is too far from ours (seconds: ours minus its).
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

    #[test]
    fn requests_and_answers_verify_only_with_the_same_secret_and_words() {
        let job = Secret::of(b"0123456789abcdef-job-a");
        let other = Secret::of(b"0123456789abcdef-job-b");
        let now = unix_now();
        let signed = job.sign_request("/v1/d/3/7", now);
        assert_eq!(job.verify_request("/v1/d/3/7", now, &signed), Ok(()));
        assert_eq!(
            job.verify_request("/v1/d/3/8", now, &signed),
            Err(Refused::Signature)
        );
        assert_eq!(
            other.verify_request("/v1/d/3/7", now, &other.sign_request("/v1/d/3/8", now)),
            Err(Refused::Signature)
        );
        assert!(other.verify_request("/v1/d/3/7", now, &signed).is_err());
        let old = now - 120;
        assert!(matches!(
            job.verify_request("/v1/d/3/7", old, &job.sign_request("/v1/d/3/7", old)),
            Err(Refused::Stale { .. })
        ));
        let answer = job.sign_answer(&signed, 42, 1 << 20);
        assert!(job.verify_answer(&signed, 42, 1 << 20, &answer));
        assert!(!job.verify_answer(&signed, 43, 1 << 20, &answer));
        assert!(!other.verify_answer(&signed, 42, 1 << 20, &answer));
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
