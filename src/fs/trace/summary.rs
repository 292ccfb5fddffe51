//! `packfs trace summarize`: reads a trace written by `mount --trace` (one `fs::trace::Event` per
//! line, the type the writer writes; a trace cut short by a killed daemon still reads) and counts requests,
//! latencies, bytes per tier and the busiest paths.

use std::collections::HashMap;
use std::io::BufRead;

use serde::Serialize;

use super::super::counts_as_error;
use super::{Event, TRACE_END};

/// Per operation: the figures the mount's counters have (exact percentiles here), and the sum
/// of the requests' durations.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpSummary {
    #[serde(flatten)]
    pub figures: crate::fs::requests::OpFigures,
    pub total_ms: f64,
}

/// One path's share of the reads.
#[derive(Clone, Debug, Serialize)]
pub struct PathSummary {
    pub path: String,
    pub reads: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub requests: u64,
    /// From the first request's start to the last one's end.
    pub span_s: f64,
    /// Requests the daemon left out (queue full, or past the size limit).
    pub dropped: Option<u64>,
    /// Whether the trace was closed by its daemon (else it was cut short).
    pub complete: bool,
    pub ops: std::collections::BTreeMap<String, OpSummary>,
    /// Bytes read, by the tier that served them.
    pub tiers: std::collections::BTreeMap<String, u64>,
    /// Paths with the most bytes read, most first.
    pub top_paths: Vec<PathSummary>,
    /// Lines that are not trace events (damaged or foreign).
    pub unreadable_lines: u64,
}

/// Summarizes the trace in `input`, keeping the `top` busiest paths.
pub fn summarize(input: impl BufRead, top: usize) -> std::io::Result<Summary> {
    let mut s = Summary::default();
    let mut durations: HashMap<String, Vec<f64>> = HashMap::new();
    let mut paths: HashMap<String, (u64, u64)> = HashMap::new();
    let (mut first, mut last) = (f64::INFINITY, 0f64);
    for line in input.lines() {
        let line = line?;
        let text = line.trim().trim_end_matches(',');
        if text.is_empty() || text == "[" || text == "]" {
            continue;
        }
        let Ok(event) = serde_json::from_str::<Event>(text) else {
            s.unreadable_lines += 1;
            continue;
        };
        match event {
            Event::Meta { name, args, .. } if name == TRACE_END => {
                s.complete = true;
                s.dropped = args.dropped;
            }
            Event::Meta { .. } => {}
            Event::Request {
                name,
                ts,
                dur,
                args,
                ..
            } => {
                first = first.min(ts);
                last = last.max(ts + dur);
                s.requests += 1;
                let op = &mut s.ops.entry(name.to_string()).or_default().figures;
                op.count += 1;
                let bytes = args.bytes.unwrap_or(0) as u64;
                op.bytes += bytes;
                if args.errno.is_some_and(counts_as_error) {
                    op.errors += 1;
                }
                durations.entry(name.to_string()).or_default().push(dur);
                if name == "read" {
                    let tier = args.tier.as_deref().unwrap_or("?").to_string();
                    *s.tiers.entry(tier).or_default() += bytes;
                    let p = paths.entry(args.path.into_owned()).or_default();
                    p.0 += 1;
                    p.1 += bytes;
                }
            }
        }
    }
    if s.requests > 0 {
        s.span_s = (last - first) / 1e6;
    }
    for (name, mut d) in durations {
        d.sort_by(f64::total_cmp);
        let op = s.ops.get_mut(&name).expect("counted");
        let at = |q: f64| d[((d.len() as f64 * q).ceil() as usize).clamp(1, d.len()) - 1];
        op.figures.p50_us = at(0.50);
        op.figures.p90_us = at(0.90);
        op.figures.p99_us = at(0.99);
        op.figures.max_us = d[d.len() - 1];
        op.total_ms = d.iter().sum::<f64>() / 1000.0;
    }
    let mut top_paths: Vec<PathSummary> = paths
        .into_iter()
        .map(|(path, (reads, bytes))| PathSummary { path, reads, bytes })
        .collect();
    top_paths.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.path.cmp(&b.path)));
    top_paths.truncate(top);
    s.top_paths = top_paths;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_trace_cut_short_and_counts_per_op() {
        let text = r#"[
{"name":"process_name","ph":"M","pid":1,"tid":0,"args":{"name":"packfs"}},
{"name":"lookup","cat":"fuse","ph":"X","ts":10.0,"dur":5.0,"pid":1,"tid":2,"args":{"ino":1,"path":"/a","offset":0,"size":0,"errno":2}},
{"name":"read","cat":"fuse","ph":"X","ts":20.0,"dur":100.0,"pid":1,"tid":2,"args":{"ino":2,"path":"/a","offset":0,"size":4096,"bytes":4096,"tier":"source"}},
{"name":"read","cat":"fuse","ph":"X","ts":30.0,"dur":1000.0,"pid":1,"tid":3,"args":{"ino":3,"path":"/b","offset":0,"size":4096,"errno":5}},
{"name":"read","cat":"fu"#;
        let s = summarize(text.as_bytes(), 10).unwrap();
        assert_eq!(s.requests, 3);
        assert!(!s.complete);
        assert_eq!(s.unreadable_lines, 1);
        assert_eq!(s.ops["lookup"].figures.errors, 0, "ENOENT is an answer");
        let read = &s.ops["read"].figures;
        assert_eq!(read.count, 2);
        assert_eq!(read.errors, 1);
        assert_eq!(read.bytes, 4096);
        assert_eq!(read.p50_us, 100.0);
        assert_eq!(read.max_us, 1000.0);
        assert_eq!(s.tiers["source"], 4096);
        assert_eq!(s.top_paths[0].path, "/a");
        assert!((s.span_s - 1020.0 / 1e6).abs() < 1e-9);
    }
}
