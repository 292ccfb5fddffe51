//! Logging through `tracing`. Commands log warnings to stderr (`-v` for more, `-q` for errors
//! only, `RUST_LOG` to pick per module). A mount daemon, whose stderr goes nowhere once it is
//! ready, also logs INFO (the ready line, staging, every error) to its log: `--log-file`, or
//! syslog/journald when none is given, or a file beside its stats file on a node without either.
//!
//! No line holds a secret, at any level: every writer passes its lines through
//! `util::redact::urls` (a presigned URL's key id, token and signature, a URL's password), and
//! other crates (the HTTP client and TLS log whole requests at debug) are held to warnings.
//! A log file is capped: past `LOG_FILE_LIMIT` it is renamed to `NAME.1` and started anew.

use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Where a daemon's log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    File(PathBuf),
    Syslog,
}

impl Destination {
    /// `file` if given; else syslog where a syslog daemon or journald listens on /dev/log; else
    /// `fallback` (a file the user can find: `packfs status` names it).
    pub fn choose(file: Option<&Path>, fallback: PathBuf) -> Destination {
        use std::os::unix::fs::FileTypeExt;
        match file {
            Some(f) => Destination::File(f.to_path_buf()),
            None if std::fs::metadata(SYSLOG_SOCKET).is_ok_and(|m| m.file_type().is_socket()) => {
                Destination::Syslog
            }
            None => Destination::File(fallback),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Destination::File(p) => p.display().to_string(),
            Destination::Syslog => "syslog (journalctl -t packfs)".into(),
        }
    }
}

const SYSLOG_SOCKET: &str = "/dev/log";

/// How to log.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// `-v` count.
    pub verbosity: u8,
    /// `-q`: errors only on stderr, warnings only in the daemon's log.
    pub quiet: bool,
    /// The daemon's log (INFO by default), besides stderr.
    pub daemon_log: Option<Destination>,
    /// Before the daemon is ready, its stderr is the launcher's pipe, shown to the user: keep it
    /// to warnings there, the detail goes to the log.
    pub stderr_warnings_only: bool,
}

fn filter_spec(verbosity: u8, quiet: bool) -> &'static str {
    // fuser logs every request at debug level: keep it down unless asked for.
    match (quiet, verbosity) {
        (true, _) => "error,fuser=error",
        (false, 0) => "warn,fuser=error",
        (false, 1) => "info,fuser=error",
        (false, 2) => "debug,fuser=info",
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
pub fn init(setup: &Setup) -> Result<(), LogError> {
    let rust_log = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    let filter = |default: &str| match &rust_log {
        Some(spec) => EnvFilter::try_new(spec).map_err(|error| LogError::Filter {
            spec: spec.clone(),
            error,
        }),
        None => Ok(EnvFilter::new(default)),
    };
    let stderr_spec = if setup.stderr_warnings_only && !setup.quiet {
        filter_spec(0, false)
    } else {
        filter_spec(setup.verbosity, setup.quiet)
    };
    let stderr = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| Redacting(std::io::stderr()))
        .with_filter(filter(stderr_spec)?);
    // The daemon's log: INFO unless -q (warnings) or -v (more).
    let log_spec = match (setup.quiet, setup.verbosity) {
        (true, _) => "warn,fuser=error",
        (false, v) => filter_spec(v.max(1), false),
    };
    let (file, syslog) = match &setup.daemon_log {
        None => (None, None),
        Some(Destination::File(path)) => {
            let file = LogFile::open(path, LOG_FILE_LIMIT).map_err(|error| LogError::File {
                path: path.to_path_buf(),
                error,
            })?;
            let layer = tracing_subscriber::fmt::layer()
                .with_target(false)
                .with_ansi(false)
                .with_writer(Mutex::new(Redacting(file)))
                .with_filter(filter(log_spec)?);
            (Some(layer), None)
        }
        Some(Destination::Syslog) => (None, Some(Syslog::open().with_filter(filter(log_spec)?))),
    };
    tracing_subscriber::registry()
        .with(filter_fn(|meta| {
            is_ours(meta.target()) || *meta.level() <= Level::WARN
        }))
        .with(stderr)
        .with(file)
        .with(syslog)
        .try_init()
        .map_err(|e| LogError::Install(e.to_string()))?;
    // Crates logging through `log` (ureq: several trace lines per request and per body read)
    // had every record walk the whole filter stack above, to be dropped there: 40% of a
    // reading daemon's CPU over peers. Below WARN only RUST_LOG or -vv lets any through.
    log::set_max_level(log_cap(rust_log.is_some(), setup.verbosity));
    Ok(())
}

/// The most detailed `log` record worth making: what RUST_LOG or -vv can ask for, else
/// warnings (other crates are held there anyway, fuser at errors).
fn log_cap(rust_log: bool, verbosity: u8) -> log::LevelFilter {
    match rust_log || verbosity >= 2 {
        true => log::LevelFilter::Trace,
        false => log::LevelFilter::Warn,
    }
}

/// Whether an event comes from packfs itself or from fuser (whose debug lines are requests, with
/// no secret in them); every other crate is held to warnings and errors, whatever `RUST_LOG`
/// says: ureq logs whole request lines (a presigned URL) at debug.
fn is_ours(target: &str) -> bool {
    ["packfs", "fuser"].iter().any(|ours| {
        target
            .strip_prefix(ours)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// A writer that hides the secrets of every URL in what passes through it. The formatter hands
/// it one whole event at a time, so a URL is never split across calls.
struct Redacting<W>(W);

impl<W: Write> Write for Redacting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Borrowed, not copied, when the line is UTF-8 (always, from the formatter).
        let text = String::from_utf8_lossy(buf);
        self.0
            .write_all(crate::util::redact::urls(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

/// Size at which a log file is rotated: one 500-file mount logged 291 MB at trace level.
pub const LOG_FILE_LIMIT: u64 = 64 << 20;

/// A log file that, past `limit` bytes, is renamed to `NAME.1` (replacing the one before) and
/// started anew: at most twice the limit on disk, the latest lines always kept.
struct LogFile {
    path: PathBuf,
    file: File,
    written: u64,
    limit: u64,
}

impl LogFile {
    fn open(path: &Path, limit: u64) -> io::Result<LogFile> {
        let file = crate::util::safe_file::append(path)?;
        let written = file.metadata()?.len();
        Ok(LogFile {
            path: path.to_path_buf(),
            file,
            written,
            limit,
        })
    }

    fn rotate(&mut self) -> io::Result<()> {
        let mut old = self.path.clone().into_os_string();
        old.push(".1");
        std::fs::rename(&self.path, &old)?;
        self.file = crate::util::safe_file::append(&self.path)?;
        self.written = 0;
        Ok(())
    }
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written > 0 && self.written + buf.len() as u64 > self.limit {
            // A log that cannot rotate (a read-only directory) goes on growing rather than stop.
            let _ = self.rotate();
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Events to syslog through the C library's `syslog(3)` (facility daemon, ident `packfs`, with
/// the pid), which journald and every syslog daemon read from /dev/log.
struct Syslog;

impl Syslog {
    fn open() -> Syslog {
        // SAFETY: the ident is a static C string that lives as long as the process, as openlog
        // requires; LOG_NDELAY connects now, before the daemon drops privileges or chroots.
        unsafe {
            libc::openlog(
                c"packfs".as_ptr(),
                libc::LOG_PID | libc::LOG_NDELAY,
                libc::LOG_DAEMON,
            )
        };
        Syslog
    }
}

impl<S: tracing::Subscriber> Layer<S> for Syslog {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut line = Line(String::new());
        event.record(&mut line);
        let priority = match *event.metadata().level() {
            Level::ERROR => libc::LOG_ERR,
            Level::WARN => libc::LOG_WARNING,
            Level::INFO => libc::LOG_INFO,
            _ => libc::LOG_DEBUG,
        };
        let line = crate::util::redact::urls(&line.0).replace('\0', "\\0");
        let Ok(text) = std::ffi::CString::new(line) else {
            return;
        };
        // SAFETY: "%s" with one NUL-terminated string argument that lives across the call.
        unsafe { libc::syslog(priority, c"%s".as_ptr(), text.as_ptr()) };
    }
}

/// An event as one line: the message, then `key=value` for every other field.
struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}{rest}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_log_file_is_rotated_past_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("packfs.log");
        let mut log = Redacting(LogFile::open(&path, 1000).unwrap());
        for i in 0..100 {
            writeln!(log, "line {i:03} GET https://h/k?X-Amz-Signature=0123abcd").unwrap();
        }
        let (now, old) = (
            std::fs::read_to_string(&path).unwrap(),
            std::fs::read_to_string(dir.path().join("packfs.log.1")).unwrap(),
        );
        assert!(
            now.len() <= 1000 && old.len() <= 1000,
            "{} {}",
            now.len(),
            old.len()
        );
        assert!(
            now.ends_with("line 099 GET https://h/k?X-Amz-Signature=REDACTED\n"),
            "{now}"
        );
        assert!(!now.contains("0123abcd") && !old.contains("0123abcd"));
        for p in [&path, &dir.path().join("packfs.log.1")] {
            let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        assert!(is_ours("packfs::source::remote") && is_ours("fuser") && !is_ours("ureq::run"));
        assert!(!is_ours("packfsx"));
    }

    #[test]
    fn other_crates_log_records_below_warn_are_not_made_unless_asked_for() {
        assert_eq!(log_cap(false, 0), log::LevelFilter::Warn);
        assert_eq!(log_cap(false, 1), log::LevelFilter::Warn);
        assert_eq!(log_cap(false, 2), log::LevelFilter::Trace);
        assert_eq!(log_cap(true, 0), log::LevelFilter::Trace);
    }
}
