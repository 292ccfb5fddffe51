//! What the mount was asked, per FUSE operation: counts, errors, bytes and a latency histogram,
//! recorded by the dispatcher for every request (a few relaxed atomic adds: no lock, no allocation),
//! read by the stats writer (`packfs status`) and by `--idle-timeout`.

use crate::util::latency::Latency;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::tiers::Tiers;

/// The operations the dispatcher records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Lookup,
    Getattr,
    Readlink,
    Open,
    Opendir,
    Read,
    Readdir,
    Readdirplus,
    Ioctl,
    Statfs,
}

impl Op {
    pub const ALL: [Op; 10] = [
        Op::Lookup,
        Op::Getattr,
        Op::Readlink,
        Op::Open,
        Op::Opendir,
        Op::Read,
        Op::Readdir,
        Op::Readdirplus,
        Op::Ioctl,
        Op::Statfs,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Lookup => "lookup",
            Op::Getattr => "getattr",
            Op::Readlink => "readlink",
            Op::Open => "open",
            Op::Opendir => "opendir",
            Op::Read => "read",
            Op::Readdir => "readdir",
            Op::Readdirplus => "readdirplus",
            Op::Ioctl => "ioctl",
            Op::Statfs => "statfs",
        }
    }

    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.name() == name)
    }
}

/// One request, as the counters and the trace record it.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub op: Op,
    pub ino: u64,
    /// The name looked up in directory `ino`.
    pub name: Option<&'a [u8]>,
    pub offset: u64,
    pub size: u32,
    pub started: Instant,
    /// The tiers that served a read.
    pub tiers: Tiers,
}

impl<'a> Request<'a> {
    pub fn new(op: Op, ino: u64, started: Instant) -> Request<'a> {
        Request {
            op,
            ino,
            name: None,
            offset: 0,
            size: 0,
            started,
            tiers: Tiers::NONE,
        }
    }

    pub fn named(self, name: &'a [u8]) -> Request<'a> {
        Request {
            name: Some(name),
            ..self
        }
    }

    pub fn served_by(self, tiers: Tiers) -> Request<'a> {
        Request { tiers, ..self }
    }

    pub fn at(self, offset: u64, size: u32) -> Request<'a> {
        Request {
            offset,
            size,
            ..self
        }
    }
}

struct OpCounters {
    count: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    latency: Latency,
}

impl OpCounters {
    fn new() -> Self {
        OpCounters {
            count: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            latency: Latency::default(),
        }
    }
}

/// Counters of every operation since the mount started.
pub struct Requests {
    ops: [OpCounters; Op::ALL.len()],
    epoch: Instant,
    /// When the last request ended, in ms since `epoch`.
    last_ms: AtomicU64,
    /// Requests that came through FUSE-over-io_uring rings (the rest came through /dev/fuse).
    through_rings: AtomicU64,
}

impl Default for Requests {
    fn default() -> Self {
        Requests {
            ops: std::array::from_fn(|_| OpCounters::new()),
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            through_rings: AtomicU64::new(0),
        }
    }
}

/// The figures of one operation, as `packfs status` and the stats file show them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct OpFigures {
    pub count: u64,
    pub errors: u64,
    /// Bytes replied (reads only).
    pub bytes: u64,
    /// Latency percentiles in µs: the upper edge of the histogram bucket (within 19%).
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Requests {
    /// Counts a request that came through a ring.
    pub fn through_ring(&self) {
        self.through_rings.fetch_add(1, Ordering::Relaxed);
    }

    pub fn through_rings(&self) -> u64 {
        self.through_rings.load(Ordering::Relaxed)
    }

    /// Records one answered request that started at `started`.
    pub fn record(&self, op: Op, started: Instant, bytes: u64, failed: bool) {
        let now = Instant::now();
        let ns = now.duration_since(started).as_nanos().min(u64::MAX as u128) as u64;
        let c = &self.ops[op as usize];
        c.count.fetch_add(1, Ordering::Relaxed);
        if failed {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        if bytes > 0 {
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        c.latency.record(ns);
        let ms = now.duration_since(self.epoch).as_millis() as u64;
        self.last_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long no request has come in (since the mount started, if none ever did).
    pub fn idle_for(&self) -> std::time::Duration {
        let last = std::time::Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    /// Every operation that was asked at least once, in `Op::ALL` order.
    pub fn figures(&self) -> Vec<(Op, OpFigures)> {
        Op::ALL
            .into_iter()
            .filter_map(|op| {
                let f = self.figures_of(op);
                (f.count > 0).then_some((op, f))
            })
            .collect()
    }

    fn figures_of(&self, op: Op) -> OpFigures {
        let c = &self.ops[op as usize];
        let [p50_us, p90_us, p99_us] = c.latency.quantiles_us([0.50, 0.90, 0.99]);
        OpFigures {
            count: c.count.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            p50_us,
            p90_us,
            p99_us,
            max_us: c.latency.max_us(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_follow_the_recorded_latencies() {
        let r = Requests::default();
        let t0 = Instant::now();
        // 90 fast requests and 10 slow ones, recorded with synthetic start times.
        for _ in 0..90 {
            r.record(Op::Lookup, t0, 0, false);
        }
        let slow = Instant::now() - std::time::Duration::from_millis(20);
        for _ in 0..10 {
            r.record(Op::Lookup, slow, 0, true);
        }
        r.record(Op::Read, Instant::now(), 4096, false);
        let figures = r.figures();
        assert_eq!(figures.len(), 2);
        let (op, lookup) = figures[0];
        assert_eq!(op, Op::Lookup);
        assert_eq!((lookup.count, lookup.errors), (100, 10));
        assert!(lookup.p50_us < 20_000.0, "{lookup:?}");
        assert!(lookup.p99_us >= 20_000.0, "{lookup:?}");
        assert!(lookup.max_us >= 20_000.0 && lookup.max_us < 30_000_000.0);
        assert_eq!(figures[1].1.bytes, 4096);
        assert!(r.idle_for() < std::time::Duration::from_secs(5));
    }
}
