//! A sampler's order handed to this process's lookahead, as the mount's hints socket hands one
//! over (`daemon::hints`): the same intake of memory, the same key (the user, the stream, the
//! rank), paths relative to the dataset's root.

use pyo3::PyResult;
use pyo3::exceptions::PyMemoryError;

use crate::tiers::lookahead::{Intake, ListKey, Lookahead, Submitted};

use super::open::Open;

/// The list of `rank` of `stream`, for this process's user.
pub fn key(stream: String, rank: u32) -> ListKey {
    ListKey {
        uid: nix::unistd::geteuid().as_raw(),
        stream,
        rank,
    }
}

/// Takes `paths` in as the list of `rank` of `stream` for `epoch`.
pub fn take(
    open: &Open,
    intake: &Intake,
    lookahead: &Lookahead,
    paths: Vec<Vec<u8>>,
    stream: String,
    rank: u32,
    epoch: u64,
) -> PyResult<(u64, u64, Option<String>, bool)> {
    let catalog = open.core.catalog();
    let mut taking = intake.take(catalog);
    let (mut unknown, mut first_unknown) = (0u64, None);
    for path in &paths {
        match catalog.resolve_file(path.strip_prefix(b"/").unwrap_or(path)) {
            Some(entry) => taking.push(entry),
            None => {
                unknown += 1;
                first_unknown.get_or_insert_with(|| String::from_utf8_lossy(path).into_owned());
            }
        }
    }
    if taking.no_room > 0 {
        let share = intake.lists().stats();
        return Err(PyMemoryError::new_err(format!(
            "no memory for this list ({} samples could not be held: the lists hold {} of their \
             {} bytes); end other streams' lists, send shorter ones, or open the engine with a \
             larger cache_size",
            taking.no_room, share.held, share.total
        )));
    }
    let truncated = taking.truncated;
    let (entries, permits) = taking.finish();
    let samples = entries.len() as u64;
    lookahead.submit(Submitted {
        key: key(stream, rank),
        epoch,
        entries,
        unknown,
        permits,
    });
    Ok((samples, unknown, first_unknown, truncated))
}
