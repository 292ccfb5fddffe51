//! What the peer tier did: chunks served to other nodes and refused, chunks fetched from them,
//! and every fall back to the source, by reason.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a chunk was read from the source instead of from the node that stages it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// No answer: connection refused or reset, timeout (the node is down or overloaded).
    Unreachable,
    /// The node has not staged (and verified) the chunk yet, or dropped it.
    NotStaged,
    /// The node refused the request (another job's secret, a clock too far off, another
    /// dataset).
    Refused,
    /// The bytes did not match the source's record (on the node's disk, which then said so and
    /// drops the chunk, or on arrival): never served.
    Mismatch,
    /// The answer was not sealed with the job's secret for this request (something else holds
    /// the node's port, or the answer was changed on the way): never served.
    Forged,
    /// The node had no memory to spare for the chunk right now.
    Busy,
    /// Any other answer (a server error, a malformed reply).
    Other,
}

impl Fallback {
    pub const ALL: [Fallback; 7] = [
        Fallback::Unreachable,
        Fallback::NotStaged,
        Fallback::Refused,
        Fallback::Mismatch,
        Fallback::Forged,
        Fallback::Busy,
        Fallback::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fallback::Unreachable => "unreachable",
            Fallback::NotStaged => "not_staged",
            Fallback::Refused => "refused",
            Fallback::Mismatch => "mismatch",
            Fallback::Forged => "forged",
            Fallback::Busy => "busy",
            Fallback::Other => "other",
        }
    }

    /// Whether the node is left alone for a while after it: it did not answer, or answered
    /// as no node of this job would. Not after "not staged", "busy" or a damaged chunk, which
    /// say nothing of the node's next answer.
    pub fn rests_the_node(self) -> bool {
        matches!(
            self,
            Fallback::Unreachable | Fallback::Refused | Fallback::Forged | Fallback::Other
        )
    }
}

/// Why this node's server refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not signed at all (or not a GET, or a malformed signature's headers).
    Unsigned,
    /// Not signed with the job's secret.
    Signature,
    /// Signed, but more than 60 s off this node's clock.
    Stale,
    /// Signed, for another node (a capture sent elsewhere).
    OtherNode,
    /// Signed, and answered already (a capture sent again).
    Replay,
    /// Signed, for another dataset (another index, other shards, another chunk size).
    OtherDataset,
    /// No room for another of the job's connections, or for another request's nonce.
    Busy,
}

impl Refusal {
    pub const ALL: [Refusal; 7] = [
        Refusal::Unsigned,
        Refusal::Signature,
        Refusal::Stale,
        Refusal::OtherNode,
        Refusal::Replay,
        Refusal::OtherDataset,
        Refusal::Busy,
    ];

    /// As counted in the stats file, and said in `x-packfs-why`.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::Signature => "signature",
            Refusal::Stale => "stale",
            Refusal::OtherNode => "other-node",
            Refusal::Replay => "replay",
            Refusal::OtherDataset => "other-dataset",
            Refusal::Busy => "busy",
        }
    }
}

/// One node's requests to another, for the status's per-peer line.
#[derive(Debug, Default)]
pub struct PeerCounters {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
    pub failures: AtomicU64,
    pub total_ns: AtomicU64,
    pub latency: crate::util::latency::Latency,
}

/// The counters of the peer tier of one mount.
#[derive(Debug, Default)]
pub struct PeerTierCounters {
    pub served_chunks: AtomicU64,
    pub served_bytes: AtomicU64,
    /// Requests this node refused, by reason (`Refusal::ALL`'s order).
    pub refusals: [AtomicU64; Refusal::ALL.len()],
    /// Connections closed before they sent a signed request, to make room (`gate`).
    pub evicted: AtomicU64,
    /// Why this node does not serve its share to the others (its port taken), if it does not.
    pub not_serving: std::sync::OnceLock<String>,
    /// Requests for chunks this node has not staged (answered "not staged").
    pub not_staged: AtomicU64,
    /// Requests for chunks whose staged bytes failed their check (dropped, staged again).
    pub damaged: AtomicU64,
    pub fallbacks: [AtomicU64; Fallback::ALL.len()],
    /// Bytes of other shares' images read from the source (fallbacks).
    pub source_bytes: AtomicU64,
    /// Per node of the list, in share order.
    pub peers: Vec<PeerCounters>,
}

impl PeerTierCounters {
    pub fn new(nodes: usize) -> PeerTierCounters {
        PeerTierCounters {
            peers: (0..nodes).map(|_| PeerCounters::default()).collect(),
            ..PeerTierCounters::default()
        }
    }

    pub fn refused_for(&self, why: Refusal) {
        let at = Refusal::ALL.iter().position(|r| *r == why).unwrap_or(0);
        self.refusals[at].fetch_add(1, Ordering::Relaxed);
    }

    pub fn fell_back(&self, why: Fallback) {
        let at = Fallback::ALL.iter().position(|f| *f == why).unwrap_or(0);
        self.fallbacks[at].fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> PeerStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PeerStats {
            served_chunks: load(&self.served_chunks),
            served_bytes: load(&self.served_bytes),
            refused: self.refusals.iter().map(load).sum(),
            refusals: Refusal::ALL
                .iter()
                .zip(&self.refusals)
                .map(|(r, n)| (r.name().to_string(), load(n)))
                .collect(),
            evicted_connections: load(&self.evicted),
            not_serving: self.not_serving.get().cloned(),
            not_staged: load(&self.not_staged),
            damaged: load(&self.damaged),
            fetched_chunks: self.peers.iter().map(|p| load(&p.requests)).sum::<u64>()
                - self.peers.iter().map(|p| load(&p.failures)).sum::<u64>(),
            fetched_bytes: self.peers.iter().map(|p| load(&p.bytes)).sum(),
            source_bytes: load(&self.source_bytes),
            fallbacks: Fallback::ALL
                .iter()
                .zip(&self.fallbacks)
                .map(|(f, n)| (f.name().to_string(), load(n)))
                .collect(),
            peers: self
                .peers
                .iter()
                .enumerate()
                .map(|(share, p)| {
                    let requests = load(&p.requests);
                    let [p50_us, p99_us] = p.latency.quantiles_us([0.50, 0.99]);
                    OnePeer {
                        share: share as u32,
                        requests,
                        bytes: load(&p.bytes),
                        failures: load(&p.failures),
                        mean_us: match requests {
                            0 => 0.0,
                            n => (load(&p.total_ns) / n) as f64 / 1000.0,
                        },
                        p50_us,
                        p99_us,
                        max_us: p.latency.max_us(),
                    }
                })
                .collect(),
        }
    }
}

/// The peer tier's counters, for the stats file (docs/metrics.md).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PeerStats {
    pub served_chunks: u64,
    pub served_bytes: u64,
    pub refused: u64,
    /// `refused`, by reason (`Refusal::name`).
    pub refusals: indexmap::IndexMap<String, u64>,
    /// Connections closed before they sent a signed request, to make room for others.
    pub evicted_connections: u64,
    /// Why this node serves no share to the others, if it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_serving: Option<String>,
    pub not_staged: u64,
    pub damaged: u64,
    pub fetched_chunks: u64,
    pub fetched_bytes: u64,
    pub source_bytes: u64,
    pub fallbacks: indexmap::IndexMap<String, u64>,
    pub peers: Vec<OnePeer>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct OnePeer {
    pub share: u32,
    pub requests: u64,
    pub bytes: u64,
    pub failures: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}
