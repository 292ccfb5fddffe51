//! The JSON manifest beside the shards: the shard list in the form webdataset's `wids` reads
//! (`wids-shard-index-v1`: `shardlist` of `url` and `nsamples`), plus what packfs knows of the
//! dataset (counts, bytes, seed, sources). Nothing in it changes from one run to the next for the
//! same input, like the shards.

use serde_json::json;

use super::gather::Sources;
use super::{PackError, PackOptions, Report};

pub fn write(
    report: &Report,
    name: &str,
    opts: &PackOptions,
    sources: &Sources,
) -> Result<(), PackError> {
    let file_name = |p: &std::path::Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let shardlist: Vec<serde_json::Value> = report
        .shards
        .iter()
        .map(|s| {
            json!({
                "url": file_name(&s.path),
                "nsamples": s.samples,
                "filesize": s.bytes,
                "members": s.members,
            })
        })
        .collect();
    let source_list: Vec<String> = sources
        .dirs
        .iter()
        .map(|d| d.root.display().to_string())
        .chain(sources.image_patterns.iter().cloned())
        .collect();
    let doc = json!({
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": name,
        "shardlist": shardlist,
        "samples": report.samples,
        "files": report.files,
        "data_bytes": report.data_bytes,
        "shuffle_seed": opts.shuffle,
        // How the shuffled samples were dealt to shards: a seed gives the same shards under
        // its deal (plan::deal).
        "deal": opts.shuffle.map(|_| opts.deal.unwrap_or(super::plan::DEAL)),
        "mtime": opts.mtime,
        "compression": opts.compress.map(|c| c.describe()),
        "frame_size": opts.compress.map(|c| c.frame),
        "sources": source_list,
        "index": file_name(&report.index),
        "written_by": format!("packfs {}", env!("CARGO_PKG_VERSION")),
    });
    let mut text = serde_json::to_vec_pretty(&doc).expect("JSON of plain values");
    text.push(b'\n');
    crate::util::safe_file::replace(&report.manifest, &text, 0o644).map_err(|error| {
        PackError::Write {
            path: report.manifest.clone(),
            error,
        }
    })
}
