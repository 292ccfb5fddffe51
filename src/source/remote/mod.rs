//! Images and indexes in object stores and behind HTTP URLs: `s3://bucket/key` (AWS, MinIO,
//! Ceph RGW, AIStore) and `http(s)://host/path`. An object is read with range requests through
//! `ReadAt`, so the formats, the catalog and the tiers treat it as any image; the tiers read it in
//! whole chunks through the RAM cache, so small-file reads of one shard coalesce into few GETs.

mod answer;
mod client;
pub mod config;
mod credentials;
#[cfg(any(test, feature = "testing"))]
pub mod faulty;
mod location;
mod refusal;
pub mod resolver;
pub mod store;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use client::{ObjectMeta, StoreStats};
pub use credentials::CredentialStats;
pub(super) use location::is_url;
pub use location::{BadUrl, Location};
#[cfg(any(test, feature = "testing"))]
pub use store::MemoryStore;
pub use store::{ObjectStore, StoreOptions, Stores};

use super::Fingerprint;
use super::read_at::ReadAt;

/// An object opened for range reads: each read is one GET, refused if the object's ETag changed
/// since it was opened.
pub struct RemoteObject {
    store: Arc<dyn ObjectStore>,
    loc: Location,
    meta: ObjectMeta,
}

impl RemoteObject {
    /// HEADs the object at `path` (a URL) in `stores`.
    pub fn open(stores: &Stores, path: &Path) -> io::Result<RemoteObject> {
        RemoteObject::open_in(stores.object_store(), path)
    }

    /// HEADs the object at `path` in `store`.
    pub fn open_in(store: Arc<dyn ObjectStore>, path: &Path) -> io::Result<RemoteObject> {
        let loc = parse(path)?;
        let meta = store.head(&loc)?;
        Ok(RemoteObject { store, loc, meta })
    }

    /// The object's size when it was opened.
    pub fn size(&self) -> u64 {
        self.meta.size
    }

    /// The fingerprint an index records: size, Last-Modified, and hashes of both ends (two range
    /// GETs), as for a file.
    pub fn fingerprint(&self) -> io::Result<Fingerprint> {
        Fingerprint::of_read_at(self, self.meta.size, self.meta.mtime, 0)
    }

    /// The whole object into `buf` (its size), for an index kept in the store: in pieces, so a
    /// retry repeats one piece, not the whole index.
    pub fn read_into(&self, buf: &mut [u8]) -> io::Result<()> {
        const PIECE: usize = 8 << 20;
        for (i, piece) in buf.chunks_mut(PIECE).enumerate() {
            self.read_exact_at(piece, (i * PIECE) as u64)?;
        }
        Ok(())
    }
}

impl ReadAt for RemoteObject {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        if offset >= self.meta.size {
            return Ok(0);
        }
        let n = (self.meta.size - offset).min(buf.len() as u64) as usize;
        self.store
            .get_range(&self.loc, offset, &mut buf[..n], Some(&self.meta))?;
        Ok(n)
    }
    // No `read_at_now`: a request to the store always waits for the network.
    // No `current()`: a HEAD per image every few seconds would cost requests on every node for
    // nothing; a replaced object is caught by If-Match on the next read instead.
}

fn parse(path: &Path) -> io::Result<Location> {
    let text = path.to_str().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, "an object URL must be UTF-8")
    })?;
    Location::parse(text).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

/// The images a URL pattern names once braces are expanded: itself, or for an `s3://` glob the
/// matching keys of the bucket (listed under the pattern's literal prefix), in key order.
pub fn expand_glob(stores: &Stores, word: &str) -> io::Result<Vec<PathBuf>> {
    expand_glob_in(&*stores.object_store(), word)
}

/// `expand_glob`, listing `store`.
pub fn expand_glob_in(store: &dyn ObjectStore, word: &str) -> io::Result<Vec<PathBuf>> {
    let loc = Location::parse(word)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let Location::S3 { bucket, key } = loc else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{word}: an HTTP server cannot be listed; name the shards with a brace range \
                 instead (train-{{000000..000127}}.tar)"
            ),
        ));
    };
    let pattern = glob::Pattern::new(&key)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{word}: {e}")))?;
    let literal = key
        .find(['*', '?', '['])
        .map_or(key.as_str(), |at| &key[..at]);
    let options = glob::MatchOptions {
        require_literal_separator: true,
        ..Default::default()
    };
    Ok(store
        .list(&bucket, literal, &|k| pattern.matches_with(k, options))?
        .into_iter()
        .map(|k| PathBuf::from(format!("s3://{bucket}/{k}")))
        .collect())
}

/// The text of the first `<tag>` element of an XML answer: S3's and STS's error codes, STS's
/// credentials. They are flat and unescaped where it matters (codes, keys, tokens and times hold
/// no `<` or `&`), so no XML parser is needed.
pub(crate) fn xml_text<'a>(xml: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = xml[start..].find(&format!("</{tag}>"))? + start;
    Some(xml[start..end].trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::read_at::Wait;

    fn store_with(objects: &[(&str, &[u8])]) -> Arc<MemoryStore> {
        let store = Arc::new(MemoryStore::default());
        for (url, bytes) in objects {
            store.put(url, bytes.to_vec());
        }
        store
    }

    /// An object is read in ranges from whatever store holds it; one replaced since it was
    /// opened fails rather than serve other bytes.
    #[test]
    fn an_object_reads_from_its_store_and_fails_once_replaced() {
        let store = store_with(&[("s3://b/shard-0.tar", b"0123456789")]);
        let object = RemoteObject::open_in(store.clone(), Path::new("s3://b/shard-0.tar")).unwrap();
        assert_eq!(object.size(), 10);
        let mut buf = [0u8; 4];
        object.read_exact_at(&mut buf, 3).unwrap();
        assert_eq!(&buf, b"3456");
        // A store request always waits for the network: never made by a thread that must not.
        let err = object
            .read_exact_with(&mut buf, 3, Wait::Never)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        store.put("s3://b/shard-0.tar", b"abcdefghij".to_vec());
        let err = object.read_exact_at(&mut buf, 3).unwrap_err();
        assert!(err.to_string().contains("replaced"), "{err}");
        let missing = RemoteObject::open_in(store, Path::new("s3://b/none.tar"));
        assert_eq!(missing.err().unwrap().kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_glob_lists_the_matching_keys_in_order() {
        let store = store_with(&[
            ("s3://b/train/shard-1.tar", b"x"),
            ("s3://b/train/shard-0.tar", b"x"),
            ("s3://b/train/sub/shard-2.tar", b"x"),
            ("s3://b/val/shard-0.tar", b"x"),
        ]);
        let found = expand_glob_in(&*store, "s3://b/train/shard-*.tar").unwrap();
        assert_eq!(
            found,
            [
                PathBuf::from("s3://b/train/shard-0.tar"),
                PathBuf::from("s3://b/train/shard-1.tar")
            ]
        );
        let err = expand_glob_in(&*store, "https://host/shard-*.tar").unwrap_err();
        assert!(err.to_string().contains("brace range"), "{err}");
    }
}
