//! Reading every file of a catalog through the read path, for `packfs verify --data`: whatever
//! can be checked is checked on the way (zip CRC-32s, squashfs blocks decoding to their exact
//! length, tar and zip data lying inside the image), so a damaged member is found before a
//! training job meets it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::{FileReader, Member, ReadRequest};
use crate::catalog::{Catalog, Kind, ROOT};

/// Bytes read per request, as the kernel would ask for them.
const PIECE: usize = 1 << 20;

/// A file that could not be read whole, and why.
#[derive(Debug)]
pub struct Failure {
    pub path: Vec<u8>,
    pub error: String,
}

/// What reading everything found.
#[derive(Debug, Default)]
pub struct Report {
    pub files: u64,
    pub bytes: u64,
    pub failures: Vec<Failure>,
}

thread_local! {
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Reads every file of `catalog` (several at once); `on_bytes` hears the bytes read so far.
pub fn read_everything(
    catalog: &Catalog,
    files: &FileReader,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Report {
    let ids: Vec<u32> = catalog
        .walk(ROOT)
        .filter(|&id| catalog.entry(id).is_ok_and(|e| e.kind() == Kind::File))
        .collect();
    let done = AtomicU64::new(0);
    let failures: Vec<Failure> = ids
        .par_iter()
        .filter_map(|&id| {
            let failure = |error: String| Failure {
                path: catalog.path_of(id),
                error,
            };
            let member = match Member::of(catalog, id) {
                Ok(member) => member,
                Err(err) => return Some(failure(err.to_string())),
            };
            let req = ReadRequest::waiting();
            let mut offset = 0;
            while offset < member.size {
                let len = (member.size - offset).min(PIECE as u64) as usize;
                let read = BUF
                    .with_borrow_mut(|buf| files.read(&req, member, offset, len, buf).map(|_| ()));
                if let Err(err) = read {
                    return Some(failure(err.to_string()));
                }
                offset += len as u64;
                on_bytes(done.fetch_add(len as u64, Ordering::Relaxed) + len as u64);
            }
            None
        })
        .collect();
    Report {
        files: ids.len() as u64,
        bytes: done.load(Ordering::Relaxed),
        failures,
    }
}
