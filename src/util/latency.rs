//! Latencies in a fixed histogram of relaxed atomics (no lock on the path that records): four
//! buckets per power of two of nanoseconds, so a percentile read from it (a bucket's upper edge)
//! is at most 19% above the latencies in it. FUSE requests (`fs::requests`) and reads from the
//! job's other nodes (`peers`) keep one each.

use std::sync::atomic::{AtomicU64, Ordering};

/// Up to 2^42 ns (73 min; longer latencies land in the last bucket).
const BUCKETS: usize = 4 * 42;

/// The bucket of a latency in nanoseconds.
fn bucket(ns: u64) -> usize {
    if ns < 4 {
        return ns as usize;
    }
    let exp = 63 - ns.leading_zeros() as usize;
    let sub = ((ns >> (exp - 2)) & 3) as usize;
    (exp * 4 + sub).min(BUCKETS - 1)
}

/// The largest latency in nanoseconds that falls in bucket `b`.
fn bucket_top(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let (exp, sub) = (b / 4, (b % 4) as u64);
    ((4 + sub + 1) << (exp - 2)) - 1
}

pub struct Latency {
    histogram: [AtomicU64; BUCKETS],
    max_ns: AtomicU64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            histogram: std::array::from_fn(|_| AtomicU64::new(0)),
            max_ns: AtomicU64::new(0),
        }
    }
}

impl std::fmt::Debug for Latency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Latency(max {} us)", self.max_us())
    }
}

impl Latency {
    pub fn record(&self, ns: u64) {
        self.histogram[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }

    pub fn max_us(&self) -> f64 {
        us(self.max_ns.load(Ordering::Relaxed))
    }

    /// The latencies at quantiles `qs` (0..1), in microseconds: the upper edge of the bucket
    /// each falls in, never above the largest recorded.
    pub fn quantiles_us<const N: usize>(&self, qs: [f64; N]) -> [f64; N] {
        let histogram: Vec<u64> = self
            .histogram
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let total: u64 = histogram.iter().sum();
        let max_ns = self.max_ns.load(Ordering::Relaxed);
        qs.map(|q| {
            let rank = ((total as f64 * q).ceil() as u64).max(1);
            let mut seen = 0;
            for (b, n) in histogram.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return us(bucket_top(b).min(max_ns));
                }
            }
            us(max_ns)
        })
    }
}

/// Nanoseconds as microseconds with one decimal.
fn us(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_value_is_at_most_its_bucket_top_and_above_the_previous(ns in 0u64..(1 << 41)) {
            let b = bucket(ns);
            prop_assert!(ns <= bucket_top(b));
            if b > 0 {
                prop_assert!(ns > bucket_top(b - 1));
            }
            // Within 25% (a quarter of a power of two) of the value.
            prop_assert!(bucket_top(b) as f64 <= (ns as f64 * 1.25).max(3.0));
        }
    }
}
