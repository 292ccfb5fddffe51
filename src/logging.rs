//! Logging through `tracing`: quiet by default (warnings only), `-v` for more, `RUST_LOG` to pick
//! per module; optionally copied to a log file, which outlives the daemon's terminal.

use std::fs::OpenOptions;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::MakeWriterExt;

fn default_filter(verbosity: u8) -> &'static str {
    // fuser logs every request at debug level: keep it down unless asked for.
    match verbosity {
        0 => "warn,fuser=error",
        1 => "info,fuser=warn",
        2 => "debug,fuser=info",
        _ => "trace",
    }
}

/// Installs the global subscriber. Call once, before any thread starts logging.
pub fn init(verbosity: u8, log_file: Option<&Path>) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => {
            EnvFilter::try_new(&spec).with_context(|| format!("bad RUST_LOG {spec:?}"))?
        }
        _ => EnvFilter::new(default_filter(verbosity)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match log_file {
        Some(path) => {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open log file {}", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::io::stderr.and(Mutex::new(file)))
                .try_init()
        }
        None => builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .try_init(),
    }
    .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}
