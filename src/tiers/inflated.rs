//! Deflated members, inflated whole and kept in a RAM cache with a byte budget.
//!
//! A deflate stream can only be decoded from its start, so a member is inflated once and its bytes
//! are served from the cache until evicted. quick_cache loads each key once even when several
//! threads miss it together, and keeps its total weight (bytes) under the budget; members larger
//! than a cache shard are refused at scan time (`archive::zip::MAX_DEFLATED`).

use std::io;
use std::sync::Arc;

use flate2::{Decompress, FlushDecompress, Status};
use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, OptionsBuilder, Weighter};

use super::Source;

/// Compressed bytes read per pread while inflating.
const READ_CHUNK: usize = 256 * 1024;
/// Shards of the cache: each holds budget / SHARDS bytes, which bounds the largest cached member.
const SHARDS: usize = 8;

#[derive(Clone)]
struct ByLen;

impl Weighter<(u32, u64), Arc<[u8]>> for ByLen {
    fn weight(&self, _key: &(u32, u64), val: &Arc<[u8]>) -> u64 {
        val.len().max(1) as u64
    }
}

pub struct Inflated {
    cache: Cache<(u32, u64), Arc<[u8]>, ByLen>,
}

impl Inflated {
    /// A cache of at most `budget` bytes.
    pub fn new(budget: u64) -> Inflated {
        let options = OptionsBuilder::new()
            .shards(SHARDS)
            .estimated_items_capacity((budget / (64 * 1024)).max(16) as usize)
            .weight_capacity(budget.max(1))
            .build()
            .expect("valid cache options");
        Inflated {
            cache: Cache::with_options(
                options,
                ByLen,
                DefaultHashBuilder::default(),
                DefaultLifecycle::default(),
            ),
        }
    }

    /// The inflated bytes of the member whose deflate stream starts at `offset` of `image`.
    pub fn member(
        &self,
        source: &Source,
        image: u32,
        offset: u64,
        size: u64,
    ) -> io::Result<Arc<[u8]>> {
        self.cache
            .get_or_insert_with(&(image, offset), || inflate(source, image, offset, size))
    }
}

fn inflate(source: &Source, image: u32, offset: u64, size: u64) -> io::Result<Arc<[u8]>> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut out = Vec::with_capacity(size as usize);
    let mut inflater = Decompress::new(false);
    let mut chunk = vec![0u8; READ_CHUNK];
    let mut pos = offset;
    let end = source.image_size(image);
    loop {
        let n = READ_CHUNK.min(end.saturating_sub(pos) as usize);
        if n == 0 {
            return Err(bad(format!(
                "deflate stream at offset {offset} runs past the end"
            )));
        }
        source.read_exact_at(image, pos, &mut chunk[..n])?;
        let mut used = 0;
        while used < n {
            if out.len() == out.capacity() {
                out.reserve(READ_CHUNK);
            }
            let (in_before, out_before) = (inflater.total_in(), out.len());
            let status = inflater
                .decompress_vec(&chunk[used..n], &mut out, FlushDecompress::None)
                .map_err(|e| bad(format!("corrupt deflate stream at offset {offset}: {e}")))?;
            used += (inflater.total_in() - in_before) as usize;
            if out.len() as u64 > size {
                return Err(bad(format!(
                    "deflate stream at offset {offset} inflates to more than {size} bytes"
                )));
            }
            if status == Status::StreamEnd {
                if out.len() as u64 != size {
                    return Err(bad(format!(
                        "deflate stream at offset {offset} inflates to {} bytes, expected {size}",
                        out.len()
                    )));
                }
                return Ok(out.into());
            }
            if inflater.total_in() == in_before && out.len() == out_before {
                break; // wants more input than this chunk holds
            }
        }
        pos += n as u64;
    }
}
