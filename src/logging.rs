//! Logging through `tracing`: quiet by default (warnings only), `-v` for more, `RUST_LOG` to pick
//! per module; optionally copied to a log file, which outlives the daemon's terminal.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Mutex;

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

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("bad RUST_LOG {spec:?}: {error}")]
    Filter {
        spec: String,
        error: tracing_subscriber::filter::ParseError,
    },
    #[error("cannot open log file {}: {error}", path.display())]
    File {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("cannot install the logger: {0}")]
    Install(String),
}

/// Installs the global subscriber. Call once, before any thread starts logging.
pub fn init(verbosity: u8, log_file: Option<&Path>) -> Result<(), LogError> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => {
            EnvFilter::try_new(&spec).map_err(|error| LogError::Filter { spec, error })?
        }
        _ => EnvFilter::new(default_filter(verbosity)),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match log_file {
        Some(path) => {
            let file = crate::safe_file::append(path).map_err(|error| LogError::File {
                path: path.to_path_buf(),
                error,
            })?;
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
    .map_err(|e| LogError::Install(e.to_string()))
}
