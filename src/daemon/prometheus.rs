//! The counters in Prometheus' text format, for node_exporter's textfile collector: one file per
//! mount beside the stats file (docs/metrics.md says what each family means).

use super::stats::Counters;
use crate::fs::requests::OpFigures;

impl Counters {
    /// The counters in Prometheus' text format, for node_exporter's textfile collector (one file
    /// per mount beside the stats file; docs/metrics.md).
    pub fn to_prometheus(&self) -> String {
        use std::fmt::Write;
        let mp = prometheus_label(&self.mountpoint);
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(
                out,
                "# HELP packfs_{name} {help}\n# TYPE packfs_{name} {kind}"
            );
            for (labels, value) in samples {
                let _ = writeln!(out, "packfs_{name}{{mountpoint=\"{mp}\"{labels}}} {value}");
            }
        };
        let one = |v: u64| vec![(String::new(), v as f64)];
        family("up", "gauge", "1 while the mount's daemon runs.", &one(1));
        family(
            "uptime_seconds",
            "gauge",
            "Seconds since the mount started.",
            &[(String::new(), self.uptime_s)],
        );
        family(
            "files",
            "gauge",
            "Regular files in the mount.",
            &one(self.about.files),
        );
        family(
            "images",
            "gauge",
            "Images the mount serves.",
            &one(self.about.images),
        );
        let tiers = [
            ("ram", self.served.ram_bytes),
            ("ahead", self.served.ahead_bytes),
            ("stage", self.served.staged_bytes),
            ("source", self.served.source_bytes),
        ];
        let by_tier: Vec<_> = tiers
            .iter()
            .map(|(t, v)| (format!(",tier=\"{t}\""), *v as f64))
            .collect();
        family(
            "served_bytes_total",
            "counter",
            "Bytes delivered to readers, by the tier that had them.",
            &by_tier,
        );
        family(
            "spliced_bytes_total",
            "counter",
            "Bytes of the source tier spliced from an image file into the kernel, not copied by the daemon.",
            &one(self.served.spliced_bytes),
        );
        family(
            "source_reads_total",
            "counter",
            "Reads issued on the images for the mount.",
            &one(self.source.reads),
        );
        family(
            "source_read_bytes_total",
            "counter",
            "Bytes read from the images for the mount.",
            &one(self.source.bytes),
        );
        family(
            "image_checks_total",
            "counter",
            "Images asked whether they changed under the mount (a stat, or a HEAD of an object).",
            &one(self.source.checks),
        );
        family(
            "ram_cache_bytes",
            "gauge",
            "Bytes held by the RAM cache.",
            &one(self.ram.held),
        );
        family(
            "ram_cache_budget_bytes",
            "gauge",
            "The RAM cache's budget.",
            &one(self.ram.budget),
        );
        let per_store =
            |value: fn(&crate::source::remote::StoreStats) -> u64| -> Vec<(String, f64)> {
                self.remote
                    .iter()
                    .map(|s| {
                        let store = prometheus_label(&s.store);
                        (format!(",store=\"{store}\""), value(s) as f64)
                    })
                    .collect()
            };
        if let Some(c) = &self.credentials {
            family(
                "remote_credential_renewals_total",
                "counter",
                "S3 credentials fetched again (before expiry, or after a store refused them).",
                &one(c.renewals),
            );
            family(
                "remote_credential_failures_total",
                "counter",
                "Fetches of S3 credentials that failed.",
                &one(c.failures),
            );
        }
        if !self.remote.is_empty() {
            family(
                "remote_requests_total",
                "counter",
                "Requests sent to an object store or HTTP server (retries included), by store.",
                &per_store(|s| s.requests),
            );
            family(
                "remote_bytes_total",
                "counter",
                "Bytes received from an object store or HTTP server, by store.",
                &per_store(|s| s.bytes),
            );
            family(
                "remote_retries_total",
                "counter",
                "Requests retried after a 5xx, 429, timeout or dropped connection, by store.",
                &per_store(|s| s.retries),
            );
            family(
                "remote_errors_total",
                "counter",
                "Requests that failed for good (the read failed with EIO), by store.",
                &per_store(|s| s.errors),
            );
        }
        let per_op = |key: fn(&OpFigures) -> f64| -> Vec<(String, f64)> {
            self.requests
                .iter()
                .map(|(op, f)| (format!(",op=\"{op}\""), key(f)))
                .collect()
        };
        family(
            "requests_total",
            "counter",
            "FUSE requests answered, by operation.",
            &per_op(|f| f.count as f64),
        );
        family(
            "request_errors_total",
            "counter",
            "FUSE requests answered with an error, by operation.",
            &per_op(|f| f.errors as f64),
        );
        let mut quantiles = Vec::new();
        for (op, f) in &self.requests {
            for (q, us) in [("0.5", f.p50_us), ("0.9", f.p90_us), ("0.99", f.p99_us)] {
                let seconds = us / 1e6;
                quantiles.push((format!(",op=\"{op}\",quantile=\"{q}\""), seconds));
            }
        }
        family(
            "request_latency_seconds",
            "gauge",
            "Request latency quantiles since the mount started, by operation.",
            &quantiles,
        );
        family(
            "storage_wait_seconds_total",
            "counter",
            "Time readers waited on storage (their reads of the images, fetches ahead in flight), \
             summed over readers: the data stall.",
            &[(String::new(), self.served.storage_wait_ns as f64 / 1e9)],
        );
        family(
            "storage_stall_seconds_total",
            "counter",
            "Time during which some reader waited on storage (wall-clock): the mount's data \
             stall, comparable to a loader's own wait.",
            &[(String::new(), self.served.storage_stall_ns as f64 / 1e9)],
        );
        let per_reader: Vec<_> = self
            .readers_waiting
            .iter()
            .map(|r| (format!(",pid=\"{}\"", r.pid), r.wait_ns as f64 / 1e9))
            .collect();
        family(
            "reader_storage_wait_seconds_total",
            "counter",
            "Time each reading process waited on storage, for the 16 that waited longest (pid 0: \
             the others).",
            &per_reader,
        );
        if let Some(h) = &self.lookahead {
            let in_time = h.first_reads.saturating_sub(h.missed + h.late);
            let outcomes: Vec<_> = [("in_time", in_time), ("late", h.late), ("missed", h.missed)]
                .iter()
                .map(|(o, v)| (format!(",outcome=\"{o}\""), *v as f64))
                .collect();
            family(
                "hinted_reads_total",
                "counter",
                "First reads of samples a sampler listed, by whether their fetch ahead was in \
                 time, still in flight, or not made.",
                &outcomes,
            );
            let singles = [
                (
                    "hint_lists_total",
                    "counter",
                    "Lists of samples received from samplers.",
                    h.lists,
                ),
                (
                    "lookahead_fetched_bytes_total",
                    "counter",
                    "Bytes fetched ahead of readers on samplers' hints.",
                    h.fetched_bytes,
                ),
                (
                    "lookahead_fetched_samples_total",
                    "counter",
                    "Samples fetched ahead of readers (requests per sample: the requests over these).",
                    h.fetched,
                ),
                (
                    "lookahead_requests_total",
                    "counter",
                    "Requests made to fetch samples ahead.",
                    h.requests,
                ),
                (
                    "lookahead_window_bytes",
                    "gauge",
                    "Bytes fetched ahead and not yet read.",
                    h.window_held,
                ),
                (
                    "lookahead_dropped_bytes_total",
                    "counter",
                    "Bytes fetched ahead and dropped unread.",
                    h.dropped_bytes,
                ),
            ];
            for (name, kind, help, value) in singles {
                family(name, kind, help, &one(value));
            }
        }
        if let Some(st) = &self.stage {
            family(
                "stage_present_bytes",
                "gauge",
                "Bytes staged and complete on local storage.",
                &one(st.present_bytes),
            );
            family(
                "stage_total_bytes",
                "gauge",
                "Bytes to stage.",
                &one(st.total_bytes),
            );
            family(
                "stage_failed_checks_total",
                "counter",
                "Staged chunks that failed their check.",
                &one(st.failed_checks),
            );
        }
        if let Some(p) = &self.peers {
            let by_share = |f: fn(&crate::peers::stats::OnePeer) -> f64| -> Vec<(String, f64)> {
                p.peers
                    .iter()
                    .map(|one| (format!(",share=\"{}\"", one.share), f(one)))
                    .collect()
            };
            family(
                "peer_fetched_bytes_total",
                "counter",
                "Bytes of other shares' images read from the nodes that stage them, checked.",
                &by_share(|o| o.bytes as f64),
            );
            family(
                "peer_requests_total",
                "counter",
                "Requests to each node of the job (a range of one chunk each).",
                &by_share(|o| o.requests as f64),
            );
            family(
                "peer_mean_latency_seconds",
                "gauge",
                "Mean time a request took from each node.",
                &by_share(|o| o.mean_us / 1e6),
            );
            family(
                "peer_p99_latency_seconds",
                "gauge",
                "99th percentile of the time a request took from each node.",
                &by_share(|o| o.p99_us / 1e6),
            );
            let reasons: Vec<_> = p
                .fallbacks
                .iter()
                .map(|(why, n)| (format!(",reason=\"{why}\""), *n as f64))
                .collect();
            family(
                "peer_fallbacks_total",
                "counter",
                "Requests answered from the source instead of the node that stages them, by reason.",
                &reasons,
            );
            family(
                "peer_source_bytes_total",
                "counter",
                "Bytes of other shares' images read from the source.",
                &one(p.source_bytes),
            );
            family(
                "peer_served_bytes_total",
                "counter",
                "Bytes of this node's stage served to the job's other nodes.",
                &one(p.served_bytes),
            );
            let refusals: Vec<_> = p
                .refusals
                .iter()
                .map(|(why, n)| (format!(",reason=\"{why}\""), *n as f64))
                .collect();
            family(
                "peer_refused_total",
                "counter",
                "Requests refused, by reason: unsigned, signature (not the job's secret), stale, \
                 other-node and replay (captures sent again), other-dataset, busy.",
                &refusals,
            );
            family(
                "peer_evicted_connections_total",
                "counter",
                "Connections closed before they sent a signed request, to make room for others.",
                &one(p.evicted_connections),
            );
            family(
                "peer_damaged_total",
                "counter",
                "Requests for staged chunks whose bytes failed their check here (dropped, \
                 staged again; the asking node read the source).",
                &one(p.damaged),
            );
        }
        out
    }
}

/// A label value with `\`, `"` and newlines escaped, as the text format wants.
fn prometheus_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::prometheus_label;
    use crate::daemon::stats::Counters;
    use crate::peers::stats::{Fallback, PeerTierCounters};
    use std::sync::atomic::Ordering;

    #[test]
    fn labels_escape_what_the_text_format_wants_escaped() {
        assert_eq!(prometheus_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    /// The peer tier's families: per node of the job, and fallbacks by reason.
    #[test]
    fn peers_have_their_families() {
        let tier = PeerTierCounters::new(2);
        tier.peers[1].requests.fetch_add(3, Ordering::Relaxed);
        tier.peers[1].bytes.fetch_add(4096, Ordering::Relaxed);
        tier.fell_back(Fallback::Mismatch);
        let counters = Counters {
            mountpoint: "/m".into(),
            peers: Some(tier.stats()),
            ..Counters::default()
        };
        let prom = counters.to_prometheus();
        for line in [
            "packfs_peer_fetched_bytes_total{mountpoint=\"/m\",share=\"1\"} 4096\n",
            "packfs_peer_requests_total{mountpoint=\"/m\",share=\"1\"} 3\n",
            "packfs_peer_fallbacks_total{mountpoint=\"/m\",reason=\"mismatch\"} 1\n",
            "packfs_peer_fallbacks_total{mountpoint=\"/m\",reason=\"unreachable\"} 0\n",
        ] {
            assert!(prom.contains(line), "{line} missing from:\n{prom}");
        }
        assert!(!Counters::default().to_prometheus().contains("packfs_peer_"));
    }
}
