//! Logging failed requests without flooding the log: one shard truncated under a mount made 32
//! readers write 47 039 error lines (11.8 MB) in 58 s. The first `NAMED` failures per image (or
//! per kind of failure that names no image) in each `WINDOW` are logged one by one; the rest are
//! counted, and one line per window says how many were left out. The request counters keep
//! every failure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::error;

/// Failures logged one by one per image and window.
pub const NAMED: u64 = 5;
/// The window after which the count of unnamed failures is logged and naming starts again.
pub const WINDOW: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Window {
    started: Option<Instant>,
    named: u64,
    unnamed: u64,
}

/// The failures seen per key (an image's path, or a kind of failure), in the current window.
#[derive(Default)]
pub struct ErrorLog {
    windows: Mutex<HashMap<String, Window>>,
    /// Started at the first failure (`admit_flushing`).
    flusher: OnceLock<()>,
}

impl ErrorLog {
    /// `admit`; from the first failure on, a thread summarizes the windows that ended every
    /// second for as long as the log lives (a mount's: each mount has its own).
    pub fn admit_flushing(self: &Arc<Self>, key: &str, now: Instant) -> bool {
        self.flusher.get_or_init(|| {
            let log = Arc::downgrade(self);
            let _ = std::thread::Builder::new()
                .name("packfs-errlog".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(1));
                        match log.upgrade() {
                            Some(log) => log.flush(Instant::now()),
                            None => return,
                        }
                    }
                });
        });
        self.admit(key, now)
    }

    /// Whether the failure under `key` at `now` is to be logged one by one; if not, it is
    /// counted. A window that ended is summarized first.
    pub fn admit(&self, key: &str, now: Instant) -> bool {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let w = match windows.get_mut(key) {
            Some(w) => w,
            None => windows.entry(key.to_string()).or_default(),
        };
        if w.started.is_none_or(|s| now.duration_since(s) >= WINDOW) {
            summarize(key, w);
            *w = Window {
                started: Some(now),
                ..Window::default()
            };
        }
        if w.named < NAMED {
            w.named += 1;
            true
        } else {
            w.unnamed += 1;
            false
        }
    }

    /// Logs the count of every window that has ended by `now` (called every second by the
    /// flusher, and at exit with a time far ahead).
    pub fn flush(&self, now: Instant) {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows.retain(|key, w| {
            let ended = w.started.is_none_or(|s| now.duration_since(s) >= WINDOW);
            if ended {
                summarize(key, w);
            }
            !ended
        });
    }

    /// Failures counted but not yet summarized (for tests).
    pub fn pending(&self) -> u64 {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows.values().map(|w| w.unnamed).sum()
    }
}

fn summarize(key: &str, w: &mut Window) {
    if w.unnamed > 0 {
        error!(
            "{key}: {} more failed requests in {} s, not logged one by one (the first {NAMED} \
             are above; `packfs status` counts every one)",
            w.unnamed,
            WINDOW.as_secs()
        );
        w.unnamed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_named_a_few_times_then_counted_per_window() {
        let log = ErrorLog::default();
        let t0 = Instant::now();
        let admitted = (0..1000)
            .filter(|i| log.admit("/d/a.tar", t0 + Duration::from_millis(*i)))
            .count();
        assert_eq!(admitted as u64, NAMED);
        assert_eq!(log.pending(), 1000 - NAMED);
        // Another image has its own allowance.
        assert!(log.admit("/d/b.tar", t0));
        // The window ends: its count is logged, and naming starts again.
        log.flush(t0 + WINDOW);
        assert_eq!(log.pending(), 0);
        assert!(log.admit("/d/a.tar", t0 + WINDOW * 2));
    }
}
