//! Requests answered once: the nonces of the signed requests a server answered, kept for as
//! long as their time would pass the skew check (`auth::SKEW`), so a request captured on the
//! wire and sent again is refused before it costs a read. Kept by the second the request was
//! signed at: a replay carries the same signed time, so one second's set is all it is looked
//! up in, and a second's set goes whole once no request of it can pass the time check.
//!
//! Only requests signed with the job's secret get here, so only the job's own nodes can fill
//! it; still it holds at most `MAX` nonces (about 16 MB), and past that refuses as busy (the
//! asker reads the source) rather than grow or forget a nonce early.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::auth::SKEW;

/// Nonces kept at most.
const MAX: usize = 1 << 20;

/// Why a nonce was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A request with this nonce and time was answered already.
    Replayed,
    /// `MAX` nonces are kept, none old enough to forget.
    Full,
}

#[derive(Default)]
pub struct Replays {
    /// By the second a request was signed at: a 64-bit hash of its nonce.
    by_second: Mutex<HashMap<u64, HashSet<u64>>>,
}

impl Replays {
    /// Takes the nonce of a request signed at `time` (already checked to be within the skew of
    /// `now`): `Ok` the first time, `Replayed` after.
    pub fn first_use(&self, nonce: &str, time: u64, now: u64) -> Result<(), Seen> {
        let key = xxhash_rust::xxh3::xxh3_64(nonce.as_bytes());
        let mut by_second = self.by_second.lock().unwrap_or_else(|e| e.into_inner());
        let oldest = now.saturating_sub(SKEW.as_secs());
        by_second.retain(|second, _| *second >= oldest);
        if by_second.get(&time).is_some_and(|s| s.contains(&key)) {
            return Err(Seen::Replayed);
        }
        if by_second.values().map(HashSet::len).sum::<usize>() >= MAX {
            return Err(Seen::Full);
        }
        by_second.entry(time).or_default().insert(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_taken_once_while_its_time_may_pass_and_forgotten_after() {
        let replays = Replays::default();
        let now = 1_000_000;
        assert_eq!(replays.first_use("aa", now - 5, now), Ok(()));
        assert_eq!(replays.first_use("aa", now - 5, now), Err(Seen::Replayed));
        // Another nonce, or the same one at another second, is another request.
        assert_eq!(replays.first_use("bb", now - 5, now), Ok(()));
        assert_eq!(replays.first_use("aa", now - 4, now), Ok(()));
        // Still refused until the request would be stale; its second forgotten after.
        let later = now - 5 + SKEW.as_secs();
        assert_eq!(replays.first_use("aa", now - 5, later), Err(Seen::Replayed));
        replays.first_use("cc", later + 1, later + 1).unwrap();
        assert!(!replays.by_second.lock().unwrap().contains_key(&(now - 5)));
    }

    #[test]
    fn a_full_guard_refuses_rather_than_forget_early() {
        let replays = Replays::default();
        let now = 5_000;
        {
            let mut by_second = replays.by_second.lock().unwrap();
            by_second.insert(now, (0..MAX as u64).collect());
        }
        assert_eq!(replays.first_use("new", now, now), Err(Seen::Full));
        // Once that second is past the skew, there is room again.
        assert_eq!(
            replays.first_use("new", now + SKEW.as_secs() + 1, now + SKEW.as_secs() + 1),
            Ok(())
        );
    }
}
