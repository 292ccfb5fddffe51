//! Staging flags shared by `packfs mount --stage` and `packfs stage`.

use std::path::PathBuf;

use crate::tiers::stage::{Share, StageMode, StageOptions};

#[derive(clap::Args, Debug, Clone)]
pub struct StageFlags {
    /// Local bytes the staged copies may take at most (K, M, G, T suffixes): eager staging stops
    /// there, lazy staging drops the least recently used chunks.
    #[arg(long, value_name = "BYTES", value_parser = super::size::parse_bytes)]
    pub stage_budget: Option<u64>,
    /// Source bytes per second the stager may read at most (e.g. 500M), so that a whole
    /// allocation staging at once does not saturate the shared filesystem.
    #[arg(long, value_name = "BYTES", value_parser = parse_rate)]
    pub stage_rate: Option<u64>,
    /// Stage only this node's share of the images: image i when i mod WORLD == RANK
    /// (e.g. $SLURM_NODEID/$SLURM_NNODES); the others are read from the source.
    #[arg(long, value_name = "RANK/WORLD")]
    pub stage_share: Option<Share>,
    /// Chunk size of staged copies and of source chunks cached in RAM (a power of two, 64K to
    /// 64M); a staged copy made with another size is staged again.
    #[arg(long, value_name = "BYTES", default_value = "1M", value_parser = parse_chunk)]
    pub chunk_size: u64,
}

impl StageFlags {
    pub fn options(&self, dir: PathBuf, mode: StageMode) -> anyhow::Result<StageOptions> {
        Ok(StageOptions {
            dir: std::path::absolute(dir)?,
            mode,
            budget: self.stage_budget,
            rate: self.stage_rate,
            share: self.stage_share,
            chunk_size: self.chunk_size,
        })
    }
}

fn parse_rate(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    match super::size::parse_bytes(t)? {
        0 => Err("a rate of 0 would never stage anything; leave --stage out instead".into()),
        r => Ok(r),
    }
}

fn parse_chunk(text: &str) -> Result<u64, String> {
    let n = super::size::parse_bytes(text)?;
    if !n.is_power_of_two() || !(64 << 10..=64 << 20).contains(&n) {
        return Err(format!(
            "{text:?}: the chunk size must be a power of two from 64K to 64M"
        ));
    }
    Ok(n)
}
