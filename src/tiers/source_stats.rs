//! What the mount asked of its images' storage, counted.

use serde::Serialize;

/// Counters of the operations issued on the backing files: for reads of the mount, and for the
/// stager's copies.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SourceStats {
    pub opens: u64,
    pub reads: u64,
    pub bytes: u64,
    pub stage_reads: u64,
    pub stage_bytes: u64,
    /// Images asked whether they changed under the mount (a stat of a file, a HEAD of an
    /// object): the metadata requests the mount sends after it opened its images.
    pub checks: u64,
    /// Bytes of members checked against their CRC-32 in the page cache (`source::mapped`),
    /// whose replies splice the same pages: not in `bytes`, the reads issued.
    pub checked_bytes: u64,
}
