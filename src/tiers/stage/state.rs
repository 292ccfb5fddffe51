//! What staging reports: its state, why it stopped, and its figures (the log, the stats file).

use super::StageMode;

/// Where staging is; its `status` text says it in words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageState {
    #[default]
    Starting,
    /// Copying: the whole share (eager), or the chunks reads touch (lazy).
    Copying,
    /// Every chunk is local (or, said in `status`, all but those the source could not deliver).
    Complete,
    /// For good, for `StageStats::stopped`; staged chunks are still read.
    Stopped,
}

/// Why staging stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `--stage-budget` reached (eager mode): what was meant to fit is staged.
    Budget,
    DirectoryGone,
    DirectoryFull,
    WriteFailed,
}

/// Staging figures, for the log and the stats file.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StageStats {
    /// As text (lossy for a non-UTF-8 path, which JSON cannot carry).
    pub dir: String,
    pub mode: Option<StageMode>,
    pub images: u64,
    pub total_bytes: u64,
    /// Bytes complete on local storage now.
    pub present_bytes: u64,
    /// Bytes written to local storage by this process.
    pub copied_bytes: u64,
    /// Of those, bytes that reads had already fetched (no second source read).
    pub copied_from_reads: u64,
    /// Reads that wanted a chunk whole, found the stager's queue full and the stage without room
    /// for them to store it (or could not wait to): they read exactly, and the chunk is read
    /// again when it is staged.
    pub lagged_reads: u64,
    pub verified_chunks: u64,
    pub failed_checks: u64,
    pub evicted_bytes: u64,
    pub state: StageState,
    pub stopped: Option<StopReason>,
    /// The state in words, with the reason of a stop.
    pub status: String,
}

/// The stage's state, its stop reason and its words, changed together.
pub(super) struct Status {
    pub state: StageState,
    pub stopped: Option<StopReason>,
    pub text: String,
}
