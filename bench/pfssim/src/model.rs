//! When a simulated RPC completes: a virtual-time model of a parallel file system client.
//!
//! Nothing here sleeps. Each operation is given the instant at which the real file system would
//! have answered it, from the instant it was asked, and the reply is sent then (`delay.rs`). So
//! any number of requests can be in flight at once, as on a real client, with a handful of threads.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Latencies and bandwidths of one simulated file system.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Profile {
    /// Round trip of one metadata RPC (lookup, getattr, open, close, readdir page).
    pub meta: Duration,
    /// Metadata RPCs one client keeps in flight; more wait for a free slot (Lustre's
    /// `mdc.*.max_rpcs_in_flight`, 8 by default). 0: no limit.
    pub meta_in_flight: usize,
    /// Fixed part of one data RPC (a read).
    pub read: Duration,
    /// Bandwidth of one read stream, bytes per second (0: unlimited).
    pub stream_bw: u64,
    /// Bandwidth of the whole client, shared by every read in flight, bytes per second (0: unlimited).
    pub total_bw: u64,
}

const MB: u64 = 1_000_000;

impl Profile {
    /// Named sets: see docs/benchmarks/parallel-fs.md for the sources.
    pub fn named(name: &str) -> Option<Profile> {
        let us = Duration::from_micros;
        Some(match name {
            "none" => Profile {
                meta: Duration::ZERO,
                meta_in_flight: 0,
                read: Duration::ZERO,
                stream_bw: 0,
                total_bw: 0,
            },
            // An idle Lustre/GPFS over InfiniBand: ~0.2 ms per metadata RPC, 3 GB/s per stream.
            "fast" => Profile {
                meta: us(200),
                meta_in_flight: 8,
                read: us(200),
                stream_bw: 3_000 * MB,
                total_bw: 10_000 * MB,
            },
            // A busy production file system in the daytime.
            "typical" => Profile {
                meta: us(500),
                meta_in_flight: 8,
                read: us(500),
                stream_bw: 1_500 * MB,
                total_bw: 3_000 * MB,
            },
            // A metadata server under a storm of small-file jobs.
            "loaded" => Profile {
                meta: us(2_000),
                meta_in_flight: 8,
                read: us(2_000),
                stream_bw: 500 * MB,
                total_bw: 1_000 * MB,
            },
            _ => return None,
        })
    }
}

/// The client's queues in virtual time.
pub struct Model {
    profile: Profile,
    /// When each metadata slot becomes free (a min-heap).
    meta_slots: Mutex<BinaryHeap<Reverse<Instant>>>,
    /// When the client's shared link finishes what it was given so far.
    link_free: Mutex<Instant>,
}

impl Model {
    pub fn new(profile: Profile) -> Model {
        let now = Instant::now();
        let slots = (0..profile.meta_in_flight).map(|_| Reverse(now)).collect();
        Model {
            profile,
            meta_slots: Mutex::new(slots),
            link_free: Mutex::new(now),
        }
    }

    /// When a metadata RPC asked `now` completes: after a free slot, plus the round trip.
    pub fn meta_done(&self, now: Instant) -> Instant {
        if self.profile.meta_in_flight == 0 {
            return now + self.profile.meta;
        }
        let mut slots = self.meta_slots.lock().unwrap();
        let Reverse(free) = slots.pop().expect("meta_in_flight > 0 slots");
        let done = free.max(now) + self.profile.meta;
        slots.push(Reverse(done));
        done
    }

    /// When a read of `bytes` asked `now` completes: the fixed latency plus the transfer at the
    /// stream's bandwidth, and not before the shared link has carried it after what it already carries.
    pub fn read_done(&self, now: Instant, bytes: u64) -> Instant {
        let p = self.profile;
        let mut done = now + p.read + transfer(bytes, p.stream_bw);
        if p.total_bw > 0 {
            let mut link = self.link_free.lock().unwrap();
            *link = (*link).max(now) + transfer(bytes, p.total_bw);
            done = done.max(*link);
        }
        done
    }
}

fn transfer(bytes: u64, per_second: u64) -> Duration {
    if per_second == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos((bytes as u128 * 1_000_000_000 / per_second as u128) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(meta_us: u64, in_flight: usize) -> Profile {
        Profile {
            meta: Duration::from_micros(meta_us),
            meta_in_flight: in_flight,
            read: Duration::from_micros(100),
            stream_bw: 1_000 * MB,
            total_bw: 2_000 * MB,
        }
    }

    #[test]
    fn metadata_rpcs_queue_behind_the_slots_in_flight() {
        let m = Model::new(profile(500, 2));
        let t = Instant::now();
        let done: Vec<_> = (0..5).map(|_| m.meta_done(t) - t).collect();
        let ms = |n| Duration::from_micros(n);
        assert_eq!(done, [ms(500), ms(500), ms(1000), ms(1000), ms(1500)]);
        // A request asked after the queue drained waits only its own round trip.
        let later = t + Duration::from_secs(1);
        assert_eq!(m.meta_done(later) - later, ms(500));
    }

    #[test]
    fn reads_pay_latency_stream_bandwidth_and_share_the_link() {
        let m = Model::new(profile(0, 0));
        let t = Instant::now();
        // 1 MB alone: 100 µs + 1 ms at 1 GB/s (the 2 GB/s link is not the limit).
        assert_eq!(m.read_done(t, MB) - t, Duration::from_micros(1100));
        // Four more at the same instant: the link carries 5 MB in 2.5 ms, so the last ends then.
        let last = (0..4).map(|_| m.read_done(t, MB)).max().unwrap();
        assert_eq!(last - t, Duration::from_micros(2500));
    }

    #[test]
    fn the_zero_profile_adds_nothing() {
        let m = Model::new(Profile::named("none").unwrap());
        let t = Instant::now();
        assert_eq!(m.meta_done(t), t);
        assert_eq!(m.read_done(t, 1 << 30), t);
    }
}
