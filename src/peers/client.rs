//! Reading another node's staged chunks: an image of another node's share is read through
//! `PeerFirst`, which asks that node for exactly the bytes a read covers (a request per chunk
//! it touches: the whole chunk, checked against the source's record, or a range of it), opens
//! the sealed answer (`auth`: only an answer of the job's for this very request opens), and on
//! any failure (no answer within the timeout, not staged yet, refused, a mismatch, a forgery)
//! reads the source at once and counts why. Exact ranges, not whole chunks for every read: a
//! 110 KB sample of a 1 MiB chunk cost 9x its bytes on the wire and ran 6x slower than the
//! simulated parallel file system (docs/benchmarks/peer-nodes.md). A node that did not answer,
//! or answered as no node of the job would, is left alone for a while (`REST`), so a dead node
//! or a stranger on its port costs one request, not one per read. Never through a proxy.

use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use xxhash_rust::xxh3::xxh3_64;

use super::auth::{Secret, SignedRequest, TAG, new_nonce, unix_now};
use super::nodes::Nodes;
use super::server::signed_part;
use super::stats::{Fallback, PeerTierCounters};
use crate::source::read_at::{ReadAt, Stamp};

/// How long a chunk may take from another node before the source is read instead.
const TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections kept open to each node between requests, and for how long at most.
const IDLE_CONNECTIONS: usize = 32;
const IDLE_AGE: Duration = Duration::from_secs(2);
/// How long a node that did not answer is not asked again.
const REST: Duration = Duration::from_secs(10);

/// Where the bytes of one request lie: from `within` chunk `chunk` (of `chunk_len` bytes) of
/// image `image`.
#[derive(Clone, Copy, Debug)]
struct Piece {
    image: u32,
    chunk: u64,
    within: u64,
    chunk_len: u64,
}

/// The job's other nodes, as one reading node sees them.
pub struct PeerLink {
    agent: ureq::Agent,
    nodes: Nodes,
    me: u32,
    secret: Secret,
    dataset: String,
    chunk_size: u64,
    counters: Arc<PeerTierCounters>,
    /// Per node: until when (ms since `epoch`) it is left alone after failing to answer.
    resting_until: Vec<AtomicU64>,
    /// Per node: its bytes failed the index's checksums; never asked again by this mount.
    distrusted: Vec<AtomicBool>,
    epoch: Instant,
}

impl PeerLink {
    pub fn new(
        nodes: Nodes,
        me: u32,
        secret: Secret,
        dataset: String,
        chunk_size: u64,
        counters: Arc<PeerTierCounters>,
    ) -> PeerLink {
        let agent = crate::source::remote::resolver::agent(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(TIMEOUT))
                .timeout_connect(Some(CONNECT_TIMEOUT))
                // Every reading thread of the mount may be asking one node at once: kept
                // connections, not a connect per request.
                .max_idle_connections(IDLE_CONNECTIONS * nodes.0.len().max(1))
                .max_idle_connections_per_host(IDLE_CONNECTIONS)
                // Well before the node closes one idle for its header timeout (5 s): a kept
                // connection never meets the close half way.
                .max_idle_age(IDLE_AGE)
                .max_redirects(0)
                // Never through a proxy from the environment (http_proxy, ALL_PROXY): another
                // user's proxy would see every request, and peers are the job's own nodes.
                .proxy(None)
                .build(),
        );
        let resting_until = (0..nodes.0.len()).map(|_| AtomicU64::new(0)).collect();
        let distrusted = (0..nodes.0.len()).map(|_| AtomicBool::new(false)).collect();
        PeerLink {
            agent,
            nodes,
            me,
            secret,
            dataset,
            chunk_size,
            counters,
            resting_until,
            distrusted,
            epoch: Instant::now(),
        }
    }

    pub fn counters(&self) -> &Arc<PeerTierCounters> {
        &self.counters
    }

    /// This node's share.
    pub fn me(&self) -> u32 {
        self.me
    }

    /// Shares, one per node.
    pub fn world(&self) -> u32 {
        self.nodes.0.len() as u32
    }

    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    /// Whether reads of an image of `share` go to a peer first: another node's share.
    pub fn serves(&self, share: u32) -> bool {
        share != self.me && self.nodes.of(share).is_some()
    }

    /// `buf.len()` bytes at `piece` (of an image of `share`), from the node that stages it,
    /// checked; why not, otherwise.
    fn fetch(&self, share: u32, piece: Piece, buf: &mut [u8]) -> Result<(), Fallback> {
        let node = self.nodes.of(share).ok_or(Fallback::Other)?;
        if self.distrusted[share as usize].load(Ordering::Relaxed) {
            return Err(Fallback::Mismatch);
        }
        let now_ms = self.epoch.elapsed().as_millis() as u64;
        let rest = &self.resting_until[share as usize];
        if rest.load(Ordering::Relaxed) > now_ms {
            return Err(Fallback::Unreachable);
        }
        let peer = &self.counters.peers[share as usize];
        let started = Instant::now();
        peer.requests.fetch_add(1, Ordering::Relaxed);
        let got = self.ask(node, piece, buf);
        let ns = started.elapsed().as_nanos() as u64;
        peer.total_ns.fetch_add(ns, Ordering::Relaxed);
        peer.latency.record(ns);
        match &got {
            Ok(()) => {
                peer.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
            }
            Err(why) => {
                peer.failures.fetch_add(1, Ordering::Relaxed);
                if why.rests_the_node() {
                    rest.store(now_ms + REST.as_millis() as u64, Ordering::Relaxed);
                }
            }
        }
        got
    }

    /// Stops asking the node of `share`: bytes it gave failed the index's checksums (a node of
    /// the job whose staged copy changed after its own check, or one that lies). Said once.
    fn distrust(&self, share: u32) {
        let Some(flag) = self.distrusted.get(share as usize) else {
            return;
        };
        if !flag.swap(true, Ordering::Relaxed) {
            self.counters.fell_back(Fallback::Mismatch);
            tracing::warn!(
                "node {} (share {share}) gave bytes that fail the index's checksums: this mount \
                 reads its share from the source from now on",
                self.nodes.of(share).unwrap_or("?")
            );
        }
    }

    fn ask(&self, node: &str, piece: Piece, buf: &mut [u8]) -> Result<(), Fallback> {
        let Piece {
            image,
            chunk,
            within,
            chunk_len,
        } = piece;
        let path = format!("/v2/{}/{image}/{chunk}", self.dataset);
        // A whole chunk is asked for as such: its answer is checked against the source's record.
        let whole = within == 0 && buf.len() as u64 == chunk_len;
        let range = (!whole).then(|| format!("bytes={within}-{}", within + buf.len() as u64 - 1));
        let what = signed_part(&path, range.as_deref());
        let nonce = new_nonce();
        let time = unix_now();
        // The node as the list names it: what the HTTP client sends as `Host`, and signs.
        let signature = self.secret.sign_request(&SignedRequest {
            host: node,
            what: &what,
            time,
            nonce: &nonce,
        });
        let mut request = self.agent.get(&format!("http://{node}{path}"));
        if let Some(range) = &range {
            request = request.header("range", range);
        }
        let resp = request
            .header("x-packfs-time", &time.to_string())
            .header("x-packfs-nonce", &nonce)
            .header("x-packfs-signature", &signature)
            .call();
        let mut resp = match resp {
            Ok(resp) => resp,
            Err(_) => return Err(Fallback::Unreachable),
        };
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        match resp.status().as_u16() {
            200 if whole => {}
            206 if !whole => {}
            404 => return Err(Fallback::NotStaged),
            500 if header("x-packfs-why").as_deref() == Some("damaged") => {
                return Err(Fallback::Mismatch);
            }
            401 | 403 | 409 | 421 => return Err(Fallback::Refused),
            503 => return Err(Fallback::Busy),
            _ => return Err(Fallback::Other),
        }
        let sum = header("x-packfs-xxh3").and_then(|s| u64::from_str_radix(&s, 16).ok());
        let salt = header("x-packfs-salt");
        let (Some(sum), Some(salt)) = (sum, salt) else {
            return Err(Fallback::Forged);
        };
        // The sealed bytes, then their tag, and nothing after.
        let mut body = resp.body_mut().as_reader();
        let mut tag = [0u8; TAG];
        if !read_full(&mut body, buf)? || !read_full(&mut body, &mut tag)? {
            return Err(Fallback::Forged);
        }
        let mut more = [0u8; 1];
        if matches!(body.read(&mut more), Ok(n) if n > 0) {
            return Err(Fallback::Forged);
        }
        // Sealed for this request with the job's secret: bytes changed on the way, or not sent
        // by a node of this job, are never served, and nobody else could read them.
        if !self
            .secret
            .open_answer(&signature, &nonce, &salt, sum, buf, &tag)
        {
            return Err(Fallback::Forged);
        }
        // A whole chunk, against the source's record: the node's disk changed after its check.
        if whole && xxh3_64(buf) != sum {
            return Err(Fallback::Mismatch);
        }
        Ok(())
    }
}

/// Fills `buf` from `body`; false if it ends first.
fn read_full(body: &mut impl Read, buf: &mut [u8]) -> Result<bool, Fallback> {
    let mut got = 0;
    while got < buf.len() {
        match body.read(&mut buf[got..]) {
            Ok(0) => return Ok(false),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(Fallback::Unreachable),
        }
    }
    Ok(true)
}

/// An image of another node's share: its bytes from that node, the source otherwise.
pub struct PeerFirst {
    pub inner: Arc<dyn ReadAt>,
    pub link: Arc<PeerLink>,
    pub image: u32,
    pub share: u32,
    pub size: u64,
}

impl PeerFirst {
    /// Fills the start of `buf` from `offset` with what the peer gives, a request per chunk
    /// the range touches, up to the image's end; how many bytes it gave (short at the first
    /// piece it could not give, which the caller reads from the source).
    fn read_from_peer(&self, buf: &mut [u8], offset: u64) -> usize {
        let chunk = self.link.chunk_size;
        let want = (buf.len() as u64).min(self.size.saturating_sub(offset)) as usize;
        let mut at = 0usize;
        while at < want {
            let start = offset + at as u64;
            let (i, within) = (start / chunk, start % chunk);
            let chunk_len = chunk.min(self.size - (start - within));
            let len = ((chunk_len - within) as usize).min(want - at);
            let piece = Piece {
                image: self.image,
                chunk: i,
                within,
                chunk_len,
            };
            if let Err(why) = self.link.fetch(self.share, piece, &mut buf[at..at + len]) {
                // A node no longer trusted is not asked, and not counted again.
                if !self.link.distrusted[self.share as usize].load(Ordering::Relaxed) {
                    self.link.counters.fell_back(why);
                }
                return at;
            }
            at += len;
        }
        at
    }
}

impl ReadAt for PeerFirst {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let given = self.read_from_peer(buf, offset);
        let end = (buf.len() as u64).min(self.size.saturating_sub(offset)) as usize;
        if given >= end {
            return Ok(given);
        }
        let n = self
            .inner
            .read_at(&mut buf[given..], offset + given as u64)?;
        let counters = &self.link.counters;
        counters.source_bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(given + n)
    }

    fn read_at_now(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at_now(buf, offset)
    }

    fn will_need(&self, offset: u64, len: u64) {
        self.inner.will_need(offset, len)
    }

    fn current(&self) -> Option<io::Result<Stamp>> {
        self.inner.current()
    }

    fn distrust(&self) -> bool {
        self.link.distrust(self.share);
        true
    }
}
