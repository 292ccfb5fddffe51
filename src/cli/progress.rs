//! Progress bars on the terminal (drawn only when stderr is one) for the library's callbacks,
//! and plain lines for a batch job's log when it is not one.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::dataset::ScanProgress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Where no bar is drawn (stderr is a file: a batch job's log), a line of progress every
/// `PACKFS_PROGRESS_EVERY` seconds (30 by default), so that a long pack or scan is not silence.
pub struct LogLines {
    every: Option<Duration>,
    last: Mutex<Option<Instant>>,
    /// Also to the log (a daemon's: its stderr is its launcher's, until the mount is ready).
    to_log: bool,
}

impl LogLines {
    pub fn new() -> LogLines {
        let every = std::env::var("PACKFS_PROGRESS_EVERY")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map_or(Duration::from_secs(30), Duration::from_secs_f64);
        LogLines {
            every: (!std::io::stderr().is_terminal()).then_some(every),
            last: Mutex::new(None),
            to_log: false,
        }
    }

    /// Lines to stderr and to the log as well.
    pub fn logged() -> LogLines {
        LogLines {
            to_log: true,
            ..LogLines::new()
        }
    }

    /// Writes `line()` if a line is due (the first comes after one interval).
    pub fn say(&self, line: impl FnOnce() -> String) {
        let Some(every) = self.every else { return };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match *last {
            None => *last = Some(now),
            Some(at) if now.duration_since(at) >= every => {
                let line = line();
                eprintln!("packfs: {line}");
                if self.to_log {
                    tracing::info!("{line}");
                }
                *last = Some(now);
            }
            Some(_) => {}
        }
    }
}

/// A bar over the bytes of the images being scanned.
pub struct ScanBar(ProgressBar, LogLines);

impl ScanBar {
    pub fn new() -> ScanBar {
        ScanBar::with_lines(LogLines::new())
    }

    pub fn with_lines(lines: LogLines) -> ScanBar {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4));
        bar.set_style(
            ProgressStyle::with_template(
                "scanning {bar:30} {binary_bytes}/{binary_total_bytes}, {msg}, eta {eta}",
            )
            .expect("valid template"),
        );
        bar.set_message("0 members");
        ScanBar(bar, lines)
    }

    pub fn update(&self, p: ScanProgress) {
        self.0.set_length(p.image_bytes.max(1));
        self.0.set_position(p.scanned_bytes);
        if p.bytes_to_check > 0 {
            // The checksums' pass: the bar follows the bytes read.
            let (done, total) = (p.bytes_checked, p.bytes_to_check);
            let percent = (done as f64 * 100.0 / total as f64) as u64;
            self.0.set_length(total.max(1));
            self.0.set_position(done);
            self.0.set_message(format!(
                "{} members, CRC-32 of {percent}% of their bytes",
                p.members
            ));
            self.1.say(|| {
                format!(
                    "checksums: {done} of {total} bytes of {} members read",
                    p.members
                )
            });
            return;
        }
        self.0.set_message(format!(
            "{}/{} images, {} members",
            p.images_done, p.images, p.members
        ));
        self.1.say(|| scan_line(&p));
    }
}

/// `scanning: 1.2 GiB of 6.4 GiB read (19%), 0 of 1 images, 0 members`.
fn scan_line(p: &ScanProgress) -> String {
    use indicatif::BinaryBytes;
    let percent = match p.image_bytes {
        0 => 0,
        total => p.scanned_bytes.saturating_mul(100) / total,
    };
    format!(
        "scanning: {} of {} read ({percent}%), {} of {} images, {} members",
        BinaryBytes(p.scanned_bytes),
        BinaryBytes(p.image_bytes),
        p.images_done,
        p.images,
        p.members
    )
}

impl Drop for ScanBar {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// A bar over bytes staged.
pub fn staging_bar(total: u64, done: u64) -> ProgressBar {
    let bar = bytes_bar("staging", total);
    bar.set_position(done);
    bar.reset_eta();
    bar
}

/// A bar over `total` bytes of some work (`what`: "staging", "reading").
pub fn bytes_bar(what: &str, total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{what} {{bar:30}} {{bytes}}/{{total_bytes}} {{binary_bytes_per_sec}}, eta {{eta}}"
        ))
        .expect("valid template"),
    );
    bar
}
