//! The seam between objects and the network: what a reader asks of a store (HEAD, a ranged GET
//! that fails if the object changed, a listing). The process's network client (`client`, S3 and
//! HTTP) is one implementation, built from the mount's options; `MemoryStore` is another, so unit
//! tests swap the store instead of starting a server (integration tests run a real one).

use std::io;
use std::sync::{Arc, OnceLock};

use super::client::{Client, ObjectMeta};
use super::config::{Limits, S3Config};
use super::location::Location;

pub trait ObjectStore: Send + Sync {
    /// The object's size, ETag and modification time.
    fn head(&self, loc: &Location) -> io::Result<ObjectMeta>;

    /// Fills `buf` from `offset` of the object; fails, saying the object was replaced, if its
    /// ETag or size is no longer the one it had when `opened`.
    fn get_range(
        &self,
        loc: &Location,
        offset: u64,
        buf: &mut [u8],
        opened: Option<&ObjectMeta>,
    ) -> io::Result<()>;

    /// Keys of `bucket` that start with `prefix` and that `keep` takes, in key order.
    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        keep: &dyn Fn(&str) -> bool,
    ) -> io::Result<Vec<String>>;
}

impl ObjectStore for Client {
    fn head(&self, loc: &Location) -> io::Result<ObjectMeta> {
        Client::head(self, loc)
    }

    fn get_range(
        &self,
        loc: &Location,
        offset: u64,
        buf: &mut [u8],
        opened: Option<&ObjectMeta>,
    ) -> io::Result<()> {
        Client::get_range(self, loc, offset, buf, opened)
    }

    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        keep: &dyn Fn(&str) -> bool,
    ) -> io::Result<Vec<String>> {
        Client::list(self, bucket, prefix, keep)
    }
}

/// What the mount's options say of the stores (the command line's `--endpoint-url`); the rest
/// comes from the environment and the AWS profile.
#[derive(Clone, Default)]
pub struct StoreOptions {
    pub endpoint: Option<String>,
}

impl std::fmt::Debug for StoreOptions {
    /// The endpoint without what a URL may carry of a secret (`https://user:key@host`): a
    /// mount's request and an engine's stores are printed whole by `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let endpoint = self.endpoint.as_deref().map(crate::util::redact::urls);
        f.debug_struct("StoreOptions")
            .field("endpoint", &endpoint)
            .finish()
    }
}

/// The stores one engine reads objects from, handed to every open (`ImageLocation::open`), so an
/// engine's reads never reach a store it was not given: the network client built from its
/// options (made at the first request: a dataset of files never resolves credentials), or a
/// store given whole (a `MemoryStore`, a failure store, a caller's own). Cloning shares it.
#[derive(Clone)]
pub struct Stores(Arc<Inner>);

struct Inner {
    options: StoreOptions,
    client: OnceLock<Arc<Client>>,
    given: Option<Arc<dyn ObjectStore>>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.given {
            Some(_) => write!(f, "Stores(given)"),
            None => write!(f, "Stores({:?})", self.0.options),
        }
    }
}

impl Default for Stores {
    /// The network, as the environment and the AWS profile configure it.
    fn default() -> Stores {
        Stores::network(StoreOptions::default())
    }
}

impl Stores {
    /// S3 and HTTP(S) over the network, with `options`.
    pub fn network(options: StoreOptions) -> Stores {
        Stores(Arc::new(Inner {
            options,
            client: OnceLock::new(),
            given: None,
        }))
    }

    /// Every object read from `store`.
    pub fn given(store: Arc<dyn ObjectStore>) -> Stores {
        Stores(Arc::new(Inner {
            options: StoreOptions::default(),
            client: OnceLock::new(),
            given: Some(store),
        }))
    }

    /// The store objects are read from.
    pub fn object_store(&self) -> Arc<dyn ObjectStore> {
        match &self.0.given {
            Some(store) => store.clone(),
            None => self.client().clone(),
        }
    }

    fn client(&self) -> &Arc<Client> {
        self.0.client.get_or_init(|| {
            let endpoint = self.0.options.endpoint.clone();
            Arc::new(Client::new(S3Config::resolve(endpoint), Limits::from_env()))
        })
    }

    /// The network client's request counters, once a request was made.
    pub fn stats(&self) -> Vec<super::StoreStats> {
        self.0.client.get().map_or_else(Vec::new, |c| c.stats())
    }

    /// The S3 credentials in use, once a request needed them.
    pub fn credential_stats(&self) -> Option<super::CredentialStats> {
        self.0.client.get()?.credential_stats()
    }
}

/// Objects held in memory, for unit tests: put, replaced (a new ETag), read and listed as a store
/// would, refusing a read of an object replaced since it was opened.
#[cfg(any(test, feature = "testing"))]
#[derive(Default)]
pub struct MemoryStore {
    /// By URL: the bytes, and a version that is the ETag.
    objects: std::sync::Mutex<std::collections::BTreeMap<String, Stored>>,
}

#[cfg(any(test, feature = "testing"))]
type Stored = (Arc<Vec<u8>>, u64);

#[cfg(any(test, feature = "testing"))]
impl MemoryStore {
    /// Puts (or replaces) the object `url` names.
    pub fn put(&self, url: &str, bytes: Vec<u8>) {
        let mut objects = self.objects.lock().expect("not poisoned");
        let version = objects.get(url).map_or(1, |(_, v)| v + 1);
        objects.insert(url.to_string(), (Arc::new(bytes), version));
    }

    fn get(&self, loc: &Location) -> io::Result<Stored> {
        let objects = self.objects.lock().expect("not poisoned");
        objects.get(&loc.to_string()).cloned().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{loc}: no such object (404)"),
            )
        })
    }
}

#[cfg(any(test, feature = "testing"))]
impl ObjectStore for MemoryStore {
    fn head(&self, loc: &Location) -> io::Result<ObjectMeta> {
        let (bytes, version) = self.get(loc)?;
        Ok(ObjectMeta {
            size: bytes.len() as u64,
            etag: Some(format!("\"v{version}\"")),
            mtime: version as i64,
        })
    }

    fn get_range(
        &self,
        loc: &Location,
        offset: u64,
        buf: &mut [u8],
        opened: Option<&ObjectMeta>,
    ) -> io::Result<()> {
        let (bytes, version) = self.get(loc)?;
        let if_match = opened.and_then(|m| m.etag.as_deref());
        if if_match.is_some_and(|etag| etag != format!("\"v{version}\"")) {
            return Err(io::Error::other(format!(
                "{loc} was replaced since it was opened (its ETag changed)"
            )));
        }
        let range = usize::try_from(offset)
            .ok()
            .and_then(|at| bytes.get(at..at.checked_add(buf.len())?))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{loc}: the object ends before offset {offset} (416)"),
                )
            })?;
        buf.copy_from_slice(range);
        Ok(())
    }

    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        keep: &dyn Fn(&str) -> bool,
    ) -> io::Result<Vec<String>> {
        let under = format!("s3://{bucket}/");
        let objects = self.objects.lock().expect("not poisoned");
        Ok(objects
            .keys()
            .filter_map(|url| url.strip_prefix(&under))
            .filter(|key| key.starts_with(prefix) && keep(key))
            .map(String::from)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mount's request and an engine's stores print their store options: an endpoint with a
    /// key in it must not reach a log that way.
    #[test]
    fn store_options_print_no_secret_of_their_endpoint() {
        let options = StoreOptions {
            endpoint: Some("https://admin:s3cr3tKey@rgw.example:7480".into()),
        };
        for shown in [
            format!("{options:?}"),
            format!("{:?}", Stores::network(options)),
        ] {
            assert!(!shown.contains("s3cr3tKey"), "{shown}");
            assert!(shown.contains("rgw.example:7480"), "{shown}");
        }
    }
}
