//! Progress bars on the terminal (drawn only when stderr is one) for the library's callbacks.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use packfs::dataset::ScanProgress;

/// A bar over the images being scanned.
pub struct ScanBar(ProgressBar);

impl ScanBar {
    pub fn new() -> ScanBar {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(4));
        bar.set_style(
            ProgressStyle::with_template("scanning {bar:30} {pos}/{len} images, {msg}, eta {eta}")
                .expect("valid template"),
        );
        bar.set_message("0 members");
        ScanBar(bar)
    }

    pub fn update(&self, p: ScanProgress) {
        self.0.set_length(p.images);
        self.0.set_position(p.images_done);
        self.0.set_message(format!("{} members", p.members));
    }
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
